/**
 * The runtime contract: a {@linkcode RuntimeProvider} places an environment
 * for a rollout, the client connects to the {@linkcode Placement}'s
 * address, and disposing the placement releases it. Every runtime
 * implements it, here and in `engines/`; `connect()` takes one
 * (structurally: the client is a lower layer and does not import this
 * module).
 *
 * @module
 */

import { type ControlAddress, formatControlUrl } from "../_internal/auth.ts";

export type { ControlAddress };

/**
 * A part of a rollout, for what the environment's network may reach:
 * `setup` (placing it and starting the task), `agent` (the agent's turn),
 * `verifier` (grading). A runtime whose network differs by phase switches
 * it as the rollout passes from one to the next.
 */
export type RolloutPhase = "setup" | "agent" | "verifier";

/**
 * A placed environment: where to connect, until disposed.
 *
 * The address is a record, not a url: the token travels from the runtime to
 * the client without being written into a string and read back. Where a url
 * is wanted (a flag for another process), `formatControlUrl(placement.address)`
 * (from `@hud/sdk/client`) makes one.
 */
export interface Placement extends AsyncDisposable {
  /** The control address: host, port, and the token (a secret: never print it). */
  readonly address: ControlAddress;
  /** Data about the placement (container id, pid...). */
  readonly params: Readonly<Record<string, unknown>>;
  /**
   * Gives the environment the network `phase` allows, before that phase
   * starts: a rollout calls it with `agent` after the task started, and
   * with `verifier` before grading. Absent where the network does not
   * change by phase. It throws when it cannot switch; the rollout then ends
   * ungraded (class `provisioning`), never scored on a network the phase
   * should not have had.
   */
  enterPhase?(phase: RolloutPhase, options?: PlaceOptions): Promise<void>;
}

/**
 * The placements this SDK's runtimes return: the {@linkcode Placement}, and
 * its address as a url besides, for code written when placements carried
 * only a url (the url is made from the address when read). Read `address`.
 */
export interface PlacementWithUrl extends Placement {
  /**
   * The address as a url, `tcp://:TOKEN@host:port` (`tcp://host:port`
   * without a token): it holds the secret, do not print it.
   */
  readonly url: string;
}

/**
 * A placement at `address`, released by `release`, with its url made on
 * demand: what the runtimes return. The url is not enumerable, so that a
 * placement that is logged or serialised shows the address, whose token
 * reads as `***`, and not the url, which holds it.
 */
export function placementOf(
  address: ControlAddress,
  params: Readonly<Record<string, unknown>>,
  release: () => Promise<void>,
  enterPhase?: Placement["enterPhase"],
): PlacementWithUrl {
  const placement = {
    address,
    params,
    [Symbol.asyncDispose]: release,
    ...(enterPhase ? { enterPhase } : {}),
  };
  Object.defineProperty(placement, "url", { get: () => formatControlUrl(address) });
  return placement as typeof placement & { readonly url: string };
}

/** Options for {@linkcode RuntimeProvider.place}. */
export interface PlaceOptions {
  /** Aborts placing. */
  signal?: AbortSignal;
}

/**
 * Something that can place an environment for a rollout: the runtimes in
 * `runtime/` and `engines/` implement it, and `connect()` accepts one.
 */
export interface RuntimeProvider {
  /** Places the environment; dispose the placement to release it. */
  place(options?: PlaceOptions): Promise<Placement>;
}

/**
 * A saved state an environment can be placed from again: a workspace's
 * files (`kind` "workspace", `Workspace.snapshot()`), or a container's file
 * system (`kind` "container", `ContainerRuntime.snapshot()`). A
 * {@linkcode SnapshotRuntime} of the same kind places from it.
 */
export interface Snapshot extends AsyncDisposable {
  /** What it holds, and so which runtime places from it: "workspace" or "container". */
  readonly kind: string;
  /** Its id, unique in this process (`snap-...`). */
  readonly id: string;
  /** What it was taken of: a workspace's name, or a container's image. */
  readonly workspace: string;
  /** The snapshot what it was taken of started from, or null. */
  readonly parent: string | null;
  /** Its ancestry, nearest first (empty when it has no parent). */
  readonly lineage: readonly string[];
  /** Bytes of disk it took. */
  readonly bytes: number;
  /** Whether it was removed. */
  readonly removed: boolean;
  /** Removes it; what a placement from it still runs on stays until released. Idempotent. */
  remove(): Promise<void>;
}

/** A runtime that can place an environment from a snapshot of its kind. */
export interface SnapshotRuntime extends RuntimeProvider {
  /** The kind of snapshot it places from ({@linkcode Snapshot.kind}). */
  readonly snapshotKind: string;
  /** Places an environment made from `from`; dispose the placement to release it. */
  placeFrom(from: Snapshot, options?: PlaceOptions): Promise<Placement>;
}
