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

import type { Environment } from "./env.ts";
import { ErrorCode } from "./errors.ts";
import {
  ByteBudget,
  encodeFrame,
  LineReader,
  type LineResult,
  MAX_JSON_DEPTH,
  peekId,
} from "./_internal/framing.ts";
import { closeQuietly, isPeerGone, openFileLimit, writeAll } from "./_internal/io.ts";
import { settleWithin } from "./_internal/async.ts";
import { generateToken, tokenFromEnv, tokenProblem, withToken } from "./_internal/auth.ts";
import {
  type ControlChannel,
  ControlDispatcher,
  errorReply,
  type Reply,
} from "./_server/dispatcher.ts";
import { FirstFrameDeadlines, Gate } from "./_server/admission.ts";
import { AttachedListeners } from "./_server/attached.ts";
import { parseRequest } from "./_server/requests.ts";
import { runTunnel, tunnelTarget } from "./_server/tunnel.ts";

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
   * non-loopback `hostname` unless `insecureListen` is set.
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
   * waited half the `firstFrameTimeout` is closed to make room; at the whole cap, the oldest of them: connections that have
   * spoken are never refused because of them. Each also has
   * `firstFrameTimeout`.
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
   * bytes before parsing; a deeper frame gets `-32600`.
   * @default 64
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
   * The control address as a client takes it, so that `connect(server)`
   * reaches this server: `tcp://:TOKEN@host:port` with auth,
   * `tcp://host:port` without. It holds the secret: do not print it.
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
 * What a connection's read loop keeps between frames. Held sessions are
 * mostly this, a pending read and the task's suspended generator, so it
 * stays a plain record: no closures, no timers of its own.
 */
interface Connection {
  conn: Deno.Conn;
  reader: LineReader;
  channel: ControlChannel | null;
  authenticated: boolean;
  /** No frame has been served yet (a `tunnel.open` must come first). */
  first: boolean;
}

/**
 * The read buffer a connection starts with and returns to: a `hello` or
 * `tasks.start` is 100 to 200 bytes, and 10,000 idle sessions with 4 KiB
 * each held 40 MiB of buffers. Longer frames grow it on demand.
 */
const CONNECTION_READ_BUFFER = 256;

/**
 * Half-closes, then discards what the peer is still sending (bounded in
 * time) so that closing does not reset the connection before the peer has
 * read the last reply.
 */
async function drainAndClose(conn: Deno.Conn): Promise<void> {
  try {
    await conn.closeWrite();
  } catch (err) {
    if (!isPeerGone(err)) throw err;
    return;
  }
  const buf = new Uint8Array(64 * 1024);
  const timer = setTimeout(() => closeQuietly(conn), 1000);
  try {
    while ((await conn.read(buf)) !== null) { /* discard */ }
  } catch (err) {
    if (!isPeerGone(err)) throw err;
  } finally {
    clearTimeout(timer);
    closeQuietly(conn);
  }
}

/**
 * The id of the first request on `conn` if a complete one comes within `ms`
 * (read into a small buffer), else `null`.
 */
async function firstRequestId(conn: Deno.Conn, ms: number): Promise<unknown> {
  const reader = new LineReader(conn, 4096, undefined, 256);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<null>((resolve) => timer = setTimeout(() => resolve(null), ms));
  try {
    const frame = await Promise.race([reader.read(), late]);
    if (frame === null) return null;
    return peekId(frame.kind === "line" ? frame.line : frame.head) ?? null;
  } catch {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

async function send(conn: Deno.Conn, reply: Reply): Promise<void> {
  await writeAll(conn, encodeFrame(reply));
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

/** Refusals that read the first frame (for its id) at once; beyond, they get `id: null`. */
const MAX_REFUSALS_READING = 32;
/** How long a refused connection has to send its first frame. */
const REFUSAL_READ_MS = 1000;

function checkPositive(name: string, value: number | undefined): void {
  if (value !== undefined && (!Number.isFinite(value) || value <= 0)) {
    throw new RangeError(`Cannot bind: "${name}" must be a positive number, got "${value}"`);
  }
}

/** Whether `hostname` only accepts connections from this machine. */
function isLoopback(hostname: string): boolean {
  const h = hostname.toLowerCase().replace(/^\[|\]$/g, "");
  return h === "localhost" || h === "::1" || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/** The token `bind` would use: the option, else `HUD_SERVE_TOKEN`, else `null`. */
function givenToken(options: BindOptions): string | null {
  const token = options.token ?? tokenFromEnv() ?? null;
  if (token === null) return null;
  const problem = tokenProblem(token);
  if (problem) {
    const from = options.token !== undefined ? '"token"' : "HUD_SERVE_TOKEN";
    throw new TypeError(`Cannot bind: ${problem} (from ${from})`);
  }
  return token;
}

/**
 * Binds a control server for `env` and serves until shut down. The
 * environment's hooks are not run: call `env.start()` first, or use
 * {@linkcode serve}.
 *
 * @throws {RangeError} for an out-of-range limit
 * @throws {Deno.errors.AddrInUse} when the port is taken
 */
export function bind(env: Environment, options: BindOptions = {}): HudServer {
  for (
    const name of [
      "maxFrameBytes",
      "parkedTtl",
      "shutdownTimeout",
      "maxConnections",
      "maxPendingConnections",
      "maxBufferedBytes",
      "maxJsonDepth",
      "firstFrameTimeout",
      "maxParked",
    ] as const
  ) {
    checkPositive(name, options[name]);
  }
  const hostname = options.hostname ?? "127.0.0.1";
  const auth = options.auth ?? true;
  let token: string | null = null;
  if (auth) {
    token = givenToken(options) ?? generateToken();
  } else {
    if (options.token !== undefined) {
      throw new TypeError('Cannot bind: "token" was given with auth: false; drop one of them');
    }
    if (!isLoopback(hostname) && !options.insecureListen) {
      throw new TypeError(
        `Cannot bind: refusing to serve without authentication on "${hostname}", which is not a loopback address; keep auth on, listen on 127.0.0.1, or pass insecureListen: true`,
      );
    }
  }
  const listener = Deno.listen({ hostname, port: options.port ?? 0 });
  return new ControlServer(env, listener, token, options);
}

/**
 * The server handle: the listener and accept loop, admission (connection
 * cap, first-frame deadline, token), framing, and the splicing of capability
 * streams, around the socket-free method table of `_server/dispatcher.ts`.
 */
class ControlServer implements HudServer {
  readonly #env: Environment;
  readonly #listener: Deno.Listener;
  readonly #token: string | null;
  readonly #gate: Gate;
  readonly #dispatcher: ControlDispatcher;
  /** Without a token: loopback ports for in-process capabilities, for raw bindings. */
  readonly #attached: AttachedListeners | null;
  readonly #maxFrame: number;
  readonly #shutdownTimeout: number;
  readonly #maxConnections: number;
  readonly #maxPending: number;
  /** How long a connection waits for its first frame before its pool may close it. */
  readonly #pendingGrace: number;
  /** Refused connections whose first frame is being read, for the id. */
  #refusalsReading = 0;
  readonly #budget: ByteBudget;
  readonly #maxDepth: number;
  readonly #deadlines: FirstFrameDeadlines<Deno.Conn>;
  /** Whether the connection cap was reached (reported once per episode). */
  #full = false;
  readonly #onError: (error: unknown) => void;
  /** Open connections, each with its handler once it has one. */
  readonly #conns = new Map<Deno.Conn, Promise<void> | undefined>();
  /** Handlers of refused connections (their one error line). */
  readonly #handlers = new Set<Promise<void>>();
  readonly #finished: PromiseWithResolvers<void> = Promise.withResolvers();
  readonly #signal: AbortSignal | undefined;
  readonly #onAbort = () => void this.shutdown();
  #closing: Promise<void> | null = null;

  constructor(
    env: Environment,
    listener: Deno.Listener,
    token: string | null,
    options: BindOptions,
  ) {
    this.#env = env;
    this.#listener = listener;
    this.#token = token;
    this.#gate = new Gate(token);
    this.#onError = options.onError ?? (() => {});
    const attached = token !== null ? null : new AttachedListeners({
      handler: (name) => env.capabilityHandler(name),
      track: (conn) => {
        if (this.#closing || this.#conns.size >= this.#maxConnections) return null;
        this.#conns.set(conn, undefined);
        return () => this.#conns.delete(conn);
      },
      onError: (err) => this.#onError(err),
    });
    this.#attached = attached;
    this.#dispatcher = new ControlDispatcher(env, {
      parkedTtl: options.parkedTtl ?? DEFAULT_PARKED_TTL_MS,
      maxParked: options.maxParked ?? DEFAULT_MAX_PARKED,
      onError: this.#onError,
      // Raw bindings of in-process capabilities are dialable without auth.
      urlOf: attached === null
        ? undefined
        : (cap) => env.capabilityHandler(cap.name) ? attached.urlFor(cap) : cap.url,
    });
    this.#maxFrame = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.#shutdownTimeout = options.shutdownTimeout ?? 10_000;
    this.#maxConnections = options.maxConnections ?? defaultMaxConnections(openFileLimit());
    this.#maxPending = options.maxPendingConnections ??
      Math.max(1, Math.min(DEFAULT_MAX_PENDING_CONNECTIONS, Math.floor(this.#maxConnections / 4)));
    this.#budget = new ByteBudget(options.maxBufferedBytes ?? 4 * this.#maxFrame);
    this.#maxDepth = options.maxJsonDepth ?? MAX_JSON_DEPTH;
    // Half the first-frame time: long enough for a loaded server to read
    // the first frames of a burst of clients (each sends it at once).
    this.#pendingGrace = (options.firstFrameTimeout ?? DEFAULT_FIRST_FRAME_TIMEOUT_MS) / 2;
    this.#deadlines = new FirstFrameDeadlines(
      options.firstFrameTimeout ?? DEFAULT_FIRST_FRAME_TIMEOUT_MS,
      (conn) => this.#expired(conn),
    );
    this.#signal = options.signal;
    options.onListen?.(this.addr);
    if (token === null && !isLoopback(this.addr.hostname)) {
      this.#onError(
        new Error(
          `Serving without authentication on ${this.addr.hostname}:${this.addr.port}: anyone who can reach this port can use the environment (its shells and files) as this server's user`,
        ),
      );
    }
    if (this.#signal?.aborted) {
      void this.shutdown();
      return;
    }
    this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
    void this.#acceptLoop();
  }

  get url(): string {
    const { hostname, port } = this.addr;
    const host = hostname.includes(":") ? `[${hostname}]` : hostname;
    const url = `tcp://${
      host === "0.0.0.0" ? "127.0.0.1" : host === "[::]" ? "[::1]" : host
    }:${port}`;
    return this.#token === null ? url : withToken(url, this.#token);
  }

  get token(): string | null {
    return this.#token;
  }

  get addr(): Deno.NetAddr {
    return this.#listener.addr as Deno.NetAddr;
  }

  get finished(): Promise<void> {
    return this.#finished.promise;
  }

  get sessionCount(): number {
    return this.#dispatcher.sessions.size;
  }

  shutdown(): Promise<void> {
    this.#closing ??= this.#shutdown();
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.shutdown();
  }

  async #shutdown(): Promise<void> {
    this.#signal?.removeEventListener("abort", this.#onAbort);
    // Connections that end from here on do not park their tasks: all are
    // cancelled below.
    this.#dispatcher.sessions.beginClose();
    closeQuietly(this.#listener);
    const attached = this.#attached?.close();
    this.#deadlines.clear();
    const handlers = [...this.#handlers];
    for (const [conn, handler] of this.#conns) {
      closeQuietly(conn);
      if (handler !== undefined) handlers.push(handler);
    }
    // Task code that never returns must not hold shutdown forever: one
    // deadline bounds both waits.
    const deadline = Date.now() + this.#shutdownTimeout;
    if (attached) handlers.push(attached);
    await this.#settle(handlers, deadline, "connections still in task code");
    await this.#settle(this.#dispatcher.sessions.close(), deadline, "tasks still closing");
    this.#finished.resolve();
  }

  /** Waits for `promises` until `deadline`; reports how many were left. */
  async #settle(promises: Promise<unknown>[], deadline: number, what: string): Promise<void> {
    const inTime = await settleWithin(
      Promise.allSettled(promises),
      Math.max(0, deadline - Date.now()),
    );
    if (!inTime) {
      this.#onError(
        new Error(
          `Shutdown went on after ${this.#shutdownTimeout} ms with ${promises.length} ${what}`,
        ),
      );
    }
  }

  async #acceptLoop(): Promise<void> {
    while (true) {
      let conn: Deno.Conn;
      try {
        conn = await this.#listener.accept();
      } catch (err) {
        if (this.#closing) return;
        if (isPeerGone(err)) return;
        // Out of file descriptors and the like: report, back off, go on.
        this.#onError(err);
        await new Promise((r) => setTimeout(r, 50));
        continue;
      }
      if (this.#closing) {
        closeQuietly(conn);
        return;
      }
      // Connections that have not spoken make room for new ones, oldest
      // first: a stranger's idle connections never lock out the token
      // holder, who speaks at once. Over their own cap, only those that
      // have waited a while go (a burst of clients connecting at once all
      // count as waiting for a moment); at the whole cap, the oldest goes.
      if (this.#deadlines.size >= this.#maxPending) this.#evictOldestPending(this.#pendingGrace);
      if (this.#conns.size >= this.#maxConnections && !this.#evictOldestPending(0)) {
        this.#refuse(conn);
        continue;
      }
      this.#full = false;
      this.#conns.set(conn, undefined);
      const handler = this.#handle(conn);
      // The handler removes its connection when it ends, which cannot be
      // before its first read.
      if (this.#conns.has(conn)) this.#conns.set(conn, handler);
    }
  }

  /**
   * Closes the connection that has waited longest for its first frame, to
   * make room, if it has waited `minWait` ms; `false` when none has.
   */
  #evictOldestPending(minWait: number): boolean {
    const conn = this.#deadlines.takeOldest(minWait);
    if (conn === undefined) return false;
    const reply = errorReply(
      null,
      ErrorCode.LIMIT_EXCEEDED,
      "too many connections waiting for their first frame; closed the oldest (this one)",
    );
    send(conn, reply).catch(() => {}).finally(() => closeQuietly(conn));
    // Its handler's pending read ends with the close; the slot is free now.
    this.#conns.delete(conn);
    return true;
  }

  /**
   * Over the connection cap: one error, then close. The error carries the
   * id of the connection's first request when it comes within a second (a
   * HUD client sends its `hello` at once, and drops a connection whose reply
   * id does not match); refusals beyond a few at once get `id: null`.
   */
  #refuse(conn: Deno.Conn): void {
    if (!this.#full) {
      this.#full = true;
      this.#onError(
        new Error(
          `Refusing connections: ${this.#conns.size} are open, the limit (maxConnections)`,
        ),
      );
    }
    const message =
      `too many connections: the server holds its limit of ${this.#maxConnections}; try again later`;
    const reading = this.#refusalsReading < MAX_REFUSALS_READING;
    if (reading) this.#refusalsReading++;
    // Bounded in time: a peer that neither speaks nor reads cannot hold it.
    const timer = setTimeout(() => closeQuietly(conn), REFUSAL_READ_MS + 1000);
    const done = (async () => {
      const id = reading ? await firstRequestId(conn, REFUSAL_READ_MS) : null;
      await writeAll(conn, encodeFrame(errorReply(id, ErrorCode.LIMIT_EXCEEDED, message)));
    })().catch(() => {}).finally(() => {
      if (reading) this.#refusalsReading--;
      clearTimeout(timer);
      closeQuietly(conn);
      this.#handlers.delete(done);
    });
    this.#handlers.add(done);
  }

  /** Past its first-frame deadline: one error, then close (its pending read ends its handler). */
  #expired(conn: Deno.Conn): void {
    const reply = errorReply(
      null,
      ErrorCode.INVALID_REQUEST,
      `no request within ${this.#deadlines.ms} ms of connecting; closing`,
    );
    send(conn, reply).catch((err) => {
      if (!isPeerGone(err)) this.#onError(err);
    }).finally(() => closeQuietly(conn));
  }

  /**
   * Serves one connection until it ends. Never rejects: what is not a peer
   * going away goes to `onError`.
   */
  async #handle(conn: Deno.Conn): Promise<void> {
    const c: Connection = {
      conn,
      reader: new LineReader(
        conn,
        this.#gate.required ? Math.min(PRE_AUTH_MAX_FRAME_BYTES, this.#maxFrame) : this.#maxFrame,
        this.#budget,
        CONNECTION_READ_BUFFER,
      ),
      channel: null,
      authenticated: !this.#gate.required,
      first: true,
    };
    this.#deadlines.start(conn);
    let deadline = true;
    try {
      while (true) {
        let frame = c.reader.next();
        while (frame === undefined) {
          c.reader.filled(await conn.read(c.reader.space()));
          frame = c.reader.next();
        }
        if (deadline) {
          // Past its deadline, the sweeper has answered and closed it.
          if (!this.#deadlines.arrived(conn)) return;
          deadline = false;
        }
        if (frame === null || !(await this.#serveFrame(c, frame))) return;
      }
    } catch (err) {
      if (!isPeerGone(err)) this.#onError(err);
    } finally {
      if (deadline) this.#deadlines.arrived(conn);
      c.reader.release();
      c.channel?.close();
      this.#conns.delete(conn);
      closeQuietly(conn);
    }
  }

  /**
   * Answers one frame; `false` when the connection is done. Kept apart from
   * the read loop so that a held connection does not keep its last request
   * and reply alive while it waits.
   */
  async #serveFrame(c: Connection, frame: LineResult): Promise<boolean> {
    const conn = c.conn;
    const parsed = parseRequest(frame, {
      maxFrameBytes: c.reader.maxLine,
      maxBufferedBytes: this.#budget.limit,
      maxJsonDepth: this.#maxDepth,
    });
    if ("error" in parsed) {
      await send(conn, parsed.error);
      // A bad frame before authentication ends the connection too.
      if (!parsed.fatal && c.authenticated) return true;
      await drainAndClose(conn);
      return false;
    }
    const request = parsed.request;
    const refusal = this.#gate.check(request, c.authenticated);
    if (refusal !== null) {
      await send(conn, refusal);
      await drainAndClose(conn);
      return false;
    }
    if (!c.authenticated) {
      c.authenticated = true;
      c.reader.maxLine = this.#maxFrame;
    }
    if (c.first && request.method === "tunnel.open") {
      await runTunnel(
        conn,
        request,
        tunnelTarget(this.#env, request),
        () => c.reader.takeBuffered(),
        {
          send: (reply) => send(conn, reply),
          track: (backend) => {
            this.#conns.set(backend, undefined);
            return () => this.#conns.delete(backend);
          },
        },
      );
      return false;
    }
    c.first = false;
    c.channel ??= this.#dispatcher.open();
    const reply = await c.channel.handle(request);
    if (reply !== null) await send(conn, reply);
    return !c.channel.ended;
  }
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
 * @throws the signal's reason, a hook's error, or what {@linkcode bind} throws
 */
export async function serve(env: Environment, options: ServeOptions = {}): Promise<HudServer> {
  const signal = options.signal;
  signal?.throwIfAborted();
  // Resolve the token before the hooks run, so that a bad one fails fast.
  const auth = options.auth ?? true;
  const given = auth ? givenToken(options) : null;
  const token = auth ? given ?? generateToken() : undefined;
  await env.start();
  let server: HudServer;
  try {
    signal?.throwIfAborted();
    server = bind(env, { ...options, token });
  } catch (err) {
    await env.stop().catch((stopErr) => options.onError?.(stopErr));
    throw err;
  }
  // Listen for signals before announcing: a parent may stop us as soon as
  // it reads the port line.
  const signals: Deno.Signal[] = options.handleSignals === false ? [] : ["SIGINT", "SIGTERM"];
  const onSignal = () => void server.shutdown();
  for (const s of signals) Deno.addSignalListener(s, onSignal);
  const announce = options.announce ??
    ((line: string) => Deno.stdout.writeSync(new TextEncoder().encode(line + "\n")));
  // The token line comes first: a parent that reads up to the port line
  // has both.
  if (auth && given === null) announce(`HUD_SERVE_TOKEN=${server.token}`);
  announce(`HUD_SERVE_PORT=${server.addr.port}`);

  const finished = server.finished.then(async () => {
    for (const s of signals) Deno.removeSignalListener(s, onSignal);
    try {
      await env.stop();
    } catch (err) {
      (options.onError ?? (() => {}))(err);
    }
  });
  return {
    get addr() {
      return server.addr;
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
    async shutdown() {
      await server.shutdown();
      await finished;
    },
    async [Symbol.asyncDispose]() {
      await server.shutdown();
      await finished;
    },
  };
}
