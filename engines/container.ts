/**
 * {@linkcode ContainerRuntime} places an environment image on Docker or
 * Podman (one client for both: the Docker Engine API over the engine's unix
 * socket), one container per placement.
 *
 * @module
 */

import { probeReady } from "../runtime/_probe.ts";
import {
  type Placement,
  placementOf,
  type PlacementWithUrl,
  type PlaceOptions,
  type Snapshot,
  type SnapshotRuntime,
} from "../runtime/placement.ts";
import { NotReadyError } from "../errors.ts";
import { type ControlAddress, controlAddress, generateToken } from "../_internal/auth.ts";
import { reachableSync } from "../_internal/fs.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { EngineClient, EngineError, findEngineSocket, removeContainer } from "./_engine.ts";
import { Relay } from "./_relay.ts";
import { seccompProfile } from "./_seccomp.ts";
import {
  changesByPhase,
  connect,
  hasAllowlist,
  needsNetwork,
  networkSwitch,
} from "./_container_network.ts";
import { PROXY_ENV } from "../workspace/_egress_relay.ts";
import {
  type ContainerEgress,
  containerEgress,
  egressSetting,
  phaseSwitch,
} from "./_container_egress.ts";
import { CONTROL_LABEL } from "./_constants.ts";
import {
  type ContainerConfig,
  type ContainerRuntimeOptions,
  type ContainerSetting,
  containerSpec,
  resolveContainerOptions,
} from "./_container_spec.ts";
import {
  type ContainerSnapshot,
  type ContainerSnapshotOptions,
  releaseSnapshot,
  retainSnapshot,
  takeSnapshot,
  usableSnapshot,
} from "./_container_snapshot.ts";

export type { ContainerRuntimeOptions, ContainerSnapshot, ContainerSnapshotOptions };

interface ContainerInfo {
  State?: { Running?: boolean; ExitCode?: number; Status?: string; OOMKilled?: boolean };
}

/** What the engine says about its own security options. */
interface EngineSecurity {
  apparmor: boolean;
}

/** What one placement holds, to release (or undo, when placing fails). */
interface Held {
  engine: EngineClient;
  id: string | null;
  dir: string | null;
  relay: Relay | null;
  /** The egress proxy and relay of an allowlist phase, or null. */
  egress: ContainerEgress | null;
  /** The snapshot it was placed from (retained until the container is removed), or null. */
  from: ContainerSnapshot | null;
}

/**
 * Places an environment image in a container for each rollout, confined:
 * no capabilities, `no-new-privileges`, a seccomp profile that allows the
 * workspace's sandbox (bubblewrap, in user namespaces) and little else, an
 * unprivileged user, a read-only image, a process limit, and no network
 * unless asked. The runtime reaches the environment through a unix socket
 * in a directory it bind-mounts (a relay on each side: 127.0.0.1 at a
 * random port here, the server's loopback port in the container), so the
 * control channel needs no network either. It waits for the protocol
 * handshake, and releasing the placement stops and removes the container;
 * when the container died while placed, the release rejects with its exit
 * code and last output (a rollout records it).
 *
 * @example
 * ```ts ignore
 * import { connect } from "../client.ts";
 * import { ContainerRuntime } from "./mod.ts";
 *
 * await using client = await connect(new ContainerRuntime("robolab:latest"));
 * console.log(client.manifest.env.name);
 * ```
 */
export class ContainerRuntime implements SnapshotRuntime {
  /** It places from container snapshots ({@linkcode ContainerRuntime.snapshot}). */
  readonly snapshotKind = "container";
  readonly #config: ContainerConfig;
  #security: Promise<EngineSecurity> | null = null;
  // Placements being made and releases running, and how to release each
  // placement still held: close() waits for all of them, so that a caller
  // that exits after an abort (rollouts release in the background) leaves
  // no container behind.
  readonly #inflight = new Set<Promise<unknown>>();
  readonly #held = new Set<() => Promise<void>>();
  /** The containers placed and not released, and the snapshot each was placed from. */
  readonly #placed = new Map<string, ContainerSnapshot | null>();

  /**
   * A runtime for `image`.
   *
   * @param image an image made by {@linkcode buildEnvironmentImage}
   * @param options engine socket, environment, limits, network, user, labels
   * @throws {TypeError} for an empty image name
   * @throws {RangeError} for a limit that is not a positive number
   */
  constructor(image: string, options: ContainerRuntimeOptions = {}) {
    this.#config = resolveContainerOptions(image, options);
  }

  /** The image placed. */
  get image(): string {
    return this.#config.image;
  }

  /**
   * Starts a container and waits until its environment answers `hello`.
   * @throws {NotReadyError} when it exits or stays silent before it is ready, with its exit code and last output
   * @throws {TypeError} for an image not made by {@linkcode buildEnvironmentImage}
   */
  place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    return this.#track(this.#place(options, null));
  }

  /**
   * Starts a container of `from`'s image (with this runtime's options
   * otherwise) and waits until its environment answers `hello`.
   * @throws {TypeError} when `from` is not a container snapshot made in this
   *   process, or its image is on another engine
   * @throws {Error} when it was removed
   */
  placeFrom(from: Snapshot, options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    let snapshot: ContainerSnapshot;
    try {
      const socket = () => findEngineSocket(this.#config.socket);
      snapshot = usableSnapshot("place container from a snapshot", from, socket);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.#track(this.#place(options, snapshot));
  }

  /**
   * Commits a placed container's file system into a snapshot image (the
   * engine pauses it meanwhile): what its processes changed in the image's
   * files; not its processes, its memory, nor /tmp (a tmpfs). The
   * snapshot's parent is the snapshot the container was placed from.
   * @param placement a placement of this runtime, not yet released
   * @throws {TypeError} for a placement not of this runtime or released, or a
   *   runtime whose image is read-only (then nothing but /tmp changes)
   */
  snapshot(
    placement: Placement,
    options: ContainerSnapshotOptions = {},
  ): Promise<ContainerSnapshot> {
    if (this.#config.readOnly) {
      return Promise.reject(
        new TypeError(
          "Cannot snapshot container: the runtime's image is read-only, so only /tmp (a tmpfs, which a commit leaves out) could change; create the runtime with readOnly: false",
        ),
      );
    }
    const container = placement?.params?.containerId;
    if (typeof container !== "string" || !this.#placed.has(container)) {
      return Promise.reject(
        new TypeError(
          "Cannot snapshot container: not a placement of this runtime, or released (pass what place() or placeFrom() returned, before disposing it)",
        ),
      );
    }
    return this.#track(this.#snapshot(container, options.signal));
  }

  async #snapshot(container: string, signal: AbortSignal | undefined): Promise<ContainerSnapshot> {
    const socket = this.#config.socket;
    using engine = await EngineClient.open(socket, signal);
    const from = this.#placed.get(container) ?? null;
    return await takeSnapshot({
      engine,
      open: () => EngineClient.open(socket),
      container,
      image: from?.image ?? this.#config.image,
      workspace: this.#config.image,
      parent: from,
      // The runtime's variables, the proxy's among them, are not the snapshot's.
      envKeys: [
        ...Object.keys(this.#config.env),
        ...(hasAllowlist(this.#config.network) ? Object.keys(PROXY_ENV) : []),
      ],
    }, signal);
  }

  /**
   * Releases every placement still held and waits until every placement
   * being made and every release has finished (their containers removed).
   * Idempotent; the runtime may place again afterwards.
   */
  async close(): Promise<void> {
    for (const release of [...this.#held]) this.#track(release());
    while (this.#inflight.size > 0) await Promise.allSettled([...this.#inflight]);
  }

  /** Disposes of {@linkcode close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #track<T>(work: Promise<T>): Promise<T> {
    this.#inflight.add(work);
    const done = () => void this.#inflight.delete(work);
    work.then(done, done);
    return work;
  }

  async #place(options: PlaceOptions, from: ContainerSnapshot | null): Promise<PlacementWithUrl> {
    const signal = options.signal;
    const held: Held = {
      engine: await EngineClient.open(this.#config.socket, signal),
      id: null,
      dir: null,
      relay: null,
      egress: null,
      from,
    };
    if (from !== null) retainSnapshot(from);
    try {
      const setting = await this.#prepare(held, signal);
      // Not aborted halfway: the engine would make the container and we
      // would not know its id to remove it. An abort is seen just after.
      const created = await held.engine.call(
        "POST",
        "/containers/create",
        containerSpec(this.#config, setting),
      ) as { Id: string };
      held.id = created.Id;
      signal?.throwIfAborted();
      const { networks } = this.#config;
      if (needsNetwork(this.#config.network)) {
        for (const n of networks.slice(1)) await connect(held.engine, held.id, n, signal);
      }
      const network = changesByPhase(this.#config.network)
        ? await networkSwitch(held.engine, held.id, this.#config.network, {
          networks: networks.length > 0 ? networks : undefined,
          signal,
        })
        : undefined;
      await network?.("setup", { signal });
      const socket = `${setting.dir}/control/control.sock`;
      const relay = held.relay = new Relay(
        { transport: "tcp", hostname: "127.0.0.1", port: 0 },
        { transport: "unix", path: socket },
        this.#config.onError,
      );
      await held.engine.call("POST", `/containers/${held.id}/start`, undefined, signal);
      if (setting.egress) {
        const egress = held.egress = containerEgress(
          held.engine,
          held.id,
          this.#config.network,
          setting.dir,
          this.#config.onError,
        );
        await egress.enter("setup");
      }
      const port = (relay.addr as Deno.NetAddr).port;
      const address = controlAddress("127.0.0.1", port, setting.token);
      await this.#waitReady(held.engine, held.id, address, socket, signal);
      return this.#placement(held, address, port, phaseSwitch(network, held.egress));
    } catch (err) {
      if (held.id !== null) await removeContainer(held.engine, held.id, 0).catch(() => {});
      await undo(held);
      throw err;
    }
  }

  /**
   * Checks the image and makes the control socket's directory: reachable
   * only through ours (0700), and writable by the container's user,
   * whoever that is on this host.
   */
  async #prepare(held: Held, signal: AbortSignal | undefined): Promise<ContainerSetting> {
    const engine = held.engine;
    const image = held.from?.image ?? this.#config.image;
    await this.#checkImage(engine, image, held.from, signal);
    const security = await (this.#security ??= engineSecurity(engine));
    const dir = held.dir = await Deno.makeTempDir({ prefix: "hud-container-" });
    await Deno.mkdir(`${dir}/control`);
    await Deno.chmod(`${dir}/control`, 0o777);
    // Docker takes the profile itself; Podman's compatible API, a path on
    // its host (this one: the engine is on this machine's socket).
    const podman = engine.product.startsWith("Podman");
    let seccomp = seccompProfile();
    if (podman) {
      await Deno.writeTextFile(`${dir}/seccomp.json`, seccomp, { mode: 0o600 });
      seccomp = `${dir}/seccomp.json`;
    }
    const egress = await egressSetting(this.#config.network, dir);
    return {
      image,
      token: generateToken(),
      dir,
      seccomp,
      podman,
      apparmor: security.apparmor,
      egress,
    };
  }

  /** The placement of a ready container; its release removes it, once. */
  #placement(
    held: Held,
    address: ControlAddress,
    port: number,
    enterPhase: Placement["enterPhase"],
  ): PlacementWithUrl {
    const containerId = held.id!;
    this.#placed.set(containerId, held.from);
    let released: Promise<void> | null = null;
    const release = (): Promise<void> => {
      this.#held.delete(release);
      this.#placed.delete(containerId);
      released ??= this.#track((async () => {
        try {
          // A container that died while placed: say how, after removing it.
          const died = await this.#deathNote(held.engine, containerId);
          const seconds = Math.ceil(this.#config.stopTimeout / 1000);
          await removeContainer(held.engine, containerId, seconds);
          if (died !== null) throw new Error(died);
        } finally {
          await undo(held);
        }
      })());
      return released;
    };
    this.#held.add(release);
    const params = {
      containerId,
      image: this.#config.image,
      port,
      ...(held.from === null ? {} : { from: held.from.id }),
    };
    return placementOf(address, params, release, enterPhase);
  }

  /** Refuses an image whose server cannot be reached through the socket. */
  async #checkImage(
    engine: EngineClient,
    image: string,
    from: ContainerSnapshot | null,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    let info: { Config?: { Labels?: Record<string, string> | null } };
    try {
      info = await engine.call(
        "GET",
        `/images/${encodeURIComponent(image)}/json`,
        undefined,
        signal,
      ) as typeof info;
    } catch (err) {
      if (err instanceof EngineError && err.status === 404) {
        throw new EngineError(
          from === null
            ? `Cannot place container: no image "${image}" on ${engine.product}; build it with buildEnvironmentImage (hud image)`
            : `Cannot place container from snapshot "${from.id}": its image ${image} is gone from ${engine.product} (removed outside this process); take the snapshot again`,
          404,
          { cause: err },
        );
      }
      throw err;
    }
    if (info.Config?.Labels?.[CONTROL_LABEL] !== "socket") {
      throw new TypeError(
        `Cannot place container: image "${image}" has no "${CONTROL_LABEL}=socket" label, so its server cannot be reached without a network; rebuild it with buildEnvironmentImage (hud image)`,
      );
    }
  }

  /** null while the container runs; else how it ended, with its last output. */
  async #deathNote(engine: EngineClient, id: string): Promise<string | null> {
    const image = this.#config.image;
    let info: ContainerInfo;
    try {
      info = await engine.call("GET", `/containers/${id}/json`) as ContainerInfo;
    } catch (err) {
      if (err instanceof EngineError && err.status === 404) {
        return `Container ${id.slice(0, 12)} of "${image}" was removed while placed`;
      }
      throw err;
    }
    if (info.State?.Running) return null;
    const logs = await engine.logs(id).catch(() => "");
    return `Container ${id.slice(0, 12)} of "${image}" died while placed: ${
      info.State?.OOMKilled ? "out of memory, " : ""
    }exit code ${info.State?.ExitCode ?? "?"}${lastLines(logs)}`;
  }

  async #waitReady(
    engine: EngineClient,
    id: string,
    address: ControlAddress,
    socket: string,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const { readyTimeout, image } = this.#config;
    using deadline = new Deadline(readyTimeout, signal, "container ready");
    for (let attempt = 1;; attempt++) {
      const info = await engine.call("GET", `/containers/${id}/json`) as ContainerInfo;
      if (!info.State?.Running) {
        const logs = await engine.logs(id).catch(() => "");
        throw new NotReadyError(
          `Container of "${image}" exited with code ${
            info.State?.ExitCode ?? "?"
          } before it was ready${lastLines(logs)}`,
        );
      }
      try {
        await probeReady(address, {
          readyTimeout: 1_000,
          retryInterval: 100,
          signal: deadline.signal,
        });
        return;
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        if (deadline.signal.aborted) {
          const logs = await engine.logs(id).catch(() => "");
          // The socket never appeared here: the engine does not share this
          // machine's file system (a VM, another host).
          const missing = !reachableSync(socket)
            ? `; the control socket never appeared at ${socket}: the engine must run on this machine`
            : "";
          throw new NotReadyError(
            `Container of "${image}" not ready after ${readyTimeout} ms (${attempt} attempts)${missing}${
              lastLines(logs)
            }`,
            { cause: err },
          );
        }
      }
      await delay(100, deadline.signal).catch(() => {});
    }
  }
}

/**
 * Closes what a placement holds on this side: the engine client, the relay,
 * the socket directory; and lets go of its snapshot (its container is gone).
 */
async function undo(held: Held): Promise<void> {
  held.engine.close();
  await held.relay?.close();
  await held.egress?.close();
  if (held.dir !== null) await Deno.remove(held.dir, { recursive: true }).catch(() => {});
  if (held.from !== null) await releaseSnapshot(held.from);
}

/** Whether the engine confines containers with AppArmor (its /info says). */
async function engineSecurity(engine: EngineClient): Promise<EngineSecurity> {
  const info = await engine.call("GET", "/info") as { SecurityOptions?: string[] | null };
  const options = info.SecurityOptions ?? [];
  return { apparmor: options.some((o) => /(^|name=)apparmor\b/.test(o)) };
}

function lastLines(logs: string): string {
  const lines = logs.trim().split("\n").filter((l) => l !== "").slice(-5);
  return lines.length === 0 ? "" : `; last output: ${lines.join(" | ")}`;
}
