/**
 * How a failed rollout is classed: a closed set of failure classes
 * ({@linkcode FAILURE_CLASSES}), each saying whether the rollout was still
 * graded, whether a job retries it, and what to do about it. A reward of 0
 * means the agent's work was graded and failed; a rollout that failed for
 * any other reason is not graded (its reward is `null`), is counted apart
 * from the graded ones, and carries its class in the results file, the
 * trace, ATIF and training rows.
 *
 * {@linkcode Trace.fail} records the class of each failure;
 * {@linkcode Taskset.run} retries by it. Files written before the classes
 * were renamed (`connection`, `timeout`, `start`, `agent`, `grading`) are
 * read under the new names ({@linkcode readErrorClass}).
 *
 * @example
 * ```ts
 * import { classifyError } from "./failure.ts";
 * import { ConnectionClosedError } from "../errors.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(classifyError("provisioning", new Error("no capacity")), "provisioning");
 * assert.equal(classifyError("agent", new ConnectionClosedError("gone")), "infrastructure_lost");
 * assert.equal(classifyError("agent", new DOMException("late", "TimeoutError")), "agent_timeout");
 * assert.equal(classifyError("agent", new Error("bad plan")), "agent_error");
 * ```
 *
 * @module
 */

import { ConnectionClosedError, HudProtocolError } from "../errors.ts";
import { isPeerGone } from "../_internal/io.ts";
import { isRecord } from "../_internal/util.ts";

/** The class of a rollout's failure: one of {@linkcode FAILURE_CLASSES}. */
export type RolloutErrorClass =
  /** The environment could not be placed or reached before the task started. */
  | "provisioning"
  /** The environment (its connection, container, node) went away during the rollout. */
  | "infrastructure_lost"
  /** The model server did not answer (refused, reset, timed out, 408, 429, 5xx) after the call's retries. */
  | "model_unavailable"
  /** The model server answered with an error that will repeat (400, 401, 403, 404) or an unreadable reply. */
  | "model_error"
  /** The prompt was over the model's context window, even trimmed. */
  | "context_overflow"
  /** The agent's own failure. */
  | "agent_error"
  /** The agent's own time limit passed. */
  | "agent_timeout"
  /** The environment could not start the task (its setup threw, or refused the arguments). */
  | "start_error"
  /** Grading failed: the grader threw, could not run its command, or gave no finite score. */
  | "grading_error"
  /** Grading did not finish in time. */
  | "verifier_timeout"
  /** The rollout's deadline passed before it was graded. */
  | "rollout_timeout"
  /** The agent changed what grades it: the reward cannot be trusted. */
  | "tampered"
  /** The job stopped it (an interrupt, a limit) before it was graded. */
  | "cancelled";

/**
 * A class under the name files written before the classes were renamed
 * hold: read as today's by {@linkcode readErrorClass}.
 */
export type LegacyErrorClass = "connection" | "timeout" | "start" | "agent" | "grading";

/** What a class means and what it leads to. */
export interface FailureClassInfo {
  /** What happened, in a few words. */
  readonly meaning: string;
  /** Whether a rollout that fails so is still graded (on what the agent did). */
  readonly graded: boolean;
  /** Whether {@linkcode Taskset.run} retries it by default (`--retries`). */
  readonly retried: boolean;
  /** The way out, for a person. */
  readonly action: string;
}

/**
 * Every failure class, with its meaning, whether the rollout is still
 * graded, whether a job retries it, and what to do. The set is closed:
 * every failure a rollout records has one of these classes. docs/evals.md
 * lists the same table.
 */
export const FAILURE_CLASSES: Readonly<Record<RolloutErrorClass, FailureClassInfo>> = Object
  .freeze({
    provisioning: {
      meaning: "the environment could not be placed or reached before the task started",
      graded: false,
      retried: true,
      action:
        "read the message (the runtime, the sandbox or the control connection says why), fix it, and rerun with --resume",
    },
    infrastructure_lost: {
      meaning: "the environment went away during the rollout (connection, container, node)",
      graded: false,
      retried: true,
      action: "rerun with --resume (or --retries N); if it repeats, look at the environment's log",
    },
    model_unavailable: {
      meaning: "the model server did not answer after the call's retries",
      graded: false,
      retried: true,
      action:
        "check that the model server named in the message is up and reachable, then rerun with --resume",
    },
    model_error: {
      meaning: "the model server answered with an error that will repeat, or an unreadable reply",
      graded: false,
      retried: false,
      action: "check --model, --base-url and the API key against the server's message",
    },
    context_overflow: {
      meaning: "the conversation outgrew the model's context window, even trimmed",
      graded: true,
      retried: false,
      action:
        "the agent's own failure; lower --max-steps or the tools' output, or use a longer context",
    },
    agent_error: {
      meaning:
        "the agent failed (its program exited with an error or could not start, its code threw)",
      graded: true,
      retried: false,
      action:
        "the agent's own failure, graded on what it did (one that could not start, exit 126 or 127, is not graded: check --agent); the trace has its error",
    },
    agent_timeout: {
      meaning: "the agent's time limit passed; what it did by then was graded",
      graded: true,
      retried: false,
      action: "the agent's own failure; raise --agent-timeout if the task needs longer",
    },
    start_error: {
      meaning:
        "the environment could not start the task (its setup threw, or refused the arguments)",
      graded: false,
      retried: false,
      action: "a bug in the environment or the task row: the message names the file and line",
    },
    grading_error: {
      meaning:
        "grading failed: the grader threw, its command could not run, or it gave no finite score",
      graded: false,
      retried: false,
      action:
        "a bug in the environment's grading: the message names the file and line, or the command that could not run",
    },
    verifier_timeout: {
      meaning: "grading did not finish in time",
      graded: false,
      retried: false,
      action: "raise the grader's or the rollout's timeout (--timeout), or make the check quicker",
    },
    rollout_timeout: {
      meaning: "the rollout's deadline passed before it was graded",
      graded: false,
      retried: false,
      action: "raise --timeout, or --agent-timeout below it so that the agent's work is graded",
    },
    tampered: {
      meaning: "the agent changed what grades it; its reward cannot be trusted",
      graded: false,
      retried: false,
      action: "an attack on the reward by the agent: the trace has the evidence",
    },
    cancelled: {
      meaning: "the job stopped it (an interrupt or a limit) before it was graded",
      graded: false,
      retried: false,
      action: "rerun with --resume to finish it",
    },
  });

/** The classes {@linkcode Taskset.run} retries unless told otherwise. */
export const RETRYABLE_ERROR_CLASSES: readonly RolloutErrorClass[] = Object.freeze(
  (Object.keys(FAILURE_CLASSES) as RolloutErrorClass[]).filter((c) => FAILURE_CLASSES[c].retried),
);

/** Whether `name` is a class of {@linkcode FAILURE_CLASSES}. */
export function isFailureClass(name: unknown): name is RolloutErrorClass {
  return typeof name === "string" && Object.hasOwn(FAILURE_CLASSES, name);
}

/** The phase of a rollout a failure happened in. */
export type FailurePhase = "provisioning" | "start" | "agent" | "grading";

/** Each phase's class for a failure nothing more specific explains. */
const PHASE_CLASS: Readonly<Record<FailurePhase, RolloutErrorClass>> = {
  provisioning: "provisioning",
  start: "start_error",
  agent: "agent_error",
  grading: "grading_error",
};

/** Each phase's class for a timeout. */
const PHASE_TIMEOUT: Readonly<Record<FailurePhase, RolloutErrorClass>> = {
  provisioning: "provisioning",
  start: "start_error",
  agent: "agent_timeout",
  grading: "verifier_timeout",
};

/** What files written before the classes were renamed say, under today's names. */
const LEGACY_CLASSES: Readonly<Record<string, RolloutErrorClass>> = {
  connection: "infrastructure_lost",
  start: "start_error",
  agent: "agent_error",
  grading: "grading_error",
};

/**
 * A class as a record or an error names it, under today's name: a class
 * of the closed set as it is, an older name (`connection`, `start`,
 * `agent`, `grading`; `timeout` by where it happened: `agent_timeout` for
 * a graded rollout's agent, `verifier_timeout` in grading, else
 * `rollout_timeout`), `null` for anything else.
 */
export function readErrorClass(
  name: unknown,
  where: { phase?: string | null; graded?: boolean } = {},
): RolloutErrorClass | null {
  if (typeof name !== "string") return null;
  if (isFailureClass(name)) return name;
  if (Object.hasOwn(LEGACY_CLASSES, name)) return LEGACY_CLASSES[name];
  if (name !== "timeout") return null;
  if (where.phase === "grading") return "verifier_timeout";
  return where.phase === "agent" && where.graded === true ? "agent_timeout" : "rollout_timeout";
}

function isConnectionLost(err: unknown): boolean {
  return err instanceof ConnectionClosedError || isPeerGone(err) ||
    err instanceof Deno.errors.ConnectionRefused;
}

/**
 * The class an error names: its own `errorClass`, or for an error reply
 * of the environment's server, the class its task code named (`data.class`).
 */
function namedClass(err: unknown): unknown {
  if (err instanceof HudProtocolError) return isRecord(err.data) ? err.data.class : undefined;
  return (err as { errorClass?: unknown } | null)?.errorClass;
}

/**
 * The class of `err`, a failure in `phase`: the error's own `errorClass`
 * when it names one (the model errors of `@hud/sdk/agents` do; task code
 * may throw an error with one, which its server passes on), a timeout
 * (the agent's, grading's, else the phase's), a lost connection (here or in
 * its `cause`: `provisioning` before the task started, else
 * `infrastructure_lost`), else the phase's (`provisioning`, `start_error`,
 * `agent_error`, `grading_error`).
 */
export function classifyError(phase: FailurePhase, err: unknown): RolloutErrorClass {
  const own = readErrorClass(namedClass(err), { phase });
  if (own !== null) return own;
  if (err instanceof DOMException && err.name === "TimeoutError") return PHASE_TIMEOUT[phase];
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 8; depth++) {
    if (isConnectionLost(e)) {
      return phase === "provisioning" ? "provisioning" : "infrastructure_lost";
    }
    e = e.cause;
  }
  return PHASE_CLASS[phase];
}

/** What {@linkcode recordClass} reads of a record: it may come from a file of any age. */
export interface ClassedRecord {
  /** The reward, or `null` when not graded. */
  reward: number | null;
  /** The failure's class, under today's name or an older one; `null` for none. */
  error_class?: string | null;
  /** The phase that failed, if any. */
  failed_phase?: string | null;
  /** `completed`, `error` or `cancelled`. */
  status?: string;
}

/**
 * The class of a record's failure under today's names, or `null` for a
 * rollout that did not fail: its `error_class` (older names read as
 * {@linkcode readErrorClass} says; `null` says it did not fail), else, in
 * files older than the classes (no `error_class` at all), what its phase
 * and status say.
 */
export function recordClass(record: ClassedRecord): RolloutErrorClass | null {
  const graded = record.reward !== null;
  const phase = record.failed_phase ?? null;
  const named = readErrorClass(record.error_class, { phase, graded });
  if (named !== null) return named;
  // Null: the record says it did not fail; a string: a name from elsewhere.
  if (record.error_class !== undefined) return null;
  if (phase !== null && Object.hasOwn(PHASE_CLASS, phase)) {
    return PHASE_CLASS[phase as FailurePhase];
  }
  if (graded) return null;
  return record.status === "cancelled" ? "cancelled" : "grading_error";
}

/**
 * Whether a record counts as graded: it has a reward, and its class (if
 * any) is one whose rollouts are graded (a `tampered` rollout's reward is
 * not trusted). Means, pass@k and training rewards are over these only.
 */
export function isGraded(record: ClassedRecord): boolean {
  if (record.reward === null) return false;
  const c = recordClass(record);
  return c === null || FAILURE_CLASSES[c].graded;
}

/**
 * Whether a rollout's record counts as finished: graded, and not failed
 * for one of the infrastructure's reasons ({@linkcode RETRYABLE_ERROR_CLASSES}:
 * its reward would say nothing about the agent). A group with a rollout
 * that did not finish is not whole.
 */
export function rolloutFinished(record: ClassedRecord): boolean {
  if (!isGraded(record)) return false;
  const c = recordClass(record);
  return c === null || !FAILURE_CLASSES[c].retried;
}
