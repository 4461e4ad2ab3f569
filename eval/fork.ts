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
  type Snapshot,
  type SnapshotRuntime,
} from "../runtime/placement.ts";
import { checkSnapshot, type WorkspaceSnapshot } from "../workspace/_snapshot.ts";

export type { Snapshot, SnapshotRuntime };

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

/** Whether `runtime` can place environments from snapshots. */
export function placesFromSnapshots(
  runtime: RuntimeProvider | undefined,
): runtime is SnapshotRuntime {
  const r = runtime as Partial<SnapshotRuntime> | undefined;
  return typeof r?.placeFrom === "function" && typeof r.snapshotKind === "string";
}

/**
 * Environments served in this process, one per placement, each made by a
 * factory from the snapshot its rollout starts from, on an empty root of
 * its own: what `rollout()` and `Taskset.run()` need to start from a
 * snapshot. Snapshots live in this process, so forks do too.
 */
export class ForkRuntime implements SnapshotRuntime {
  /** It places from workspace snapshots. */
  readonly snapshotKind = "workspace";
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
   * @throws {TypeError} when `from` is not a workspace snapshot
   * @throws {Error} when it was removed
   */
  placeFrom(from: Snapshot, options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    let snapshot: WorkspaceSnapshot;
    try {
      snapshot = checkSnapshot("place environment", checkUsable("place environment", from));
    } catch (err) {
      return Promise.reject(err);
    }
    return this.#place(snapshot, options);
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
 * Checks that `from` is a snapshot (of any kind: the runtime placing from
 * it checks that it made it) and was not removed.
 * @throws {TypeError} when it is not a snapshot
 * @throws {Error} when it was removed
 */
export function checkUsable(verb: string, from: unknown): Snapshot {
  const s = from as Partial<Snapshot> | null;
  const shaped = typeof s === "object" && s !== null && typeof s.kind === "string" &&
    typeof s.id === "string" && Array.isArray(s.lineage) && typeof s.remove === "function";
  if (!shaped) {
    throw new TypeError(
      `Cannot ${verb}: not a snapshot (use one that Workspace.snapshot() or ContainerRuntime.snapshot() returned)`,
    );
  }
  if (s.removed) throw new Error(`Cannot ${verb}: snapshot "${s.id}" was removed`);
  return s as Snapshot;
}

/** The runtime that places from snapshots of `kind`, for messages. */
function placerOf(kind: string): string {
  return kind === "container" ? "ContainerRuntime" : "ForkRuntime";
}

/**
 * Why `runtime` cannot place from `from`, or null when it can.
 * @param verb what was refused, for the message
 */
export function snapshotRefusal(
  verb: string,
  runtime: RuntimeProvider | undefined,
  from: Snapshot | null,
): TypeError | null {
  if (!placesFromSnapshots(runtime)) {
    const name = runtime === undefined
      ? "the default runtime (LocalRuntime)"
      : runtimeName(runtime);
    return new TypeError(
      `Cannot ${verb}: ${name} cannot place an environment from a snapshot (workspace snapshots: runtime ForkRuntime; container snapshots: ContainerRuntime)`,
    );
  }
  if (from !== null && from.kind !== runtime.snapshotKind) {
    return new TypeError(
      `Cannot ${verb}: ${
        runtimeName(runtime)
      } places from ${runtime.snapshotKind} snapshots, and "${from.id}" is a ${from.kind} snapshot (pass runtime: a ${
        placerOf(from.kind)
      })`,
    );
  }
  return null;
}

function runtimeName(runtime: RuntimeProvider): string {
  const name = (runtime as { constructor?: { name?: unknown } }).constructor?.name;
  return typeof name === "string" && name !== "" && name !== "Object" ? name : "the runtime";
}

/**
 * Places an environment on `runtime`, from `from` when it is a snapshot.
 * @throws {TypeError} when `from` is given and the runtime cannot place from it
 */
export function placeOn(
  runtime: RuntimeProvider,
  from: Snapshot | null,
  options: PlaceOptions,
): Promise<Placement> {
  if (from === null) return runtime.place(options);
  if (!placesFromSnapshots(runtime) || from.kind !== runtime.snapshotKind) {
    return Promise.reject(snapshotRefusal(`start from snapshot "${from.id}"`, runtime, from));
  }
  return runtime.placeFrom(from, options);
}
