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

import { connect, type ConnectOptions, type HudClient } from "../client.ts";
import type { TaskRow } from "../env.ts";
import { environmentOf } from "../env.ts";
import type { Placement, RuntimeProvider } from "../runtime/placement.ts";
import { LocalRuntime } from "../runtime/local.ts";
import { type FileTrackingEvent, type FlushResult, observeFiles } from "../filetracking/tracker.ts";
import { abortable, Deadline } from "../_internal/async.ts";
import { isRecord } from "../_internal/util.ts";
import { type Agent, type AgentContext, NotGradedError } from "./agent.ts";
import { Run } from "./run.ts";
import { type Phase, Trace } from "./trace.ts";

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
  /**
   * More for the agent's context than the signal: the job's model-call
   * concurrency and its usage counter ({@linkcode Taskset.run} sets them).
   */
  context?: Omit<AgentContext, "signal">;
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
      // HUD's shape, which this project's tracker sends too (a HUD tracker
      // has no skipped_files; a flat flush of an earlier version of this
      // one has the diff's members beside capture).
      const diff = event.result.diff ?? (event.result as unknown as FlushResult["diff"]);
      const capture = event.result.capture ?? { files: [] };
      const patches = (diff.patches ?? []).filter((p) => inScope(p.path));
      const files = (capture.files ?? []).filter((f) => inScope(f.path));
      const skipped = (capture.skipped_files ?? []).filter((f) => inScope(f.path));
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
 * phase failed (`provisioning`, `start`, `agent`, `grading`), why, and the
 * failure's class ({@linkcode classifyError}: what a job may retry). An
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
        abortable(
          agent.run(currentRun, { ...options.context, signal: agentDeadline.signal }),
          agentDeadline.signal,
        );
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
