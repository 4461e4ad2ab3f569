/**
 * A Harbor phase's network as the container's (`ContainerRuntime`'s
 * `network` for that phase): `public` the engine's network, `no-network`
 * loopback alone, `allowlist` loopback alone with the egress proxy, whose
 * allowlist is the phase's `allowed_hosts` (names exactly, as Harbor's
 * iptables rules let through only the addresses a name resolves to; IPv4
 * addresses as themselves; any port).
 *
 * Harbor's own Docker environment applies an allowlist inside the
 * container's network namespace with iptables (loopback, and TCP and UDP
 * to the addresses the hosts resolve to when the phase starts), sets no
 * proxy variable, and leaves name resolution to the engine. Here the
 * container has no route at all: what the phase reaches goes through the
 * proxy (`HTTP_PROXY`, `HTTPS_PROXY`... set in the container), and its
 * resolver answers only the listed names.
 *
 * @module
 */

import type { ContainerPhaseNetwork } from "../engines/mod.ts";
import type { HarborNetworkPolicy } from "./_network.ts";

/** `policy` as the container's network for its phase. */
export function containerPhaseNetwork(policy: HarborNetworkPolicy): ContainerPhaseNetwork {
  if (policy.mode === "public") return "public";
  if (policy.mode === "no-network") return "none";
  return { allow: policy.allowedHosts };
}
