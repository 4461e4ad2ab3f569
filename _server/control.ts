// The control server's handle: the listener and its accept loop, admission
// (connection cap, the pool of connections that have not spoken, the
// first-frame deadline, the token), framing, the splice of capability
// streams, and shutdown. What a request does is the method table's
// (`dispatcher.ts`), which never sees a socket; `server.ts` resolves the
// options into a {@linkcode ServerConfig} and hands back this handle.

import type { Environment } from "../env.ts";
import { ErrorCode, type TaskError } from "../errors.ts";
import {
  ByteBudget,
  encodeFrame,
  LineReader,
  type LineResult,
  peekId,
} from "../_internal/framing.ts";
import { closeQuietly, isPeerGone, writeAll } from "../_internal/io.ts";
import { settleWithin } from "../_internal/async.ts";
import { type ControlAddress, dialableAddress, formatControlUrl } from "../_internal/auth.ts";
import { acceptLoop } from "../_internal/accept.ts";
import { type ControlChannel, ControlDispatcher, errorReply, type Reply } from "./dispatcher.ts";
import { FirstFrameDeadlines, Gate } from "./admission.ts";
import { AttachedListeners } from "./attached.ts";
import { parseRequest } from "./requests.ts";
import { runTunnel, tunnelTarget } from "./tunnel.ts";

/** Every limit and callback of a server, resolved (see `BindOptions` for each). */
export interface ServerConfig {
  /** `null`: no authentication. */
  token: string | null;
  maxFrameBytes: number;
  preAuthMaxFrameBytes: number;
  parkedTtl: number;
  shutdownTimeout: number;
  maxConnections: number;
  maxPendingConnections: number;
  maxBufferedBytes: number;
  maxJsonDepth: number;
  /** The deepest nesting of a first frame that must carry the token. */
  preAuthMaxJsonDepth: number;
  firstFrameTimeout: number;
  maxParked: number;
  signal: AbortSignal | undefined;
  onListen: ((addr: Deno.NetAddr) => void) | undefined;
  onError: (error: unknown) => void;
  onTaskError: ((error: TaskError) => void) | undefined;
  /** A warning to report once the address is known, or `null`. */
  warning: ((addr: Deno.NetAddr) => string) | null;
}

/**
 * What a connection keeps between frames. Held sessions are mostly this, a
 * pending read and the task's suspended generator, so it stays a plain
 * record: no timers of its own, and no suspended function (the read loop is
 * promise callbacks: see `#next`).
 */
interface Connection {
  conn: Deno.Conn;
  reader: LineReader;
  channel: ControlChannel | null;
  authenticated: boolean;
  /** No frame has been served yet (a `tunnel.open` must come first). */
  first: boolean;
  /** Its first frame has not come yet: its deadline runs. */
  waiting: boolean;
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

/** Replies write NaN and the infinities as HUD's server (Python's json) does. */
const WRITE = { nonFinite: true } as const;

async function send(conn: Deno.Conn, reply: Reply): Promise<void> {
  await writeAll(conn, encodeFrame(reply, WRITE));
}

/** Refusals that read the first frame (for its id) at once; beyond, they get `id: null`. */
const MAX_REFUSALS_READING = 32;
/** How long a refused connection has to send its first frame. */
const REFUSAL_READ_MS = 1000;
/**
 * Refusals over the cap in flight at once; beyond, the accept loop waits
 * for one to end, so that refusing never takes the descriptors that the
 * process keeps in reserve (at least 128, see `defaultMaxConnections`).
 */
const MAX_REFUSALS_HELD = 64;
/**
 * Connections turned away before authenticating (a wrong token, a bad
 * first frame) whose refusal is drained so that they can read it; they hold
 * no slot, and beyond this many they are closed right after the write.
 */
const MAX_DRAINING = 32;
/**
 * At the whole cap, how long a connection that has not spoken is kept
 * before a newcomer takes its slot: the first-frame deadline under
 * pressure. A client sends its first frame at once; a connection younger
 * than this may be the token holder's, not yet read, so the accept loop
 * waits instead (the newcomers wait in the kernel's queue).
 */
const PRESSURE_FIRST_FRAME_MS = 1000;

/**
 * The server handle: the listener and accept loop, admission (connection
 * cap, first-frame deadline, token), framing, and the splicing of capability
 * streams, around the socket-free method table of `_server/dispatcher.ts`.
 */
export class ControlServer {
  readonly #env: Environment;
  readonly #listener: Deno.Listener;
  readonly #token: string | null;
  readonly #gate: Gate;
  readonly #dispatcher: ControlDispatcher;
  /** Without a token: loopback ports for in-process capabilities, for raw bindings. */
  readonly #attached: AttachedListeners | null;
  readonly #maxFrame: number;
  readonly #preAuthMaxFrame: number;
  readonly #shutdownTimeout: number;
  readonly #maxConnections: number;
  readonly #maxPending: number;
  /** How long a connection waits for its first frame before its pool may close it. */
  readonly #pendingGrace: number;
  /** At the whole cap, how long a silent connection keeps its slot. */
  readonly #pressureWait: number;
  /** Refused connections whose first frame is being read, for the id. */
  #refusalsReading = 0;
  /** Wakes the accept loop when it waits for room (see `#room`). */
  #wake: (() => void) | null = null;
  readonly #budget: ByteBudget;
  readonly #maxDepth: number;
  readonly #preAuthMaxDepth: number;
  readonly #deadlines: FirstFrameDeadlines<Deno.Conn>;
  /** Whether the connection cap was reached (reported once per episode). */
  #full = false;
  readonly #onError: (error: unknown) => void;
  /** Open connections: control connections, tunnels' backends, attached capabilities'. */
  readonly #conns = new Set<Deno.Conn>();
  /** Control connections that have not ended yet (their cleanup has not run). */
  #serving = 0;
  /** Resolved when the last control connection ends, once shutdown waits for it. */
  #drained: PromiseWithResolvers<void> | null = null;
  /** Handlers of refused connections (their one error line). */
  readonly #handlers = new Set<Promise<void>>();
  /** Connections turned away before authenticating, draining; they hold no slot. */
  readonly #turnedAway = new Set<Deno.Conn>();
  readonly #finished: PromiseWithResolvers<void> = Promise.withResolvers();
  readonly #signal: AbortSignal | undefined;
  readonly #onAbort = () => void this.shutdown();
  #closing: Promise<void> | null = null;

  constructor(env: Environment, listener: Deno.Listener, config: ServerConfig) {
    const token = config.token;
    this.#env = env;
    this.#listener = listener;
    this.#token = token;
    this.#gate = new Gate(token);
    this.#onError = config.onError;
    const attached = token !== null ? null : new AttachedListeners({
      handler: (name) => env.capabilityHandler(name),
      track: (conn) => {
        if (this.#closing || this.#conns.size >= this.#maxConnections) return null;
        this.#conns.add(conn);
        return () => this.#conns.delete(conn);
      },
      onError: (err) => this.#onError(err),
    });
    this.#attached = attached;
    this.#dispatcher = new ControlDispatcher(env, {
      parkedTtl: config.parkedTtl,
      maxParked: config.maxParked,
      onError: this.#onError,
      onTaskError: config.onTaskError,
      // Raw bindings of in-process capabilities are dialable without auth.
      urlOf: attached === null
        ? undefined
        : (cap) => env.capabilityHandler(cap.name) ? attached.urlFor(cap) : cap.url,
    });
    this.#maxFrame = config.maxFrameBytes;
    this.#preAuthMaxFrame = config.preAuthMaxFrameBytes;
    this.#shutdownTimeout = config.shutdownTimeout;
    this.#maxConnections = config.maxConnections;
    this.#maxPending = config.maxPendingConnections;
    this.#budget = new ByteBudget(config.maxBufferedBytes);
    this.#maxDepth = config.maxJsonDepth;
    this.#preAuthMaxDepth = Math.min(config.preAuthMaxJsonDepth, config.maxJsonDepth);
    // Half the first-frame time: long enough for a loaded server to read
    // the first frames of a burst of clients (each sends it at once).
    this.#pendingGrace = config.firstFrameTimeout / 2;
    this.#pressureWait = Math.min(PRESSURE_FIRST_FRAME_MS, config.firstFrameTimeout);
    this.#deadlines = new FirstFrameDeadlines(
      config.firstFrameTimeout,
      (conn) => this.#expired(conn),
    );
    this.#signal = config.signal;
    config.onListen?.(this.addr);
    if (config.warning !== null) this.#onError(new Error(config.warning(this.addr)));
    if (this.#signal?.aborted) {
      void this.shutdown();
      return;
    }
    this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
    void acceptLoop(this.#listener, (conn) => this.#accepted(conn), {
      closing: () => this.#closing !== null,
      onError: (err) => this.#onError(err),
      room: () => this.#room(),
    });
  }

  get address(): ControlAddress {
    return dialableAddress(this.addr, this.#token ?? undefined);
  }

  get url(): string {
    return formatControlUrl(this.address);
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
    this.#wake?.();
    for (const conn of [...this.#conns, ...this.#turnedAway]) closeQuietly(conn);
    // Closed, an idle connection's pending read ends at once; one in task
    // code ends when the task code returns.
    if (this.#serving > 0) this.#drained = Promise.withResolvers();
    // Task code that never returns must not hold shutdown forever: one
    // deadline bounds both waits.
    const deadline = Date.now() + this.#shutdownTimeout;
    const waits = [...this.#handlers, ...(attached ? [attached] : [])];
    if (this.#drained) waits.push(this.#drained.promise);
    await this.#settle(waits, deadline, () => `${this.#serving} connections still in task code`);
    const cancels = this.#dispatcher.sessions.close();
    await this.#settle(cancels, deadline, () => `${cancels.length} tasks still closing`);
    this.#finished.resolve();
  }

  /** Waits for `promises` until `deadline`; reports what was left. */
  async #settle(promises: Promise<unknown>[], deadline: number, left: () => string): Promise<void> {
    const inTime = await settleWithin(
      Promise.allSettled(promises),
      Math.max(0, deadline - Date.now()),
    );
    if (!inTime) {
      this.#onError(new Error(`Shutdown went on after ${this.#shutdownTimeout} ms with ${left()}`));
    }
  }

  /** Admits or refuses one accepted connection (the accept loop's handler). */
  #accepted(conn: Deno.Conn): void {
    if (this.#closing) {
      closeQuietly(conn);
      return;
    }
    // Connections that have not spoken make room for new ones, oldest
    // first: a stranger's idle connections never lock out the token
    // holder, who speaks at once. Over their own cap, only those that have
    // waited a while go (a burst of clients connecting at once all count as
    // waiting for a moment); at the whole cap, the oldest goes.
    if (this.#deadlines.size >= this.#maxPending) this.#evictOldestPending(this.#pendingGrace);
    if (this.#conns.size >= this.#maxConnections && !this.#evictOldestPending(this.#pressureWait)) {
      this.#refuse(conn);
      return;
    }
    this.#full = false;
    this.#conns.add(conn);
    this.#serve(conn);
  }

  /**
   * `null` when the accept loop may accept, else what it waits for first:
   * a refusal to end when as many as it may hold are in flight, or, at the
   * whole cap, the oldest silent connection to have waited its time under
   * pressure (or any change: a connection speaking, closing). At the cap
   * with no silent connection, the next one is accepted to be refused with
   * a message. So the descriptors held stay within the cap, the refusals and
   * the drains, below the process's limit.
   */
  #room(): Promise<void> | null {
    if (this.#closing) return null;
    let wait: number;
    if (this.#handlers.size >= MAX_REFUSALS_HELD) {
      wait = REFUSAL_READ_MS + 1000;
    } else if (this.#conns.size >= this.#maxConnections) {
      const waited = this.#deadlines.oldestWait();
      if (waited === null || waited >= this.#pressureWait) return null;
      wait = this.#pressureWait - waited;
    } else {
      return null;
    }
    const { promise, resolve } = Promise.withResolvers<void>();
    const timer = setTimeout(resolve, wait);
    this.#wake = resolve;
    return promise.finally(() => {
      clearTimeout(timer);
      this.#wake = null;
    });
  }

  /** Forgets `conn` (closed, or turned away): its slot is free. */
  #release(conn: Deno.Conn): void {
    this.#conns.delete(conn);
    this.#turnedAway.delete(conn);
    this.#wake?.();
  }

  /**
   * Closes a connection after its refusal. One turned away before it
   * authenticated gives its slot back at once, and is drained (so that it
   * can read why) only while few others are.
   */
  async #closeRefused(c: Connection): Promise<void> {
    if (!c.authenticated) {
      this.#release(c.conn);
      this.#turnedAway.add(c.conn);
      if (this.#turnedAway.size > MAX_DRAINING) return closeQuietly(c.conn);
    }
    await drainAndClose(c.conn);
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
    // Its pending read ends with the close; the slot is free now.
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
      this.#wake?.();
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

  /** Starts serving one connection; `#end` runs when it ends. */
  #serve(conn: Deno.Conn): void {
    this.#serving++;
    this.#deadlines.start(conn);
    this.#next({
      conn,
      reader: new LineReader(
        conn,
        this.#gate.required ? Math.min(this.#preAuthMaxFrame, this.#maxFrame) : this.#maxFrame,
        this.#budget,
        CONNECTION_READ_BUFFER,
      ),
      channel: null,
      authenticated: !this.#gate.required,
      first: true,
      waiting: true,
    });
  }

  /**
   * Answers the next frame, or reads until one is complete. Promise
   * callbacks rather than an async function's loop: a held session waits
   * in one pending read, without a suspended function of its own and its
   * registers (0.4 KiB less per session; BENCHMARKS.md).
   */
  #next(c: Connection): void {
    let frame;
    try {
      frame = c.reader.next();
    } catch (err) {
      // Growing the buffer failed: the connection ends as in a read loop's
      // catch; thrown in a promise callback, it would end the process.
      return this.#end(c, err);
    }
    if (frame === undefined) {
      c.conn.read(c.reader.space()).then((n) => {
        c.reader.filled(n);
        this.#next(c);
      }, (err) => this.#end(c, err));
      return;
    }
    if (c.waiting) {
      c.waiting = false;
      // Past its deadline, the sweeper has answered and closed it.
      if (!this.#deadlines.arrived(c.conn)) return this.#end(c, null);
      this.#wake?.();
    }
    if (frame === null) return this.#end(c, null);
    this.#handleFrame(c, frame).then(
      (more) => more ? this.#next(c) : this.#end(c, null),
      (err) => this.#end(c, err),
    );
  }

  /** The connection is done (`err`: why, if it failed); what is not a peer going away goes to `onError`. */
  #end(c: Connection, err: unknown): void {
    if (err !== null && !isPeerGone(err)) this.#onError(err);
    if (c.waiting) this.#deadlines.arrived(c.conn);
    c.reader.release();
    c.channel?.close();
    this.#release(c.conn);
    closeQuietly(c.conn);
    if (--this.#serving === 0) this.#drained?.resolve();
  }

  /**
   * Answers one frame; `false` when the connection is done. Kept apart from
   * the read loop so that a held connection does not keep its last request
   * and reply alive while it waits.
   */
  async #handleFrame(c: Connection, frame: LineResult): Promise<boolean> {
    const conn = c.conn;
    const parsed = parseRequest(frame, {
      maxFrameBytes: c.reader.maxLine,
      maxBufferedBytes: this.#budget.limit,
      // A stranger's first frame gets a tight limit; a session, what HUD's
      // server reads.
      maxJsonDepth: c.authenticated ? this.#maxDepth : this.#preAuthMaxDepth,
    });
    if ("error" in parsed) {
      await send(conn, parsed.error);
      // A bad frame before authentication ends the connection too.
      if (!parsed.fatal && c.authenticated) return true;
      await this.#closeRefused(c);
      return false;
    }
    const request = parsed.request;
    const refusal = this.#gate.check(request, c.authenticated);
    if (refusal !== null) {
      await send(conn, refusal);
      await this.#closeRefused(c);
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
            this.#conns.add(backend);
            return () => this.#release(backend);
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
