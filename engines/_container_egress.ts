/**
 * A container's allowlist phases: the container has loopback alone then
 * (disconnected from every network, as `none`), and the workspace's egress
 * proxy and resolver (`workspace/_egress.ts`) run on this host for the
 * phase's policy, reached through a relay (`workspace/_egress_relay.ts`)
 * that this host starts inside the container's network namespace and no
 * other of its namespaces: `nsenter --net=/proc/<pid>/ns/net deno run
 * relay.js`. The relay listens on the container's 127.0.0.1:3128 (the
 * proxy variables) and :53 (its /etc/resolv.conf) and carries bytes to the
 * proxy's Unix sockets, which it opens by path through this host's file
 * system. The container's processes cannot see the relay (another PID
 * namespace), so cannot kill or replace it, and the image needs no deno.
 * Nothing here is a trust boundary beyond the missing route: an agent that
 * bypasses the relay has nowhere to go.
 *
 * @module
 */

import type { Placement, RolloutPhase } from "../runtime/placement.ts";
import type { EngineClient } from "./_engine.ts";
import type { ParsedPolicy } from "../workspace/_netpolicy.ts";
import { type EgressProxy, startEgressProxy } from "../workspace/_egress.ts";
import { PROXY_ENV, RELAY_ENV, RELAY_JS, relayRun } from "../workspace/_egress_relay.ts";
import { hasAllowlist, type NetworkPlan } from "./_container_network.ts";

/** How long the relay may take to listen, in ms. */
const RELAY_READY_TIMEOUT = 15_000;

/** The resolver the container's /etc/resolv.conf names: its own loopback, where the relay listens. */
const RESOLV_CONF = "nameserver 127.0.0.1\noptions edns0\n";

/**
 * The relay run from this host: the workspace's relay, which also ends when
 * its stdin closes, so that it outlives neither the runtime's process nor
 * its placement.
 */
const HOST_RELAY_JS = `${RELAY_JS}
for await (const _ of Deno.stdin.readable) { /* until this host's end closes */ }
Deno.exit(0);
`;

/** What a container with an allowlist phase is made with: its variables and a bind mount. */
export interface EgressSetting {
  /** The proxy variables (every spelling), for the container's environment. */
  env: Record<string, string>;
  /** A bind of /etc/resolv.conf (read-only) naming the relay's resolver. */
  bind: string;
}

/**
 * Writes what a container with an allowlist phase is made with into `dir`
 * (the placement's own directory), or null for a plan with none.
 */
export async function egressSetting(plan: NetworkPlan, dir: string): Promise<EgressSetting | null> {
  if (!hasAllowlist(plan)) return null;
  await Deno.writeTextFile(`${dir}/resolv.conf`, RESOLV_CONF, { mode: 0o644 });
  await Deno.writeTextFile(`${dir}/relay.js`, HOST_RELAY_JS, { mode: 0o600 });
  return { env: { ...PROXY_ENV }, bind: `${dir}/resolv.conf:/etc/resolv.conf:ro` };
}

/** A container's proxy and relay, switched by phase. */
export interface ContainerEgress {
  /**
   * Stops the running phase's relay and proxy and starts the ones `phase`'s
   * policy asks for: an allowlist's, or in a `public` phase one that lets
   * everything through (the container keeps the proxy variables and the
   * resolver of its creation); none in a `none` phase.
   */
  enter(phase: RolloutPhase): Promise<void>;
  /** Stops the relay and the proxy (its directory removed). Idempotent. */
  close(): Promise<void>;
}

interface Running {
  policy: ParsedPolicy;
  proxy: EgressProxy;
  relay: Deno.ChildProcess;
}

/**
 * The egress of container `id` (started), made with {@linkcode egressSetting}'s
 * files in `dir`.
 * @param onError the proxy's unexpected errors
 */
export function containerEgress(
  engine: EngineClient,
  id: string,
  plan: NetworkPlan,
  dir: string,
  onError: (err: unknown) => void,
): ContainerEgress {
  let running: Running | null = null;
  let queue: Promise<void> = Promise.resolve();
  let closed = false;
  const stop = async () => {
    const r = running;
    running = null;
    if (r === null) return;
    await stopRelay(r.relay);
    await r.proxy.close();
  };
  const enter = async (phase: RolloutPhase) => {
    if (closed) throw new Error("Cannot switch the container's egress: it is closed");
    const policy = plan[phase];
    if (running?.policy === policy) return;
    await stop();
    if (policy.mode === "none") return;
    const pid = await containerPid(engine, id);
    // In the placement's directory: gc (removeStaleContainers) removes it
    // with the container's if this process dies first.
    const proxy = await startEgressProxy(policy, onError, dir);
    let relay: Deno.ChildProcess | null = null;
    try {
      relay = await startRelay(pid, dir, proxy.dir);
      // The pid was the container's all along (it cannot be reused while
      // the container runs): the relay is in the container's namespace.
      if (await containerPid(engine, id) !== pid) {
        throw new Error(`Cannot start the egress relay: container ${id.slice(0, 12)} restarted`);
      }
      running = { policy, proxy, relay };
    } catch (err) {
      if (relay !== null) await stopRelay(relay);
      await proxy.close();
      throw err;
    }
  };
  // One switch at a time; close waits for the one under way.
  const serial = (work: () => Promise<void>) => queue = queue.catch(() => {}).then(work);
  let closing: Promise<void> | null = null;
  return {
    enter: (phase) => serial(() => enter(phase)),
    close: () =>
      closing ??= serial(() => {
        closed = true;
        return stop();
      }).catch(() => {}),
  };
}

/** The container's main process on this host, from the engine's inspect. */
async function containerPid(engine: EngineClient, id: string): Promise<number> {
  const info = await engine.call("GET", `/containers/${id}/json`) as {
    State?: { Pid?: number; Running?: boolean };
  };
  const pid = info.State?.Pid ?? 0;
  if (!info.State?.Running || pid <= 0) {
    throw new Error(`Cannot start the egress relay: container ${id.slice(0, 12)} is not running`);
  }
  return pid;
}

/** Starts the relay in `pid`'s network namespace and waits until it listens. */
async function startRelay(pid: number, dir: string, proxyDir: string): Promise<Deno.ChildProcess> {
  const child = new Deno.Command("nsenter", {
    args: [
      `--net=/proc/${pid}/ns/net`,
      "--",
      ...relayRun(Deno.execPath(), `${dir}/relay.js`, proxyDir),
    ],
    clearEnv: true,
    env: { ...RELAY_ENV },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const ready = (async () => {
    const reader = child.stdout.getReader();
    const { value } = await reader.read();
    reader.releaseLock();
    return new TextDecoder().decode(value ?? new Uint8Array()).startsWith("ready");
  })();
  const timeout = new Promise<false>((resolve) => {
    const timer = setTimeout(() => resolve(false), RELAY_READY_TIMEOUT);
    ready.finally(() => clearTimeout(timer));
  });
  if (await Promise.race([ready, timeout])) {
    // Its stderr is not read again: drained so that it never blocks on a full pipe.
    child.stderr.pipeTo(new WritableStream()).catch(() => {});
    child.stdout.cancel().catch(() => {});
    return child;
  }
  const why = await stopRelay(child);
  throw new Error(
    `Cannot start the egress relay in the container's network namespace (pid ${pid}): ${
      why || "it did not listen"
    }`,
  );
}

/** Kills the relay and waits for it; its last error output, when it still had some. */
async function stopRelay(child: Deno.ChildProcess): Promise<string> {
  await child.stdin.close().catch(() => {});
  try {
    child.kill("SIGKILL");
  } catch {
    // already gone
  }
  await child.status;
  try {
    const err = await new Response(child.stderr).text();
    return err.trim().split("\n").slice(-1)[0] ?? "";
  } catch {
    return ""; // already drained
  }
}

/**
 * The placement's phase switch: the engine's network first (a phase that
 * loses it loses it before anything else), then the egress; undefined when
 * neither changes.
 */
export function phaseSwitch(
  network: Placement["enterPhase"],
  egress: ContainerEgress | null,
): Placement["enterPhase"] {
  if (egress === null) return network;
  return async (phase, options) => {
    await network?.(phase, options);
    options?.signal?.throwIfAborted();
    await egress.enter(phase);
  };
}
