// One rollout as a pipeline of named stages: place the environment, connect
// to it, start the task, run the agent, grade; then record how it ended and
// release what it held. Each stage does one job and returns a typed
// StageOutcome (its value, a failure with its phase, class and error, or an
// interruption by the rollout's deadline); runRollout() composes them. A
// retry policy, a failure class or a network phase is a change in one
// stage; recordEnding() is the one place an ending becomes the trace's
// status, and release() the one place resources are let go.

import type { ConnectOptions, HudClient } from "../client.ts";
import type { TaskRow } from "../env.ts";
import type { Placement, RolloutPhase, RuntimeProvider, Snapshot } from "../runtime/placement.ts";
import { abortable, Deadline } from "../_internal/async.ts";
import { errorMessage } from "../_internal/util.ts";
import { type Agent, type AgentContext, NotGradedError } from "./agent.ts";
import { classifyError, FAILURE_CLASSES, type RolloutErrorClass } from "./failure.ts";
import { beginRun, createRun, type Grade, type Run } from "./run.ts";
import { type Phase, Trace } from "./trace.ts";
import { type FileTrackingConfig, fileTrackingWrapper } from "./_file_tracking.ts";
import { placeOn } from "./fork.ts";

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

/** A rollout's options resolved once (every default applied), as the stages read them. */
export interface RolloutConfig {
  /** Where the environment is placed. */
  readonly runtime: RuntimeProvider;
  /**
   * The snapshot the rollout starts from, got when it is placed (a job's
   * is taken then), or null.
   */
  readonly from: ((signal: AbortSignal) => Promise<Snapshot>) | null;
  /** The whole rollout's deadline, in ms. */
  readonly rolloutTimeout: number;
  /** The agent's own limit, in ms, if any. */
  readonly agentTimeout: number | undefined;
  /** Options for the control connection. */
  readonly connect: Omit<ConnectOptions, "signal">;
  /** File tracking around the agent phase. */
  readonly fileTracking: FileTrackingConfig;
  /** Observers of the agent phase. */
  readonly observers: readonly RolloutObserver[];
  /** What the agent's context holds besides its signal. */
  readonly context: Omit<AgentContext, "signal">;
  /** The caller's abort: an interruption without it is the rollout's timeout. */
  readonly signal: AbortSignal | undefined;
  /** Opens the control connection to a placement: `connect()`, or a test's own. */
  readonly dial: (placement: Placement, options: ConnectOptions) => Promise<HudClient>;
}

/** What every stage reads: the rollout's inputs, its trace and its deadline. */
export interface StageScope {
  readonly task: TaskRow;
  readonly agent: Agent;
  readonly config: RolloutConfig;
  readonly trace: Trace;
  /** Aborts at the rollout's deadline or the caller's abort. */
  readonly signal: AbortSignal;
}

/** A stage's failure: where, its class (what a job may retry), and the error. */
export interface StageFailure {
  readonly phase: Phase;
  readonly errorClass: RolloutErrorClass;
  readonly error: unknown;
}

/**
 * What a stage returns: `ok` with its value (the next stage runs);
 * `failed`, which ends the rollout ungraded; or `interrupted`, when the
 * rollout's deadline passed or its caller aborted during `phase`.
 */
export type StageOutcome<T = void> =
  | { readonly kind: "ok"; readonly value: T }
  | { readonly kind: "failed"; readonly failure: StageFailure }
  | { readonly kind: "interrupted"; readonly phase: Phase };

/** How a rollout's stages ended: a failure, an interruption, or the grade stage's outcome. */
export type RolloutEnding = StageOutcome<Grade | null>;

/** What a rollout holds until it is released, set by runRollout() as stages succeed. */
export interface Held {
  placement: Placement | null;
  client: HudClient | null;
  run: Run | null;
  /** Whether the task started (`tasks.start` answered): an ungraded end cancels it. */
  started: boolean;
}

/** How long cancelling a task may take before the rollout lets it go. */
const CANCEL_BOUND = 2_000;

function ok<T>(value: T): StageOutcome<T> {
  return { kind: "ok", value };
}

/** A failure in `phase`, classed by {@linkcode classifyError}: the one place failures get a class. */
function stageFailure(phase: Phase, error: unknown): StageFailure {
  return { phase, errorClass: classifyError(phase, error), error };
}

function failed(phase: Phase, error: unknown): StageOutcome<never> {
  return { kind: "failed", failure: stageFailure(phase, error) };
}

function interrupted(phase: Phase): StageOutcome<never> {
  return { kind: "interrupted", phase };
}

/** `work`'s value, or its error as a failure in `phase` (an interruption once `signal` aborted). */
async function attempt<T>(
  signal: AbortSignal,
  phase: Phase,
  work: () => Promise<T>,
): Promise<StageOutcome<T>> {
  try {
    return ok(await work());
  } catch (err) {
    return signal.aborted ? interrupted(phase) : failed(phase, err);
  }
}

function timeoutError(what: string, ms: number): DOMException {
  return new DOMException(`${what} timed out after ${ms} ms`, "TimeoutError");
}

/**
 * Stage `place`: the runtime places the environment, from the rollout's
 * snapshot when it has one, which the trace records (phase `provisioning`).
 */
export function place(scope: StageScope): Promise<StageOutcome<Placement>> {
  const { signal, config } = scope;
  return attempt(signal, "provisioning", async () => {
    const from = config.from === null ? null : await abortable(config.from(signal), signal);
    if (from !== null) scope.trace.startFrom(from);
    const placing = placeOn(config.runtime, from, { signal });
    // A placement that arrives after the deadline is released at once.
    return abortable(placing, signal, () => {
      placing.then((p) => p[Symbol.asyncDispose](), () => {});
    });
  });
}

/** Stage `connect`: the control connection to the placement (phase `provisioning`). */
export function connectTo(
  scope: StageScope,
  placement: Placement,
): Promise<StageOutcome<HudClient>> {
  const { config, signal } = scope;
  return attempt(
    signal,
    "provisioning",
    () => config.dial(placement, { ...config.connect, signal }),
  );
}

/** Stage `start`: `tasks.start`, recording the setup and prompt steps (phase `start`). */
export function start(scope: StageScope, run: Run): Promise<StageOutcome> {
  const { signal } = scope;
  return attempt(signal, "start", () => abortable(beginRun(run, signal), signal));
}

/**
 * Stage `phase`: the placement's network as `phase` allows, where it
 * changes by phase ({@linkcode Placement.enterPhase}). A switch that fails
 * is the infrastructure's (phase `provisioning`): the rollout ends
 * ungraded, neither the agent nor the verifier runs on the wrong network.
 */
export function enterPhase(
  scope: StageScope,
  placement: Placement,
  phase: RolloutPhase,
): Promise<StageOutcome> {
  const { signal } = scope;
  const enter = placement.enterPhase;
  if (enter === undefined) return Promise.resolve(ok(undefined));
  return attempt(signal, "provisioning", async () => {
    try {
      await enter.call(placement, phase, { signal });
    } catch (err) {
      throw new Error(`the environment's network for the ${phase} phase: ${errorMessage(err)}`, {
        cause: err,
      });
    }
  });
}

/**
 * Stage `act`: the observers' `before`, the agent (inside file tracking
 * when the environment has it), the observers' `after`. An agent that
 * fails for its own reasons (its error, its time limit, a context
 * overflow) is recorded and still graded; one that throws
 * {@linkcode NotGradedError}, or fails for a reason that is not the
 * agent's (the model server, the environment gone), ends the rollout
 * ungraded: grading it would make a zero out of the infrastructure.
 */
export async function act(scope: StageScope, run: Run): Promise<StageOutcome> {
  const { config, trace, signal } = scope;
  using agentDeadline = new Deadline(config.agentTimeout, signal, "agent");
  await notify(trace, config.observers, (o) => o.before?.(run, agentDeadline.signal));
  try {
    await agentPhase(scope, run, agentDeadline.signal);
  } catch (err) {
    if (signal.aborted) return interrupted("agent");
    // Nothing to grade: the agent never ran, or its answer is unusable.
    if (err instanceof NotGradedError) return failed("agent", err);
    const timedOut = agentDeadline.signal.aborted;
    const failure = stageFailure(
      "agent",
      timedOut ? timeoutError("agent", config.agentTimeout!) : err,
    );
    if (!FAILURE_CLASSES[failure.errorClass].graded) return { kind: "failed", failure };
    recordFailure(trace, failure);
  }
  await notify(trace, config.observers, (o) => o.after?.(run, signal));
  return signal.aborted ? interrupted("agent") : ok(undefined);
}

/** Runs the agent on `run` until `signal` aborts, inside file tracking when there is any. */
function agentPhase(scope: StageScope, run: Run, signal: AbortSignal): Promise<void> {
  const { agent, config, trace } = scope;
  const runAgent = () => abortable(agent.run(run, { ...config.context, signal }), signal);
  const tracking = fileTrackingWrapper(run.client, run, trace, config.fileTracking, scope.signal);
  return tracking === null ? runAgent() : tracking(runAgent);
}

/** Calls each observer; what one throws becomes an `observer_error` step. */
async function notify(
  trace: Trace,
  observers: readonly RolloutObserver[],
  call: (observer: RolloutObserver) => Promise<void> | void,
): Promise<void> {
  for (const o of observers) {
    try {
      await call(o);
    } catch (err) {
      trace.record("observer_error", errorMessage(err));
    }
  }
}

/**
 * Stage `grade`: `tasks.grade` with the answer. Its value is the grade, or
 * `null` when grading failed ({@linkcode Run.finish} recorded why).
 */
export async function grade(scope: StageScope, run: Run): Promise<StageOutcome<Grade | null>> {
  const { signal } = scope;
  try {
    return ok(await abortable(run.finish({ signal }), signal));
  } catch {
    return signal.aborted ? interrupted("grading") : ok(null);
  }
}

/** Records `f` in `trace` as an error step, with its phase and class. */
export function recordFailure(trace: Trace, f: StageFailure): void {
  trace.fail(f.phase, f.error, f.errorClass);
}

/**
 * Stage `record`: how the rollout ended, as its trace's status and stop
 * reason. A failure ends it as an error (`provisioning_error`,
 * `start_error`, `agent_error`) and cancels a task that started; an
 * interruption cancels the task (bounded) and ends it as cancelled, with a
 * timeout failure when the deadline, not the caller, stopped it
 * (`verifier_timeout` while grading, else `rollout_timeout`). A graded
 * run (or one whose grading failed) was recorded by {@linkcode Run.finish}.
 */
export async function recordEnding(
  scope: StageScope,
  held: Held,
  ending: RolloutEnding,
): Promise<void> {
  const { trace, config } = scope;
  if (ending.kind === "failed") {
    recordFailure(trace, ending.failure);
    trace.finish("error", `${ending.failure.phase}_error`);
    if (held.started && held.run) await cancelWithin(held.run, CANCEL_BOUND);
  } else if (ending.kind === "interrupted") {
    const reason = config.signal?.aborted ? "cancelled" : "timeout";
    if (reason === "timeout") {
      const late = ending.phase === "grading" ? "verifier_timeout" : "rollout_timeout";
      trace.fail(ending.phase, timeoutError("rollout", config.rolloutTimeout), late);
    }
    trace.finish("cancelled", reason);
    if (held.run && !held.run.settled) await cancelWithin(held.run, CANCEL_BOUND);
  }
}

async function cancelWithin(run: Run, ms: number): Promise<void> {
  using bound = new Deadline(ms, undefined, "cancel");
  await abortable(run.cancel({ signal: bound.signal }), bound.signal).catch(() => {});
}

/**
 * Stage `release`: closes the control connection and releases the
 * placement, recording a failed teardown as a `teardown_error` step. After
 * an interruption the environment's teardown goes on in the background: the
 * rollout returns without waiting for it.
 */
export async function release(trace: Trace, held: Held, interrupted: boolean): Promise<void> {
  const { client, placement } = held;
  if (interrupted) {
    const closing = client?.close();
    if (placement) void Promise.resolve(placement[Symbol.asyncDispose]()).catch(() => {});
    await closing;
    return;
  }
  await client?.close();
  if (placement) {
    await Promise.resolve(placement[Symbol.asyncDispose]()).catch((err: unknown) => {
      trace.record("teardown_error", errorMessage(err));
    });
  }
}

/** Runs the stages in order until one does not succeed; records into `held` what each acquired. */
async function runStages(scope: StageScope, held: Held): Promise<RolloutEnding> {
  const placed = await place(scope);
  if (placed.kind !== "ok") return placed;
  held.placement = placed.value;
  const connected = await connectTo(scope, placed.value);
  if (connected.kind !== "ok") return connected;
  held.client = connected.value;
  const run = held.run = createRun(connected.value, scope.task, scope.trace);
  const started = await start(scope, run);
  if (started.kind !== "ok") return started;
  held.started = true;
  const agentNetwork = await enterPhase(scope, placed.value, "agent");
  if (agentNetwork.kind !== "ok") return agentNetwork;
  const acted = await act(scope, run);
  if (acted.kind !== "ok") return acted;
  const verifierNetwork = await enterPhase(scope, placed.value, "verifier");
  if (verifierNetwork.kind !== "ok") return verifierNetwork;
  return await grade(scope, run);
}

/**
 * One rollout of `task` by `agent`, as `config` says: the stages, then the
 * record of how they ended, then the release. Never throws for a failed
 * rollout; returns the run (one that never connected when provisioning
 * failed).
 */
export async function runRollout(task: TaskRow, agent: Agent, config: RolloutConfig): Promise<Run> {
  using deadline = new Deadline(config.rolloutTimeout, config.signal, "rollout");
  const scope: StageScope = { task, agent, config, trace: new Trace(), signal: deadline.signal };
  const held: Held = { placement: null, client: null, run: null, started: false };
  let ending: RolloutEnding | undefined;
  try {
    ending = await runStages(scope, held);
    await recordEnding(scope, held, ending);
  } finally {
    await release(scope.trace, held, ending?.kind === "interrupted");
  }
  return held.run ?? createRun(null, task, scope.trace);
}
