/**
 * {@linkcode llmJudgeGrader}: a model decides, criterion by criterion,
 * whether an answer meets it (MET or UNMET, with an explanation); the
 * verdicts are weighted into one subscore, negative weights being
 * penalties. Any {@linkcode ModelBackend} of `agents/` judges (OpenAI
 * compatible, Anthropic). The semantics are those of the HUD Python SDK's
 * `LLMJudgeGrader`.
 *
 * @module
 */

import {
  type ModelBackend,
  type RetryOptions,
  type SamplingOptions,
  withRetries,
} from "../agents/model.ts";
import { Deadline } from "../_internal/async.ts";
import { refuseRenamed } from "../_internal/util.ts";
import type { SubScore } from "./combine.ts";

/** A criterion with a weight; a negative weight marks a mistake to penalise. */
export interface Criterion {
  /** What the answer should do or contain (or, with a negative weight, the mistake). */
  requirement: string;
  /**
   * Its weight.
   * @default 1
   */
  weight?: number;
}

/** Options for {@linkcode llmJudgeGrader}. */
export interface LlmJudgeOptions {
  /** What to judge the answer against: plain strings weigh 1. */
  criteria: readonly (string | Criterion)[];
  /** The question the answer replies to, shown to the judge. */
  question?: string;
  /**
   * The subscore's name.
   * @default "llm_judge"
   */
  name?: string;
  /**
   * The subscore's weight.
   * @default 1
   */
  weight?: number;
  /**
   * Sampling options for the judge.
   * @default { temperature: 0, maxTokens: 1024 }
   */
  sampling?: SamplingOptions;
  /** How HTTP failures are retried (as {@linkcode ChatAgent} does). @default withRetries' defaults */
  retry?: RetryOptions;
  /**
   * Tries per criterion when the judge's reply holds no verdict.
   * @default 3
   */
  verdictTries?: number;
  /**
   * The longest one model call may take, in ms, retries included.
   * @default 120_000
   */
  callTimeout?: number;
  /**
   * How many criteria are judged at once.
   * @default 4
   */
  concurrency?: number;
  /** Abort judging. */
  signal?: AbortSignal;
}

/** A judge's verdict on one criterion, read from its reply. */
export interface Verdict {
  /** Whether what the criterion describes is present. */
  met: boolean;
  /** The judge's reason. */
  explanation: string;
}

/** Thrown when the judge gave no readable verdict, after every try. */
export class JudgeVerdictError extends Error {
  /** The criterion. */
  readonly requirement: string;
  /** The judge's last reply. */
  readonly reply: string;

  /** Makes one for `requirement` with the judge's last `reply`. */
  constructor(requirement: string, reply: string, tries: number) {
    super(
      `Cannot judge criterion "${requirement}": no MET or UNMET verdict in the model's reply after ${tries} ${
        tries === 1 ? "try" : "tries"
      }: ${JSON.stringify(reply.slice(0, 200))}`,
    );
    this.name = "JudgeVerdictError";
    this.requirement = requirement;
    this.reply = reply;
  }
}

const SYSTEM_PROMPT =
  `You grade one response against one criterion: decide whether what the criterion describes is present in the response.

The <criterion_type> says whether the criterion describes something wanted (positive) or a mistake to avoid (negative). The question is the same for both: is the thing described actually there?
- positive: MET when the response does or contains it, UNMET when it does not.
- negative: MET when the response makes the mistake, UNMET when it does not, or only mentions the mistake to warn against it.

Be strict about facts and lenient about wording: accept equivalent statements and clear implications. Watch for negations, warnings and contrasts. Something the criterion asks for unconditionally is UNMET if the response does it only under a condition. Judge presence, not quality.

Reply with a JSON object only, no code fences:
{"criterion_status": "MET", "explanation": "One or two sentences."}
(or "UNMET").`;

function userPrompt(requirement: string, negative: boolean, answer: string, question?: string) {
  const parts = [
    `<criterion_type>\n${negative ? "negative" : "positive"}\n</criterion_type>`,
    `<criterion>\n${requirement}\n</criterion>`,
  ];
  if (question) parts.push(`<query>\n${question}\n</query>`);
  parts.push(`<response>\n${answer}\n</response>`);
  return parts.join("\n\n");
}

const STATUS_KEYS = ["criterion_status", "status", "verdict", "result", "met"];
const EXPLANATION_KEYS = ["explanation", "reason", "rationale", "justification"];

function statusOf(v: unknown): boolean | null {
  if (typeof v === "boolean") return v;
  if (typeof v !== "string") return null;
  const s = v.trim().toUpperCase().replace(/[\s_-]+/g, " ");
  if (s === "MET" || s === "TRUE" || s === "YES" || s === "PASS") return true;
  if (s === "UNMET" || s === "NOT MET" || s === "FALSE" || s === "NO" || s === "FAIL") {
    return false;
  }
  return null;
}

function verdictOf(value: unknown): Verdict | null {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return null;
  const record = value as Record<string, unknown>;
  for (const key of STATUS_KEYS) {
    const met = statusOf(record[key]);
    if (met === null) continue;
    const why = EXPLANATION_KEYS.map((k) => record[k]).find((v) => typeof v === "string");
    return { met, explanation: (why as string | undefined) ?? "" };
  }
  return null;
}

/**
 * Reads a verdict from a judge's reply: the JSON object it was asked for
 * (also inside code fences, after a reasoning block, or among other text;
 * `status`, `verdict` or a boolean `met` do too), else a lone `MET` or
 * `UNMET` word. `null` when there is none.
 *
 * @example
 * ```ts
 * import { parseVerdict } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const fence = "`".repeat(3);
 * const reply = `${fence}json\n{"criterion_status": "unmet", "explanation": "No source."}\n${fence}`;
 * assert.deepEqual(parseVerdict(reply), { met: false, explanation: "No source." });
 * assert.equal(parseVerdict("Verdict: MET")?.met, true);
 * assert.equal(parseVerdict("I cannot tell."), null);
 * ```
 */
export function parseVerdict(reply: string): Verdict | null {
  // Reasoning models may think aloud first.
  const text = reply.replace(/<think>[\s\S]*?<\/think>/gi, "").trim();
  const starts: number[] = [];
  const ends: number[] = [];
  for (let i = 0; i < text.length; i++) {
    if (text[i] === "{" && starts.length < 16) starts.push(i);
    if (text[i] === "}") ends.push(i);
  }
  for (const start of starts) {
    for (const end of ends.slice(-16).reverse()) {
      if (end < start) break;
      try {
        const verdict = verdictOf(JSON.parse(text.slice(start, end + 1)));
        if (verdict !== null) return verdict;
      } catch {
        // Not this span.
      }
    }
  }
  // No JSON: a verdict word, UNMET first since it contains MET.
  const plain = text.replace(/```\w*/g, "");
  if (/\b(UNMET|NOT[ _]MET)\b/i.test(plain)) {
    return { met: false, explanation: plain.slice(0, 500) };
  }
  if (/\bMET\b/i.test(plain)) return { met: true, explanation: plain.slice(0, 500) };
  return null;
}

/** The rubric value of weighted verdicts, as the Python SDK computes it. */
function rubricValue(verdicts: readonly { value: number; weight: number }[]): number {
  const positive = verdicts.reduce((s, v) => s + Math.max(0, v.weight), 0);
  const negative = verdicts.reduce((s, v) => s + (v.weight < 0 ? -v.weight : 0), 0);
  const sum = verdicts.reduce((s, v) => s + v.value * v.weight, 0);
  const clamp = (x: number) => Math.min(1, Math.max(0, x));
  if (positive > 0) return clamp(sum / positive);
  if (negative > 0) return clamp(1 + sum / negative);
  return 0;
}

/**
 * Runs `fn` over `items`, at most `limit` at a time. On the first failure
 * no new item starts and `stop` aborts the running ones; the error is
 * thrown once every started call has settled, so nothing outlives it.
 */
async function pool<T, R>(
  items: readonly T[],
  limit: number,
  stop: AbortController,
  fn: (t: T) => Promise<R>,
): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  let failure: { err: unknown } | null = null;
  const worker = async () => {
    while (next < items.length && failure === null) {
      const i = next++;
      try {
        out[i] = await fn(items[i]);
      } catch (err) {
        failure ??= { err };
        stop.abort(err);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  if (failure !== null) throw (failure as { err: unknown }).err;
  return out;
}

/**
 * Judges `answer` against weighted criteria with a model. Each criterion
 * is a child subscore (1 for MET, 0 for UNMET, its weight, and
 * `info: { status, explanation }`); the subscore's value is Σ value ×
 * weight over the positive weights, clamped to [0, 1] (with only
 * negative criteria, 1 less the penalties met).
 *
 * @param backend the judge model (`new OpenAiBackend(...)`, `new AnthropicBackend(...)`)
 * @param answer the agent's answer; a non-string is judged as JSON
 * @throws {TypeError} without criteria, or with one that has an empty requirement
 * @throws {RangeError} for a criterion weight that is not finite, or a bad bound
 * @throws {JudgeVerdictError} when a criterion gets no verdict after `verdictTries`
 * @throws {ModelHttpError} (and the other model errors) once retries are spent
 *
 * @example Against an OpenAI-compatible server
 * ```ts
 * import { combine, llmJudgeGrader } from "./mod.ts";
 * import { OpenAiBackend } from "../agents/mod.ts";
 * import assert from "node:assert/strict";
 *
 * // A stand-in judge on loopback that finds every criterion met.
 * await using server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () =>
 *   Response.json({
 *     choices: [{
 *       index: 0,
 *       finish_reason: "stop",
 *       message: { role: "assistant", content: '{"criterion_status": "MET", "explanation": "Yes."}' },
 *     }],
 *   }));
 * const judge = new OpenAiBackend({
 *   model: "judge",
 *   baseUrl: `http://127.0.0.1:${server.addr.port}/v1`,
 *   stream: false,
 *   apiKey: "unused",
 * });
 * const grade = await combine([
 *   llmJudgeGrader(judge, "Paris is the capital of France.", {
 *     question: "What is the capital of France?",
 *     criteria: ["Names Paris", { requirement: "Names a wrong city", weight: -1 }],
 *   }),
 * ]);
 * assert.equal(grade.score, 0); // the penalty was met too
 * assert.deepEqual(grade.subscores, {
 *   "llm_judge": 0,
 *   "llm_judge/Names Paris": 1,
 *   "llm_judge/Names a wrong city": 1,
 * });
 * ```
 */
export async function llmJudgeGrader(
  backend: ModelBackend,
  answer: unknown,
  options: LlmJudgeOptions,
): Promise<SubScore> {
  const config = judgeConfig(options);
  const text = typeof answer === "string" ? answer : JSON.stringify(answer) ?? String(answer);
  options.signal?.throwIfAborted();
  // One criterion failing stops the others.
  const stop = new AbortController();
  const signal = options.signal ? AbortSignal.any([options.signal, stop.signal]) : stop.signal;
  let children: SubScore[];
  try {
    children = await pool(
      config.criteria,
      config.concurrency,
      stop,
      (c) => judgeCriterion(backend, c, text, config, signal),
    );
  } catch (err) {
    if (options.signal?.aborted) throw options.signal.reason;
    throw err;
  }
  const info: Record<string, unknown> = { model: backend.model, format: backend.format };
  if (options.question !== undefined) info.question = options.question;
  return {
    name: options.name ?? "llm_judge",
    value: rubricValue(children as { value: number; weight: number }[]),
    weight: options.weight ?? 1,
    info,
    children,
  };
}

/** {@linkcode LlmJudgeOptions} checked, with every default applied. */
interface JudgeConfig {
  criteria: Required<Criterion>[];
  question: string | undefined;
  tries: number;
  concurrency: number;
  callTimeout: number;
  sampling: SamplingOptions;
  retry: RetryOptions | undefined;
}

/**
 * Checks the criteria and options before the model is called.
 * @throws {TypeError} for no criteria, one without a requirement, or an option by its old name
 * @throws {RangeError} for a weight, a count or a timeout out of range
 */
function judgeConfig(options: LlmJudgeOptions): JudgeConfig {
  const criteria = (options?.criteria ?? []).map((c, i): Required<Criterion> => {
    const requirement = typeof c === "string" ? c : c?.requirement;
    if (typeof requirement !== "string" || requirement.trim() === "") {
      throw new TypeError(`Cannot judge: criterion ${i} has no requirement`);
    }
    const weight = typeof c === "string" ? 1 : c.weight ?? 1;
    if (typeof weight !== "number" || !Number.isFinite(weight)) {
      throw new RangeError(`Cannot judge: criterion "${requirement}" has weight ${weight}`);
    }
    return { requirement, weight };
  });
  if (criteria.length === 0) throw new TypeError("Cannot judge: no criteria given");
  const tries = options.verdictTries ?? 3;
  const concurrency = options.concurrency ?? 4;
  refuseRenamed("judge", options, { callTimeoutMs: "callTimeout" });
  const callTimeout = options.callTimeout ?? 120_000;
  for (const [what, v] of [["verdictTries", tries], ["concurrency", concurrency]] as const) {
    if (!Number.isInteger(v) || v < 1) {
      throw new RangeError(`Cannot judge: ${what} ${v} must be a whole number ≥ 1`);
    }
  }
  if (!(callTimeout > 0)) {
    throw new RangeError(`Cannot judge: callTimeout ${callTimeout} must be > 0`);
  }
  const sampling: SamplingOptions = { temperature: 0, maxTokens: 1024, ...options.sampling };
  return {
    criteria,
    question: options.question,
    tries,
    concurrency,
    callTimeout,
    sampling,
    retry: options.retry,
  };
}

/**
 * Asks the model about one criterion until its reply holds a verdict (at
 * most `tries` times), each call within `callTimeout`.
 * @throws {JudgeVerdictError} when no reply held one
 */
async function judgeCriterion(
  backend: ModelBackend,
  c: Required<Criterion>,
  answer: string,
  config: JudgeConfig,
  signal: AbortSignal,
): Promise<SubScore> {
  const messages = [
    { role: "system" as const, content: SYSTEM_PROMPT },
    {
      role: "user" as const,
      content: userPrompt(c.requirement, c.weight < 0, answer, config.question),
    },
  ];
  let reply = "";
  for (let attempt = 1; attempt <= config.tries; attempt++) {
    using deadline = new Deadline(config.callTimeout, signal, "judge call");
    const answered = await withRetries(
      () => backend.complete({ messages, tools: [], sampling: config.sampling }, deadline.signal),
      deadline.signal,
      config.retry,
    );
    reply = answered.content || answered.refusal || "";
    const verdict = parseVerdict(reply);
    if (verdict !== null) {
      return {
        name: c.requirement,
        value: verdict.met ? 1 : 0,
        weight: c.weight,
        info: {
          status: verdict.met ? "MET" : "UNMET",
          explanation: verdict.explanation,
          ...(attempt > 1 ? { tries: attempt } : {}),
        },
      };
    }
  }
  throw new JudgeVerdictError(c.requirement, reply, config.tries);
}
