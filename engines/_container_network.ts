/**
 * A container's network by rollout phase: which phases are on the
 * engine's network and which have nothing but loopback, and the switch
 * between them through the engine's API (`/networks/{name}/connect` and
 * `/disconnect`), made from outside the container: nothing in it can undo
 * a disconnect (it has no capability to make interfaces, and none to reach
 * the engine).
 *
 * @module
 */

import type { PlaceOptions, RolloutPhase } from "../runtime/placement.ts";
import type { EngineClient } from "./_engine.ts";

/**
 * A container's network in each phase of a rollout: `true` puts it on the
 * engine's default network, `false` leaves it only its loopback. A phase
 * left out has `setup`'s (the network the container is created with), as
 * Harbor's phases fall back to its environment's.
 */
export interface ContainerNetworkPhases {
  /** Placing the container and starting the task. */
  setup: boolean;
  /** The agent's turn. @default setup's */
  agent?: boolean;
  /** Grading. @default setup's */
  verifier?: boolean;
}

/** The network of each phase, resolved. */
export type NetworkPlan = Readonly<Record<RolloutPhase, boolean>>;

/** `option` (the runtime's `network`) as a plan for each phase, checked. */
export function resolveNetwork(option: boolean | ContainerNetworkPhases | undefined): NetworkPlan {
  if (option === undefined || typeof option === "boolean") {
    const on = option ?? false;
    return { setup: on, agent: on, verifier: on };
  }
  if (typeof option !== "object" || option === null || typeof option.setup !== "boolean") {
    throw new TypeError(
      "Cannot create ContainerRuntime: network must be a boolean or { setup, agent?, verifier? } of booleans",
    );
  }
  for (const phase of ["agent", "verifier"] as const) {
    const value = option[phase];
    if (value !== undefined && typeof value !== "boolean") {
      throw new TypeError(
        `Cannot create ContainerRuntime: network.${phase} must be a boolean, got ${typeof value}`,
      );
    }
  }
  return {
    setup: option.setup,
    agent: option.agent ?? option.setup,
    verifier: option.verifier ?? option.setup,
  };
}

/** Whether any phase of `plan` has a network (the container is created on one). */
export function needsNetwork(plan: NetworkPlan): boolean {
  return plan.setup || plan.agent || plan.verifier;
}

/** Whether the network changes between phases (the placement then switches it). */
export function changesByPhase(plan: NetworkPlan): boolean {
  return plan.setup !== plan.agent || plan.agent !== plan.verifier;
}

/** An engine network a container joins, and the names it is known by there. */
export interface ContainerNetwork {
  /** The network's name. */
  name: string;
  /** The names other containers on it reach this one by. */
  aliases: readonly string[];
}

/** A named volume mounted into a container. */
export interface ContainerVolume {
  /** The volume's name on the engine. */
  source: string;
  /** Where it is mounted: an absolute path. */
  target: string;
  /** Whether it is mounted read-only. */
  readOnly: boolean;
}

/** The runtime's `networks` option, checked. */
export function resolveNetworks(
  option: readonly ContainerNetwork[] | undefined,
): readonly ContainerNetwork[] {
  for (const n of option ?? []) {
    if (
      typeof n?.name !== "string" || n.name === "" || !Array.isArray(n.aliases) ||
      n.aliases.some((a) => typeof a !== "string" || a === "")
    ) {
      throw new TypeError(
        "Cannot create ContainerRuntime: each of networks must be { name, aliases } of non-empty strings",
      );
    }
  }
  return [...(option ?? [])];
}

/** The runtime's `volumes` option, checked. */
export function resolveVolumes(
  option: readonly ContainerVolume[] | undefined,
): readonly ContainerVolume[] {
  for (const v of option ?? []) {
    if (
      typeof v?.source !== "string" || v.source === "" || typeof v.target !== "string" ||
      !v.target.startsWith("/") || typeof v.readOnly !== "boolean"
    ) {
      throw new TypeError(
        "Cannot create ContainerRuntime: each of volumes must be { source, target (an absolute path), readOnly }",
      );
    }
  }
  return [...(option ?? [])];
}

/** Connects container `id` to `network` under its aliases. */
export async function connect(
  engine: EngineClient,
  id: string,
  network: ContainerNetwork,
  signal?: AbortSignal,
): Promise<void> {
  // The default network takes no aliases: none is sent where there are none.
  const body = network.aliases.length === 0
    ? { Container: id }
    : { Container: id, EndpointConfig: { Aliases: network.aliases } };
  await post(engine, network.name, "connect", body, signal);
}

async function post(
  engine: EngineClient,
  network: string,
  verb: "connect" | "disconnect",
  body: unknown,
  signal: AbortSignal | undefined,
): Promise<void> {
  // Podman answers "OK", not JSON: the body is not read as JSON.
  const res = await engine.raw("POST", `/networks/${encodeURIComponent(network)}/${verb}`, {
    body: JSON.stringify(body),
    headers: { "content-type": "application/json" },
    signal,
  });
  await res.body?.cancel();
}

/**
 * The switch for container `id`, created on a network: finds the network's
 * name (Docker's `bridge`, Podman's `podman`), or takes `options.networks`
 * (the container's own, with their aliases), and returns `enterPhase`,
 * which connects or disconnects it as `plan` says (nothing when the phase
 * has the network the container has). Call `enterPhase("setup")` before
 * the container starts.
 */
export async function networkSwitch(
  engine: EngineClient,
  id: string,
  plan: NetworkPlan,
  options: { networks?: readonly ContainerNetwork[]; signal?: AbortSignal } = {},
): Promise<(phase: RolloutPhase, options?: PlaceOptions) => Promise<void>> {
  let networks = options.networks;
  if (networks === undefined) {
    const info = await engine.call("GET", `/containers/${id}/json`, undefined, options.signal) as {
      NetworkSettings?: { Networks?: Record<string, unknown> | null };
    };
    const name = Object.keys(info.NetworkSettings?.Networks ?? {})[0];
    if (name === undefined) {
      throw new Error(`container ${id.slice(0, 12)} was created on no network to switch`);
    }
    networks = [{ name, aliases: [] }];
  }
  const all = networks;
  let connected = true;
  let switching: Promise<void> = Promise.resolve();
  const enter = async (phase: RolloutPhase, options?: PlaceOptions) => {
    const want = plan[phase];
    if (want === connected) return;
    for (const network of all) {
      if (want) await connect(engine, id, network, options?.signal);
      else {await post(
          engine,
          network.name,
          "disconnect",
          { Container: id, Force: true },
          options?.signal,
        );}
    }
    connected = want;
  };
  // One switch at a time: a second call waits for the first.
  return (phase, options) =>
    switching = switching.catch(() => {}).then(() => enter(phase, options));
}
