/**
 * The live handle an agent gets for one task: {@linkcode Run} starts the
 * task, holds the prompt and the agent's answer, and grades it into a
 * {@linkcode Grade}.
 *
 * @module
 */

import type { Capability } from "../capability.ts";
import type { HudClient } from "../client.ts";
import type { GradeFrame, PromptFrame, TaskRow } from "../env.ts";
import { isRecord } from "../_internal/util.ts";
import { Trace } from "./trace.ts";

/** The result of grading, shaped like the HUD SDK's evaluation result. */
export interface Grade {
  /** The score the environment gave. */
  reward: number;
  /**
   * Whether the task is finished.
   * @default true
   */
  done: boolean;
  /** What the grader said about the answer. */
  content?: unknown;
  /** Extra data from the grader. */
  info: Record<string, unknown>;
  /** Whether grading itself failed on the environment's side. */
  isError: boolean;
  /** Named partial scores. */
  subscores?: Record<string, number>;
  /** The grade frame as received. */
  raw: GradeFrame;
}

/** Reads a {@linkcode Grade} from a grade frame. */
export function gradeFromFrame(frame: GradeFrame): Grade {
  const grade: Grade = {
    reward: frame.score,
    done: typeof frame.done === "boolean" ? frame.done : true,
    info: isRecord(frame.info) ? frame.info : {},
    isError: frame.isError === true,
    raw: frame,
  };
  if (frame.content !== undefined) grade.content = frame.content;
  if (isRecord(frame.subscores)) grade.subscores = frame.subscores as Record<string, number>;
  return grade;
}

/**
 * What a grade's `info.tampered` says the environment found the agent doing
 * to its grading (one line each), or null when it says nothing: an
 * environment that catches reward tampering reports it there, with the
 * score it gives (0), and the rollout is classed `tampered`.
 */
function tamperEvidence(info: Record<string, unknown>): string[] | null {
  const said = info.tampered;
  if (said === undefined || said === null || said === false) return null;
  const lines = Array.isArray(said) ? said.map(String) : [String(said)];
  return lines.length === 0 ? null : lines;
}

/** The failure a tampered grade records: what the environment found. */
class TamperedError extends Error {
  constructor(evidence: string[]) {
    super(`The environment found the agent tampering with its grading: ${evidence.join("; ")}`);
    this.name = "TamperedError";
  }
}

/** Options for {@linkcode Run.start}. */
export interface RunStartOptions {
  /** Aborts starting. */
  signal?: AbortSignal;
}

// Plumbing the rollout's stages need and Run's public API must not show;
// assigned in Run's static block, which can reach its #private members.
let construct: (client: HudClient | null, task: TaskRow, trace: Trace) => Run;
let begin: (run: Run, signal: AbortSignal | undefined) => Promise<void>;

/**
 * The live handle an agent gets for one task. {@linkcode Run.start} sends
 * `tasks.start` and records a `setup` step and a `user` step holding the
 * prompt; {@linkcode Run.finish} sends `tasks.grade` with the answer and
 * records an `evaluate` step; disposing a run that was not finished grades
 * it (best effort).
 *
 * @example
 * ```ts
 * import { bind, connect, Environment, Run } from "../mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo");
 * const echo = env.template({ id: "echo" }, async function* () {
 *   const answer = yield "Say ok";
 *   yield answer === "ok" ? 1 : 0;
 * });
 * await using server = bind(env);
 * await using client = await connect(server);
 * const run = await Run.start(client, echo());
 * run.answer = "ok";
 * await run.finish();
 * assert.equal(run.reward, 1);
 * ```
 */
export class Run implements AsyncDisposable {
  readonly #client: HudClient | null;
  readonly #task: TaskRow;
  readonly #trace: Trace;
  #frame: PromptFrame | null = null;
  #answer: unknown = undefined;
  #grade: Grade | null = null;
  #settled = false;

  // TypeScript's `private` is the only way to keep a constructor out of the
  // public API (a #private name cannot apply to one); use Run.start() or
  // rollout(), whose stages make runs through createRun().
  private constructor(client: HudClient | null, task: TaskRow, trace: Trace) {
    this.#client = client;
    this.#task = task;
    this.#trace = trace;
  }

  static {
    construct = (client, task, trace) => new Run(client, task, trace);
    begin = (run, signal) => run.#begin(signal);
  }

  /**
   * Starts `task` on `client`'s session.
   * @throws {HudProtocolError} when the environment refuses to start it
   */
  static async start(
    client: HudClient,
    task: TaskRow,
    options: RunStartOptions = {},
  ): Promise<Run> {
    const run = new Run(client, task, new Trace());
    await run.#begin(options.signal);
    return run;
  }

  /** Sends `tasks.start` and records the setup and prompt steps. */
  async #begin(signal?: AbortSignal): Promise<void> {
    this.#trace.record("setup", { id: this.#task.id, args: this.#task.args }, {
      slug: this.#task.slug,
      session_id: this.client.sessionId,
      env_version: this.client.manifest.env.version,
    });
    this.#frame = await this.client.startTask(this.#task.id, this.#task.args, { signal });
    this.#trace.record("user", this.#frame.prompt);
  }

  /** The task row being run. */
  get task(): TaskRow {
    return this.#task;
  }
  /** The prompt (the start frame's `prompt`). */
  get prompt(): unknown {
    return this.#frame?.prompt ?? null;
  }
  /** The whole start frame. */
  get frame(): PromptFrame | null {
    return this.#frame;
  }
  /** Per-episode data from the start frame, keyed by capability name. */
  get bindings(): Record<string, unknown> {
    return isRecord(this.#frame?.bindings) ? this.#frame.bindings as Record<string, unknown> : {};
  }
  /** Capabilities of the environment, with urls pointing at local forwarders. */
  get capabilities(): Capability[] {
    return this.#client?.bindings ?? [];
  }
  /**
   * The control client.
   * @throws {Error} for a run whose rollout failed before it connected
   */
  get client(): HudClient {
    if (this.#client === null) {
      throw new Error("Cannot use run.client: the rollout failed before it connected");
    }
    return this.#client;
  }
  /** What happened so far. */
  get trace(): Trace {
    return this.#trace;
  }
  /** The grade, once graded. */
  get grade(): Grade | null {
    return this.#grade;
  }
  /** The reward, once graded; `null` before or when grading failed. */
  get reward(): number | null {
    return this.#grade?.reward ?? null;
  }
  /** The agent's answer so far. */
  get answer(): unknown {
    return this.#answer;
  }
  /** Sets the agent's answer; the last one set is graded. */
  set answer(value: unknown) {
    this.#answer = value;
    this.#trace.setContent(value);
  }
  /** Whether the run was graded or cancelled. */
  get settled(): boolean {
    return this.#settled;
  }

  /**
   * Grades the answer (once): sends `tasks.grade` and records an `evaluate`
   * step. Stopped by `signal`, it records nothing and may be cancelled.
   * @throws {HudProtocolError} when grading fails; the trace records it too
   */
  async finish(options: RunStartOptions = {}): Promise<Grade> {
    if (this.#grade) return this.#grade;
    if (this.#settled) throw new Error("Cannot grade run: it was cancelled");
    this.#settled = true;
    this.#trace.record("agent", this.#answer ?? null);
    try {
      const frame = await this.client.grade({ answer: this.#answer ?? null }, options);
      // JSON has no NaN or Infinity: a non-finite score arrives as null.
      if (typeof frame.score !== "number" || !Number.isFinite(frame.score)) {
        throw new RangeError(
          `Cannot grade: the environment's score is not a finite number, got ${
            JSON.stringify(frame.score) ?? String(frame.score)
          }`,
        );
      }
      this.#grade = gradeFromFrame(frame);
      this.#trace.record("evaluate", frame);
    } catch (err) {
      if (options.signal?.aborted) {
        // Stopped, not failed (a deadline, the job's abort): whoever
        // stopped it says how the rollout ended, and cancels the task.
        this.#settled = false;
        throw err;
      }
      this.#trace.fail("grading", err);
      this.#trace.finish("error", "grading_error");
      throw err;
    }
    const tampered = tamperEvidence(this.#grade.info);
    if (tampered !== null) {
      this.#trace.fail("grading", new TamperedError(tampered), "tampered");
      this.#trace.finish("error", "tampered");
    } else if (this.#trace.errors.length > 0) this.#trace.finish("error", "agent_error");
    else this.#trace.finish("completed", "graded");
    return this.#grade;
  }

  /** Cancels the task instead of grading it; bounded by `signal`. Never throws. */
  async cancel(options: RunStartOptions = {}): Promise<void> {
    if (this.#settled) return;
    this.#settled = true;
    this.#trace.record("cancel");
    try {
      await this.client.cancel(options);
    } catch {
      // Best effort: the connection is about to be dropped anyway.
    }
    this.#trace.finish("cancelled", "cancelled");
  }

  /** Grades the run if it was not settled; failures stay in the trace. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#settled) return;
    try {
      await this.finish();
    } catch {
      // Recorded in the trace.
    }
  }
}

/**
 * A run of `task` on `client`, not started, recording into `trace`; a
 * `null` client makes the run of a rollout that never connected. For the
 * rollout's stages (eval/_rollout_stages.ts); no face exports it.
 */
export function createRun(client: HudClient | null, task: TaskRow, trace: Trace): Run {
  return construct(client, task, trace);
}

/**
 * Starts `run`'s task: sends `tasks.start` and records the setup and prompt
 * steps. For the rollout's stages; no face exports it.
 * @throws {HudProtocolError} when the environment refuses to start it
 */
export function beginRun(run: Run, signal?: AbortSignal): Promise<void> {
  return begin(run, signal);
}
