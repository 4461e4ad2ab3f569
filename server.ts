/**
 * The control server: serves an {@linkcode Environment} over the HUD control
 * protocol (`hud/1.0`), JSON-RPC over newline-delimited JSON on one TCP port.
 *
 * @example Bind on a free port and talk to it
 * ```ts
 * import { bind, connect, Environment } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo");
 * env.template({ id: "hello" }, async function* () {
 *   const answer = yield "Say hello";
 *   yield answer === "hello" ? 1 : 0;
 * });
 * await using server = bind(env);
 * await using client = await connect(server);
 * assert.deepEqual(await client.startTask("hello"), { prompt: "Say hello" });
 * assert.equal((await client.grade({ answer: "hello" })).score, 1);
 * ```
 *
 * @module
 */

import { markServing, servingWhileLoaded } from "./_internal/serving.ts";
import type { Environment } from "./env.ts";
import type { TaskError } from "./errors.ts";
import { MAX_JSON_DEPTH, PRE_AUTH_MAX_JSON_DEPTH } from "./_internal/framing.ts";
import { openFileLimit } from "./_internal/io.ts";
import {
  type ControlAddress,
  generateToken,
  portLine,
  SERVE_TOKEN_VAR,
  tokenFromEnv,
  tokenLine,
  tokenProblem,
} from "./_internal/auth.ts";
import { isLoopback } from "./_internal/net.ts";
import { ControlServer, type ServerConfig } from "./_server/control.ts";

/** Default largest accepted frame: 16 MiB. */
export const DEFAULT_MAX_FRAME_BYTES: number = 16 * 1024 * 1024;
/** Default lifetime of a parked task: 1 hour. */
export const DEFAULT_PARKED_TTL_MS: number = 60 * 60 * 1000;
/** Default cap on parked tasks. */
export const DEFAULT_MAX_PARKED: number = 10_000;
/**
 * Cap on connections when the open-files limit cannot be read (reading
 * `/proc/self/limits` needs `--allow-all`); otherwise the cap follows the
 * limit, see {@linkcode defaultMaxConnections}.
 */
export const DEFAULT_MAX_CONNECTIONS: number = 10_000;
/**
 * Default cap on connections that have not sent their first frame (with
 * authentication: that have not authenticated), a pool of their own.
 */
export const DEFAULT_MAX_PENDING_CONNECTIONS: number = 1024;
/** Default time a new connection has to send its first complete frame: 10 s. */
export const DEFAULT_FIRST_FRAME_TIMEOUT_MS: number = 10_000;
/**
 * Largest first frame of a connection that has not authenticated yet: a
 * `hello` or `tunnel.open` is small, and a stranger must not make the
 * server hold megabytes.
 */
export const PRE_AUTH_MAX_FRAME_BYTES: number = 64 * 1024;

/** Options for {@linkcode bind}. */
export interface BindOptions {
  /**
   * Interface to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Require the token: a connection's first frame must be a `hello` or
   * `tunnel.open` whose `params.token` is the server's token, else it gets
   * one error and is closed. `false` keeps the unauthenticated protocol of
   * HUD's Python SDK: anyone who can reach the port can use the environment
   * (and does not get to adopt parked tasks). Refused together with a
   * `hostname` that is not loopback, or resolves to an address that is not
   * (`x.localhost` mapped to 0.0.0.0), unless `insecureListen` is set.
   * @default true
   */
  auth?: boolean;
  /**
   * The token (at least 32 visible ASCII characters; a random 256-bit
   * secret is best). Read `url` (which carries it) to hand it to clients.
   * @default `HUD_SERVE_TOKEN` from the environment, else a fresh random one
   */
  token?: string;
  /**
   * With `auth: false`, allow a non-loopback `hostname` anyway; `onError`
   * then gets one warning saying what that exposes.
   * @default false
   */
  insecureListen?: boolean;
  /**
   * Most connections (control sessions, tunnels, and each tunnel's backend
   * connection) held at once; one more is accepted, answered with one error
   * (`-32002`, with its first request's id when it sends one promptly), and
   * closed. By default the cap follows what the process can hold: the
   * open-files limit (which Deno raises to the hard limit as it starts)
   * less a reserve for everything else the process does.
   * @default the open-files limit less a quarter of it (at least 128, at most 1024 descriptors)
   */
  maxConnections?: number;
  /**
   * Most connections that have not sent their first frame (with
   * authentication: that have not shown the token) held at once, within
   * `maxConnections`. When this pool is full, the oldest of them that has
   * waited half the `firstFrameTimeout` is closed to make room. At the whole
   * cap, the oldest of them that has waited 1 s (the first-frame deadline
   * under pressure) makes room for a newcomer, and while none has, new
   * connections wait in the kernel's queue rather than being refused:
   * connections that have spoken are never refused because of them. One
   * turned away before authenticating (a wrong token, a bad first frame)
   * gives its slot back at once. Each also has `firstFrameTimeout`.
   * @default 1024, and at most a quarter of maxConnections
   */
  maxPendingConnections?: number;
  /**
   * Bytes of unfinished frames buffered across all connections; a frame
   * that would need more gets `-32002` and its connection is closed.
   * @default 4 × maxFrameBytes (64 MiB)
   */
  maxBufferedBytes?: number;
  /**
   * Deepest nesting of arrays and objects in a frame, checked on the raw
   * bytes before parsing; a deeper frame gets `-32600`. With a token
   * required, a connection's first frame may nest at most 64 levels (or
   * this, if lower).
   * @default 1000, what HUD's server reads, well within the stack
   */
  maxJsonDepth?: number;
  /**
   * How long a new connection has to send its first complete frame, in
   * milliseconds; then it gets one error and is closed.
   * @default 10_000
   */
  firstFrameTimeout?: number;
  /**
   * Most tasks parked at once; when full, `tasks.start` is refused (`-32002`)
   * and a task whose connection drops is cancelled rather than parked.
   * @default 10_000
   */
  maxParked?: number;
  /**
   * Port to listen on; 0 picks a free one.
   * @default 0
   */
  port?: number;
  /** Aborting it shuts the server down. */
  signal?: AbortSignal;
  /** Called once the listener is bound. */
  onListen?: (addr: Deno.NetAddr) => void;
  /** Called with unexpected errors (never for a peer going away). */
  onError?: (error: unknown) => void;
  /**
   * Called with each error of task code (a template's setup or grading
   * that threw), after the client got its error reply; `hud serve` logs
   * them with the file and line of the environment's code.
   * @default none
   */
  onTaskError?: (error: TaskError) => void;
  /**
   * Largest accepted frame in bytes; a longer line gets `-32600` and the
   * connection is closed.
   * @default 16 MiB
   */
  maxFrameBytes?: number;
  /**
   * How long a parked task (its connection dropped) waits for a resume or a
   * grade before it is cancelled, in milliseconds.
   * @default 3_600_000
   */
  parkedTtl?: number;
  /**
   * How long shutdown waits for task code still running (a task's setup,
   * grader or `finally` block) before it finishes anyway, in milliseconds.
   * What is still running then is reported to `onError`.
   * @default 10_000
   */
  shutdownTimeout?: number;
}

/** A running control server, shaped like `Deno.serve`'s handle. */
export interface HudServer extends AsyncDisposable {
  /** The bound address. */
  readonly addr: Deno.NetAddr;
  /**
   * The control address as a client dials it (a wildcard listener is
   * reached on loopback), with the token: `connect(server)` uses it. The
   * token is a secret: do not print it.
   */
  readonly address: ControlAddress;
  /**
   * {@linkcode HudServer.address} as a url, for another process (a
   * `--url` flag): `tcp://:TOKEN@host:port` with auth, `tcp://host:port`
   * without. It holds the secret: do not print it.
   */
  readonly url: string;
  /** The token clients must present, or `null` without auth. */
  readonly token: string | null;
  /** Resolves once the server has shut down completely. */
  readonly finished: Promise<void>;
  /** Number of sessions (live or parked). */
  readonly sessionCount: number;
  /**
   * Stops accepting, closes every connection, cancels every held task.
   * Idempotent.
   */
  shutdown(): Promise<void>;
}

/**
 * The default connection cap for an open-files limit of `fds` (`null`:
 * unknown): the limit less a reserve of a quarter of it, at least 128 and
 * at most 1024 descriptors, for listeners, files, child processes and the
 * connections being refused.
 */
export function defaultMaxConnections(fds: number | null): number {
  if (fds === null) return DEFAULT_MAX_CONNECTIONS;
  const reserve = Math.min(1024, Math.max(128, Math.floor(fds / 4)));
  return Math.max(16, fds - reserve);
}

/** The options of {@linkcode bind} that must be positive numbers. */
const POSITIVE_OPTIONS = [
  "maxFrameBytes",
  "parkedTtl",
  "shutdownTimeout",
  "maxConnections",
  "maxPendingConnections",
  "maxBufferedBytes",
  "maxJsonDepth",
  "firstFrameTimeout",
  "maxParked",
] as const;

function checkPositive(name: string, value: number | undefined): void {
  if (value !== undefined && (!Number.isFinite(value) || value <= 0)) {
    throw new RangeError(`Cannot bind: "${name}" must be a positive number, got "${value}"`);
  }
}

/** The token `bind` would use: the option, else `HUD_SERVE_TOKEN`, else `null`. */
function givenToken(options: BindOptions): string | null {
  const token = options.token ?? tokenFromEnv() ?? null;
  if (token === null) return null;
  const problem = tokenProblem(token);
  if (problem) {
    const from = options.token !== undefined ? '"token"' : SERVE_TOKEN_VAR;
    throw new TypeError(`Cannot bind: ${problem} (from ${from})`);
  }
  return token;
}

/**
 * The server's token (`null`: no authentication), once the combination of
 * `auth`, `token`, `hostname` and `insecureListen` is checked.
 */
function bindToken(options: BindOptions, hostname: string): string | null {
  if (options.auth ?? true) return givenToken(options) ?? generateToken();
  if (options.token !== undefined) {
    throw new TypeError('Cannot bind: "token" was given with auth: false; drop one of them');
  }
  if (!isLoopback(hostname) && !options.insecureListen) {
    throw new TypeError(
      `Cannot bind: refusing to serve without authentication on "${hostname}", which is not a loopback address; keep auth on, listen on 127.0.0.1, or pass insecureListen: true`,
    );
  }
  return null;
}

/**
 * Listens on `hostname`. Without authentication, a name is checked once
 * more as the resolver answered it: "x.localhost" that a hosts file or DNS
 * maps to 0.0.0.0 listens on every interface.
 */
function listen(hostname: string, options: BindOptions, token: string | null): Deno.TcpListener {
  const listener = Deno.listen({ hostname, port: options.port ?? 0 });
  const bound = listener.addr.hostname;
  if (token === null && !options.insecureListen && !isLoopback(bound)) {
    listener.close();
    throw new TypeError(
      `Cannot bind: refusing to serve without authentication on "${hostname}", which resolves to ${bound}, not a loopback address; keep auth on, listen on 127.0.0.1, or pass insecureListen: true`,
    );
  }
  return listener;
}

/** Every option of `bind` resolved, every default here: the record the server runs on. */
function serverConfig(
  options: BindOptions,
  token: string | null,
  bound: Deno.NetAddr,
): ServerConfig {
  const maxFrameBytes = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
  const maxConnections = options.maxConnections ?? defaultMaxConnections(openFileLimit());
  return {
    token,
    maxFrameBytes,
    preAuthMaxFrameBytes: PRE_AUTH_MAX_FRAME_BYTES,
    parkedTtl: options.parkedTtl ?? DEFAULT_PARKED_TTL_MS,
    shutdownTimeout: options.shutdownTimeout ?? 10_000,
    maxConnections,
    maxPendingConnections: options.maxPendingConnections ??
      Math.max(1, Math.min(DEFAULT_MAX_PENDING_CONNECTIONS, Math.floor(maxConnections / 4))),
    maxBufferedBytes: options.maxBufferedBytes ?? 4 * maxFrameBytes,
    maxJsonDepth: options.maxJsonDepth ?? MAX_JSON_DEPTH,
    preAuthMaxJsonDepth: PRE_AUTH_MAX_JSON_DEPTH,
    firstFrameTimeout: options.firstFrameTimeout ?? DEFAULT_FIRST_FRAME_TIMEOUT_MS,
    maxParked: options.maxParked ?? DEFAULT_MAX_PARKED,
    signal: options.signal,
    onListen: options.onListen,
    onError: options.onError ?? (() => {}),
    onTaskError: options.onTaskError,
    warning: token === null && !isLoopback(bound.hostname)
      ? (addr) =>
        `Serving without authentication on ${addr.hostname}:${addr.port}: anyone who can reach this port can use the environment (its shells and files) as this server's user`
      : null,
  };
}

/**
 * Binds a control server for `env` and serves until shut down. The
 * environment's hooks are not run: call `env.start()` first, or use
 * {@linkcode serve}.
 *
 * @throws {RangeError} for an out-of-range limit
 * @throws {TypeError} for `auth: false` on a `hostname` that is not, or does
 *   not resolve to, a loopback address (unless `insecureListen`)
 * @throws {Deno.errors.AddrInUse} when the port is taken
 */
export function bind(env: Environment, options: BindOptions = {}): HudServer {
  for (const name of POSITIVE_OPTIONS) checkPositive(name, options[name]);
  const hostname = options.hostname ?? "127.0.0.1";
  const token = bindToken(options, hostname);
  const listener = listen(hostname, options, token);
  return new ControlServer(env, listener, serverConfig(options, token, listener.addr));
}

/** Options for {@linkcode serve}. */
export interface ServeOptions extends BindOptions {
  /**
   * Where the announcement goes: `HUD_SERVE_PORT=<port>`, preceded by
   * `HUD_SERVE_TOKEN=<token>` when the token was generated here (given
   * through `token` or `HUD_SERVE_TOKEN`, it is never repeated). This is
   * the channel to the parent process; nothing else ever shows the token.
   * Pass `() => {}` to announce nothing (a server for this process's own
   * use), as with `Deno.serve`'s `onListen`.
   * @default standard output
   */
  announce?: (line: string) => void;
  /**
   * Stop on SIGINT and SIGTERM.
   * @default true
   */
  handleSignals?: boolean;
}

/**
 * The serve lifecycle, the one every way of serving an environment in this
 * process goes through (`serve` in a program, the command line's `serve`,
 * `LocalRuntime`): runs the environment's initialize hooks, binds the
 * control port, announces `HUD_SERVE_PORT=<port>` (after
 * `HUD_SERVE_TOKEN=<token>` when it generated the token), and serves until
 * SIGINT/SIGTERM, the signal, or the handle stops it; then closes the
 * listener and connections, cancels held tasks and runs the shutdown hooks
 * in reverse order.
 *
 * An initialize hook that fails has the shutdown hooks run and its error
 * thrown. The signal aborting while the hooks run binds nothing: once they
 * settle, the shutdown hooks run and the signal's reason is thrown.
 *
 * @returns the server handle; its `finished` resolves after the shutdown
 *   hooks (whose errors go to `onError`)
 * @throws the signal's reason, a hook's error, or what {@linkcode bind} throws;
 *   an `Error` when called from a module's top level while the command line
 *   (`loadEnvironment`) imports it: a module guards its serve() call with
 *   `if (import.meta.main)`
 */
export async function serve(env: Environment, options: ServeOptions = {}): Promise<HudServer> {
  options.signal?.throwIfAborted();
  // Before anything is bound or printed: the command line would print a
  // second server's port (and a token) in its output, then serve it again.
  if (servingWhileLoaded() !== undefined) {
    throw new Error(
      `Cannot serve "${env.name}" while its module is loaded as an environment: ` +
        `guard the serve() call with "if (import.meta.main)"`,
    );
  }
  // Resolve the token before the hooks run, so that a bad one fails fast.
  const auth = options.auth ?? true;
  const given = auth ? givenToken(options) : null;
  const server = await startAndBind(env, {
    ...options,
    token: auth ? given ?? generateToken() : undefined,
  });
  // Listen for signals before announcing: a parent may stop us as soon as
  // it reads the port line.
  const signals: Deno.Signal[] = options.handleSignals === false ? [] : ["SIGINT", "SIGTERM"];
  const onSignal = () => void server.shutdown();
  for (const s of signals) Deno.addSignalListener(s, onSignal);
  const announce = options.announce ??
    ((line: string) => Deno.stdout.writeSync(new TextEncoder().encode(line + "\n")));
  // The token line comes first: a parent that reads up to the port line
  // has both.
  if (server.token !== null && given === null) announce(tokenLine(server.token));
  announce(portLine(server.addr.port));
  const finished = server.finished.then(async () => {
    for (const s of signals) Deno.removeSignalListener(s, onSignal);
    try {
      await env.stop();
    } catch (err) {
      (options.onError ?? (() => {}))(err);
    }
  });
  markServing(env, server, finished);
  return servingHandle(server, finished);
}

/** Runs the initialize hooks and binds; a failure runs the shutdown hooks before it is thrown. */
async function startAndBind(env: Environment, options: BindOptions): Promise<HudServer> {
  await env.start();
  try {
    options.signal?.throwIfAborted();
    return bind(env, options);
  } catch (err) {
    await env.stop().catch((stopErr) => options.onError?.(stopErr));
    throw err;
  }
}

/** The handle `serve` returns: the server's, finished (and shut down) after the shutdown hooks. */
function servingHandle(server: HudServer, finished: Promise<void>): HudServer {
  const shutdown = async () => {
    await server.shutdown();
    await finished;
  };
  return {
    get addr() {
      return server.addr;
    },
    get address() {
      return server.address;
    },
    get url() {
      return server.url;
    },
    get token() {
      return server.token;
    },
    finished,
    get sessionCount() {
      return server.sessionCount;
    },
    shutdown,
    [Symbol.asyncDispose]: shutdown,
  };
}
