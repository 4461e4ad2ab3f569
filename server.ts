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

import { type Capability, parseHostPort } from "./capability.ts";
import type { ActiveTask, CapabilityHandler, Environment } from "./env.ts";
import { ErrorCode, HudProtocolError } from "./errors.ts";
import {
  ByteBudget,
  encodeFrame,
  LineReader,
  type LineResult,
  MAX_JSON_DEPTH,
  parseLine,
} from "./_internal/framing.ts";
import { closeQuietly, isPeerGone, openFileLimit, splice, writeAll } from "./_internal/io.ts";
import { settleWithin } from "./_internal/async.ts";
import { isRecord } from "./_internal/util.ts";
import {
  generateToken,
  tokenFromEnv,
  tokenProblem,
  TokenVerifier,
  withToken,
} from "./_internal/auth.ts";

/** Default largest accepted frame: 16 MiB. */
export const DEFAULT_MAX_FRAME_BYTES: number = 16 * 1024 * 1024;
/** Default lifetime of a parked task: 1 hour. */
export const DEFAULT_PARKED_TTL_MS: number = 60 * 60 * 1000;
/** Default cap on parked tasks. */
export const DEFAULT_MAX_PARKED: number = 10_000;
/** Default cap on connections (further capped to a quarter of the descriptor limit). */
export const DEFAULT_MAX_CONNECTIONS: number = 1024;
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
   * connection) held at once; one more is accepted, told so in one error
   * line, and closed. The default also stays under a quarter of the
   * process's open-file limit, so that descriptors remain for everything
   * else this process serves.
   * @default 1024
   */
  maxConnections?: number;
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

interface Session {
  id: string;
  conn: Deno.Conn | null;
  task: ActiveTask | null;
  expiry: ReturnType<typeof setTimeout> | undefined;
}

/**
 * What a connection's read loop keeps between frames. Held sessions are
 * mostly this, a pending read and the task's suspended generator, so it
 * stays a plain record: no closures, no timers of its own.
 */
interface Connection {
  conn: Deno.Conn;
  reader: LineReader;
  session: Session | null;
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

type Reply = { result: Record<string, unknown> } | { error: HudProtocolError };

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

/** `sess-` and 128 random bits as 32 hex characters. */
function newSessionId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "sess-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

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

class ControlServer implements HudServer {
  readonly #env: Environment;
  readonly #listener: Deno.Listener;
  readonly #token: string | null;
  readonly #verifier: TokenVerifier | null;
  readonly #maxFrame: number;
  readonly #parkedTtl: number;
  readonly #shutdownTimeout: number;
  readonly #maxConnections: number;
  readonly #budget: ByteBudget;
  readonly #maxDepth: number;
  readonly #firstFrameTimeout: number;
  readonly #maxParked: number;
  /** Whether the connection cap was reached (reported once per episode). */
  #full = false;
  readonly #onError: (error: unknown) => void;
  readonly #sessions = new Map<string, Session>();
  /** Sessions holding a task with no live connection, for O(1) adoption. */
  readonly #parked = new Set<Session>();
  /** Open connections, each with its handler once it has one. */
  readonly #conns = new Map<Deno.Conn, Promise<void> | undefined>();
  /** Handlers of refused connections (their one error line). */
  readonly #handlers = new Set<Promise<void>>();
  /**
   * Connections still owing their first frame, with their deadlines: in
   * deadline order, since every connection gets the same time. One timer
   * sweeps them, rather than one timer and one race per connection.
   */
  readonly #awaitingFirst = new Map<Deno.Conn, number>();
  #sweepTimer: ReturnType<typeof setTimeout> | undefined;
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
    this.#verifier = token === null ? null : new TokenVerifier(token);
    this.#maxFrame = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.#parkedTtl = options.parkedTtl ?? DEFAULT_PARKED_TTL_MS;
    this.#shutdownTimeout = options.shutdownTimeout ?? 10_000;
    const fds = openFileLimit();
    this.#maxConnections = options.maxConnections ??
      (fds === null
        ? DEFAULT_MAX_CONNECTIONS
        : Math.max(16, Math.min(DEFAULT_MAX_CONNECTIONS, Math.floor(fds / 4))));
    this.#budget = new ByteBudget(options.maxBufferedBytes ?? 4 * this.#maxFrame);
    this.#maxDepth = options.maxJsonDepth ?? MAX_JSON_DEPTH;
    this.#firstFrameTimeout = options.firstFrameTimeout ?? DEFAULT_FIRST_FRAME_TIMEOUT_MS;
    this.#maxParked = options.maxParked ?? DEFAULT_MAX_PARKED;
    this.#onError = options.onError ?? (() => {});
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
    return this.#sessions.size;
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
    closeQuietly(this.#listener);
    clearTimeout(this.#sweepTimer);
    this.#awaitingFirst.clear();
    const handlers = [...this.#handlers];
    for (const [conn, handler] of this.#conns) {
      closeQuietly(conn);
      if (handler !== undefined) handlers.push(handler);
    }
    // Task code that never returns must not hold shutdown forever: one
    // deadline bounds both waits.
    const deadline = Date.now() + this.#shutdownTimeout;
    await this.#settle(handlers, deadline, "connections still in task code");
    const tasks: Promise<void>[] = [];
    for (const session of this.#sessions.values()) {
      clearTimeout(session.expiry);
      if (session.task) tasks.push(session.task.cancel());
    }
    this.#sessions.clear();
    this.#parked.clear();
    await this.#settle(tasks, deadline, "tasks still closing");
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
      if (this.#conns.size >= this.#maxConnections) {
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

  /** Over the connection cap: one error line, then close. */
  #refuse(conn: Deno.Conn): void {
    if (!this.#full) {
      this.#full = true;
      this.#onError(
        new Error(
          `Refusing connections: ${this.#conns.size} are open, the limit (maxConnections)`,
        ),
      );
    }
    const frame = encodeFrame({
      jsonrpc: "2.0",
      id: null,
      error: {
        code: ErrorCode.LIMIT_EXCEEDED,
        message:
          `too many connections: the server holds its limit of ${this.#maxConnections}; try again later`,
      },
    });
    // A fresh socket's send buffer takes one short line without waiting; a
    // peer that does not read cannot hold this up for long either.
    const timer = setTimeout(() => closeQuietly(conn), 1000);
    const done = conn.write(frame).catch(() => 0).finally(() => {
      clearTimeout(timer);
      closeQuietly(conn);
      this.#handlers.delete(done);
    }).then(() => {});
    this.#handlers.add(done);
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
        this.#verifier ? Math.min(PRE_AUTH_MAX_FRAME_BYTES, this.#maxFrame) : this.#maxFrame,
        this.#budget,
        CONNECTION_READ_BUFFER,
      ),
      session: null,
      authenticated: this.#verifier === null,
      first: true,
    };
    this.#expectFirstFrame(conn);
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
          if (!this.#firstFrameArrived(conn)) return;
          deadline = false;
        }
        if (frame === null || !(await this.#serveFrame(c, frame))) return;
      }
    } catch (err) {
      if (!isPeerGone(err)) this.#onError(err);
    } finally {
      if (deadline) this.#firstFrameArrived(conn);
      c.reader.release();
      if (c.session !== null) this.#release(c.session);
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
    const request = await this.#request(conn, frame, c.authenticated);
    if (request === "close") return false;
    if (request === "skip") return true;
    const method = request.method;
    const params = isRecord(request.params) ? request.params : {};
    // The first frame authenticates the connection; a later hello that
    // carries a token must carry the right one too.
    if (this.#verifier && (!c.authenticated || (method === "hello" && "token" in params))) {
      const ok = (method === "hello" || method === "tunnel.open") &&
        this.#verifier.verify(params.token);
      if (!ok) {
        await this.#unauthorized(conn, request);
        return false;
      }
      c.authenticated = true;
      c.reader.maxLine = this.#maxFrame;
    }
    if (c.first && method === "tunnel.open") {
      await this.#tunnel(conn, request, c.reader);
      return false;
    }
    c.first = false;
    if (c.session === null) {
      c.session = { id: newSessionId(), conn, task: null, expiry: undefined };
      this.#sessions.set(c.session.id, c.session);
    }
    const hasId = "id" in request;
    const id = request.id ?? null;
    const reply = await this.#dispatch(c, request);
    if (hasId) await this.#send(conn, id, reply);
    return method !== "bye";
  }

  /** Starts the first-frame deadline of a new connection. */
  #expectFirstFrame(conn: Deno.Conn): void {
    this.#awaitingFirst.set(conn, Date.now() + this.#firstFrameTimeout);
    if (this.#sweepTimer === undefined) this.#armSweep(this.#firstFrameTimeout);
  }

  /**
   * Ends the first-frame deadline of `conn`; `false` when it had already
   * expired (or the server is closing).
   */
  #firstFrameArrived(conn: Deno.Conn): boolean {
    if (!this.#awaitingFirst.delete(conn)) return false;
    if (this.#awaitingFirst.size === 0) {
      clearTimeout(this.#sweepTimer);
      this.#sweepTimer = undefined;
    }
    return true;
  }

  #armSweep(ms: number): void {
    this.#sweepTimer = setTimeout(() => this.#sweep(), ms);
  }

  /**
   * Each connection past its first-frame deadline gets one error and is
   * closed; its pending read then ends its handler.
   */
  #sweep(): void {
    this.#sweepTimer = undefined;
    const now = Date.now();
    for (const [conn, deadline] of this.#awaitingFirst) {
      if (deadline > now) {
        this.#armSweep(deadline - now);
        return;
      }
      this.#awaitingFirst.delete(conn);
      const error = new HudProtocolError(
        ErrorCode.INVALID_REQUEST,
        `no request within ${this.#firstFrameTimeout} ms of connecting; closing`,
      );
      this.#send(conn, null, { error }).catch((err) => {
        if (!isPeerGone(err)) this.#onError(err);
      }).finally(() => closeQuietly(conn));
    }
  }

  /**
   * Parses a frame into a request object. Bad frames are answered here:
   * `"skip"` when the connection goes on, `"close"` when it is done (an
   * oversized frame, or any bad frame before authentication).
   */
  async #request(
    conn: Deno.Conn,
    frame: LineResult,
    authenticated: boolean,
  ): Promise<Record<string, unknown> | "skip" | "close"> {
    let error: HudProtocolError;
    if (frame.kind === "oversized") {
      error = frame.overBudget
        ? new HudProtocolError(
          ErrorCode.LIMIT_EXCEEDED,
          `frame refused: unfinished frames across connections would exceed the server's limit of ${this.#budget.limit} bytes; send it again later`,
        )
        : new HudProtocolError(
          ErrorCode.INVALID_REQUEST,
          `frame exceeds the limit of ${
            authenticated ? this.#maxFrame : Math.min(PRE_AUTH_MAX_FRAME_BYTES, this.#maxFrame)
          } bytes`,
        );
      await this.#send(conn, null, { error });
      await drainAndClose(conn);
      return "close";
    }
    let request: unknown;
    try {
      request = parseLine(frame.line, this.#maxDepth);
      if (!isRecord(request)) {
        error = new HudProtocolError(
          ErrorCode.INVALID_REQUEST,
          "invalid request: expected a JSON object",
        );
      } else {
        return request;
      }
    } catch (err) {
      error = err instanceof RangeError
        ? new HudProtocolError(ErrorCode.INVALID_REQUEST, err.message)
        : new HudProtocolError(ErrorCode.PARSE_ERROR, `parse error: ${(err as Error).message}`);
    }
    await this.#send(conn, null, { error });
    if (authenticated) return "skip";
    await drainAndClose(conn);
    return "close";
  }

  /** One error, nothing else, then close. */
  async #unauthorized(conn: Deno.Conn, request: Record<string, unknown>): Promise<void> {
    await this.#send(conn, request.id ?? null, {
      error: new HudProtocolError(
        ErrorCode.UNAUTHORIZED,
        "unauthorized: the first frame must be hello or tunnel.open with the server's token in params.token (set HUD_SERVE_TOKEN, or connect to tcp://:TOKEN@host:port)",
      ),
    });
    await drainAndClose(conn);
  }

  /** On disconnect: park a session holding a task, forget one without. */
  #release(session: Session): void {
    if (session.conn === null) return;
    session.conn = null;
    if (this.#closing) return;
    if (session.task === null || session.task.done) {
      this.#sessions.delete(session.id);
      return;
    }
    this.#park(session);
  }

  #park(session: Session): void {
    clearTimeout(session.expiry);
    if (this.#parked.size >= this.#maxParked) {
      this.#sessions.delete(session.id);
      const task = session.task;
      session.task = null;
      void task?.cancel();
      this.#onError(
        new Error(
          `Cannot park a task: ${this.#parked.size} tasks are parked, the limit (maxParked); cancelled it`,
        ),
      );
      return;
    }
    this.#parked.add(session);
    session.expiry = setTimeout(() => {
      if (session.conn !== null || this.#sessions.get(session.id) !== session) return;
      this.#sessions.delete(session.id);
      this.#parked.delete(session);
      const task = session.task;
      session.task = null;
      void task?.cancel();
    }, this.#parkedTtl);
    Deno.unrefTimer(session.expiry);
  }

  async #send(conn: Deno.Conn, id: unknown, reply: Reply): Promise<void> {
    const frame = "result" in reply
      ? { jsonrpc: "2.0", id, result: reply.result }
      : { jsonrpc: "2.0", id, error: { code: reply.error.code, message: reply.error.message } };
    await writeAll(conn, encodeFrame(frame));
  }

  async #dispatch(c: Connection, request: Record<string, unknown>): Promise<Reply> {
    const session = c.session!;
    const method = request.method;
    const params = request.params ?? {};
    try {
      if (method !== undefined && typeof method !== "string") {
        throw new HudProtocolError(
          ErrorCode.INVALID_REQUEST,
          "invalid request: method must be a string",
        );
      }
      if (!isRecord(params)) {
        throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "params must be an object");
      }
      switch (method) {
        case "hello":
          return { result: this.#hello(c, params) };
        case "tasks.list":
          return { result: { tasks: this.#env.listTasks() } };
        case "tasks.start":
          return { result: await this.#start(session, params) };
        case "tasks.grade":
          return { result: await this.#grade(session, params) };
        case "tasks.cancel": {
          const task = session.task;
          session.task = null;
          await task?.cancel();
          return { result: { cancelled: true } };
        }
        case "bye": {
          const task = session.task;
          session.task = null;
          await task?.cancel();
          return { result: { goodbye: true } };
        }
        default:
          throw new HudProtocolError(
            ErrorCode.METHOD_NOT_FOUND,
            `method not found: ${method ?? ""}`,
          );
      }
    } catch (err) {
      if (err instanceof HudProtocolError) return { error: err };
      return {
        error: new HudProtocolError(
          ErrorCode.SERVER_ERROR,
          err instanceof Error ? err.message : String(err),
          { cause: err },
        ),
      };
    }
  }

  #manifest(session: Session): Record<string, unknown> {
    return {
      session_id: session.id,
      env: { name: this.#env.name, version: this.#env.version },
      bindings: this.#env.capabilities.map((c) => c.toManifest()),
    };
  }

  #hello(c: Connection, params: Record<string, unknown>): Record<string, unknown> {
    const session = c.session!;
    const wanted = params.session_id;
    if (wanted === undefined || wanted === null || wanted === session.id) {
      return this.#manifest(session);
    }
    if (typeof wanted !== "string") {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "session_id must be a string");
    }
    // Messages never repeat a session id: ids are known only to their owner.
    const target = this.#sessions.get(wanted);
    if (target === undefined) {
      throw new HudProtocolError(
        ErrorCode.INVALID_REQUEST,
        "unknown session (it expired, was graded or cancelled, or never existed)",
      );
    }
    if (target.conn !== null) {
      throw new HudProtocolError(ErrorCode.INVALID_REQUEST, "session has a live connection");
    }
    // Take the parked session over; the one this connection had is released
    // (parked when it holds a task, forgotten otherwise).
    clearTimeout(target.expiry);
    target.expiry = undefined;
    this.#parked.delete(target);
    target.conn = session.conn;
    this.#release(session);
    c.session = target;
    return this.#manifest(target);
  }

  async #start(
    session: Session,
    params: Record<string, unknown>,
  ): Promise<Record<string, unknown>> {
    const id = params.id;
    if (typeof id !== "string") {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "id must be a string");
    }
    const args = params.args ?? {};
    if (!isRecord(args)) {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "args must be an object");
    }
    if (!this.#env.hasTemplate(id)) {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, `unknown task: ${id}`);
    }
    if (this.#parked.size >= this.#maxParked) {
      throw new HudProtocolError(
        ErrorCode.LIMIT_EXCEEDED,
        `Cannot start task "${id}": ${this.#parked.size} tasks are parked, the server's limit (maxParked); grade or resume them, or wait for them to expire`,
      );
    }
    const previous = session.task;
    session.task = null;
    await previous?.cancel();
    const task = await this.#env.startTask(id, args);
    if (this.#closing) {
      await task.cancel();
      throw new HudProtocolError(ErrorCode.SERVER_ERROR, "server is shutting down");
    }
    session.task = task;
    return task.prompt;
  }

  async #grade(
    session: Session,
    params: Record<string, unknown>,
  ): Promise<Record<string, unknown>> {
    let task = session.task;
    session.task = null;
    if (task === null) {
      const parked = this.#parked.size;
      if (parked === 0) {
        throw new HudProtocolError(ErrorCode.INVALID_REQUEST, "no task in progress");
      }
      // Adopting someone else's task is only for connections that proved
      // they hold the token; without auth, anyone could grade it.
      if (this.#verifier === null) {
        throw new HudProtocolError(
          ErrorCode.INVALID_REQUEST,
          `no task in progress (${parked} parked; adopting a parked task needs an authenticated server: resume yours with hello {"session_id": ...})`,
        );
      }
      // Counts only: which sessions are parked is for their owners to know.
      if (parked > 1) {
        throw new HudProtocolError(
          ErrorCode.INVALID_REQUEST,
          `${parked} parked sessions hold a task; resume yours with hello {"session_id": ...} before grading`,
        );
      }
      const owner: Session = this.#parked.values().next().value!;
      task = owner.task!;
      owner.task = null;
      clearTimeout(owner.expiry);
      this.#parked.delete(owner);
      this.#sessions.delete(owner.id);
    }
    return await task.grade(params.answer);
  }

  async #tunnel(
    conn: Deno.Conn,
    request: Record<string, unknown>,
    reader: LineReader,
  ): Promise<void> {
    const id = request.id ?? null;
    const params = isRecord(request.params) ? request.params : {};
    const name = params.capability;
    const fail = (code: number, message: string) =>
      this.#send(conn, id, { error: new HudProtocolError(code, message) });
    if (typeof name !== "string") {
      return await fail(ErrorCode.INVALID_PARAMS, "capability must be a string");
    }
    const capability: Capability | undefined = this.#env.capability(name);
    if (capability === undefined) {
      return await fail(ErrorCode.SERVER_ERROR, `unknown capability: ${name}`);
    }
    const handler: CapabilityHandler | undefined = this.#env.capabilityHandler(name);
    if (handler !== undefined) {
      // Served in this process: no dialling, no port of its own.
      await this.#send(conn, id, { result: { capability: name } });
      await handler.attach(conn, reader.takeBuffered());
      return;
    }
    const target = parseHostPort(capability.url);
    if (target === null || target.port === null) {
      return await fail(ErrorCode.INVALID_PARAMS, `capability ${name} has no host:port in its url`);
    }
    let backend: Deno.TcpConn;
    try {
      backend = await Deno.connect({ hostname: target.hostname, port: target.port });
    } catch (err) {
      return await fail(
        ErrorCode.SERVER_ERROR,
        `cannot reach capability ${name}: ${(err as Error).message}`,
      );
    }
    this.#conns.set(backend, undefined);
    try {
      await this.#send(conn, id, { result: { capability: name } });
      await splice(conn, backend, reader.takeBuffered());
    } finally {
      this.#conns.delete(backend);
      closeQuietly(backend);
    }
  }
}

/** Options for {@linkcode serve}. */
export interface ServeOptions extends BindOptions {
  /**
   * Where the announcement goes: `HUD_SERVE_PORT=<port>`, preceded by
   * `HUD_SERVE_TOKEN=<token>` when the token was generated here (given
   * through `token` or `HUD_SERVE_TOKEN`, it is never repeated). This is
   * the channel to the parent process; nothing else ever shows the token.
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
 * Runs the environment's initialize hooks, binds the control port, prints
 * `HUD_SERVE_PORT=<port>` (after `HUD_SERVE_TOKEN=<token>` when it generated
 * the token), and serves until SIGINT/SIGTERM, the signal, or
 * the handle stops it; then closes the listener and connections, cancels
 * held tasks and runs the shutdown hooks in reverse order.
 *
 * @returns the server handle; its `finished` resolves after the shutdown hooks
 */
export async function serve(env: Environment, options: ServeOptions = {}): Promise<HudServer> {
  if (options.signal?.aborted) throw options.signal.reason;
  // Resolve the token before the hooks run, so that a bad one fails fast.
  const auth = options.auth ?? true;
  const given = auth ? givenToken(options) : null;
  const token = auth ? given ?? generateToken() : undefined;
  await env.start();
  let server: HudServer;
  try {
    server = bind(env, { ...options, token });
  } catch (err) {
    await env.stop().catch(() => {});
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
