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
  type RuntimeProvider,
} from "../runtime/placement.ts";
import { NotReadyError } from "../errors.ts";
import {
  type ControlAddress,
  controlAddress,
  generateToken,
  SERVE_TOKEN_VAR,
} from "../_internal/auth.ts";
import { reachableSync } from "../_internal/fs.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { EngineClient, EngineError, removeContainer } from "./_engine.ts";
import { Relay } from "./_relay.ts";
import { seccompProfile } from "./_seccomp.ts";
import {
  changesByPhase,
  connect,
  type ContainerNetwork,
  type ContainerNetworkPhases,
  type ContainerPhaseNetwork,
  type ContainerVolume,
  needsNetwork,
  type NetworkPlan,
  networkSwitch,
  resolveNetwork,
  resolveNetworks,
  resolveVolumes,
} from "./_container_network.ts";
import {
  type ContainerEgress,
  containerEgress,
  type EgressSetting,
  egressSetting,
  phaseSwitch,
} from "./_container_egress.ts";
import {
  CONTROL_DIR_LABEL,
  CONTROL_LABEL,
  CONTROL_SOCKET_VAR,
  CREATED_LABEL,
  OWNER_LABEL,
} from "./_constants.ts";

/** Where the runtime's control socket directory appears inside a container. */
const CONTROL_DIR = "/tmp/.hud-control";
/** The user containers run as unless told otherwise: nobody, in every base image. */
const DEFAULT_USER = "65534:65534";
const DEFAULT_TMP_SIZE = 1024 * 1024 * 1024;
const DEFAULT_PIDS = 4096;
/**
 * What the engine's default masks hide that a fresh /proc would show
 * anyway: the /sys ones stay (nothing in the sandbox mounts sysfs).
 */
const MASKED_PATHS = ["/sys/firmware", "/sys/devices/virtual/powercap"];

/** Options for {@linkcode ContainerRuntime}. */
export interface ContainerRuntimeOptions {
  /**
   * Engine socket.
   * @default `DOCKER_HOST` (unix://), else /var/run/docker.sock, else Podman's
   */
  socket?: string;
  /**
   * Variables for the environment's process (the token is added).
   * @default {}
   */
  env?: Record<string, string>;
  /** CPU limit, in CPUs (`1.5`). */
  cpus?: number;
  /**
   * Memory limit, in bytes (the /tmp tmpfs counts against it).
   * @default none
   */
  memory?: number;
  /**
   * Most processes (and threads) in the container.
   * @default 4096
   */
  pids?: number;
  /**
   * Whether the container has a network: `false` gives it none at all (no
   * interface but its own loopback, so no route to the host, the engine's
   * bridge or a cloud's metadata service); `true` puts it on the engine's
   * default bridge, for environments that download or call out. The
   * control channel does not depend on it: the runtime reaches the
   * environment through a unix socket in a directory it bind-mounts.
   *
   * By phase, `{ setup, agent?, verifier? }`: the container is made with
   * `setup`'s, and the rollout switches it (the engine connects or
   * disconnects it, from outside) before the agent's turn and before
   * grading; a phase left out has `setup`'s. A switch that fails ends the
   * rollout ungraded.
   *
   * A phase may be an allowlist (`{ allow, deny?, nameServer? }`, the
   * workspace's policy: names, `*.domain`, `host:port`, CIDRs): the
   * container then has loopback alone, and an egress proxy on this host,
   * reached through a relay this host runs in the container's network
   * namespace (127.0.0.1:3128 and :53), is its only way out; the container
   * is made with the proxy variables and a read-only /etc/resolv.conf
   * naming 127.0.0.1. Needs root on this host and the engine on it (the
   * relay enters the container's namespace with nsenter).
   * @default false
   */
  network?: ContainerPhaseNetwork | ContainerNetworkPhases;
  /**
   * The engine networks the container joins, each with the names it is
   * known by there, instead of the engine's default network, in the phases
   * that have a network (`network`): the runtime neither makes nor removes
   * them. For a container among services of its own (Harbor's compose tasks).
   * @default [] (the engine's default network)
   */
  networks?: readonly ContainerNetwork[];
  /**
   * Named volumes mounted into the container; the runtime neither makes nor
   * removes them.
   * @default []
   */
  volumes?: readonly ContainerVolume[];
  /**
   * The user the container's processes run as (`uid:gid` or a name the
   * image knows). Not root: the workspace sandbox inside is made with user
   * namespaces, which need no privilege.
   * @default "65534:65534" (nobody)
   */
  user?: string;
  /**
   * Capabilities the container keeps (`"SETUID"`...): every other one is
   * dropped. For images whose server switches users (Harbor tasks' agent
   * and verifier users).
   * @default []
   */
  capabilities?: readonly string[];
  /**
   * Whether the image's file system is read-only; `/tmp` is a fresh tmpfs
   * either way.
   * @default true
   */
  readOnly?: boolean;
  /**
   * Size of the container's `/tmp` tmpfs, in bytes (counted as memory).
   * @default 1 GiB
   */
  tmpSize?: number;
  /**
   * Errors of the control relay that are not a peer going away (out of
   * file descriptors...).
   * @default dropped
   */
  onError?: (err: unknown) => void;
  /**
   * Extra labels (run id, job id...).
   * @default {}
   */
  labels?: Record<string, string>;
  /**
   * How long a container may take to answer `hello`, in ms.
   * @default 60_000
   */
  readyTimeout?: number;
  /**
   * How long the engine waits after SIGTERM before SIGKILL on release, in ms
   * (whole seconds to the engine: rounded up).
   * @default 5_000
   */
  stopTimeout?: number;
}

interface ContainerInfo {
  State?: { Running?: boolean; ExitCode?: number; Status?: string; OOMKilled?: boolean };
}

/** What the engine says about its own security options. */
interface EngineSecurity {
  apparmor: boolean;
}

/** {@linkcode ContainerRuntimeOptions}, checked, with every default resolved. */
interface ContainerConfig {
  image: string;
  socket: string | undefined;
  env: Record<string, string>;
  cpus: number | undefined;
  memory: number | undefined;
  pids: number;
  network: NetworkPlan;
  networks: readonly ContainerNetwork[];
  volumes: readonly ContainerVolume[];
  user: string;
  capabilities: readonly string[];
  readOnly: boolean;
  tmpSize: number;
  onError: (err: unknown) => void;
  labels: Record<string, string>;
  readyTimeout: number;
  stopTimeout: number;
}

function resolveContainerOptions(image: string, options: ContainerRuntimeOptions): ContainerConfig {
  if (typeof image !== "string" || image === "") {
    throw new TypeError("Cannot create ContainerRuntime: image must be a non-empty string");
  }
  for (const name of ["cpus", "memory", "pids", "tmpSize"] as const) {
    const value = options[name];
    if (value !== undefined && !(typeof value === "number" && value > 0 && isFinite(value))) {
      throw new RangeError(
        `Cannot create ContainerRuntime: ${name} must be a positive number, got ${value}`,
      );
    }
  }
  for (const cap of options.capabilities ?? []) {
    if (typeof cap !== "string" || !/^[A-Z_]+$/.test(cap)) {
      throw new TypeError(
        `Cannot create ContainerRuntime: capability "${cap}" must be a name like "SETUID"`,
      );
    }
  }
  if (options.user !== undefined && (typeof options.user !== "string" || options.user === "")) {
    throw new TypeError("Cannot create ContainerRuntime: user must be a non-empty string");
  }
  return {
    image,
    socket: options.socket,
    env: { ...options.env },
    cpus: options.cpus,
    memory: options.memory,
    pids: options.pids ?? DEFAULT_PIDS,
    network: resolveNetwork(options.network),
    networks: resolveNetworks(options.networks),
    volumes: resolveVolumes(options.volumes),
    user: options.user ?? DEFAULT_USER,
    capabilities: [...(options.capabilities ?? [])],
    readOnly: options.readOnly ?? true,
    tmpSize: options.tmpSize ?? DEFAULT_TMP_SIZE,
    onError: options.onError ?? (() => {}),
    labels: { ...options.labels },
    readyTimeout: options.readyTimeout ?? 60_000,
    stopTimeout: options.stopTimeout ?? 5_000,
  };
}

/** How a container is made beyond the runtime's options: its token, socket directory, engine. */
interface ContainerSetting {
  token: string;
  /** The directory on this host that holds the control socket's directory. */
  dir: string;
  /** The seccomp option: the profile itself (Docker), or a file's path (Podman). */
  seccomp: string;
  podman: boolean;
  apparmor: boolean;
  /** The proxy variables and resolv.conf of a container with an allowlist phase. */
  egress: EgressSetting | null;
}

/** The body of `POST /containers/create`: the image, confined as the runtime's doc says. */
function containerSpec(config: ContainerConfig, setting: ContainerSetting): unknown {
  const env = {
    ...config.env,
    ...setting.egress?.env,
    [SERVE_TOKEN_VAR]: setting.token,
    [CONTROL_SOCKET_VAR]: `${CONTROL_DIR}/control.sock`,
  };
  return {
    Image: config.image,
    User: config.user,
    Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
    Labels: {
      ...config.labels,
      [OWNER_LABEL]: String(Deno.pid),
      [CONTROL_DIR_LABEL]: setting.dir,
      [CREATED_LABEL]: new Date().toISOString(),
    },
    HostConfig: hostConfig(config, setting),
    // The first of its own networks; the others are connected before it starts.
    ...(needsNetwork(config.network) && config.networks.length > 0
      ? {
        NetworkingConfig: {
          EndpointsConfig: { [config.networks[0].name]: { Aliases: config.networks[0].aliases } },
        },
      }
      : {}),
  };
}

function hostConfig(config: ContainerConfig, setting: ContainerSetting): unknown {
  return {
    NetworkMode: needsNetwork(config.network) ? config.networks[0]?.name ?? "bridge" : "none",
    Binds: [
      `${setting.dir}/control:${CONTROL_DIR}`,
      ...(setting.egress ? [setting.egress.bind] : []),
    ],
    ...(config.volumes.length > 0
      ? {
        Mounts: config.volumes.map((v) => ({
          Type: "volume",
          Source: v.source,
          Target: v.target,
          ReadOnly: v.readOnly,
        })),
      }
      : {}),
    CapDrop: ["ALL"],
    ...(config.capabilities.length > 0 ? { CapAdd: [...config.capabilities] } : {}),
    SecurityOpt: [
      "no-new-privileges",
      `seccomp=${setting.seccomp}`,
      // AppArmor's docker-default profile refuses every mount, also in
      // a user namespace: bubblewrap could not build the sandbox.
      ...(setting.apparmor ? ["apparmor=unconfined"] : []),
      // Podman's compatible API ignores MaskedPaths and ReadonlyPaths.
      ...(setting.podman ? ["unmask=/proc/*"] : []),
    ],
    // A fresh /proc (the sandbox's PID namespace) may be mounted only
    // where the container's /proc is not partly covered: the engine's
    // masks over /proc entries (kcore, keys, sys...) must go. They
    // hide what only root may read or write, and nothing here runs as
    // root.
    MaskedPaths: MASKED_PATHS,
    ReadonlyPaths: [],
    ReadonlyRootfs: config.readOnly,
    Tmpfs: { "/tmp": `rw,exec,nosuid,nodev,size=${config.tmpSize},mode=1777` },
    PidsLimit: config.pids,
    ...(config.cpus ? { NanoCpus: Math.round(config.cpus * 1e9) } : {}),
    ...(config.memory ? { Memory: config.memory } : {}),
  };
}

/** What one placement holds, to release (or undo, when placing fails). */
interface Held {
  engine: EngineClient;
  id: string | null;
  dir: string | null;
  relay: Relay | null;
  egress: ContainerEgress | null;
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
export class ContainerRuntime implements RuntimeProvider {
  readonly #config: ContainerConfig;
  #security: Promise<EngineSecurity> | null = null;
  // Placements being made and releases running, and how to release each
  // placement still held: close() waits for all of them, so that a caller
  // that exits after an abort (rollouts release in the background) leaves
  // no container behind.
  readonly #inflight = new Set<Promise<unknown>>();
  readonly #held = new Set<() => Promise<void>>();

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
    return this.#track(this.#place(options));
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

  async #place(options: PlaceOptions): Promise<PlacementWithUrl> {
    const signal = options.signal;
    const held: Held = {
      engine: await EngineClient.open(this.#config.socket, signal),
      id: null,
      dir: null,
      relay: null,
      egress: null,
    };
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
    await this.#checkImage(engine, signal);
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
    return { token: generateToken(), dir, seccomp, podman, apparmor: security.apparmor, egress };
  }

  /** The placement of a ready container; its release removes it, once. */
  #placement(
    held: Held,
    address: ControlAddress,
    port: number,
    enterPhase: Placement["enterPhase"],
  ): PlacementWithUrl {
    const containerId = held.id!;
    let released: Promise<void> | null = null;
    const release = (): Promise<void> => {
      this.#held.delete(release);
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
    const params = { containerId, image: this.#config.image, port };
    return placementOf(address, params, release, enterPhase);
  }

  /** Refuses an image whose server cannot be reached through the socket. */
  async #checkImage(engine: EngineClient, signal: AbortSignal | undefined): Promise<void> {
    const image = this.#config.image;
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
          `Cannot place container: no image "${image}" on ${engine.product}; build it with buildEnvironmentImage (hud image)`,
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

/** Closes what a placement holds on this side: the engine client, the relay, the socket directory. */
async function undo(held: Held): Promise<void> {
  held.engine.close();
  await held.relay?.close();
  await held.egress?.close();
  if (held.dir !== null) await Deno.remove(held.dir, { recursive: true }).catch(() => {});
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
