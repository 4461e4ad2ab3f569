/**
 * {@linkcode SubprocessRuntime}: an environment module served by the
 * command line's `serve` in a child process, one per placement, and
 * {@linkcode SERVER_V8_FLAGS}, the V8 flags servers start with.
 *
 * @module
 */

import { abortable, Deadline, settleWithin } from "../_internal/async.ts";
import { signalGroup } from "../_internal/process.ts";
import {
  type ControlAddress,
  controlAddress,
  generateToken,
  readAnnouncement,
  redactAnnouncement,
  SERVE_TOKEN_VAR,
} from "../_internal/auth.ts";
import { errorMessage } from "../_internal/util.ts";
import { NotReadyError } from "../errors.ts";
import { probeReady } from "./_probe.ts";
import {
  placementOf,
  type PlacementWithUrl,
  type PlaceOptions,
  type RuntimeProvider,
} from "./placement.ts";
import { SERVER_V8_FLAGS } from "../_server/v8_flags.ts";

// The V8 flags servers start with; their one definition is beside the
// command line's `serve`, which gives them to itself.
export { SERVER_V8_FLAGS };

/**
 * Checks a `v8Flags` option: an array of `--name[=value]` strings without
 * commas (they are joined with commas on the command line).
 */
export function checkV8Flags(owner: string, flags: unknown): void {
  if (flags === undefined) return;
  if (!Array.isArray(flags)) {
    throw new TypeError(`Cannot create ${owner}: "v8Flags" must be an array of strings`);
  }
  for (const f of flags) {
    if (typeof f !== "string" || !/^--[A-Za-z0-9_-]+(=[^,\s]*)?$/.test(f)) {
      throw new TypeError(
        `Cannot create ${owner}: v8Flags entry ${JSON.stringify(f)} is not a V8 flag ` +
          `(write it as "--name" or "--name=value", without commas or spaces)`,
      );
    }
  }
}

/** Options for {@linkcode SubprocessRuntime}. */
export interface SubprocessRuntimeOptions {
  /**
   * Which environment of the module to serve: an export name or an
   * environment's name (the CLI's `--env`).
   * @default the module's only environment
   */
  name?: string;
  /**
   * Environment variables for the child, on top of this process's.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * How long the child may take to announce its port, in ms (this includes
   * compiling the module and running the initialize hooks).
   * @default 60_000
   */
  readyTimeout?: number;
  /**
   * How long teardown waits after SIGTERM before sending SIGKILL, in ms.
   * @default 5_000
   */
  killGrace?: number;
  /**
   * Flags for `deno run`, placed before the script: permissions, `--config`...
   * @default ["-A"]
   */
  denoArgs?: string[];
  /**
   * V8 flags for the child (`deno run --v8-flags=...`); `[]` keeps V8's
   * defaults. A `--v8-flags` in `denoArgs` comes later and wins where the
   * two set the same flag.
   * @default {@linkcode SERVER_V8_FLAGS}
   */
  v8Flags?: readonly string[];
  /**
   * Called with every line the child writes, for as long as it runs (the
   * runtime itself never prints).
   */
  onOutput?: (line: string, stream: "stdout" | "stderr") => void;
}

const TAIL_LINES = 50;
const SHOWN_LINES = 20;
const MAX_LINE_CHARS = 2_000;
/** How long to wait for the output pipes to close once the child is gone. */
const DRAIN_MS = 1_000;
/** How long a child that announced its port may take to answer hello. */
const PROBE_TIMEOUT = 10_000;

function checkTimeout(what: string, value: unknown, infiniteOk: boolean): void {
  if (value === undefined) return;
  if (
    typeof value !== "number" || Number.isNaN(value) || value < 0 ||
    (!infiniteOk && !Number.isFinite(value))
  ) {
    throw new RangeError(
      `Cannot create SubprocessRuntime: "${what}" must be a non-negative number, got "${value}"`,
    );
  }
}

/** `path` made absolute against the current directory; URLs stay as they are. */
function absolutePath(path: string): string {
  if (/^[a-zA-Z][a-zA-Z0-9+.-]+:/.test(path)) return path;
  const windows = Deno.build.os === "windows";
  if (windows ? /^([a-zA-Z]:)?[\\/]/.test(path) : path.startsWith("/")) return path;
  return `${Deno.cwd()}${windows ? "\\" : "/"}${path}`;
}

/**
 * An environment module served in a child process, one child per placement:
 * `deno run -A cli.ts serve <path> --port 0 [--env NAME]` in a process group
 * (session) of its own. Each child gets a fresh token through its
 * environment (`HUD_SERVE_TOKEN`, never its arguments), and the placement's
 * address carries it. Placing waits for the child's `HUD_SERVE_PORT=` line;
 * releasing the placement ends the child's whole process group: SIGTERM
 * (the child stops serving and runs its shutdown hooks), SIGKILL after the
 * grace period, and SIGKILL for any process of the group still there when
 * the child has exited. Processes that the environment's hooks spawn are in
 * that group unless they start a session of their own.
 *
 * The child's output is read for as long as it runs; the last lines are
 * kept for error messages and every line goes to `onOutput`. The child's
 * standard input stays open until teardown: should this process die
 * without tearing down, the child sees end of file and stops serving.
 *
 * On Windows there are no process groups: only the child is ended.
 *
 * @example
 * ```ts ignore
 * import { connect } from "../mod.ts";
 * import { SubprocessRuntime } from "./mod.ts";
 *
 * const runtime = new SubprocessRuntime("./my_env.ts", { name: "robolab" });
 * await using placed = await runtime.place();
 * await using client = await connect(placed);
 * console.log(await client.listTasks());
 * ```
 */
export class SubprocessRuntime implements RuntimeProvider {
  readonly #config: SubprocessConfig;

  /**
   * Serves the environment module at `path` in child processes.
   * @param path the module's file path (relative to the current directory
   *   at construction) or URL
   * @throws {TypeError} for a bad path or `env` that is not an object of strings
   * @throws {RangeError} for a negative timeout or an infinite grace period
   */
  constructor(path: string, options: SubprocessRuntimeOptions = {}) {
    this.#config = resolveSubprocessOptions(path, options);
  }

  /**
   * Spawns a child serving the environment and waits for its port.
   *
   * @returns the placement: its address is `127.0.0.1`, the child's port
   *   and its token; `params` holds the child's `pid` and `port`
   * @throws {Error} when the child exits before serving (the message gives
   *   the exit code and the last lines of output)
   * @throws {NotReadyError} when the child does not announce a port within
   *   the ready timeout (the message gives the last lines of output)
   * @throws the signal's reason when `signal` aborts. The child is ended
   *   first, as at teardown: a child busy in its initialize hooks finishes
   *   them and runs its shutdown hooks, or is killed after `killGrace`
   */
  async place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    options.signal?.throwIfAborted();
    const config = this.#config;
    // The author's own HUD_SERVE_TOKEN wins; otherwise one per child.
    const token = config.env[SERVE_TOKEN_VAR] ?? generateToken();
    const child = spawnServer(config, token);
    using deadline = new Deadline(config.readyTimeout, options.signal, "placing");
    const port = await this.#announced(child, deadline.signal, options.signal);
    const address = controlAddress("127.0.0.1", port, token);
    await this.#answers(child, address, deadline.signal, options.signal);
    const params = Object.freeze({ pid: child.pid, port });
    return placementOf(address, params, () => child.stop(config.killGrace));
  }

  /** The port the child announced; the child is stopped when it exits first or time runs out. */
  async #announced(
    child: ServerProcess,
    deadline: AbortSignal,
    signal: AbortSignal | undefined,
  ): Promise<number> {
    const { readyTimeout, killGrace } = this.#config;
    let outcome: { port: number } | { status: Deno.CommandStatus };
    try {
      outcome = await abortable(
        Promise.race([
          child.announced.then((port) => ({ port })),
          child.status.then((status) => ({ status })),
        ]),
        deadline,
      );
    } catch (err) {
      await child.stop(killGrace);
      if (signal?.aborted) throw signal.reason;
      if (deadline.aborted) {
        throw new NotReadyError(
          `${this.#what}: the server did not announce its port within ${readyTimeout} ms${child.output()}`,
          { cause: err },
        );
      }
      throw err;
    }
    if ("port" in outcome) return outcome.port;
    await child.stop(killGrace);
    const how = outcome.status.signal
      ? `was killed by ${outcome.status.signal}`
      : `exited with code ${outcome.status.code}`;
    throw new Error(`${this.#what}: the server ${how} before serving${child.output()}`);
  }

  /**
   * The port line says the child listens; a hello with the token says it is
   * the server we started and that it takes our token.
   */
  async #answers(
    child: ServerProcess,
    address: ControlAddress,
    deadline: AbortSignal,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    try {
      await probeReady(address, { readyTimeout: PROBE_TIMEOUT, signal: deadline });
    } catch (err) {
      await child.stop(this.#config.killGrace);
      if (signal?.aborted) throw signal.reason;
      throw new NotReadyError(
        `${this.#what}: the server announced port ${address.port} but did not answer hello: ${
          errorMessage(err)
        }${child.output()}`,
        { cause: err },
      );
    }
  }

  get #what(): string {
    return `Cannot place environment "${this.#config.path}"`;
  }
}

/** {@linkcode SubprocessRuntimeOptions}, checked, with every default resolved. */
interface SubprocessConfig {
  /** The path as given, for messages. */
  path: string;
  /** The module's absolute path or URL. */
  module: string;
  name: string | undefined;
  env: Record<string, string>;
  readyTimeout: number;
  killGrace: number;
  denoArgs: readonly string[];
  v8Flags: readonly string[];
  onOutput: SubprocessRuntimeOptions["onOutput"];
}

function resolveSubprocessOptions(
  path: string,
  options: SubprocessRuntimeOptions,
): SubprocessConfig {
  if (typeof path !== "string" || path === "") {
    throw new TypeError("Cannot create SubprocessRuntime: path must be a non-empty string");
  }
  const env = options.env;
  if (
    env !== undefined &&
    (typeof env !== "object" || env === null ||
      Object.values(env).some((v) => typeof v !== "string"))
  ) {
    throw new TypeError(
      'Cannot create SubprocessRuntime: "env" must be an object of environment variables (strings); pick the environment with "name"',
    );
  }
  if (options.name !== undefined && (typeof options.name !== "string" || options.name === "")) {
    throw new TypeError('Cannot create SubprocessRuntime: "name" must be a non-empty string');
  }
  if (options.denoArgs !== undefined && !Array.isArray(options.denoArgs)) {
    throw new TypeError('Cannot create SubprocessRuntime: "denoArgs" must be an array');
  }
  checkV8Flags("SubprocessRuntime", options.v8Flags);
  checkTimeout("readyTimeout", options.readyTimeout, true);
  checkTimeout("killGrace", options.killGrace, false);
  return {
    path,
    module: absolutePath(path),
    name: options.name,
    env: { ...env },
    readyTimeout: options.readyTimeout ?? 60_000,
    killGrace: options.killGrace ?? 5_000,
    denoArgs: [...(options.denoArgs ?? ["-A"])],
    v8Flags: [...(options.v8Flags ?? SERVER_V8_FLAGS)],
    onOutput: options.onOutput,
  };
}

/**
 * `deno run cli.ts serve` for the module, in a session of its own, with the
 * token in its environment (never its arguments).
 */
function spawnServer(config: SubprocessConfig, token: string): ServerProcess {
  const args = [
    "run",
    // A bare --v8-flags keeps V8's defaults: `serve` adds its own flags
    // only when none were chosen (_server/v8_flags.ts).
    config.v8Flags.length === 0 ? "--v8-flags" : `--v8-flags=${config.v8Flags.join(",")}`,
    ...config.denoArgs,
    new URL("../cli.ts", import.meta.url).href,
    "serve",
    "--host=127.0.0.1",
    "--port=0",
    // The child stops when its stdin closes: it never outlives this process.
    "--stop-on-eof",
    ...(config.name === undefined ? [] : [`--env=${config.name}`]),
    "--",
    config.module,
  ];
  const command = new Deno.Command(Deno.execPath(), {
    args,
    env: { ...config.env, [SERVE_TOKEN_VAR]: token },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
    // A session of its own (setsid), so that teardown can signal the group.
    detached: true,
  });
  return new ServerProcess(command.spawn(), config.onOutput);
}

/** A spawned `serve` child: its output readers, its port, its teardown. */
class ServerProcess {
  readonly #child: Deno.ChildProcess;
  readonly #onOutput: SubprocessRuntimeOptions["onOutput"];
  readonly #tail: string[] = [];
  readonly #announced: PromiseWithResolvers<number> = Promise.withResolvers();
  readonly #readers: ReadableStreamDefaultReader<Uint8Array>[] = [];
  readonly #reading: Promise<unknown>;
  readonly #status: Promise<Deno.CommandStatus>;
  #exited = false;
  #stopping: Promise<void> | null = null;

  constructor(child: Deno.ChildProcess, onOutput: SubprocessRuntimeOptions["onOutput"]) {
    this.#child = child;
    this.#onOutput = onOutput;
    this.#status = child.status.then((status) => {
      this.#exited = true;
      return status;
    });
    this.#reading = Promise.allSettled([
      this.#read(child.stdout, "stdout"),
      this.#read(child.stderr, "stderr"),
    ]);
  }

  get pid(): number {
    return this.#child.pid;
  }

  /** Resolves with the announced port; never rejects. */
  get announced(): Promise<number> {
    return this.#announced.promise;
  }

  get status(): Promise<Deno.CommandStatus> {
    return this.#status;
  }

  /** The last lines of output, as a message suffix. */
  output(): string {
    const lines = this.#tail.slice(-SHOWN_LINES);
    if (lines.length === 0) return "; it wrote no output";
    return `; last output:\n${lines.map((l) => `  | ${l}`).join("\n")}`;
  }

  async #read(stream: ReadableStream<Uint8Array>, which: "stdout" | "stderr"): Promise<void> {
    const reader = stream.getReader();
    this.#readers.push(reader);
    const decoder = new TextDecoder();
    let pending = "";
    try {
      while (true) {
        const { value, done } = await reader.read();
        if (done) break;
        pending += decoder.decode(value, { stream: true });
        let nl: number;
        while ((nl = pending.indexOf("\n")) >= 0) {
          this.#line(pending.slice(0, nl), which);
          pending = pending.slice(nl + 1);
        }
        // A line that never ends must not grow without bound.
        if (pending.length > MAX_LINE_CHARS * 8) {
          this.#line(pending, which);
          pending = "";
        }
      }
      pending += decoder.decode();
    } catch {
      // Cancelled at teardown, or the pipe broke: nothing more to read.
    } finally {
      reader.releaseLock();
    }
    if (pending !== "") this.#line(pending, which);
  }

  #line(raw: string, which: "stdout" | "stderr"): void {
    let line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
    if (which === "stdout") {
      // A child that made its own token announces it; it goes no further.
      line = redactAnnouncement(line);
      const said = readAnnouncement(line);
      if (said !== null && "port" in said) this.#announced.resolve(said.port);
    }
    this.#tail.push(line.length > MAX_LINE_CHARS ? `${line.slice(0, MAX_LINE_CHARS)}...` : line);
    if (this.#tail.length > TAIL_LINES) this.#tail.shift();
    try {
      this.#onOutput?.(line, which);
    } catch {
      // A failing observer must not stop the draining that keeps the child alive.
    }
  }

  #signalGroup(signal: Deno.Signal): void {
    signalGroup(this.pid, signal);
  }

  /** Ends the process group and waits for the child and its output. Idempotent. */
  stop(grace: number): Promise<void> {
    this.#stopping ??= this.#stop(grace);
    return this.#stopping;
  }

  async #stop(grace: number): Promise<void> {
    if (!this.#exited) {
      this.#signalGroup("SIGTERM");
      await settleWithin(this.#status, grace);
      if (!this.#exited) this.#signalGroup("SIGKILL");
    }
    await this.#status;
    await this.#child.stdin.close().catch(() => {});
    // Whatever the group still holds goes with the child. The child is
    // reaped, but its pid stays reserved while the group has members.
    if (Deno.build.os !== "windows") this.#signalGroup("SIGKILL");
    // A process outside the group may still hold the pipes open.
    if (!(await settleWithin(this.#reading, DRAIN_MS))) {
      await Promise.allSettled(this.#readers.map((r) => r.cancel()));
      await this.#reading;
    }
  }
}
