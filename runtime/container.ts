/**
 * Containers: {@linkcode ContainerRuntime} places an environment image on
 * Docker or Podman (one client for both: the Docker Engine API over the
 * engine's unix socket), {@linkcode buildEnvironmentImage} makes such an
 * image from an environment module with no registry, and
 * {@linkcode removeStaleContainers} cleans up after a run that was killed.
 *
 * @module
 */

import { connect, type Placement, type PlaceOptions, type RuntimeProvider } from "../client.ts";
import { NotReadyError } from "../errors.ts";
import { generateToken, withToken } from "../_internal/auth.ts";
import { abortable, Deadline, delay } from "../_internal/async.ts";
import { EngineClient, EngineError } from "./_engine.ts";

export { EngineError };
import { TarWriter } from "./_tar.ts";
import { checkV8Flags, SERVER_V8_FLAGS } from "./runtime.ts";

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
 * import { connect } from "../client.ts";
 * import { ContainerRuntime } from "./container.ts";
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
        const client = await abortable(
          connect(url, { readyTimeout: 1_000, retryInterval: 100, forward: false }),
          deadline.signal,
        );
        await client.close();
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

/** 404, or Podman's 500 for a container another call removed meanwhile. */
function isGone(err: EngineError): boolean {
  return err.status === 404 || (err.status === 500 && /no such container/i.test(err.message));
}

async function removeContainer(engine: EngineClient, id: string, stopTimeout: number) {
  try {
    await engine.call("POST", `/containers/${id}/stop?t=${stopTimeout}`);
  } catch (err) {
    // 304: already stopped; 404 (or Podman's 500 "no such container"): already gone.
    if (!(err instanceof EngineError) || (err.status !== 304 && !isGone(err))) throw err;
  }
  try {
    await engine.call("DELETE", `/containers/${id}?force=true`);
  } catch (err) {
    // 404: already gone; 409 "already in progress": another cleaner (a
    // second `gc`, the runtime releasing it) is removing it right now.
    const gone = err instanceof EngineError &&
      (isGone(err) || (err.status === 409 && /already in progress/.test(err.message)));
    if (!gone) throw err;
  }
}

/** Options for {@linkcode removeStaleContainers}. */
export interface RemoveStaleOptions {
  /**
   * Engine socket.
   * @default as {@linkcode ContainerRuntimeOptions.socket}
   */
  socket?: string;
  /**
   * Also remove containers of live processes older than this, in ms.
   * @default Infinity (only those whose creating process is gone)
   */
  olderThan?: number;
}

function processAlive(pid: number): boolean {
  try {
    return Deno.statSync(`/proc/${pid}`).isDirectory;
  } catch {
    return false;
  }
}

/**
 * Removes the containers a killed run left behind: those labelled by this
 * runtime whose creating process is gone (on this machine), or older than
 * `olderThan`.
 *
 * @returns the ids removed
 */
export async function removeStaleContainers(options: RemoveStaleOptions = {}): Promise<string[]> {
  using engine = await EngineClient.open(options.socket);
  const filters = encodeURIComponent(JSON.stringify({ label: [OWNER_LABEL] }));
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
    Created: number;
    Labels?: Record<string, string>;
  }[];
  const removed: string[] = [];
  const now = Date.now();
  for (const c of list) {
    const owner = Number(c.Labels?.[OWNER_LABEL]);
    const orphan = !Number.isInteger(owner) || owner === Deno.pid ? false : !processAlive(owner);
    const old = now - c.Created * 1000 > (options.olderThan ?? Infinity);
    if (orphan || old) {
      await removeContainer(engine, c.Id, 0);
      removed.push(c.Id);
    }
  }
  return removed;
}

/** Options for {@linkcode buildEnvironmentImage}. */
export interface BuildImageOptions {
  /**
   * Engine socket.
   * @default as {@linkcode ContainerRuntimeOptions.socket}
   */
  socket?: string;
  /**
   * Base image (one with bash and coreutils, for workspaces); `scratch` holds
   * only Deno and the libraries it links.
   * @default "scratch"
   */
  from?: string;
  /** Labels: `dev.hud.env` and the version are added. */
  labels?: Record<string, string>;
  /** The environment's name, for the `dev.hud.env` label. */
  envName: string;
  /** The environment's version, for the `dev.hud.env.version` label. */
  envVersion: string;
  /**
   * V8 flags the image's server starts with; `[]` keeps V8's defaults.
   * @default {@linkcode SERVER_V8_FLAGS}
   */
  v8Flags?: readonly string[];
  /** Aborts the build. */
  signal?: AbortSignal;
}

const SDK_ROOT = new URL("../", import.meta.url);

async function run(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return new TextDecoder().decode(out.stdout);
}

/** Local files of a module graph, as absolute paths. */
async function localModules(entry: string): Promise<string[]> {
  const info = JSON.parse(await run(Deno.execPath(), ["info", "--json", entry])) as {
    modules: { local?: string; specifier: string }[];
  };
  return info.modules.filter((m) => m.specifier.startsWith("file:") && m.local).map((m) =>
    m.local!
  );
}

function commonDir(paths: string[]): string {
  let common = paths[0].split("/").slice(0, -1);
  for (const p of paths) {
    const parts = p.split("/");
    let i = 0;
    while (i < common.length && common[i] === parts[i]) i++;
    common = common.slice(0, i);
  }
  return common.join("/") || "/";
}

/**
 * Builds an OCI image of an environment module with the local engine, no
 * registry needed: Deno's own binary and the shared libraries it links
 * (`ldd`), the module and its local imports, and this SDK's command line,
 * started as `serve --host 0.0.0.0 --port 8765 --no-auth-without-token`:
 * with the token {@linkcode ContainerRuntime} passes in `HUD_SERVE_TOKEN`,
 * and without authentication when started with none (HUD's DockerRuntime
 * sends none), as HUD's own images serve.
 *
 * @param modulePath the environment module
 * @param tag the image name
 * @param options base image, labels, engine socket
 * @returns the image id
 */
export async function buildEnvironmentImage(
  modulePath: string,
  tag: string,
  options: BuildImageOptions,
): Promise<string> {
  checkV8Flags("the image", options.v8Flags);
  const v8Flags = options.v8Flags ?? SERVER_V8_FLAGS;
  const modulePathAbs = await Deno.realPath(modulePath);
  const cli = new URL("cli.ts", SDK_ROOT).pathname;
  const files = [...new Set([...await localModules(modulePathAbs), ...await localModules(cli)])];
  const root = commonDir(files);
  const rel = (p: string) => p.slice(root === "/" ? 1 : root.length + 1);
  const tar = new TarWriter();
  const from = options.from ?? "scratch";
  if (from === "scratch") {
    // Merged /usr, so that the paths ldd prints resolve.
    for (const d of ["usr/bin", "usr/lib", "usr/lib64", "etc"]) tar.dir(`root/${d}`);
    tar.symlink("root/bin", "usr/bin");
    tar.symlink("root/lib", "usr/lib");
    tar.symlink("root/lib64", "usr/lib64");
    tar.file("root/etc/passwd", new TextEncoder().encode("root:x:0:0:root:/root:/bin/sh\n"));
  }
  tar.dir("root/tmp", 0o1777);
  const deno = await Deno.realPath(Deno.execPath());
  tar.file("root/usr/local/bin/deno", await Deno.readFile(deno), 0o755);
  if (from === "scratch") {
    const libs = (await run("ldd", [deno])).match(/\/[^ :()]+\.so[^ :()]*/g) ?? [];
    for (const lib of new Set(libs)) {
      const real = await Deno.realPath(lib);
      tar.file(
        `root${lib.replace(/^\/(lib|lib64)\//, "/usr/$1/")}`,
        await Deno.readFile(real),
        0o755,
      );
    }
  }
  for (const f of files) tar.file(`root/app/${rel(f)}`, await Deno.readFile(f));
  const labels = {
    ...options.labels,
    [ENV_LABEL]: options.envName,
    "dev.hud.env.version": options.envVersion,
  };
  const cmd = [
    "/usr/local/bin/deno",
    "run",
    "-A",
    ...(v8Flags.length === 0 ? [] : [`--v8-flags=${v8Flags.join(",")}`]),
    `/app/${rel(cli)}`,
    "serve",
    `/app/${rel(modulePathAbs)}`,
    "--host",
    "0.0.0.0",
    "--port",
    String(CONTAINER_PORT),
    "--no-auth-without-token",
  ];
  const dockerfile = [
    `FROM ${from}`,
    "COPY root/ /",
    "ENV DENO_DIR=/tmp/deno HOME=/tmp NO_COLOR=1",
    `LABEL ${
      Object.entries(labels).map(([k, v]) => `${JSON.stringify(k)}=${JSON.stringify(v)}`).join(" ")
    }`,
    `EXPOSE ${CONTAINER_PORT}`,
    `CMD ${JSON.stringify(cmd)}`,
    "",
  ].join("\n");
  tar.file("Dockerfile", new TextEncoder().encode(dockerfile));
  using engine = await EngineClient.open(options.socket, options.signal);
  const res = await engine.raw("POST", `/build?t=${encodeURIComponent(tag)}&rm=1&forcerm=1`, {
    body: tar.bytes(),
    headers: { "content-type": "application/x-tar" },
    signal: options.signal,
  });
  // The build reports as a JSON stream; an error arrives inside it, with status 200.
  const text = await res.text();
  let imageId = "";
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    const msg = JSON.parse(line) as { error?: string; aux?: { ID?: string }; stream?: string };
    if (msg.error) throw new EngineError(`Cannot build image "${tag}": ${msg.error.trim()}`, 500);
    if (msg.aux?.ID) imageId = msg.aux.ID;
  }
  if (imageId === "") {
    const info = await engine.call("GET", `/images/${encodeURIComponent(tag)}/json`) as {
      Id: string;
    };
    imageId = info.Id;
  }
  return imageId;
}
