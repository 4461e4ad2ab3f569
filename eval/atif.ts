/**
 * Export of rollouts in Harbor's Agent Trajectory Interchange Format
 * (ATIF v1.4, Harbor's `docs/rfcs/0001-trajectory-format.md`), so that the
 * ecosystem's viewers and training pipelines read our runs:
 * {@linkcode toAtif} turns one results-file record into one trajectory.
 *
 * What maps where:
 * - a model run's system prompt, the task's prompt and each model call are
 *   `system`, `user` and `agent` steps; a call's tool calls are its
 *   `tool_calls` (arguments parsed to objects), their results its
 *   `observation` (by `source_call_id`), its tokens, cost, token ids and
 *   log-probabilities its `metrics`;
 * - a command agent's run is one `agent` step holding its answer, with the
 *   exit code and stderr in the step's `extra`;
 * - file-tracking diffs are `system` steps whose observation holds one
 *   unified diff per file;
 * - the task, the reward (whether it was graded, its failure class), the
 *   subscores, the grade's info and the errors are
 *   the root's `extra.hud`; tokens and cost totals are `final_metrics`.
 *
 * @example
 * ```ts
 * import { toAtif } from "./atif.ts";
 * import assert from "node:assert/strict";
 *
 * const trajectory = toAtif({
 *   job_id: "j", group_id: "j:t", task: { env: "e", id: "t", args: {}, slug: "t" },
 *   repeat: 0, status: "completed", reward: 1, failed_phase: null,
 *   trace: {
 *     status: "completed", stop_reason: "graded", content: "42", started_at: "2026-01-01T00:00:00.000Z",
 *     ended_at: "2026-01-01T00:00:01.000Z", errors: [],
 *     steps: [
 *       { type: "user", timestamp: "2026-01-01T00:00:00.100Z", content: "What is 6 x 7?" },
 *       { type: "agent", timestamp: "2026-01-01T00:00:00.900Z", content: "42" },
 *     ],
 *   },
 * });
 * assert.equal(trajectory.schema_version, "ATIF-v1.4");
 * assert.deepEqual(trajectory.steps.map((s) => s.source), ["user", "agent"]);
 * ```
 *
 * @module
 */

import type { RunRecord } from "./results.ts";
import { Job } from "./job.ts";
import { isGraded, recordClass } from "./failure.ts";
import { isRecord } from "../_internal/util.ts";
import { redactDeep } from "../_internal/redact.ts";
import { traceTokens, type TurnTokens } from "./tokens.ts";

/** The root of an ATIF trajectory. */
export interface AtifTrajectory {
  /** Always `ATIF-v1.4`. */
  schema_version: "ATIF-v1.4";
  /** The run's id: the HUD session's, else `job:slug#repeat`. */
  session_id: string;
  /** What ran. */
  agent: AtifAgent;
  /** The interaction, in order, `step_id` from 1. */
  steps: AtifStep[];
  /** Where the trajectory came from. */
  notes?: string;
  /** Totals over the steps. */
  final_metrics?: AtifFinalMetrics;
  /** The HUD record's task, reward, subscores and errors, under `hud`. */
  extra?: Record<string, unknown>;
}

/** ATIF's `AgentSchema`. */
export interface AtifAgent {
  /** The agent system. */
  name: string;
  /** Its version. */
  version: string;
  /** The model, for a model agent. */
  model_name?: string;
  /** Its kind and settings. */
  extra?: Record<string, unknown>;
}

/** ATIF's `StepObject`. */
export interface AtifStep {
  /** From 1, in order. */
  step_id: number;
  /** ISO 8601. */
  timestamp?: string;
  /** Who spoke. */
  source: "system" | "user" | "agent";
  /** The model of an agent step. */
  model_name?: string;
  /** The message; may be empty. */
  message: string;
  /** The agent's tool calls. */
  tool_calls?: AtifToolCall[];
  /** What came back. */
  observation?: { results: AtifObservationResult[] };
  /** An agent step's tokens and cost. */
  metrics?: AtifMetrics;
  /** Anything else about the step. */
  extra?: Record<string, unknown>;
}

/** ATIF's `ToolCallSchema`. */
export interface AtifToolCall {
  /** Matches an observation result's `source_call_id`. */
  tool_call_id: string;
  /** The tool. */
  function_name: string;
  /** Its arguments, an object. */
  arguments: Record<string, unknown>;
}

/** ATIF's `ObservationResultSchema`. */
export interface AtifObservationResult {
  /** The tool call it answers, if any. */
  source_call_id?: string;
  /** Its text. */
  content?: string;
}

/** ATIF's `MetricsSchema`. */
export interface AtifMetrics {
  /** Prompt tokens of the call. */
  prompt_tokens?: number;
  /** Completion tokens of the call. */
  completion_tokens?: number;
  /** What the call cost, in USD. */
  cost_usd?: number;
  /** The prompt's token ids, when the agent kept them. */
  prompt_token_ids?: number[];
  /** The completion's token ids, when the agent kept them. */
  completion_token_ids?: number[];
  /** The completion tokens' log-probabilities, when the agent kept them. */
  logprobs?: number[];
  /** Latency, finish reason, attempts. */
  extra?: Record<string, unknown>;
}

/** ATIF's `FinalMetricsSchema`. */
export interface AtifFinalMetrics {
  /** Prompt tokens over all steps. */
  total_prompt_tokens?: number;
  /** Completion tokens over all steps. */
  total_completion_tokens?: number;
  /** Cost over all steps, in USD. */
  total_cost_usd?: number;
  /** The number of steps. */
  total_steps?: number;
}

/** Options for {@linkcode toAtif}. */
export interface AtifOptions {
  /**
   * The SDK's version: the version of its model agent (`hud-chat-agent`)
   * when the record does not name one. Other agents' versions are theirs
   * to say (`AgentInfo.version`), else `unknown`.
   * @default "unknown"
   */
  sdkVersion?: string;
}

function text(value: unknown): string {
  if (value === null || value === undefined) return "";
  if (typeof value === "string") return value;
  if (Array.isArray(value)) {
    return value.map((p) => typeof p === "string" ? p : isRecord(p) ? String(p.text ?? "") : "")
      .join("");
  }
  return JSON.stringify(value);
}

function numbers(value: unknown): number[] | undefined {
  return Array.isArray(value) && value.every((x) => typeof x === "number") ? value : undefined;
}

function count(value: unknown): number | undefined {
  return typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : undefined;
}

/** A tool call's arguments as an object, whatever the model sent. */
function argumentsOf(raw: unknown): Record<string, unknown> {
  if (isRecord(raw)) return raw;
  if (typeof raw === "string") {
    if (raw.trim() === "") return {};
    try {
      const parsed = JSON.parse(raw);
      if (isRecord(parsed)) return parsed;
    } catch {
      // Not JSON: kept as the text the model wrote.
    }
    return { arguments: raw };
  }
  return raw === undefined || raw === null ? {} : { arguments: raw };
}

function defined<T extends Record<string, unknown>>(value: T): T {
  for (const k of Object.keys(value)) if (value[k] === undefined) delete value[k];
  return value;
}

/** A step before it has its number. */
type Step = Omit<AtifStep, "step_id">;

/**
 * One results-file record (a rollout) as an ATIF v1.4 trajectory. Fields
 * outside ATIF's schema go under `extra`; nothing of the record is lost
 * but the timing of steps that ATIF has no place for, and its secrets
 * (redacted as a results file is).
 */
export function toAtif(record: RunRecord, options: AtifOptions = {}): AtifTrajectory {
  const raw = record as unknown as Record<string, unknown>;
  const trace: Record<string, unknown> = isRecord(raw.trace) ? raw.trace : {};
  const steps: Record<string, unknown>[] = (Array.isArray(trace.steps) ? trace.steps : [])
    .filter(isRecord);
  const setup = steps.find((s) => s.type === "setup");
  const setupInfo = isRecord(setup?.info) ? setup.info : {};
  const task = isRecord(raw.task) ? raw.task : {};
  const trajectory = new Trajectory(steps);
  for (const s of steps) trajectory.add(s);
  const atif: AtifTrajectory = {
    schema_version: "ATIF-v1.4",
    session_id: typeof setupInfo.session_id === "string"
      ? setupInfo.session_id
      : `${String(raw.job_id ?? "")}:${String(task.slug ?? "")}#${String(raw.repeat ?? 0)}`,
    agent: atifAgent(isRecord(raw.agent) ? raw.agent : null, options),
    steps: trajectory.steps.map((s, i) => ({ step_id: i + 1, ...s })),
    notes: "Exported from a HUD SDK results file (@hud/sdk toAtif); the grade is in extra.hud.",
    final_metrics: trajectory.finalMetrics(),
    extra: { hud: hudExtra(raw, trace, steps, setupInfo.env_version) },
  };
  // Redacted as a results file is, whatever file it came from (one written
  // before traces were, or secrets this process holds that the writer did not).
  return redactDeep(atif, REDACT_DEPTH) as AtifTrajectory;
}

/** How deep a trajectory is redacted: a trace's own depth, and the levels above its content. */
const REDACT_DEPTH = 80;

/**
 * The steps of one trajectory, made from a trace's steps in order, and the
 * totals over them. A step may change the one before it (a refusal) or one
 * made earlier (a command agent's answer), so they are made here together.
 */
class Trajectory {
  readonly steps: Step[] = [];
  /** The `tool` steps by call id: their results ride on the calling step. */
  readonly #tools = new Map<string, Record<string, unknown>>();
  readonly #modelRun: boolean;
  /** What ChatAgent kept with `tokens: true` (eval/tokens.ts), whole prompts. */
  readonly #sampled: (TurnTokens | null)[];
  #modelCalls = 0;
  #prompt: string | null = null;
  #command: Step | null = null;
  #tokens = false;
  #totalIn = 0;
  #totalOut = 0;
  #totalCost: number | null = null;

  constructor(steps: Record<string, unknown>[]) {
    for (const s of steps) {
      if (s.type === "tool" && isRecord(s.content) && typeof s.content.id === "string") {
        this.#tools.set(s.content.id, s);
      }
    }
    const models = steps.filter((s) => s.type === "model" && isRecord(s.content));
    this.#modelRun = models.length > 0;
    this.#sampled = traceTokens(steps);
    // A model run: the system prompt first, as the model saw it.
    const firstRequest = models.length > 0 && isRecord(models[0].content)
      ? models[0].content.request
      : [];
    const system = Array.isArray(firstRequest)
      ? firstRequest.find((m) => isRecord(m) && m.role === "system")
      : undefined;
    if (isRecord(system)) {
      // No timestamp: the prompt was set before the first call, not at it.
      this.steps.push({ source: "system", message: text(system.content) });
    }
  }

  /** Adds what one trace step says, if ATIF has a place for it. */
  add(s: Record<string, unknown>): void {
    const info = isRecord(s.info) ? s.info : {};
    const at = typeof s.timestamp === "string" && s.timestamp !== "" ? s.timestamp : undefined;
    const type = String(s.type);
    const turn = type === "model" ? this.#sampled[this.#modelCalls++] ?? null : null;
    if (type === "user") {
      this.#prompt = text(s.content);
      this.steps.push({ timestamp: at, source: "user", message: this.#prompt });
    } else if (type === "model" && isRecord(s.content)) {
      this.#model(s.content, info, at, turn);
    } else if (type === "refusal") {
      const step = this.steps.at(-1);
      if (step?.source === "agent") step.extra = { ...step.extra, refusal: text(s.content) };
    } else if (type === "command") {
      this.#command = {
        timestamp: at,
        source: "agent",
        message: "",
        extra: { exit_code: info.code, signal: info.signal ?? null, stderr: info.stderr ?? "" },
      };
      this.steps.push(this.#command);
    } else if (type === "agent") {
      // A command agent's answer is its step's message; a model's is its submit call.
      if (this.#command !== null) this.#command.message = text(s.content);
      else if (!this.#modelRun) {
        this.steps.push({ timestamp: at, source: "agent", message: text(s.content) });
      }
    } else if (type.startsWith("filetracking.") && isRecord(s.content)) {
      const step = fileTrackingStep(type, s.content, at);
      if (step !== null) this.steps.push(step);
    }
  }

  /** A model call: later user turns, then the agent step with its calls and their results. */
  #model(
    content: Record<string, unknown>,
    info: Record<string, unknown>,
    at: string | undefined,
    turn: TurnTokens | null,
  ): void {
    const request = Array.isArray(content.request) ? content.request.filter(isRecord) : [];
    for (const m of request) {
      // Later user turns; tool results ride on the step that called them.
      if (m.role === "user" && text(m.content) !== this.#prompt) {
        this.steps.push({ timestamp: at, source: "user", message: text(m.content) });
      }
    }
    const reply = isRecord(content.reply) ? content.reply : {};
    const { toolCalls, results } = this.#toolCalls(reply);
    const metrics = modelMetrics(info, turn);
    if (metrics.prompt_tokens !== undefined || metrics.completion_tokens !== undefined) {
      this.#tokens = true;
      this.#totalIn += metrics.prompt_tokens ?? 0;
      this.#totalOut += metrics.completion_tokens ?? 0;
    }
    if (metrics.cost_usd !== undefined) this.#totalCost = (this.#totalCost ?? 0) + metrics.cost_usd;
    this.steps.push(defined({
      timestamp: at,
      source: "agent" as const,
      model_name: typeof info.model === "string" ? info.model : undefined,
      message: text(reply.content),
      tool_calls: toolCalls.length > 0 ? toolCalls : undefined,
      observation: results.length > 0 ? { results } : undefined,
      metrics,
    }));
  }

  /** A reply's tool calls, with ids unique in the step, and the results of those that ran. */
  #toolCalls(
    reply: Record<string, unknown>,
  ): { toolCalls: AtifToolCall[]; results: AtifObservationResult[] } {
    const calls = (Array.isArray(reply.tool_calls) ? reply.tool_calls : []).filter(isRecord);
    const toolCalls: AtifToolCall[] = [];
    const results: AtifObservationResult[] = [];
    const seen = new Set<string>();
    calls.forEach((c, n) => {
      const fn = isRecord(c.function) ? c.function : {};
      let id = typeof c.id === "string" && c.id !== "" ? c.id : `call_${this.steps.length}_${n}`;
      // ATIF wants the ids of one step unique.
      while (seen.has(id)) id += "_";
      seen.add(id);
      toolCalls.push({
        tool_call_id: id,
        function_name: String(c.name ?? fn.name ?? "tool"),
        arguments: argumentsOf(c.arguments ?? fn.arguments),
      });
      const result = this.#tools.get(String(c.id));
      if (result && isRecord(result.content)) {
        results.push({ source_call_id: id, content: text(result.content.result) });
      }
    });
    return { toolCalls, results };
  }

  /** Totals over the steps. */
  finalMetrics(): AtifFinalMetrics {
    return defined({
      total_prompt_tokens: this.#tokens ? this.#totalIn : undefined,
      total_completion_tokens: this.#tokens ? this.#totalOut : undefined,
      total_cost_usd: this.#totalCost ?? undefined,
      total_steps: this.steps.length,
    });
  }
}

/** A model step's tokens, cost, sampled ids and timing. */
function modelMetrics(info: Record<string, unknown>, turn: TurnTokens | null): AtifMetrics {
  return defined({
    prompt_tokens: count(info.input_tokens),
    completion_tokens: count(info.output_tokens),
    cost_usd: typeof info.cost_usd === "number" ? info.cost_usd : undefined,
    prompt_token_ids: numbers(info.prompt_token_ids) ?? turn?.promptIds ?? undefined,
    completion_token_ids: numbers(info.completion_token_ids) ?? turn?.completionIds ?? undefined,
    logprobs: numbers(info.logprobs) ?? turn?.logprobs ?? undefined,
    extra: defined({
      latency_ms: info.latency_ms,
      finish_reason: info.finish_reason ?? undefined,
      attempts: info.attempts,
      retries: info.retries,
    }),
  });
}

/** A file-tracking step with patches as a `system` step, one unified diff per file. */
function fileTrackingStep(
  type: string,
  content: Record<string, unknown>,
  at: string | undefined,
): Step | null {
  // A flush nests its diff (HUD's shape); the other kinds hold the patches.
  const diff = isRecord(content.diff) ? content.diff : content;
  const patches = (Array.isArray(diff.patches) ? diff.patches : []).filter(isRecord);
  if (patches.length === 0) return null;
  const kind = type.slice("filetracking.".length);
  return {
    timestamp: at,
    source: "system",
    message: kind === "setup"
      ? `The environment set up ${patches.length} file(s)`
      : `The agent changed ${patches.length} file(s)`,
    observation: {
      results: patches.map((p) => ({ content: String(p.patch ?? `${p.status} ${p.path}`) })),
    },
    extra: { kind: type, paths: patches.map((p) => String(p.path)) },
  };
}

/** ATIF's agent for the record's `agent`: ChatAgent is `hud-chat-agent`. */
function atifAgent(agentInfo: Record<string, unknown> | null, options: AtifOptions): AtifAgent {
  const settings = agentInfo && isRecord(agentInfo.settings) ? agentInfo.settings : undefined;
  const isModel = agentInfo?.kind === "model";
  return defined({
    name: isModel ? "hud-chat-agent" : String(agentInfo?.name ?? "unknown") || "unknown",
    version: typeof agentInfo?.version === "string"
      ? agentInfo.version
      : isModel
      ? options.sdkVersion ?? "unknown"
      : "unknown",
    model_name: isModel ? String(agentInfo?.name) : undefined,
    extra: agentInfo ? defined({ kind: agentInfo.kind, settings }) : undefined,
  });
}

/** The record's task, reward (whether graded, its failure class), grade and errors: the root's `extra.hud`. */
function hudExtra(
  raw: Record<string, unknown>,
  trace: Record<string, unknown>,
  steps: Record<string, unknown>[],
  envVersion: unknown,
): Record<string, unknown> {
  const evaluate = steps.filter((s) => s.type === "evaluate" && isRecord(s.content)).pop();
  const grade = isRecord(evaluate?.content) ? evaluate.content : null;
  const classed = {
    reward: typeof raw.reward === "number" ? raw.reward : null,
    error_class: raw.error_class as string | null | undefined,
    failed_phase: typeof raw.failed_phase === "string" ? raw.failed_phase : null,
    status: String(raw.status),
  };
  return defined({
    job_id: raw.job_id,
    group_id: raw.group_id,
    task: isRecord(raw.task) ? raw.task : {},
    repeat: raw.repeat,
    status: raw.status,
    reward: raw.reward,
    // Whether the reward counts (an errored rollout's never does), and why it failed.
    graded: isGraded(classed),
    error_class: recordClass(classed),
    subscores: raw.subscores ?? (grade && isRecord(grade.subscores) ? grade.subscores : undefined),
    grade_info: grade && isRecord(grade.info) ? grade.info : undefined,
    answer: trace.content,
    failed_phase: raw.failed_phase,
    errors: trace.errors,
    stop_reason: trace.stop_reason,
    started_at: trace.started_at,
    ended_at: trace.ended_at,
    env_version: envVersion,
  });
}

/** A file name for `slug`: its letters, digits, `.`, `_` and `-`, the rest as `_`. */
function fileName(slug: string, repeat: number): string {
  return `${slug.replace(/[^A-Za-z0-9._-]/g, "_").replace(/^\.+/, "_") || "_"}.${repeat}`;
}

/**
 * Writes one ATIF trajectory per counted rollout of the results file at
 * `path` (the latest attempt of each task and repeat, as {@linkcode Job.load}
 * reads it) into `dir`, as `<slug>.<repeat>.json`, private to the user
 * (0600: a trajectory holds what the results file holds). Creates `dir`.
 *
 * @returns the files written, in the file's order
 * @throws {Deno.errors.NotFound} when the results file does not exist
 */
export async function writeTrajectories(
  path: string,
  dir: string,
  options: AtifOptions = {},
): Promise<string[]> {
  const job = await Job.load(path);
  await Deno.mkdir(dir, { recursive: true });
  const written: string[] = [];
  const used = new Set<string>();
  for (const record of job.runs) {
    const base = fileName(record.task.slug, record.repeat);
    let name = `${base}.json`;
    // Two slugs that differ only in characters a file name cannot hold.
    for (let n = 2; used.has(name); n++) name = `${base}-${n}.json`;
    used.add(name);
    const file = `${dir.replace(/\/+$/, "") || "."}/${name}`;
    await Deno.writeTextFile(file, JSON.stringify(toAtif(record, options), null, 2) + "\n", {
      mode: 0o600,
    });
    // A file that was there keeps its mode through a write: set it.
    await Deno.chmod(file, 0o600);
    written.push(file);
  }
  return written;
}
