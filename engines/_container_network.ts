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
import {
  type NetworkPolicy,
  type ParsedPolicy,
  parseNetworkPolicy,
} from "../workspace/_netpolicy.ts";

/**
 * One phase's network: `true` (or `"public"`) the engine's default network,
 * `false` (or `"none"`) loopback alone, an allowlist (`{ allow, deny?,
 * nameServer? }`) loopback alone with an egress proxy reached through it
 * (`_container_egress.ts`).
 */
export type ContainerPhaseNetwork = boolean | NetworkPolicy;

/**
 * A container's network in each phase of a rollout (each a
 * {@linkcode ContainerPhaseNetwork}). A phase left out has `setup`'s (the
 * network the container is created with), as Harbor's phases fall back to
 * its environment's.
 */
export interface ContainerNetworkPhases {
  /** Placing the container and starting the task. */
  setup: ContainerPhaseNetwork;
  /** The agent's turn. @default setup's */
  agent?: ContainerPhaseNetwork;
  /** Grading. @default setup's */
  verifier?: ContainerPhaseNetwork;
}

/** The network of each phase, resolved (a phase left out is the same object as setup's). */
export type NetworkPlan = Readonly<Record<RolloutPhase, ParsedPolicy>>;

/** `value`, one phase's network, parsed; `what` names it in the error. */
function phasePolicy(value: unknown, what: string): ParsedPolicy {
  try {
    return parseNetworkPolicy(value as NetworkPolicy | boolean);
  } catch (err) {
    throw new TypeError(
      `Cannot create ContainerRuntime: ${what}: ${(err as Error).message}`,
      { cause: err },
    );
  }
}

/** `option` (the runtime's `network`) as a plan for each phase, checked. */
export function resolveNetwork(
  option: ContainerPhaseNetwork | ContainerNetworkPhases | undefined,
): NetworkPlan {
  const byPhase = typeof option === "object" && option !== null &&
    ["setup", "agent", "verifier"].some((k) => k in option);
  if (!byPhase) {
    const one = phasePolicy(option ?? false, "network");
    return { setup: one, agent: one, verifier: one };
  }
  if (!("setup" in option) || option.setup === undefined) {
    throw new TypeError(
      'Cannot create ContainerRuntime: network by phase needs "setup": { setup, agent?, verifier? }',
    );
  }
  const setup = phasePolicy(option.setup, "network.setup");
  const other = (phase: "agent" | "verifier") =>
    option[phase] === undefined ? setup : phasePolicy(option[phase], `network.${phase}`);
  return { setup, agent: other("agent"), verifier: other("verifier") };
}

/** Whether the phase is on the engine's network (`public`). */
export function isPublic(policy: ParsedPolicy): boolean {
  return policy.mode === "public";
}

/** Whether any phase of `plan` has the engine's network (the container is created on one). */
export function needsNetwork(plan: NetworkPlan): boolean {
  return isPublic(plan.setup) || isPublic(plan.agent) || isPublic(plan.verifier);
}

/** Whether any phase of `plan` is an allowlist (the container is made for the egress proxy). */
export function hasAllowlist(plan: NetworkPlan): boolean {
  return Object.values(plan).some((p) => p.mode === "allowlist");
}

/** Whether the engine's network changes between phases (the placement then switches it). */
export function changesByPhase(plan: NetworkPlan): boolean {
  return isPublic(plan.setup) !== isPublic(plan.agent) ||
    isPublic(plan.agent) !== isPublic(plan.verifier);
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
    const want = isPublic(plan[phase]);
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
