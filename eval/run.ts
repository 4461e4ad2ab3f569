/**
 * Running evaluations: a {@linkcode Run} is the live handle an agent gets
 * for one task; {@linkcode rollout} places an environment, runs an
 * {@linkcode Agent} against one task and grades it, and never throws for a
 * failed rollout: the returned run's trace says which phase failed and why.
 *
 * @example A function agent, one rollout, in-process
 * ```ts
 * import { Environment, functionAgent, LocalRuntime, rollout } from "../mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo");
 * const shout = env.template({ id: "shout" }, async function* () {
 *   const answer = yield "Say hi, loudly";
 *   yield answer === "HI" ? 1 : 0;
 * });
 * const agent = functionAgent((prompt) => "hi".toUpperCase());
 * const run = await rollout(shout(), agent, { runtime: new LocalRuntime(env) });
 * assert.equal(run.reward, 1);
 * assert.equal(run.trace.status, "completed");
 * ```
 *
 * @module
 */

import type { Capability } from "../capability.ts";
import { connect, type ConnectOptions, type HudClient } from "../client.ts";
import type { GradeFrame, PromptFrame, TaskRow } from "../env.ts";
import { environmentOf } from "../env.ts";
import type { Placement, RuntimeProvider } from "../client.ts";
import { LocalRuntime } from "../runtime/runtime.ts";
import { type FileTrackingEvent, observeFiles } from "../filetracking/tracker.ts";
import { abortable, Deadline } from "../_internal/async.ts";
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

/** A failure recorded in a trace. */
export interface TraceError {
  /** The phase that failed. */
  phase: Phase;
  /** What went wrong. */
  message: string;
  /** The error's name (`TimeoutError`, `HudProtocolError`...). */
  name: string;
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
}

/**
 * An agent failure after which nothing may be graded: the agent could not
 * start (a command not found or not executable), or its output went over
 * its cap. {@linkcode rollout} cancels the task and records an error.
 */
export class NotGradedError extends Error {
  /** Makes one; `cause` as for `Error`. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "NotGradedError";
  }
}

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

function nowIso(): string {
  return new Date().toISOString();
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
 * What happened in a run: its steps, how it ended, and the answer. The JSON
 * form uses the HUD SDK's field names so traces mean the same on both sides.
 */
export class Trace {
  readonly #steps: TraceStep[] = [];
  readonly #startedAt: string = nowIso();
  #endedAt: string | null = null;
  #status: TraceStatus = "running";
  #stopReason: string | null = null;
  #content: unknown = undefined;
  #errors: TraceError[] = [];

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

  /** Appends a step, stamped now. */
  record(type: string, content?: unknown, info?: Record<string, unknown>): TraceStep {
    const step: TraceStep = { type, timestamp: nowIso() };
    if (content !== undefined) step.content = content;
    if (info !== undefined) step.info = info;
    this.#steps.push(step);
    return step;
  }

  /** Records a failure in `phase` as an `error` step. */
  fail(phase: Phase, error: unknown): void {
    const err = error instanceof Error ? error : new Error(String(error));
    const entry = { phase, message: err.message, name: err.name };
    this.#errors.push(entry);
    this.record("error", err.message, { phase, name: err.name });
  }

  /** Sets the answer. */
  setContent(content: unknown): void {
    this.#content = content;
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
    };
  }
}

/** Options for {@linkcode Run.start}. */
export interface RunStartOptions {
  /** Aborts starting. */
  signal?: AbortSignal;
}

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

  /** @internal Use {@linkcode Run.start} or {@linkcode rollout}. */
  constructor(client: HudClient | null, task: TaskRow, trace: Trace = new Trace()) {
    this.#client = client;
    this.#task = task;
    this.#trace = trace;
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
    const run = new Run(client, task);
    await run._begin(options.signal);
    return run;
  }

  /** @internal Sends `tasks.start` and records the setup and prompt steps. */
  async _begin(signal?: AbortSignal): Promise<void> {
    this.#trace.record("setup", { id: this.#task.id, args: this.#task.args }, {
      slug: this.#task.slug,
      session_id: this.client.sessionId,
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
   * step.
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
      this.#trace.fail("grading", err);
      this.#trace.finish("error", "grading_error");
      throw err;
    }
    if (this.#trace.errors.length > 0) this.#trace.finish("error", "agent_error");
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

/** What an agent gets besides the run. */
export interface AgentContext {
  /** Aborts when the agent's time is up or the rollout is cancelled. */
  signal: AbortSignal;
}

/**
 * An agent: drives a run to completion and sets `run.answer`. It may throw;
 * the answer it had set is still graded.
 */
export interface Agent {
  /** Works on the task until done; sets `run.answer`. */
  run(run: Run, context: AgentContext): Promise<void>;
}

/**
 * Adapts a function into an {@linkcode Agent}: it gets the prompt, the run
 * and the context, and its return value (when not `undefined`) becomes the
 * answer.
 */
export function functionAgent(
  fn: (prompt: unknown, run: Run, context: AgentContext) => unknown,
): Agent {
  if (typeof fn !== "function") throw new TypeError("Cannot create agent: expected a function");
  return {
    async run(run, context) {
      const answer = await fn(run.prompt, run, context);
      if (answer !== undefined) run.answer = answer;
    },
  };
}

/** Options for {@linkcode rollout}. */
export interface RolloutOptions {
  /**
   * Where the environment runs. Omitted: a task row minted from a live
   * environment runs in-process.
   */
  runtime?: RuntimeProvider;
  /**
   * The deadline for the whole rollout, in ms. When it passes, the task is
   * cancelled (waiting at most 2 s for that) and the rollout returns
   * without waiting for the environment's teardown.
   * @default 600_000
   */
  rolloutTimeout?: number;
  /**
   * The agent's own limit, in ms; must fit inside the rollout timeout. When
   * it passes, the agent is aborted and what it answered is graded.
   * @default no limit beyond the rollout's
   */
  agentTimeout?: number;
  /** Aborts the rollout: the task is cancelled, not graded. */
  signal?: AbortSignal;
  /** Options for the control connection. */
  connect?: Omit<ConnectOptions, "signal">;
  /**
   * File tracking: when the environment publishes a `filetracking/1`
   * capability, the agent phase is observed and each non-empty result (the
   * setup diff, snapshot, periodic diffs, final flush) is recorded in the
   * trace as a `filetracking.<kind>` step. When the task's start frame has
   * per-episode data `{ path }` for the tracker (`bindings.filetracking`),
   * only changes under that path (relative to the tracked root) are kept.
   * `false` turns it off.
   * @default { pollInterval: 2000 }
   */
  fileTracking?: false | { pollInterval?: number };
  /**
   * Observers that wrap the agent phase (such as file tracking). Each gets
   * the run and must not throw; see {@linkcode RolloutObserver}.
   * @default []
   */
  observers?: RolloutObserver[];
}

/**
 * Watches a rollout's agent phase: `before` runs after the task started,
 * `after` once the agent finished. Errors are recorded in the trace, never
 * fail the rollout.
 */
export interface RolloutObserver {
  /** Called before the agent runs. */
  before?(run: Run, signal: AbortSignal): Promise<void> | void;
  /** Called after the agent ran, before grading. */
  after?(run: Run, signal: AbortSignal): Promise<void> | void;
}

/**
 * The part of a tracker result under `scope` (a path relative to the
 * tracker's root), or `null` when nothing of it is left.
 */
function scoped(event: FileTrackingEvent, scope: string | null): unknown | null {
  const inScope = (path: string) =>
    scope === null || path === scope || path.startsWith(scope.endsWith("/") ? scope : `${scope}/`);
  switch (event.kind) {
    case "snapshot": {
      const files = event.result.files.filter((f) => inScope(f.path));
      return files.length === 0 ? null : { ...event.result, files };
    }
    case "setup":
    case "diff": {
      const patches = event.result.patches.filter((p) => inScope(p.path));
      return patches.length === 0
        ? null
        : { ...event.result, patches, files_changed: patches.length };
    }
    case "flush": {
      const { diff, capture } = event.result;
      const patches = diff.patches.filter((p) => inScope(p.path));
      const files = capture.files.filter((f) => inScope(f.path));
      const skipped = capture.skipped_files.filter((f) => inScope(f.path));
      if (patches.length === 0 && files.length === 0 && skipped.length === 0) return null;
      return {
        diff: { ...diff, patches, files_changed: patches.length },
        capture: {
          ...capture,
          files,
          files_eligible: files.length + skipped.length,
          files_captured: files.length,
          files_skipped: skipped.length,
          skipped_files: skipped,
        },
      };
    }
  }
}

const CANCEL_BOUND_MS = 2_000;

function timeoutError(what: string, ms: number): DOMException {
  return new DOMException(`${what} timed out after ${ms} ms`, "TimeoutError");
}

/**
 * The runtime a row runs on when none is given: the live environment it was
 * minted from, in-process.
 * @throws {TypeError} when the row was not minted from a live environment
 */
export function defaultRuntimeFor(
  task: TaskRow,
  cache?: Map<unknown, RuntimeProvider>,
): RuntimeProvider {
  const env = environmentOf(task);
  if (env === undefined) {
    throw new TypeError(
      `Cannot run task "${task.slug}": it was not made from a live environment's template; pass a runtime`,
    );
  }
  let runtime = cache?.get(env);
  if (!runtime) {
    runtime = new LocalRuntime(env);
    cache?.set(env, runtime);
  }
  return runtime;
}

/**
 * Runs one task: places the environment, connects, starts the task, runs
 * the agent, grades the answer, releases the environment.
 *
 * Never throws for a failed rollout: the returned run's trace says which
 * phase failed (`provisioning`, `start`, `agent`, `grading`) and why. An
 * agent timeout still grades what the agent had; a rollout timeout or an
 * abort cancels the task instead.
 *
 * @throws {RangeError} up front, when `agentTimeout` does not fit inside `rolloutTimeout`
 * @throws {TypeError} up front, when no runtime is given and the row has no live environment
 */
export async function rollout(
  task: TaskRow,
  agent: Agent,
  options: RolloutOptions = {},
): Promise<Run> {
  const rolloutTimeout = options.rolloutTimeout ?? 600_000;
  if (!(rolloutTimeout > 0)) {
    throw new RangeError(
      `Cannot roll out: rolloutTimeout must be positive, got "${rolloutTimeout}"`,
    );
  }
  const agentTimeout = options.agentTimeout;
  if (agentTimeout !== undefined && (!(agentTimeout > 0) || agentTimeout >= rolloutTimeout)) {
    throw new RangeError(
      `Cannot roll out: agentTimeout (${agentTimeout} ms) must be positive and fit inside rolloutTimeout (${rolloutTimeout} ms)`,
    );
  }
  if (typeof agent?.run !== "function") {
    throw new TypeError("Cannot roll out: agent must have a run() method");
  }
  const runtime = options.runtime ?? defaultRuntimeFor(task);

  using deadline = new Deadline(rolloutTimeout, options.signal, "rollout");
  const trace = new Trace();
  let placement: Placement | null = null;
  let client: HudClient | null = null;
  let run: Run | null = null;
  const stub = () => new Run(null, task, trace);

  const interrupted = () => deadline.signal.aborted;
  const endInterrupted = async () => {
    // Rollout deadline or abort: cancel (bounded), drop the connection, and
    // leave the environment's teardown running in the background.
    const reason = options.signal?.aborted ? "cancelled" : "timeout";
    if (reason === "timeout") trace.fail(phase, timeoutError("rollout", rolloutTimeout));
    trace.finish("cancelled", reason);
    if (run && !run.settled) {
      using bound = new Deadline(CANCEL_BOUND_MS, undefined, "cancel");
      await abortable(run.cancel({ signal: bound.signal }), bound.signal).catch(() => {});
    }
    void client?.close();
    const p = placement;
    if (p) void Promise.resolve(p[Symbol.asyncDispose]()).catch(() => {});
    placement = null;
    return run ?? stub();
  };

  let phase: Phase = "provisioning";
  try {
    try {
      const placing = runtime.place({ signal: deadline.signal });
      // A placement that arrives after the deadline is released at once.
      placement = await abortable(placing, deadline.signal, () => {
        placing.then((p) => p[Symbol.asyncDispose](), () => {});
      });
      client = await connect(placement, { ...options.connect, signal: deadline.signal });
    } catch (err) {
      if (interrupted()) return await endInterrupted();
      trace.fail("provisioning", err);
      trace.finish("error", "provisioning_error");
      return stub();
    }

    phase = "start";
    run = new Run(client, task, trace);
    try {
      await abortable(run._begin(deadline.signal), deadline.signal);
    } catch (err) {
      if (interrupted()) return await endInterrupted();
      trace.fail("start", err);
      trace.finish("error", "start_error");
      return run;
    }

    phase = "agent";
    {
      using agentDeadline = new Deadline(agentTimeout, deadline.signal, "agent");
      for (const o of options.observers ?? []) {
        try {
          await o.before?.(run, agentDeadline.signal);
        } catch (err) {
          trace.record("observer_error", String((err as Error)?.message ?? err));
        }
      }
      const currentRun = run;
      const runAgent = () =>
        abortable(agent.run(currentRun, { signal: agentDeadline.signal }), agentDeadline.signal);
      const tracker = options.fileTracking === false
        ? undefined
        : client.manifest.bindings.find((c) => c.protocol === "filetracking/1");
      try {
        if (tracker) {
          // A task may scope the tracker to its own part of the workspace
          // with per-episode data: `bindings: { filetracking: { path } }`.
          const episode = run.bindings[tracker.name];
          const path = isRecord(episode) && typeof episode.path === "string" ? episode.path : null;
          await observeFiles(client.binding(tracker.name), runAgent, {
            pollInterval: options.fileTracking ? options.fileTracking.pollInterval : undefined,
            signal: deadline.signal,
            onResult: (event) => {
              const result = scoped(event, path);
              if (result !== null) trace.record(`filetracking.${event.kind}`, result);
            },
            onError: (err) =>
              trace.record("filetracking_error", String((err as Error)?.message ?? err)),
          });
        } else {
          await runAgent();
        }
      } catch (err) {
        if (interrupted()) return await endInterrupted();
        if (err instanceof NotGradedError) {
          // Nothing to grade: the agent never ran, or its answer is unusable.
          trace.fail("agent", err);
          trace.finish("error", "agent_error");
          using bound = new Deadline(CANCEL_BOUND_MS, undefined, "cancel");
          await abortable(run.cancel({ signal: bound.signal }), bound.signal).catch(() => {});
          return run;
        }
        trace.fail(
          "agent",
          agentDeadline.signal.aborted ? timeoutError("agent", agentTimeout!) : err,
        );
      }
      for (const o of options.observers ?? []) {
        try {
          await o.after?.(run, deadline.signal);
        } catch (err) {
          trace.record("observer_error", String((err as Error)?.message ?? err));
        }
      }
    }
    if (interrupted()) return await endInterrupted();

    phase = "grading";
    try {
      await abortable(run.finish({ signal: deadline.signal }), deadline.signal);
    } catch {
      if (interrupted()) return await endInterrupted();
      // finish() recorded the failure.
    }
    return run;
  } finally {
    if (placement || client) {
      await client?.close();
      const p = placement as Placement | null;
      if (p) {
        await Promise.resolve(p[Symbol.asyncDispose]()).catch((err: unknown) => {
          trace.record("teardown_error", String((err as Error)?.message ?? err));
        });
      }
    }
  }
}
