/**
 * How a failed rollout is classed, so that a job can retry the failures
 * that are the infrastructure's (an environment that could not be placed,
 * a connection lost, a model server that stayed unavailable after its own
 * retries) and never those that are the agent's, a timeout, or a prompt
 * over the model's context window. {@linkcode Trace.fail} records the
 * class of each failure; {@linkcode Taskset.run} retries by it.
 *
 * @example
 * ```ts
 * import { classifyError } from "./failure.ts";
 * import { ConnectionClosedError } from "../errors.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(classifyError("provisioning", new Error("no capacity")), "provisioning");
 * assert.equal(classifyError("agent", new ConnectionClosedError("gone")), "connection");
 * assert.equal(classifyError("agent", new DOMException("late", "TimeoutError")), "timeout");
 * assert.equal(classifyError("agent", new Error("bad plan")), "agent");
 * ```
 *
 * @module
 */

import { ConnectionClosedError } from "../errors.ts";
import { isPeerGone } from "../_internal/io.ts";

/** The class of a rollout's failure. */
export type RolloutErrorClass =
  /** The environment could not be placed or reached before the task started. */
  | "provisioning"
  /** A connection to the environment was lost. */
  | "connection"
  /** The model server stayed unavailable (429, 5xx, unreachable) after the call's own retries. */
  | "model_unavailable"
  /** The prompt was over the model's context window, even trimmed. */
  | "context_overflow"
  /** The rollout's or the agent's deadline passed. */
  | "timeout"
  /** The environment refused to start the task. */
  | "start"
  /** The agent's own failure. */
  | "agent"
  /** Grading failed. */
  | "grading"
  /**
   * The environment found the agent tampering with its grading (a planted
   * file the grader would run, a process that killed it): its grade says
   * so in `info.tampered`, and the score it gave (0) stands.
   */
  | "tampered";

/** The classes {@linkcode Taskset.run} retries unless told otherwise. */
export const RETRYABLE_ERROR_CLASSES: readonly RolloutErrorClass[] = Object.freeze([
  "provisioning",
  "connection",
  "model_unavailable",
]);

const CLASSES = new Set<string>([
  "provisioning",
  "connection",
  "model_unavailable",
  "context_overflow",
  "timeout",
  "start",
  "agent",
  "grading",
  "tampered",
]);

function isConnectionLost(err: unknown): boolean {
  return err instanceof ConnectionClosedError || isPeerGone(err) ||
    err instanceof Deno.errors.ConnectionRefused;
}

/**
 * The class of `err`, a failure in `phase`: the error's own `errorClass`
 * when it names one (the model errors of `@hud/sdk/agents` do), a timeout,
 * a lost connection (here or in its `cause`), else the phase's
 * (`provisioning`, `start`, `agent`, `grading`).
 */
export function classifyError(
  phase: "provisioning" | "start" | "agent" | "grading",
  err: unknown,
): RolloutErrorClass {
  const own = (err as { errorClass?: unknown } | null)?.errorClass;
  if (typeof own === "string" && CLASSES.has(own)) return own as RolloutErrorClass;
  if (err instanceof DOMException && err.name === "TimeoutError") return "timeout";
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 8; depth++) {
    if (isConnectionLost(e)) return phase === "provisioning" ? "provisioning" : "connection";
    e = e.cause;
  }
  return phase;
}

/**
 * Whether a rollout's record counts as finished: graded, and not failed
 * for one of the infrastructure's reasons ({@linkcode RETRYABLE_ERROR_CLASSES}:
 * an agent cut off by a model server that stayed down may still have been
 * graded, but its reward says nothing about the agent). A group with a
 * rollout that did not finish is not whole.
 */
export function rolloutFinished(
  record: { reward: number | null; error_class?: string | null },
): boolean {
  return record.reward !== null &&
    !(RETRYABLE_ERROR_CLASSES as readonly (string | null | undefined)[]).includes(
      record.error_class,
    );
}
