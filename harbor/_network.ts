/**
 * A Harbor task's network policy for each phase, read as Harbor reads it
 * (`harbor/models/task/config.py`, 0.18 and later): `[environment]`'s
 * `network_mode` is the baseline, and without one `allow_internet` (false:
 * `no-network`, else `public`); `[agent]` and `[verifier]` may each name
 * their own, else they have the baseline (the verifier, with a
 * `[verifier.environment]`, that table's). `allowed_hosts` without a
 * `network_mode` means `allowlist`; beside another mode it is refused.
 * Hosts are names or IPv4 addresses, lowercased, a final dot dropped,
 * duplicates and empty entries dropped; a url, a path, a port or a CIDR is
 * refused.
 *
 * @module
 */

import type { TomlTable } from "./toml.ts";

/** Harbor's network modes. */
export type HarborNetworkMode = "public" | "no-network" | "allowlist";

/** One phase's network: its mode, and the hosts an `allowlist` lets it reach. */
export interface HarborNetworkPolicy {
  /** `network_mode`. */
  mode: HarborNetworkMode;
  /** `allowed_hosts`, normalised (empty unless `allowlist`). */
  allowedHosts: string[];
}

/** A task's network in each phase. */
export interface HarborNetworkPhases {
  /** `[environment]`: the container is made with it (building, starting, the healthcheck). */
  environment: HarborNetworkPolicy;
  /** The agent's turn (the oracle's too). */
  agent: HarborNetworkPolicy;
  /** `tests/test.sh`. */
  verifier: HarborNetworkPolicy;
}

const MODES: readonly string[] = ["public", "no-network", "allowlist"];

function fail(file: string, message: string): never {
  throw new TypeError(`Cannot load Harbor task: ${file}: ${message}`);
}

/** `section`'s `network_mode` and `allowed_hosts`, or null when it names neither. */
function explicitPolicy(t: TomlTable, file: string, section: string): HarborNetworkPolicy | null {
  const mode = t.network_mode;
  if (mode !== undefined && (typeof mode !== "string" || !MODES.includes(mode))) {
    fail(file, `"${section}.network_mode" must be "public", "no-network" or "allowlist"`);
  }
  const hosts = allowedHosts(t.allowed_hosts, file, section);
  if (hosts.length > 0 && mode !== undefined && mode !== "allowlist") {
    fail(
      file,
      `"${section}.allowed_hosts" is only valid with ${section}.network_mode = "allowlist"`,
    );
  }
  if (mode === undefined && hosts.length === 0) return null;
  return { mode: (mode as HarborNetworkMode | undefined) ?? "allowlist", allowedHosts: hosts };
}

function allowedHosts(value: unknown, file: string, section: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) {
    fail(file, `"${section}.allowed_hosts" must be an array of host names`);
  }
  const hosts: string[] = [];
  for (const entry of value) {
    if (typeof entry !== "string") {
      fail(file, `"${section}.allowed_hosts" must be an array of host names`);
    }
    const host = entry.trim().toLowerCase().replace(/\.$/, "");
    if (host === "") continue;
    if (host.includes("/") || host.includes(":")) {
      fail(
        file,
        `"${section}.allowed_hosts": "${entry}" is not a host name or IPv4 address (no url, path, port or CIDR)`,
      );
    }
    if (!hosts.includes(host)) hosts.push(host);
  }
  return hosts;
}

/**
 * The network an environment table (`[environment]`, or Harbor 0.22's
 * `[verifier.environment]`, named by `section`) makes its container with:
 * its `network_mode`, else `allow_internet` (false: `no-network`), else `public`.
 *
 * @throws {TypeError} as {@linkcode harborNetwork}, naming `section`'s key
 */
export function baselinePolicy(t: TomlTable, file: string, section: string): HarborNetworkPolicy {
  const allow = t.allow_internet;
  if (allow !== undefined && typeof allow !== "boolean") {
    fail(file, `"${section}.allow_internet" must be a boolean`);
  }
  return explicitPolicy(t, file, section) ??
    { mode: allow === false ? "no-network" : "public", allowedHosts: [] };
}

/**
 * The network of each phase of a task, from its `[environment]`, `[agent]`
 * and `[verifier]` tables.
 *
 * @throws {TypeError} for a mode Harbor does not have, `allowed_hosts` that
 * are not host names, or `allowed_hosts` beside a mode other than
 * `allowlist` (each naming the key)
 */
export function harborNetwork(
  environment: TomlTable,
  agent: TomlTable,
  verifier: TomlTable,
  file: string,
): HarborNetworkPhases {
  const baseline = baselinePolicy(environment, file, "environment");
  // A verifier container of its own (`[verifier.environment]`) starts from its own baseline.
  const own = verifier.environment;
  const verifierBaseline = typeof own === "object" && own !== null && !Array.isArray(own)
    ? baselinePolicy(own as TomlTable, file, "verifier.environment")
    : baseline;
  return {
    environment: baseline,
    agent: explicitPolicy(agent, file, "agent") ?? baseline,
    verifier: explicitPolicy(verifier, file, "verifier") ?? verifierBaseline,
  };
}
