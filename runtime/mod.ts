/**
 * Runtimes: where an environment runs for a rollout. A runtime implements
 * {@linkcode RuntimeProvider}: it is placed, the client connects to the
 * placement's address, and disposing the placement releases it.
 *
 * - {@linkcode Runtime}: an environment already served at an address.
 * - {@linkcode LocalRuntime}: an environment in this process.
 * - {@linkcode SubprocessRuntime}: an environment module served by the
 *   command line's `serve` in a child process, one per placement.
 * - {@linkcode Shared}: one placement of another provider, leased to up
 *   to `width` rollouts at once.
 *
 * The engine-backed runtimes (containers on Docker or Podman, Docker Swarm)
 * are in `@hud/sdk/engines`.
 *
 * @module
 */

export type {
  ControlAddress,
  Placement,
  PlacementWithUrl,
  PlaceOptions,
  RolloutPhase,
  RuntimeProvider,
  Snapshot,
  SnapshotRuntime,
} from "./placement.ts";
export { Shared, type SharedOptions } from "./shared.ts";
export { Runtime } from "./runtime.ts";
export { LocalRuntime, type LocalRuntimeOptions } from "./local.ts";
export { SERVER_V8_FLAGS, SubprocessRuntime, type SubprocessRuntimeOptions } from "./subprocess.ts";
