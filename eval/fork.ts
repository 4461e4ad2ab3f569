/**
 * Rollouts from workspace snapshots: a {@linkcode ForkRuntime} places, for
 * each rollout, an environment of its own made from the snapshot the
 * rollout starts from (`rollout(task, agent, { runtime, from })`, or
 * `Taskset.run(agent, { runtime, from, group })` for n rollouts from one
 * state); the trace records the snapshot and its ancestry.
 *
 * @example Two rollouts from one prepared state
 * ```ts ignore
 * import { addWorkspace, Environment, functionAgent, rollout } from "../mod.ts";
 * import { ForkRuntime } from "./mod.ts";
 *
 * const runtime = new ForkRuntime(({ from, root }) => {
 *   const env = new Environment("fix");
 *   const workspace = addWorkspace(env, root, { from: from ?? undefined, snapshots: true });
 *   env.template({ id: "fix" }, async function* () {
 *     yield `Fix ${root}/add.sh`;
 *     yield (await workspace.exec(["bash", "add.sh", "2", "3"])).stdout === "5\n" ? 1 : 0;
 *   });
 *   return env;
 * });
 * // ... a snapshot of the prepared workspace, `prepared` ...
 * const runs = await Promise.all([0, 1].map(() =>
 *   rollout(task, agent, { runtime, from: prepared })
 * ));
 * console.log(runs.map((r) => r.trace.fromSnapshot?.id));
 * ```
 *
 * @module
 */

import type { Environment } from "../env.ts";
import { LocalRuntime, type LocalRuntimeOptions } from "../runtime/local.ts";
import {
  type Placement,
  placementOf,
  type PlacementWithUrl,
  type PlaceOptions,
  type RuntimeProvider,
} from "../runtime/placement.ts";
import { checkSnapshot, type WorkspaceSnapshot } from "../workspace/_snapshot.ts";

/** What a {@linkcode ForkRuntime}'s factory gets for each placement. */
export interface ForkPlacement {
  /**
   * The snapshot the rollout starts from: give it to `addWorkspace` as
   * `from` (`from ?? undefined`). `null` for a rollout from no snapshot.
   */
  readonly from: WorkspaceSnapshot | null;
  /**
   * An empty directory made for this placement, for the workspace's root
   * (a fork's root must be empty); removed once the environment stopped.
   */
  readonly root: string;
}

/** A runtime that can place an environment whose workspace starts from a snapshot. */
export interface SnapshotRuntime extends RuntimeProvider {
  /** Places an environment made from `from`; dispose the placement to release it. */
  placeFrom(from: WorkspaceSnapshot, options?: PlaceOptions): Promise<Placement>;
}

/** Whether `runtime` can place environments from snapshots. */
export function placesFromSnapshots(
  runtime: RuntimeProvider | undefined,
): runtime is SnapshotRuntime {
  return typeof (runtime as Partial<SnapshotRuntime> | undefined)?.placeFrom === "function";
}

/**
 * Environments served in this process, one per placement, each made by a
 * factory from the snapshot its rollout starts from, on an empty root of
 * its own: what `rollout()` and `Taskset.run()` need to start from a
 * snapshot. Snapshots live in this process, so forks do too.
 */
export class ForkRuntime implements SnapshotRuntime {
  readonly #factory: (place: ForkPlacement) => Environment | Promise<Environment>;
  readonly #options: LocalRuntimeOptions;

  /**
   * Serves, for each placement, an environment `factory` makes.
   * @param factory makes a fresh environment for one placement, its workspace on `root` from `from`
   * @param options the ready timeout and error callback, as {@linkcode LocalRuntime}'s
   * @throws {TypeError} when `factory` is not a function
   */
  constructor(
    factory: (place: ForkPlacement) => Environment | Promise<Environment>,
    options: LocalRuntimeOptions = {},
  ) {
    if (typeof factory !== "function") {
      throw new TypeError(
        "Cannot create ForkRuntime: expected a factory ({ from, root }) => Environment",
      );
    }
    this.#factory = factory;
    this.#options = options;
  }

  /** Places an environment from no snapshot (the factory gets `from: null`). */
  place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    return this.#place(null, options);
  }

  /**
   * Places an environment made from `from`.
   * @throws {TypeError} when `from` is not a snapshot
   * @throws {Error} when it was removed
   */
  placeFrom(from: WorkspaceSnapshot, options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    try {
      checkUsable("place environment", from);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.#place(from, options);
  }

  async #place(
    from: WorkspaceSnapshot | null,
    options: PlaceOptions,
  ): Promise<PlacementWithUrl> {
    options.signal?.throwIfAborted();
    const root = await Deno.makeTempDir({ prefix: "hud-fork-" });
    const removeRoot = () => Deno.remove(root, { recursive: true }).catch(() => {});
    let placed: PlacementWithUrl;
    try {
      const local = new LocalRuntime(() => this.#factory({ from, root }), this.#options);
      placed = await local.place(options);
    } catch (err) {
      await removeRoot();
      throw err;
    }
    const params = { ...placed.params, root, from: from?.id ?? null };
    let released = false;
    return placementOf(placed.address, Object.freeze(params), async () => {
      if (released) return;
      released = true;
      try {
        await placed[Symbol.asyncDispose]();
      } finally {
        await removeRoot();
      }
    }, placed.enterPhase);
  }
}

/**
 * Checks that `from` is a snapshot made here and not removed.
 * @throws {TypeError} when it is not a snapshot
 * @throws {Error} when it was removed
 */
export function checkUsable(verb: string, from: unknown): WorkspaceSnapshot {
  const snapshot = checkSnapshot(verb, from);
  if (snapshot.removed) {
    throw new Error(`Cannot ${verb}: snapshot "${snapshot.id}" was removed`);
  }
  return snapshot;
}

/**
 * Places an environment on `runtime`, from `from` when it is a snapshot.
 * @throws {TypeError} when `from` is given and the runtime cannot place from snapshots
 */
export function placeOn(
  runtime: RuntimeProvider,
  from: WorkspaceSnapshot | null,
  options: PlaceOptions,
): Promise<Placement> {
  if (from === null) return runtime.place(options);
  if (!placesFromSnapshots(runtime)) {
    return Promise.reject(noSnapshotRuntime(`start from snapshot "${from.id}"`));
  }
  return runtime.placeFrom(from, options);
}

/** The error for a runtime that cannot place from snapshots. */
export function noSnapshotRuntime(verb: string): TypeError {
  return new TypeError(
    `Cannot ${verb}: the runtime cannot place an environment from a snapshot (pass runtime: a ForkRuntime)`,
  );
}
