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

/** The port an environment image serves on inside its container. */
export const CONTAINER_PORT = 8765;
/** Label on every container this runtime starts (value: the creating process's pid). */
export const OWNER_LABEL = "dev.hud.owner";
/** Label on every environment image: the environment's name. */
export const ENV_LABEL = "dev.hud.env";

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
  /** Memory limit, in bytes. */
  memory?: number;
  /** Most processes in the container. */
  pids?: number;
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
  NetworkSettings?: { Ports?: Record<string, { HostIp: string; HostPort: string }[] | null> };
}

/**
 * Places an environment image in a container for each rollout: creates and
 * starts it with a fresh token and the given limits, publishes its control
 * port on 127.0.0.1 at a random host port, and waits for the protocol
 * handshake (the engine's proxy accepts connections before the server
 * listens, so a TCP connect proves nothing). Releasing the placement stops
 * and removes the container; when the container died while placed, the
 * release rejects with its exit code and last output (a rollout records it).
 *
 * @example
 * ```ts ignore
 * import { probeReady } from "../runtime/_probe.ts";
 * import { ContainerRuntime } from "./mod.ts";
 *
 * await using client = await connect(new ContainerRuntime("robolab:latest"));
 * console.log(client.manifest.env.name);
 * ```
 */
export class ContainerRuntime implements RuntimeProvider {
  readonly #image: string;
  readonly #options: ContainerRuntimeOptions;

  /**
   * A runtime for `image`.
   *
   * @param image an image made by {@linkcode buildEnvironmentImage} (or one serving the protocol on 8765)
   * @param options engine socket, environment, limits, labels
   * @throws {TypeError} for an empty image name
   */
  constructor(image: string, options: ContainerRuntimeOptions = {}) {
    if (typeof image !== "string" || image === "") {
      throw new TypeError("Cannot create ContainerRuntime: image must be a non-empty string");
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
   */
  async place(options: PlaceOptions = {}): Promise<Placement> {
    const opts = this.#options;
    const engine = await EngineClient.open(opts.socket, options.signal);
    const token = generateToken();
    let id: string | null = null;
    try {
      const env = { ...opts.env, HUD_SERVE_TOKEN: token };
      const created = await engine.call("POST", "/containers/create", {
        Image: this.#image,
        Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
        Labels: {
          ...opts.labels,
          [OWNER_LABEL]: String(Deno.pid),
          "dev.hud.created": new Date().toISOString(),
        },
        ExposedPorts: { [`${CONTAINER_PORT}/tcp`]: {} },
        HostConfig: {
          PortBindings: { [`${CONTAINER_PORT}/tcp`]: [{ HostIp: "127.0.0.1", HostPort: "" }] },
          ...(opts.cpus ? { NanoCpus: Math.round(opts.cpus * 1e9) } : {}),
          ...(opts.memory ? { Memory: opts.memory } : {}),
          ...(opts.pids ? { PidsLimit: opts.pids } : {}),
        },
      }, options.signal) as { Id: string };
      id = created.Id;
      await engine.call("POST", `/containers/${id}/start`, undefined, options.signal);
      const port = await this.#hostPort(engine, id);
      const url = withToken(`tcp://127.0.0.1:${port}`, token);
      await this.#waitReady(engine, id, url, options.signal);
      const containerId = id;
      let released: Promise<void> | null = null;
      return {
        url,
        params: { containerId, image: this.#image, port },
        [Symbol.asyncDispose]: () => {
          released ??= (async () => {
            try {
              // A container that died while placed: say how, after removing it.
              const died = await this.#deathNote(engine, containerId);
              await removeContainer(engine, containerId, opts.stopTimeout ?? 5);
              if (died !== null) throw new Error(died);
            } finally {
              engine.close();
            }
          })();
          return released;
        },
      };
    } catch (err) {
      if (id !== null) await removeContainer(engine, id, 0).catch(() => {});
      engine.close();
      throw err;
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

  async #hostPort(engine: EngineClient, id: string): Promise<number> {
    const info = await engine.call("GET", `/containers/${id}/json`) as ContainerInfo;
    const binding = info.NetworkSettings?.Ports?.[`${CONTAINER_PORT}/tcp`]?.[0];
    const port = Number(binding?.HostPort);
    if (!Number.isInteger(port) || port <= 0) {
      const logs = await engine.logs(id).catch(() => "");
      throw new NotReadyError(
        `Cannot place container of "${this.#image}": no published port (state ${
          info.State?.Status ?? "unknown"
        }, exit code ${info.State?.ExitCode ?? "?"})${lastLines(logs)}`,
      );
    }
    return port;
  }

  async #waitReady(
    engine: EngineClient,
    id: string,
    url: string,
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
          throw new NotReadyError(
            `Container of "${this.#image}" not ready after ${readyTimeout} ms (${attempt} attempts)${
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

function lastLines(logs: string): string {
  const lines = logs.trim().split("\n").filter((l) => l !== "").slice(-5);
  return lines.length === 0 ? "" : `; last output: ${lines.join(" | ")}`;
}
