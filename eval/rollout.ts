/**
 * One rollout: {@linkcode rollout} places an environment, runs an
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

import { connect, type ConnectOptions } from "../client.ts";
import type { TaskRow } from "../env.ts";
import { environmentOf } from "../env.ts";
import type { RuntimeProvider } from "../runtime/placement.ts";
import { LocalRuntime } from "../runtime/local.ts";
import type { Agent, AgentContext } from "./agent.ts";
import type { Run } from "./run.ts";
import { checkPositive, type OptionSpelling, optionSpelling } from "./_options.ts";
import { type RolloutConfig, type RolloutObserver, runRollout } from "./_rollout_stages.ts";
import { checkUsable, type Snapshot, snapshotRefusal } from "./fork.ts";

export type { RolloutObserver } from "./_rollout_stages.ts";

/** Options for {@linkcode rollout}. */
export interface RolloutOptions {
  /**
   * Where the environment runs. Omitted: a task row minted from a live
   * environment runs in-process.
   */
  runtime?: RuntimeProvider;
  /**
   * A snapshot to start from: the runtime places an environment from it
   * (a {@linkcode ForkRuntime} from a workspace snapshot, whose workspace
   * starts as the snapshot's files; a `ContainerRuntime` from a container
   * snapshot, in a new container of its image), and the trace records the
   * snapshot and its ancestry (`trace.fromSnapshot`, `from_snapshot` in
   * its JSON).
   * @default none: the environment starts as its runtime places it
   */
  from?: Snapshot;
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
  /**
   * More for the agent's context than the signal: the job's model-call
   * concurrency and its usage counter ({@linkcode Taskset.run} sets them).
   */
  context?: Omit<AgentContext, "signal">;
}

/** How long a rollout may take unless told otherwise: 10 minutes. */
export const DEFAULT_ROLLOUT_TIMEOUT = 600_000;

/**
 * Refuses a rollout timeout that is not positive, and an agent timeout
 * that is not positive or does not fit inside it; `s` says how to name
 * them (rollout() and Taskset.run() name options, `hud eval` its flags).
 * @throws {RangeError} naming the timeout
 */
export function checkTimeouts(
  s: OptionSpelling,
  rolloutTimeout: number,
  agentTimeout: number | undefined,
): void {
  checkPositive(s, "rolloutTimeout", rolloutTimeout);
  checkPositive(s, "agentTimeout", agentTimeout);
  if (agentTimeout !== undefined && agentTimeout >= rolloutTimeout) {
    throw new RangeError(
      `${s.prefix}${s.name("agentTimeout")} (${s.duration(agentTimeout)}) must be less than ${
        s.name("rolloutTimeout")
      } (${s.duration(rolloutTimeout)})`,
    );
  }
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
 * `options` resolved once: every default applied, every check made;
 * `from` is what the rollout starts from (a job's, got when it is placed).
 * @throws {RangeError} when a timeout is not positive, or `agentTimeout` does not fit
 * @throws {TypeError} for an agent without `run()`, a row with no runtime,
 *   or a snapshot to start from without a runtime that can
 */
function rolloutConfig(
  task: TaskRow,
  agent: Agent,
  options: RolloutOptions,
  from: RolloutConfig["from"],
): RolloutConfig {
  const rolloutTimeout = options.rolloutTimeout ?? DEFAULT_ROLLOUT_TIMEOUT;
  checkTimeouts(optionSpelling("Cannot roll out"), rolloutTimeout, options.agentTimeout);
  if (typeof agent?.run !== "function") {
    throw new TypeError("Cannot roll out: agent must have a run() method");
  }
  const refused = from === null
    ? null
    : snapshotRefusal("roll out from a snapshot", options.runtime, null);
  if (refused !== null) throw refused;
  return {
    runtime: options.runtime ?? defaultRuntimeFor(task),
    from,
    rolloutTimeout,
    agentTimeout: options.agentTimeout,
    connect: options.connect ?? {},
    fileTracking: options.fileTracking ?? {},
    observers: options.observers ?? [],
    context: options.context ?? {},
    signal: options.signal,
    dial: connect,
  };
}

/**
 * Runs one task: places the environment, connects, starts the task, runs
 * the agent, grades the answer, releases the environment: the stages of
 * eval/_rollout_stages.ts, in order.
 *
 * Never throws for a failed rollout: the returned run's trace says which
 * phase failed (`provisioning`, `start`, `agent`, `grading`), why, and the
 * failure's class ({@linkcode classifyError}: what a job may retry). An
 * agent timeout still grades what the agent had; a rollout timeout or an
 * abort cancels the task instead.
 *
 * @throws {RangeError} up front, when `agentTimeout` does not fit inside `rolloutTimeout`
 * @throws {TypeError} up front, when no runtime is given and the row has no live
 *   environment, or `from` is not a snapshot or comes without a runtime that places from one
 * @throws {Error} up front, when `from` was removed
 */
export async function rollout(
  task: TaskRow,
  agent: Agent,
  options: RolloutOptions = {},
): Promise<Run> {
  let from: RolloutConfig["from"] = null;
  if (options.from !== undefined) {
    const snapshot = checkUsable("roll out from a snapshot", options.from);
    const refused = snapshotRefusal("roll out from a snapshot", options.runtime, snapshot);
    if (refused !== null) throw refused;
    from = () => Promise.resolve(snapshot);
  }
  return await runRollout(task, agent, rolloutConfig(task, agent, options, from));
}

/**
 * A rollout of a job, from what `from` gets when it is placed (the job's
 * snapshot of the task): for {@linkcode Taskset.run}; no face exports it.
 */
export async function rolloutFrom(
  task: TaskRow,
  agent: Agent,
  options: Omit<RolloutOptions, "from">,
  from: (signal: AbortSignal) => Promise<Snapshot>,
): Promise<Run> {
  return await runRollout(task, agent, rolloutConfig(task, agent, options, from));
}
