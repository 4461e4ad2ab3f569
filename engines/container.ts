/**
 * {@linkcode ContainerRuntime} places an environment image on Docker or
 * Podman (one client for both: the Docker Engine API over the engine's unix
 * socket), one container per placement.
 *
 * @module
 */

import { probeReady } from "../runtime/_probe.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { NotReadyError } from "../errors.ts";
import { generateToken, withToken } from "../_internal/auth.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { EngineClient, EngineError, removeContainer } from "./_engine.ts";
import { Relay } from "./_relay.ts";
import { seccompProfile } from "./_seccomp.ts";

/** The port an environment image serves on inside its container. */
export const CONTAINER_PORT = 8765;
/** Label on every container this runtime starts (value: the creating process's pid). */
export const OWNER_LABEL = "dev.hud.owner";
/** Label on every environment image: the environment's name. */
export const ENV_LABEL = "dev.hud.env";
/**
 * Label on images whose server can be reached through a unix socket (value
 * `socket`): those {@linkcode buildEnvironmentImage} makes.
 */
export const CONTROL_LABEL = "dev.hud.control";

/**
 * Label on every container this runtime starts: the directory on this host
 * that holds its control socket, for {@linkcode removeStaleContainers} to
 * remove after a killed run.
 */
export const CONTROL_DIR_LABEL = "dev.hud.control.dir";
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
   * @default false
   */
  network?: boolean;
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
   * Seconds the engine waits after SIGTERM before SIGKILL on release.
   * @default 5
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
  readonly #image: string;
  readonly #options: ContainerRuntimeOptions;
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
    this.#image = image;
    this.#options = options;
  }

  /** The image placed. */
  get image(): string {
    return this.#image;
  }

  /**
   * Starts a container and waits until its environment answers `hello`.
   * @throws {NotReadyError} when it exits or stays silent before it is ready, with its exit code and last output
   * @throws {TypeError} for an image not made by {@linkcode buildEnvironmentImage}
   */
  place(options: PlaceOptions = {}): Promise<Placement> {
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

  async #place(options: PlaceOptions): Promise<Placement> {
    const opts = this.#options;
    const engine = await EngineClient.open(opts.socket, options.signal);
    const token = generateToken();
    let id: string | null = null;
    let dir: string | null = null;
    let relay: Relay | null = null;
    try {
      await this.#checkImage(engine, options.signal);
      const security = await (this.#security ??= engineSecurity(engine));
      // The socket's directory: reachable only through ours (0700), and
      // writable by the container's user, whoever that is on this host.
      dir = await Deno.makeTempDir({ prefix: "hud-container-" });
      const shared = `${dir}/control`;
      await Deno.mkdir(shared);
      await Deno.chmod(shared, 0o777);
      // Docker takes the profile itself; Podman's compatible API, a path on
      // its host (this one: the engine is on this machine's socket).
      const podman = engine.product.startsWith("Podman");
      let seccomp = seccompProfile();
      if (podman) {
        await Deno.writeTextFile(`${dir}/seccomp.json`, seccomp, { mode: 0o600 });
        seccomp = `${dir}/seccomp.json`;
      }
      const env = {
        ...opts.env,
        HUD_SERVE_TOKEN: token,
        HUD_CONTROL_SOCKET: `${CONTROL_DIR}/control.sock`,
      };
      const created = await engine.call("POST", "/containers/create", {
        Image: this.#image,
        User: opts.user ?? DEFAULT_USER,
        Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
        Labels: {
          ...opts.labels,
          [OWNER_LABEL]: String(Deno.pid),
          [CONTROL_DIR_LABEL]: dir,
          "dev.hud.created": new Date().toISOString(),
        },
        HostConfig: {
          NetworkMode: opts.network ? "bridge" : "none",
          Binds: [`${shared}:${CONTROL_DIR}`],
          CapDrop: ["ALL"],
          ...(opts.capabilities?.length ? { CapAdd: [...opts.capabilities] } : {}),
          SecurityOpt: [
            "no-new-privileges",
            `seccomp=${seccomp}`,
            // AppArmor's docker-default profile refuses every mount, also in
            // a user namespace: bubblewrap could not build the sandbox.
            ...(security.apparmor ? ["apparmor=unconfined"] : []),
            // Podman's compatible API ignores MaskedPaths and ReadonlyPaths.
            ...(podman ? ["unmask=/proc/*"] : []),
          ],
          // A fresh /proc (the sandbox's PID namespace) may be mounted only
          // where the container's /proc is not partly covered: the engine's
          // masks over /proc entries (kcore, keys, sys...) must go. They
          // hide what only root may read or write, and nothing here runs as
          // root.
          MaskedPaths: MASKED_PATHS,
          ReadonlyPaths: [],
          ReadonlyRootfs: opts.readOnly ?? true,
          Tmpfs: {
            "/tmp": `rw,exec,nosuid,nodev,size=${opts.tmpSize ?? DEFAULT_TMP_SIZE},mode=1777`,
          },
          PidsLimit: opts.pids ?? DEFAULT_PIDS,
          ...(opts.cpus ? { NanoCpus: Math.round(opts.cpus * 1e9) } : {}),
          ...(opts.memory ? { Memory: opts.memory } : {}),
        },
        // Not aborted halfway: the engine would make the container and we
        // would not know its id to remove it. An abort is seen just after.
      }) as { Id: string };
      id = created.Id;
      options.signal?.throwIfAborted();
      relay = new Relay(
        { transport: "tcp", hostname: "127.0.0.1", port: 0 },
        { transport: "unix", path: `${shared}/control.sock` },
        opts.onError ?? (() => {}),
      );
      await engine.call("POST", `/containers/${id}/start`, undefined, options.signal);
      const port = (relay.addr as Deno.NetAddr).port;
      const url = withToken(`tcp://127.0.0.1:${port}`, token);
      await this.#waitReady(engine, id, url, `${shared}/control.sock`, options.signal);
      const containerId = id;
      const placed = { relay, dir };
      let released: Promise<void> | null = null;
      const release = (): Promise<void> => {
        this.#held.delete(release);
        released ??= this.#track((async () => {
          try {
            // A container that died while placed: say how, after removing it.
            const died = await this.#deathNote(engine, containerId);
            await removeContainer(engine, containerId, opts.stopTimeout ?? 5);
            if (died !== null) throw new Error(died);
          } finally {
            engine.close();
            await placed.relay.close();
            await Deno.remove(placed.dir, { recursive: true }).catch(() => {});
          }
        })());
        return released;
      };
      this.#held.add(release);
      return {
        url,
        params: { containerId, image: this.#image, port },
        [Symbol.asyncDispose]: release,
      };
    } catch (err) {
      if (id !== null) await removeContainer(engine, id, 0).catch(() => {});
      engine.close();
      await relay?.close();
      if (dir !== null) await Deno.remove(dir, { recursive: true }).catch(() => {});
      throw err;
    }
  }

  /** Refuses an image whose server cannot be reached through the socket. */
  async #checkImage(engine: EngineClient, signal: AbortSignal | undefined): Promise<void> {
    let info: { Config?: { Labels?: Record<string, string> | null } };
    try {
      info = await engine.call(
        "GET",
        `/images/${encodeURIComponent(this.#image)}/json`,
        undefined,
        signal,
      ) as typeof info;
    } catch (err) {
      if (err instanceof EngineError && err.status === 404) {
        throw new EngineError(
          `Cannot place container: no image "${this.#image}" on ${engine.product}; build it with buildEnvironmentImage (hud image)`,
          404,
          { cause: err },
        );
      }
      throw err;
    }
    if (info.Config?.Labels?.[CONTROL_LABEL] !== "socket") {
      throw new TypeError(
        `Cannot place container: image "${this.#image}" has no "${CONTROL_LABEL}=socket" label, so its server cannot be reached without a network; rebuild it with buildEnvironmentImage (hud image)`,
      );
    }
  }

  /** null while the container runs; else how it ended, with its last output. */
  async #deathNote(engine: EngineClient, id: string): Promise<string | null> {
    let info: ContainerInfo;
    try {
      info = await engine.call("GET", `/containers/${id}/json`) as ContainerInfo;
    } catch (err) {
      if (err instanceof EngineError && err.status === 404) {
        return `Container ${id.slice(0, 12)} of "${this.#image}" was removed while placed`;
      }
      throw err;
    }
    if (info.State?.Running) return null;
    const logs = await engine.logs(id).catch(() => "");
    return `Container ${id.slice(0, 12)} of "${this.#image}" died while placed: ${
      info.State?.OOMKilled ? "out of memory, " : ""
    }exit code ${info.State?.ExitCode ?? "?"}${lastLines(logs)}`;
  }

  async #waitReady(
    engine: EngineClient,
    id: string,
    url: string,
    socket: string,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const readyTimeout = this.#options.readyTimeout ?? 60_000;
    using deadline = new Deadline(readyTimeout, signal, "container ready");
    let lastError: unknown;
    for (let attempt = 1;; attempt++) {
      const info = await engine.call("GET", `/containers/${id}/json`) as ContainerInfo;
      if (!info.State?.Running) {
        const logs = await engine.logs(id).catch(() => "");
        throw new NotReadyError(
          `Container of "${this.#image}" exited with code ${
            info.State?.ExitCode ?? "?"
          } before it was ready${lastLines(logs)}`,
        );
      }
      try {
        await probeReady(url, { readyTimeout: 1_000, retryInterval: 100, signal: deadline.signal });
        return;
      } catch (err) {
        lastError = err;
        if (signal?.aborted) throw signal.reason;
        if (deadline.signal.aborted) {
          const logs = await engine.logs(id).catch(() => "");
          // The socket never appeared here: the engine does not share this
          // machine's file system (a VM, another host).
          const missing = !exists(socket)
            ? `; the control socket never appeared at ${socket}: the engine must run on this machine`
            : "";
          throw new NotReadyError(
            `Container of "${this.#image}" not ready after ${readyTimeout} ms (${attempt} attempts)${missing}${
              lastLines(logs)
            }`,
            { cause: lastError },
          );
        }
      }
      await delay(100, deadline.signal).catch(() => {});
    }
  }
}

/** Whether the engine confines containers with AppArmor (its /info says). */
async function engineSecurity(engine: EngineClient): Promise<EngineSecurity> {
  const info = await engine.call("GET", "/info") as { SecurityOptions?: string[] | null };
  const options = info.SecurityOptions ?? [];
  return { apparmor: options.some((o) => /(^|name=)apparmor\b/.test(o)) };
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

function lastLines(logs: string): string {
  const lines = logs.trim().split("\n").filter((l) => l !== "").slice(-5);
  return lines.length === 0 ? "" : `; last output: ${lines.join(" | ")}`;
}
