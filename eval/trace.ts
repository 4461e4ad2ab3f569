/**
 * What happened in a run: a {@linkcode Trace} of steps and failures, and
 * its JSON form with the HUD SDK's field names (the results file's `trace`).
 *
 * @module
 */

import { classifyError, type RolloutErrorClass } from "./failure.ts";
import { redactDeep, redactSecrets } from "../_internal/redact.ts";
import { codeStack } from "../_internal/stack.ts";
import { HudProtocolError } from "../errors.ts";
import { isRecord } from "../_internal/util.ts";

/** The phase of a rollout in which something failed. */
export type Phase = "provisioning" | "start" | "agent" | "grading";

/** How a trace ended. */
export type TraceStatus = "running" | "completed" | "error" | "cancelled";

/** One step of a trace. */
export interface TraceStep {
  /** `setup`, `user`, `agent`, `evaluate`, `error`, `cancel`, or an observer's kind. */
  type: string;
  /** When the step was recorded, ISO-8601 UTC. */
  timestamp: string;
  /** The step's payload: the prompt, the answer, the grade, a diff... */
  content?: unknown;
  /** Extra data about the step. */
  info?: Record<string, unknown>;
}

/**
 * A file of a trace (a screenshot), as a step references it: its bytes are
 * kept apart from the JSON, and a results file writes them beside itself,
 * in `<results file>.files/`, named by their SHA-256.
 */
export interface TraceFile {
  /** The file's name in the results file's `.files/` directory: `<sha256>.<ext>`. */
  file: string;
  /** Its media type. */
  media_type: string;
  /** Its size in bytes. */
  bytes: number;
}

const EXTENSIONS: Readonly<Record<string, string>> = {
  "image/png": "png",
  "image/jpeg": "jpg",
  "image/webp": "webp",
};

/** A failure recorded in a trace. */
export interface TraceError {
  /** The phase that failed. */
  phase: Phase;
  /** What went wrong. */
  message: string;
  /** The error's name (`TimeoutError`, `HudProtocolError`...). */
  name: string;
  /** Its class (see {@linkcode classifyError}), which decides whether a job retries the rollout. */
  class?: RolloutErrorClass;
  /**
   * Where the code that threw is, for an error of the environment's task
   * code (the control server sends it) or of an agent's own code: its first
   * frame outside the SDK, `/path/env.ts:12:7`.
   */
  at?: string;
  /** That code's stack: the error's first line and its frames outside the SDK, redacted. */
  stack?: string;
}

/**
 * Where `err` was thrown: what the environment's server said of its task
 * code (a {@linkcode HudProtocolError}'s `data`), else the error's own
 * stack outside the SDK (an agent's code), else nothing.
 */
function whereThrown(err: Error): { at?: string; stack?: string } {
  if (err instanceof HudProtocolError) {
    const data = isRecord(err.data) ? err.data : {};
    const out: { at?: string; stack?: string } = {};
    if (typeof data.at === "string") out.at = redactSecrets(data.at);
    if (typeof data.stack === "string") out.stack = redactSecrets(data.stack);
    return out;
  }
  const own = codeStack(err);
  return own === null ? {} : { at: own.at, stack: own.stack };
}

/**
 * The workspace snapshot a rollout started from, and its ancestry as the
 * snapshot knew it: its parent, that one's parent, and so on.
 */
export interface TraceSnapshot {
  /** The snapshot's id (`snap-...`). */
  id: string;
  /** The workspace it was taken of. */
  workspace: string;
  /** Its ancestors' ids, nearest first (empty for a snapshot of a workspace that was no fork). */
  parents: string[];
}

/** A trace as JSON (the results file's `trace`), with the HUD SDK's field names. */
export interface TraceJson {
  /** How the run ended. */
  status: TraceStatus;
  /** Why it stopped (`graded`, `agent_error`, `timeout`...). */
  stop_reason: string | null;
  /** The agent's answer. */
  content: unknown;
  /** ISO-8601 UTC. */
  started_at: string;
  /** ISO-8601 UTC, or `null` while running. */
  ended_at: string | null;
  /** Failures, in order. */
  errors: TraceError[];
  /** Steps, in order. */
  steps: TraceStep[];
  /** The workspace snapshot the rollout started from; absent when it started from none. */
  from_snapshot?: TraceSnapshot;
}

function nowIso(): string {
  return new Date().toISOString();
}

/**
 * What happened in a run: its steps, how it ended, and the answer. The JSON
 * form uses the HUD SDK's field names so traces mean the same on both sides.
 *
 * Everything recorded (each step's content and info, failure messages, the
 * answer) goes through the file tracker's redactor first: private keys,
 * tokens and `*_API_KEY=`-style values become `[REDACTED kind]`, so that
 * what an agent read in its workspace (a command's output, a model's
 * messages) does not reach a results file. The run itself (what the agent
 * answered, what the environment grades) is not changed.
 */
export class Trace {
  readonly #steps: TraceStep[] = [];
  readonly #startedAt: string = nowIso();
  #endedAt: string | null = null;
  #status: TraceStatus = "running";
  #stopReason: string | null = null;
  #content: unknown = undefined;
  #errors: TraceError[] = [];
  readonly #files = new Map<string, Uint8Array>();
  #fromSnapshot: TraceSnapshot | null = null;

  /** Recorded steps, in order. */
  get steps(): readonly TraceStep[] {
    return this.#steps;
  }
  /** `running` until the run ends, then `completed`, `error` or `cancelled`. */
  get status(): TraceStatus {
    return this.#status;
  }
  /** Why the run stopped (`graded`, `agent_error`, `timeout`...). */
  get stopReason(): string | null {
    return this.#stopReason;
  }
  /** The agent's answer. */
  get content(): unknown {
    return this.#content;
  }
  /** Failures, in the order they happened. */
  get errors(): readonly TraceError[] {
    return this.#errors;
  }
  /** The first failure's phase, if any. */
  get failedPhase(): Phase | null {
    return this.#errors[0]?.phase ?? null;
  }
  /** When the run began, ISO-8601 UTC. */
  get startedAt(): string {
    return this.#startedAt;
  }
  /** When the run ended, ISO-8601 UTC. */
  get endedAt(): string | null {
    return this.#endedAt;
  }

  /** The workspace snapshot the rollout started from, or null. */
  get fromSnapshot(): TraceSnapshot | null {
    return this.#fromSnapshot;
  }

  /** Records the snapshot the rollout starts from, and its ancestry. */
  startFrom(snapshot: { id: string; workspace: string; lineage: readonly string[] }): void {
    this.#fromSnapshot = {
      id: snapshot.id,
      workspace: snapshot.workspace,
      parents: [...snapshot.lineage],
    };
  }

  /** The bytes of the files steps reference ({@linkcode Trace.attach}), by name. */
  get files(): ReadonlyMap<string, Uint8Array> {
    return this.#files;
  }

  /**
   * Keeps `bytes` as a file of the trace and returns the reference a step
   * holds in their place (named by their SHA-256, so a picture seen twice
   * is one file).
   * @throws {RangeError} for a media type other than PNG, JPEG or WebP
   */
  async attach(bytes: Uint8Array, mediaType: string): Promise<TraceFile> {
    const ext = Object.hasOwn(EXTENSIONS, mediaType) ? EXTENSIONS[mediaType] : undefined;
    if (ext === undefined) {
      throw new RangeError(`Cannot attach file: media type "${mediaType}" is not an image type`);
    }
    const digest = new Uint8Array(
      await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>),
    );
    const file = `${[...digest].map((b) => b.toString(16).padStart(2, "0")).join("")}.${ext}`;
    this.#files.set(file, bytes);
    return { file, media_type: mediaType, bytes: bytes.length };
  }

  /** Appends a step, stamped now, its content and info redacted. */
  record(type: string, content?: unknown, info?: Record<string, unknown>): TraceStep {
    const step: TraceStep = { type, timestamp: nowIso() };
    if (content !== undefined) step.content = redactDeep(content);
    if (info !== undefined) step.info = redactDeep(info) as Record<string, unknown>;
    this.#steps.push(step);
    return step;
  }

  /**
   * Records a failure in `phase` as an `error` step, with its class: the
   * one given (a rollout stage's), else {@linkcode classifyError}'s.
   */
  fail(
    phase: Phase,
    error: unknown,
    errorClass: RolloutErrorClass = classifyError(phase, error),
  ): void {
    const err = error instanceof Error ? error : new Error(String(error));
    const message = redactSecrets(err.message);
    const entry: TraceError = { phase, message, name: err.name, class: errorClass };
    const where = whereThrown(err);
    if (where.at !== undefined) entry.at = where.at;
    if (where.stack !== undefined) entry.stack = where.stack;
    this.#errors.push(entry);
    const info: Record<string, unknown> = { phase, name: err.name, class: entry.class };
    if (entry.at !== undefined) info.at = entry.at;
    this.record("error", message, info);
  }

  /** Sets the answer (redacted, as the steps are). */
  setContent(content: unknown): void {
    this.#content = redactDeep(content);
  }

  /** Ends the trace; later calls are ignored. */
  finish(status: Exclude<TraceStatus, "running">, stopReason: string): void {
    if (this.#status !== "running") return;
    this.#status = status;
    this.#stopReason = stopReason;
    this.#endedAt = nowIso();
  }

  /** The JSON form, with the HUD SDK's field names. */
  toJSON(): TraceJson {
    return {
      status: this.#status,
      stop_reason: this.#stopReason,
      content: this.#content ?? null,
      started_at: this.#startedAt,
      ended_at: this.#endedAt,
      errors: this.#errors,
      steps: this.#steps,
      ...(this.#fromSnapshot === null ? {} : { from_snapshot: this.#fromSnapshot }),
    };
  }
}
