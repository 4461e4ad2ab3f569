// How ContainerRuntime makes a container: its options checked once into a
// complete config record, and the body of `POST /containers/create` (the
// confinement ContainerRuntime's doc describes).

import { SERVE_TOKEN_VAR } from "../_internal/auth.ts";
import {
  type ContainerNetwork,
  type ContainerNetworkPhases,
  type ContainerPhaseNetwork,
  type ContainerVolume,
  needsNetwork,
  type NetworkPlan,
  resolveNetwork,
  resolveNetworks,
  resolveVolumes,
} from "./_container_network.ts";
import type { EgressSetting } from "./_container_egress.ts";
import { CONTROL_DIR_LABEL, CONTROL_SOCKET_VAR, CREATED_LABEL, OWNER_LABEL } from "./_constants.ts";

/** Where the runtime's control socket directory appears inside a container. */
export const CONTROL_DIR = "/tmp/.hud-control";
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

/** {@linkcode ContainerRuntimeOptions}, checked, with every default resolved. */
export interface ContainerConfig {
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

export function resolveContainerOptions(
  image: string,
  options: ContainerRuntimeOptions,
): ContainerConfig {
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
export interface ContainerSetting {
  /** The image: the runtime's, or a snapshot's (by id). */
  image: string;
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
export function containerSpec(config: ContainerConfig, setting: ContainerSetting): unknown {
  const env = {
    ...config.env,
    ...setting.egress?.env,
    [SERVE_TOKEN_VAR]: setting.token,
    [CONTROL_SOCKET_VAR]: `${CONTROL_DIR}/control.sock`,
  };
  return {
    Image: setting.image,
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
