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

/**
 * The switch for container `id`, created on a network: finds the network's
 * name (Docker's `bridge`, Podman's `podman`), and returns `enterPhase`,
 * which connects or disconnects it as `plan` says (nothing when the phase
 * has the network the container has). Call `enterPhase("setup")` before
 * the container starts.
 */
export async function networkSwitch(
  engine: EngineClient,
  id: string,
  plan: NetworkPlan,
  signal?: AbortSignal,
): Promise<(phase: RolloutPhase, options?: PlaceOptions) => Promise<void>> {
  const info = await engine.call("GET", `/containers/${id}/json`, undefined, signal) as {
    NetworkSettings?: { Networks?: Record<string, unknown> | null };
  };
  const name = Object.keys(info.NetworkSettings?.Networks ?? {})[0];
  if (name === undefined) {
    throw new Error(`container ${id.slice(0, 12)} was created on no network to switch`);
  }
  let connected = true;
  let switching: Promise<void> = Promise.resolve();
  const enter = async (phase: RolloutPhase, options?: PlaceOptions) => {
    const want = isPublic(plan[phase]);
    if (want === connected) return;
    const verb = want ? "connect" : "disconnect";
    const body = want ? { Container: id } : { Container: id, Force: true };
    // Podman answers "OK", not JSON: the body is not read as JSON.
    const res = await engine.raw("POST", `/networks/${encodeURIComponent(name)}/${verb}`, {
      body: JSON.stringify(body),
      headers: { "content-type": "application/json" },
      signal: options?.signal,
    });
    await res.body?.cancel();
    connected = want;
  };
  // One switch at a time: a second call waits for the first.
  return (phase, options) =>
    switching = switching.catch(() => {}).then(() => enter(phase, options));
}
