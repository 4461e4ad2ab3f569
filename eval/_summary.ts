// The one summarizer behind `eval`'s last lines, `eval --json`, `report`,
// `view` and `Job`: which attempts count (the latest of each task slug and
// repeat), and the job's figures over those. Everything that shows a count
// gets it from here, so no two of them can disagree.

import { FAILURE_CLASSES, isGraded, recordClass, type RolloutErrorClass } from "./failure.ts";
import type { AgentInfo } from "./agent.ts";
import { recordKey, type RunRecord } from "./results.ts";
import type { TraceSnapshot } from "./trace.ts";
import { isRecord } from "../_internal/util.ts";
import { setOwn } from "../schema.ts";

/** `target[key] = value`, as an own property even for `__proto__` (a name from a file). */
function put(target: Record<string, unknown>, key: string, value: unknown): void {
  if (key === "__proto__") setOwn(target, key, value);
  else target[key] = value;
}

/**
 * What a summary needs of one rollout, read from its record without
 * keeping the trace. Records come from files, so every field is read
 * defensively.
 */
export interface RolloutDigest {
  /** The job id. */
  job: string;
  /** Task slug. */
  slug: string;
  /** Template id. */
  id: string;
  /** Template arguments. */
  args: Record<string, unknown>;
  /** The environment's name. */
  env: string;
  /** Group id (every repeat of a task shares it). */
  group: string;
  /** Which repeat (0-based). */
  repeat: number;
  /** The reward, or `null` when not graded. */
  reward: number | null;
  /**
   * Whether it counts as graded ({@linkcode isGraded}): a reward, and no
   * failure that makes it untrusted (`tampered`).
   */
  graded: boolean;
  /** `completed`, `error` or `cancelled`. */
  status: string;
  /** The phase that failed, if any. */
  phase: string | null;
  /**
   * The failure that decided it (for a rollout not graded, the one that
   * ended it; else the first), `phase: message` on one line with where the
   * code that threw is (`(at /path/env.ts:12:7)`), or `""`.
   */
  error: string;
  /** That failure's whole message, or `""`. */
  errorMessage: string;
  /** Where the code that threw is, when the trace says (`/path/env.ts:12:7`). */
  at: string | null;
  /** Start, in ms since the epoch, when the trace has it. */
  started: number | null;
  /** End, in ms since the epoch, when the trace has it. */
  ended: number | null;
  /** Wall time in ms, when the trace has both ends. */
  duration: number | null;
  /** The grade's flat subscores, when it had any. */
  subscores: Record<string, number> | null;
  /** Steps in the trace. */
  steps: number;
  /** Model calls (`model` steps). */
  modelCalls: number;
  /** Tool calls (`tool` steps). */
  toolCalls: number;
  /** Prompt tokens over the model calls, when any call reported them. */
  inputTokens: number | null;
  /** Completion tokens over the model calls, when any call reported them. */
  outputTokens: number | null;
  /** Cost in USD over the model calls, when any call reported it. */
  costUsd: number | null;
  /** What ran, when the record says. */
  agent: AgentInfo | null;
  /**
   * The class of its failure (`error_class`, older names read as today's;
   * for files older than the classes, what its phase says), or `null`.
   */
  errorClass: RolloutErrorClass | null;
  /** The environment's version, when the trace's setup step says. */
  envVersion: string | null;
  /** The workspace snapshot it started from (`trace.from_snapshot`), or `null`. */
  fromSnapshot: TraceSnapshot | null;
}

/** A trace's `from_snapshot`, when it has that shape. */
function fromSnapshotOf(value: unknown): TraceSnapshot | null {
  if (!isRecord(value) || typeof value.id !== "string") return null;
  const parents = Array.isArray(value.parents)
    ? value.parents.filter((p) => typeof p === "string")
    : [];
  const workspace = typeof value.workspace === "string" ? value.workspace : "";
  return { id: value.id, workspace, parents };
}

function time(value: unknown): number | null {
  if (typeof value !== "string") return null;
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

function finite(value: unknown): number | null {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function add(sum: number | null, value: unknown): number | null {
  const v = finite(value);
  return v === null ? sum : (sum ?? 0) + v;
}

/** The flat subscores of a grade frame or record, numbers only. */
function subscoresOf(value: unknown): Record<string, number> | null {
  if (!isRecord(value)) return null;
  const out: Record<string, number> = {};
  let any = false;
  for (const k in value) {
    const n = finite(value[k]);
    if (n === null) continue;
    put(out, k, n);
    any = true;
  }
  return any ? out : null;
}

function agentOf(value: unknown): AgentInfo | null {
  if (!isRecord(value) || typeof value.kind !== "string" || typeof value.name !== "string") {
    return null;
  }
  const info: AgentInfo = { kind: value.kind, name: value.name };
  if (typeof value.version === "string") info.version = value.version;
  if (isRecord(value.settings)) info.settings = value.settings;
  return info;
}

/** What a trace's steps say: calls, tokens, cost, the environment's version, the grade's subscores. */
interface StepFigures {
  modelCalls: number;
  toolCalls: number;
  inputTokens: number | null;
  outputTokens: number | null;
  costUsd: number | null;
  envVersion: string | null;
  graded: Record<string, number> | null;
}

function stepFigures(steps: readonly unknown[]): StepFigures {
  const f: StepFigures = {
    modelCalls: 0,
    toolCalls: 0,
    inputTokens: null,
    outputTokens: null,
    costUsd: null,
    envVersion: null,
    graded: null,
  };
  for (const step of steps) {
    if (!isRecord(step)) continue;
    const info = isRecord(step.info) ? step.info : {};
    if (step.type === "model") {
      f.modelCalls++;
      f.inputTokens = add(f.inputTokens, info.input_tokens);
      f.outputTokens = add(f.outputTokens, info.output_tokens);
      f.costUsd = add(f.costUsd, info.cost_usd);
    } else if (step.type === "tool") {
      f.toolCalls++;
    } else if (step.type === "setup" && typeof info.env_version === "string") {
      f.envVersion = info.env_version;
    } else if (step.type === "evaluate" && isRecord(step.content)) {
      f.graded = subscoresOf(step.content.subscores);
    }
  }
  return f;
}

/**
 * The failure that decided a rollout (for one not graded, the last: the one
 * that ended it; else the first), as `phase: message` (its first line, then
 * where the code that threw is) and the whole message; for a rollout not
 * graded with none recorded, its status.
 */
function decidingFailure(
  trace: Record<string, unknown>,
  reward: number | null,
  status: string,
): { error: string; errorMessage: string; at: string | null } {
  const errors = (Array.isArray(trace.errors) ? trace.errors : []).filter(isRecord);
  const deciding = reward === null ? errors[errors.length - 1] : errors[0];
  if (deciding) {
    const message = String(deciding.message ?? "");
    const at = typeof deciding.at === "string" ? deciding.at : null;
    return {
      error: `${String(deciding.phase ?? "?")}: ${message.split("\n")[0]}${
        at === null ? "" : ` (at ${at})`
      }`,
      errorMessage: message,
      at,
    };
  }
  return {
    error: reward === null && status !== "completed" ? status : "",
    errorMessage: "",
    at: null,
  };
}

/** The digest of one record (a results line). */
export function digestRecord(record: RunRecord): RolloutDigest {
  const raw = record as unknown as Record<string, unknown>;
  const trace: Record<string, unknown> = isRecord(raw.trace) ? raw.trace : {};
  const task: Record<string, unknown> = isRecord(raw.task) ? raw.task : {};
  const started = time(trace.started_at);
  const ended = time(trace.ended_at);
  const steps: unknown[] = Array.isArray(trace.steps) ? trace.steps : [];
  const figures = stepFigures(steps);
  const reward = finite(raw.reward);
  const status = typeof raw.status === "string" ? raw.status : "?";
  const failure = decidingFailure(trace, reward, status);
  const phase = typeof raw.failed_phase === "string" ? raw.failed_phase : null;
  const classed = { reward, error_class: raw.error_class as string, failed_phase: phase, status };
  return {
    job: String(raw.job_id ?? ""),
    slug: String(task.slug ?? "?"),
    id: String(task.id ?? "?"),
    args: isRecord(task.args) ? task.args : {},
    env: String(task.env ?? ""),
    group: String(raw.group_id ?? ""),
    repeat: typeof raw.repeat === "number" ? raw.repeat : 0,
    reward,
    graded: isGraded(classed),
    status,
    phase,
    error: failure.error,
    errorMessage: failure.errorMessage,
    at: failure.at,
    started,
    ended,
    duration: started !== null && ended !== null ? ended - started : null,
    subscores: subscoresOf(raw.subscores) ?? figures.graded,
    steps: steps.length,
    modelCalls: figures.modelCalls,
    toolCalls: figures.toolCalls,
    inputTokens: figures.inputTokens,
    outputTokens: figures.outputTokens,
    costUsd: figures.costUsd,
    agent: agentOf(raw.agent),
    errorClass: recordClass(classed),
    envVersion: figures.envVersion,
    fromSnapshot: fromSnapshotOf(trace.from_snapshot),
  };
}

/**
 * Which attempts count: for each (slug, repeat), the index of its latest
 * attempt, in the order the keys first appear; every other index is
 * superseded. Linear in the number of attempts.
 */
export function latestAttempts(
  items: readonly { slug: string; repeat: number }[],
): { counted: number[]; superseded: number[] } {
  const latest = new Map<string, number>();
  for (let i = 0; i < items.length; i++) latest.set(recordKey(items[i].slug, items[i].repeat), i);
  // A Map keeps the order of first insertion: the order of first mention.
  const counted = [...latest.values()];
  const keep = new Set(counted);
  const superseded: number[] = [];
  for (let i = 0; i < items.length; i++) if (!keep.has(i)) superseded.push(i);
  return { counted, superseded };
}

/** One task's line of a {@linkcode JobSummary}. */
export interface TaskSummary {
  /** Task slug. */
  slug: string;
  /** Template id. */
  id: string;
  /** Template arguments. */
  args: Record<string, unknown>;
  /** Rollouts counted (the latest attempt of each repeat). */
  runs: number;
  /** Of those, graded. */
  graded: number;
  /** Of those, not graded. */
  errored: number;
  /** The errored ones by failure class. */
  errored_by_class: Record<string, number>;
  /** Graded rollouts with a reward of at least 1. */
  passes: number;
  /** Mean reward over graded rollouts. */
  mean_reward: number | null;
  /** Its standard error, from two graded rollouts up. */
  stderr: number | null;
  /** Mean of each subscore over the graded rollouts that have it. */
  subscores: Record<string, number>;
  /** Earlier attempts of its repeats that a later one replaced, not counted. */
  superseded: number;
  /** The phases that failed among the counted rollouts. */
  failed_phases: string[];
  /** The first failure among the counted rollouts, `phase: message`, if any. */
  first_error: string | null;
  /**
   * Whether every rollout of the task's groups finished: graded, and not
   * failed for an infrastructure reason (see `rolloutFinished`).
   */
  group_complete: boolean;
}

/** The one reason every rollout of a job errored, when they all errored alike. */
export interface CommonFailure {
  /** Its class. */
  class: RolloutErrorClass;
  /** The message of the first of them, first line (with where the code that threw is). */
  message: string;
  /** How many rollouts (all of them). */
  count: number;
  /** What the class means. */
  meaning: string;
  /** The way out. */
  action: string;
}

/** Why a job stopped before running everything: a budget was reached. */
export interface JobStop {
  /** Which limit. */
  reason: "token_limit" | "cost_limit";
  /** The limit (tokens or USD). */
  limit: number;
  /** What the job had spent when it stopped (tokens or USD), every attempt counted. */
  spent: number;
}

/** A job's summary, as `hud eval --json` prints it. Numbers are exact. */
export interface JobSummary {
  /** The job id. */
  id: string;
  /** Rollouts counted: the latest attempt of each (task, repeat). */
  total: number;
  /** Rollouts graded: the mean, its standard error and pass@k are over these alone. */
  graded: number;
  /** Rollouts not graded (a failure that is not the agent's work being judged). */
  errored: number;
  /** The errored rollouts by failure class (see `FAILURE_CLASSES`). */
  errored_by_class: Record<string, number>;
  /**
   * Rollouts whose record names a failure class, graded or not (an agent
   * that timed out is still graded), by that class.
   */
  failures_by_class: Record<string, number>;
  /** Each class's share of the counted rollouts: `failures_by_class` over `total`. */
  class_rates: Record<string, number>;
  /**
   * When every counted rollout errored for the same reason (one class, one
   * message but for its numbers): that reason once, with the way out;
   * else `null`.
   */
  common_failure: CommonFailure | null;
  /** Earlier attempts that a later attempt of the same (task, repeat) replaced, not counted. */
  superseded: number;
  /** Errored rollouts by the phase that failed (`cancelled` for those cancelled before one failed). */
  errored_by_phase: Record<string, number>;
  /**
   * Rollouts whose trace records a failure, graded or not, by the phase
   * that failed first (an agent that crashed after answering is graded).
   */
  failures_by_phase: Record<string, number>;
  /** Mean reward over graded rollouts. */
  mean_reward: number | null;
  /** Its standard error. */
  stderr: number | null;
  /** Rollouts per task (the most any task has). */
  group_size: number;
  /**
   * pass@k for k from 1 to the group size, over graded rollouts as the mean
   * is (a pass is a reward of at least 1; errored rollouts are left out,
   * not counted as fails), averaged over the tasks with at least k graded
   * rollouts (`pass_at_tasks`); `null` when no task has k.
   */
  pass_at: Record<string, number | null>;
  /** For each k of `pass_at`, how many tasks it averages over. */
  pass_at_tasks: Record<string, number>;
  /** Mean of each subscore over the graded rollouts that have it. */
  subscores: Record<string, number>;
  /** What ran (the latest record that says). */
  agent: AgentInfo | null;
  /**
   * Every agent that ran the counted rollouts, in the order first met: one
   * (or none), unless a resume was forced with another agent, whose
   * rollouts the mean and pass@k then mix.
   */
  agents: AgentInfo[];
  /** The environment and its version (the latest record that says). */
  env: { name: string; version: string | null } | null;
  /** Prompt tokens over all counted rollouts, when any model call reported them. */
  input_tokens: number | null;
  /** Completion tokens, likewise. */
  output_tokens: number | null;
  /** Cost in USD, when any model call reported it. */
  cost_usd: number | null;
  /** Model calls over all counted rollouts. */
  model_calls: number;
  /** Tool calls over all counted rollouts. */
  tool_calls: number;
  /** Trace steps over all counted rollouts. */
  steps: number;
  /** From the first rollout's start to the last one's end, in ms. */
  wall_ms: number | null;
  /** Mean rollout duration, in ms. */
  mean_duration_ms: number | null;
  /** Per task, in the order tasks first appear. */
  tasks: TaskSummary[];
  /** Groups (a task's repeats) with a rollout that could not finish, after any retries. */
  incomplete_groups: number;
  /**
   * The workspace snapshots counted rollouts started from, in the order
   * first met: each state and the rollouts that branched from it. Empty
   * when none started from a snapshot.
   */
  snapshots: SnapshotSummary[];
}

/** The rollouts that started from one workspace snapshot: its branches. */
export interface SnapshotSummary {
  /** The snapshot's id. */
  id: string;
  /** The workspace it was taken of. */
  workspace: string;
  /** Its ancestors' ids, nearest first. */
  parents: string[];
  /** Counted rollouts that started from it. */
  rollouts: number;
  /** Of them, graded. */
  graded: number;
  /** Mean reward over those graded. */
  mean_reward: number | null;
  /** Best reward among them. */
  best_reward: number | null;
}

/** The snapshots `rows` started from, with their rollouts' figures. */
function snapshotSummaries(rows: readonly RolloutDigest[]): SnapshotSummary[] {
  const by = new Map<string, { from: TraceSnapshot; rows: RolloutDigest[] }>();
  for (const r of rows) {
    if (r.fromSnapshot === null) continue;
    let entry = by.get(r.fromSnapshot.id);
    if (entry === undefined) by.set(r.fromSnapshot.id, entry = { from: r.fromSnapshot, rows: [] });
    entry.rows.push(r);
  }
  return [...by.values()].map(({ from, rows }) => {
    const rewards = rows.filter((r) => r.graded).map((r) => r.reward!);
    return {
      id: from.id,
      workspace: from.workspace,
      parents: from.parents,
      rollouts: rows.length,
      graded: rewards.length,
      mean_reward: meanAndError(rewards).mean,
      best_reward: rewards.length === 0 ? null : Math.max(...rewards),
    };
  });
}

/**
 * Mean and standard error of `xs`. Rewards that are all alike give that
 * reward and an error of 0 exactly, not the noise of their sum (three
 * rewards of 0.1 summed and divided by three give 0.10000000000000002 ±
 * 9.8e-18); others, their sum divided by their count.
 */
export function meanAndError(
  xs: readonly number[],
): { mean: number | null; stderr: number | null } {
  if (xs.length === 0) return { mean: null, stderr: null };
  const alike = xs.every((x) => x === xs[0]);
  const mean = alike ? xs[0] : xs.reduce((a, b) => a + b, 0) / xs.length;
  if (xs.length < 2) return { mean, stderr: null };
  if (alike) return { mean, stderr: 0 };
  const variance = xs.reduce((a, x) => a + (x - mean) ** 2, 0) / (xs.length - 1);
  return { mean, stderr: Math.sqrt(variance / xs.length) };
}

/**
 * pass@k over tasks, each with `n` graded rollouts of which `c` passed:
 * the unbiased estimate 1 - C(n-c, k) / C(n, k), averaged over the tasks
 * with at least k graded rollouts (how many: `tasks`); `value` is `null`
 * when none has k.
 */
export function passAtKOver(
  tasks: readonly { n: number; c: number }[],
  k: number,
): { value: number | null; tasks: number } {
  if (!(k >= 1)) return { value: null, tasks: 0 };
  let sum = 0;
  let counted = 0;
  for (const { n, c } of tasks) {
    if (n < k) continue;
    // As a product, to stay finite for large n.
    let fail = 1;
    if (n - c < k) fail = 0;
    else for (let i = n - c + 1; i <= n; i++) fail *= 1 - k / i;
    sum += 1 - fail;
    counted++;
  }
  return { value: counted === 0 ? null : sum / counted, tasks: counted };
}

/** {@linkcode passAtKOver}'s value alone. */
export function passAtK(tasks: readonly { n: number; c: number }[], k: number): number | null {
  return passAtKOver(tasks, k).value;
}

/** Sums and counts of subscores by name, in the order first met. */
interface SubscoreSums {
  names: string[];
  sums: Record<string, number>;
  counts: Record<string, number>;
}

function subscoreSums(): SubscoreSums {
  return { names: [], sums: {}, counts: {} };
}

function addSubscores(into: SubscoreSums, subscores: Record<string, number> | null): void {
  if (subscores === null) return;
  for (const k in subscores) {
    if (Object.hasOwn(into.counts, k)) {
      into.sums[k] += subscores[k];
      into.counts[k]++;
    } else {
      into.names.push(k);
      put(into.sums, k, subscores[k]);
      put(into.counts, k, 1);
    }
  }
}

function meansOf(sums: SubscoreSums): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of sums.names) put(out, k, sums.sums[k] / sums.counts[k]);
  return out;
}

function phasesOf(rows: readonly RolloutDigest[]): string[] {
  const out: string[] = [];
  for (const r of rows) if (r.phase !== null && !out.includes(r.phase)) out.push(r.phase);
  return out;
}

/** Options for {@linkcode summarizeDigests}. */
export interface SummarizeOptions {
  /** The job id; by default the first record's. */
  id?: string;
  /**
   * Earlier attempts known to be superseded besides those among the
   * attempts themselves (a resumed job's older lines): counted in
   * `superseded`, never as rollouts.
   * @default []
   */
  superseded?: readonly RolloutDigest[];
  /** pass@k is reached with a reward of at least this. @default 1 */
  threshold?: number;
  /**
   * Whether to make the per-task lines; without them (`tasks: []`) a
   * summary of many tasks is several times quicker.
   * @default true
   */
  tasks?: boolean;
}

/** One task's figures as the summary gathers them. */
interface TaskAcc {
  first: RolloutDigest;
  /** Graded rollouts, and of them passes: all pass@k needs. */
  n: number;
  c: number;
  /** Rollouts, graded or not: the group size. */
  runs: number;
  /** The rest only for the per-task lines. */
  rows: RolloutDigest[];
  superseded: number;
  subscores: SubscoreSums | null;
}

/** Each task's figures over `rows`, in the order tasks first appear; `lines` keeps their rows too. */
function taskAccumulators(
  rows: readonly RolloutDigest[],
  threshold: number,
  lines: boolean,
): Map<string, TaskAcc> {
  const tasks = new Map<string, TaskAcc>();
  for (const r of rows) {
    let t = tasks.get(r.slug);
    if (!t) {
      tasks.set(
        r.slug,
        t = { first: r, n: 0, c: 0, runs: 0, rows: [], superseded: 0, subscores: null },
      );
    }
    t.runs++;
    if (r.graded) {
      t.n++;
      if (r.reward! >= threshold) t.c++;
    }
    if (!lines) continue;
    t.rows.push(r);
    if (r.graded && r.subscores !== null) {
      addSubscores(t.subscores ??= subscoreSums(), r.subscores);
    }
  }
  return tasks;
}

/** The job-wide figures over the counted rollouts. */
interface JobTotals {
  rewards: number[];
  erroredByPhase: Record<string, number>;
  erroredByClass: Record<string, number>;
  classes: Record<string, number>;
  failuresByPhase: Record<string, number>;
  subscores: SubscoreSums;
  agent: AgentInfo | null;
  /** Distinct agents by their JSON, in the order first met. */
  agents: Map<string, AgentInfo>;
  envName: string | null;
  envVersion: string | null;
  inputTokens: number | null;
  outputTokens: number | null;
  costUsd: number | null;
  modelCalls: number;
  toolCalls: number;
  steps: number;
  /** The earliest start and the latest end. */
  first: number | null;
  last: number | null;
  durationSum: number;
  durations: number;
}

/** The job-wide figures over `rows`, gathered in one pass. */
function jobTotals(rows: readonly RolloutDigest[]): JobTotals {
  const t: JobTotals = {
    rewards: [],
    erroredByPhase: {},
    erroredByClass: {},
    classes: {},
    failuresByPhase: {},
    subscores: subscoreSums(),
    agent: null,
    agents: new Map(),
    envName: null,
    envVersion: null,
    inputTokens: null,
    outputTokens: null,
    costUsd: null,
    modelCalls: 0,
    toolCalls: 0,
    steps: 0,
    first: null,
    last: null,
    durationSum: 0,
    durations: 0,
  };
  for (const r of rows) addToTotals(t, r);
  return t;
}

function addToTotals(t: JobTotals, r: RolloutDigest): void {
  if (r.phase !== null) t.failuresByPhase[r.phase] = (t.failuresByPhase[r.phase] ?? 0) + 1;
  if (r.errorClass !== null) bump(t.classes, r.errorClass);
  if (r.graded) {
    t.rewards.push(r.reward!);
    addSubscores(t.subscores, r.subscores);
  } else {
    const phase = r.phase ?? (r.status === "completed" ? "grading" : r.status);
    bump(t.erroredByPhase, phase);
    bump(t.erroredByClass, r.errorClass ?? "unknown");
  }
  if (r.agent) {
    t.agent = r.agent;
    const key = JSON.stringify(r.agent);
    if (!t.agents.has(key)) t.agents.set(key, r.agent);
  }
  if (r.env !== "") t.envName = r.env;
  if (r.envVersion !== null) t.envVersion = r.envVersion;
  t.inputTokens = add(t.inputTokens, r.inputTokens);
  t.outputTokens = add(t.outputTokens, r.outputTokens);
  t.costUsd = add(t.costUsd, r.costUsd);
  t.modelCalls += r.modelCalls;
  t.toolCalls += r.toolCalls;
  t.steps += r.steps;
  if (r.started !== null && (t.first === null || r.started < t.first)) t.first = r.started;
  if (r.ended !== null && (t.last === null || r.ended > t.last)) t.last = r.ended;
  if (r.duration !== null) {
    t.durationSum += r.duration;
    t.durations++;
  }
}

function bump(counts: Record<string, number>, key: string): void {
  put(counts, key, (Object.hasOwn(counts, key) ? counts[key] : 0) + 1);
}

/** The groups with a rollout that did not finish (see `rolloutFinished`). */
function incompleteGroups(rows: readonly RolloutDigest[]): Set<string> {
  return new Set(
    rows.filter((r) =>
      !(r.graded && (r.errorClass === null || !FAILURE_CLASSES[r.errorClass].retried))
    ).map((r) => r.group),
  );
}

/** pass@k for every k from 1 to the group size (at least pass@1), and the tasks each is over. */
function passAtEvery(
  tasks: readonly { n: number; c: number }[],
  groupSize: number,
): { passAt: Record<string, number | null>; over: Record<string, number> } {
  const passAt: Record<string, number | null> = {};
  const over: Record<string, number> = {};
  for (let k = 1; k <= Math.max(1, groupSize); k++) {
    const { value, tasks: n } = passAtKOver(tasks, k);
    passAt[String(k)] = value;
    over[String(k)] = n;
  }
  return { passAt, over };
}

/** A message with its numbers blanked: rollouts that failed alike differ in ids, ports, times. */
function shapeOf(message: string): string {
  return message.replace(/[0-9a-f]{8,}|\d+(\.\d+)?/gi, "#");
}

/**
 * The one reason every rollout in `rows` errored, when there is one: the
 * same class and the same message but for its numbers.
 */
function commonFailure(rows: readonly RolloutDigest[]): CommonFailure | null {
  const first = rows[0];
  if (first === undefined || first.graded || first.errorClass === null) return null;
  const shape = shapeOf(first.error);
  for (const r of rows) {
    if (r.graded || r.errorClass !== first.errorClass || shapeOf(r.error) !== shape) return null;
  }
  const info = FAILURE_CLASSES[first.errorClass];
  return {
    class: first.errorClass,
    message: first.error,
    count: rows.length,
    meaning: info.meaning,
    action: info.action,
  };
}

/** Each class's count over `total`. */
function ratesOf(classes: Record<string, number>, total: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k in classes) put(out, k, classes[k] / total);
  return out;
}

/** A task's line of the summary; `incomplete` holds the groups that are not whole. */
function taskSummary(t: TaskAcc, incomplete: ReadonlySet<string>): TaskSummary {
  const graded = t.rows.filter((r) => r.graded).map((r) => r.reward!);
  const stats = meanAndError(graded);
  const byClass: Record<string, number> = {};
  for (const r of t.rows) if (!r.graded) bump(byClass, r.errorClass ?? "unknown");
  return {
    slug: t.first.slug,
    id: t.first.id,
    args: t.first.args,
    runs: t.rows.length,
    graded: graded.length,
    errored: t.rows.length - graded.length,
    errored_by_class: byClass,
    passes: t.c,
    mean_reward: stats.mean,
    stderr: stats.stderr,
    subscores: t.subscores === null ? {} : meansOf(t.subscores),
    superseded: t.superseded,
    failed_phases: phasesOf(t.rows),
    first_error: t.rows.find((r) => r.error !== "")?.error ?? null,
    group_complete: !t.rows.some((r) => incomplete.has(r.group)),
  };
}

/**
 * The summary over every attempt of a job, in file order: the latest
 * attempt of each (slug, repeat) counts, the others are superseded.
 */
export function summarizeDigests(
  attempts: readonly RolloutDigest[],
  options: SummarizeOptions = {},
): JobSummary {
  const { counted, superseded } = latestAttempts(attempts);
  const rows = counted.map((i) => attempts[i]);
  const lines = options.tasks ?? true;
  const tasks = taskAccumulators(rows, options.threshold ?? 1, lines);
  const older = [...superseded.map((i) => attempts[i]), ...(options.superseded ?? [])];
  for (const r of older) {
    const t = tasks.get(r.slug);
    if (t) t.superseded++;
  }
  const totals = jobTotals(rows);
  const { mean, stderr } = meanAndError(totals.rewards);
  const incomplete = incompleteGroups(rows);
  const counts = [...tasks.values()];
  const groupSize = counts.reduce((m, t) => Math.max(m, t.runs), 0);
  const { first, last } = totals;
  const pass = passAtEvery(counts, groupSize);
  return {
    id: options.id ?? rows[0]?.job ?? "",
    total: rows.length,
    graded: totals.rewards.length,
    errored: rows.length - totals.rewards.length,
    errored_by_class: totals.erroredByClass,
    failures_by_class: totals.classes,
    class_rates: ratesOf(totals.classes, rows.length),
    common_failure: commonFailure(rows),
    superseded: older.length,
    errored_by_phase: totals.erroredByPhase,
    failures_by_phase: totals.failuresByPhase,
    mean_reward: mean,
    stderr,
    group_size: groupSize,
    pass_at: pass.passAt,
    pass_at_tasks: pass.over,
    subscores: meansOf(totals.subscores),
    agent: totals.agent,
    agents: [...totals.agents.values()],
    env: totals.envName === null ? null : { name: totals.envName, version: totals.envVersion },
    input_tokens: totals.inputTokens,
    output_tokens: totals.outputTokens,
    cost_usd: totals.costUsd,
    model_calls: totals.modelCalls,
    tool_calls: totals.toolCalls,
    steps: totals.steps,
    wall_ms: first !== null && last !== null ? last - first : null,
    mean_duration_ms: totals.durations > 0 ? totals.durationSum / totals.durations : null,
    tasks: lines ? counts.map((t) => taskSummary(t, incomplete)) : [],
    incomplete_groups: incomplete.size,
    snapshots: snapshotSummaries(rows),
  };
}
