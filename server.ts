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
 * await using client = await connect(`tcp://127.0.0.1:${server.addr.port}`);
 * assert.deepEqual(await client.startTask("hello"), { prompt: "Say hello" });
 * assert.equal((await client.grade({ answer: "hello" })).score, 1);
 * ```
 *
 * @module
 */

import { type Capability, parseHostPort } from "./capability.ts";
import type { ActiveTask, Environment } from "./env.ts";
import { ErrorCode, HudProtocolError } from "./errors.ts";
import { encodeFrame, LineReader, parseLine } from "./_internal/framing.ts";
import { closeQuietly, isPeerGone, splice, writeAll } from "./_internal/io.ts";
import { settleWithin } from "./_internal/async.ts";
import { isRecord } from "./_internal/util.ts";

/** Default largest accepted frame: 16 MiB. */
export const DEFAULT_MAX_FRAME_BYTES: number = 16 * 1024 * 1024;
/** Default lifetime of a parked task: 1 hour. */
export const DEFAULT_PARKED_TTL_MS: number = 60 * 60 * 1000;

/** Options for {@linkcode bind}. */
export interface BindOptions {
  /**
   * Interface to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
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
   * The control address as a client takes it (`tcp://host:port`), so that
   * `connect(server)` reaches this server.
   */
  readonly url: string;
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

function newSessionId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(4));
  return "sess-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function checkPositive(name: string, value: number | undefined): void {
  if (value !== undefined && (!Number.isFinite(value) || value <= 0)) {
    throw new RangeError(`Cannot bind: "${name}" must be a positive number, got "${value}"`);
  }
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
  checkPositive("maxFrameBytes", options.maxFrameBytes);
  checkPositive("parkedTtl", options.parkedTtl);
  checkPositive("shutdownTimeout", options.shutdownTimeout);
  const listener = Deno.listen({
    hostname: options.hostname ?? "127.0.0.1",
    port: options.port ?? 0,
  });
  return new ControlServer(env, listener, options);
}

class ControlServer implements HudServer {
  readonly #env: Environment;
  readonly #listener: Deno.Listener;
  readonly #maxFrame: number;
  readonly #parkedTtl: number;
  readonly #shutdownTimeout: number;
  readonly #onError: (error: unknown) => void;
  readonly #sessions = new Map<string, Session>();
  /** Sessions holding a task with no live connection, for O(1) adoption. */
  readonly #parked = new Set<Session>();
  readonly #conns = new Set<Deno.Conn>();
  readonly #handlers = new Set<Promise<void>>();
  readonly #finished: PromiseWithResolvers<void> = Promise.withResolvers();
  readonly #signal: AbortSignal | undefined;
  readonly #onAbort = () => void this.shutdown();
  #closing: Promise<void> | null = null;

  constructor(env: Environment, listener: Deno.Listener, options: BindOptions) {
    this.#env = env;
    this.#listener = listener;
    this.#maxFrame = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.#parkedTtl = options.parkedTtl ?? DEFAULT_PARKED_TTL_MS;
    this.#shutdownTimeout = options.shutdownTimeout ?? 10_000;
    this.#onError = options.onError ?? (() => {});
    this.#signal = options.signal;
    options.onListen?.(this.addr);
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
    return `tcp://${host === "0.0.0.0" ? "127.0.0.1" : host === "[::]" ? "[::1]" : host}:${port}`;
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
    for (const conn of this.#conns) closeQuietly(conn);
    // Task code that never returns must not hold shutdown forever: one
    // deadline bounds both waits.
    const deadline = Date.now() + this.#shutdownTimeout;
    await this.#settle([...this.#handlers], deadline, "connections still in task code");
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
      this.#track(conn, this.#handle(conn));
    }
  }

  #track(conn: Deno.Conn, handler: Promise<void>): void {
    this.#conns.add(conn);
    const done = handler.catch((err) => {
      if (!isPeerGone(err)) this.#onError(err);
    }).finally(() => {
      this.#conns.delete(conn);
      this.#handlers.delete(done);
      closeQuietly(conn);
    });
    this.#handlers.add(done);
  }

  async #handle(conn: Deno.Conn): Promise<void> {
    const reader = new LineReader(conn, this.#maxFrame);
    const session: Session = { id: newSessionId(), conn, task: null, expiry: undefined };
    this.#sessions.set(session.id, session);
    let current = session;
    try {
      let first = true;
      while (true) {
        const frame = await reader.read();
        if (frame === null) return;
        if (frame.kind === "oversized") {
          await this.#send(conn, null, {
            error: new HudProtocolError(
              ErrorCode.INVALID_REQUEST,
              `frame exceeds the limit of ${this.#maxFrame} bytes`,
            ),
          });
          await drainAndClose(conn);
          return;
        }
        let request: unknown;
        try {
          request = parseLine(frame.line);
        } catch (err) {
          await this.#send(conn, null, {
            error: new HudProtocolError(
              ErrorCode.PARSE_ERROR,
              `parse error: ${(err as Error).message}`,
            ),
          });
          continue;
        }
        if (!isRecord(request)) {
          await this.#send(conn, null, {
            error: new HudProtocolError(
              ErrorCode.INVALID_REQUEST,
              "invalid request: expected a JSON object",
            ),
          });
          continue;
        }
        if (first && request.method === "tunnel.open") {
          this.#sessions.delete(session.id);
          return await this.#tunnel(conn, request, reader);
        }
        first = false;
        const hasId = "id" in request;
        const id = request.id ?? null;
        const reply = await this.#dispatch(current, request, (next) => current = next);
        if (hasId) await this.#send(conn, id, reply);
        if (request.method === "bye") return;
      }
    } finally {
      this.#release(current);
    }
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

  async #dispatch(
    session: Session,
    request: Record<string, unknown>,
    switchTo: (s: Session) => void,
  ): Promise<Reply> {
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
          return { result: this.#hello(session, params, switchTo) };
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

  #hello(
    session: Session,
    params: Record<string, unknown>,
    switchTo: (s: Session) => void,
  ): Record<string, unknown> {
    const wanted = params.session_id;
    if (wanted === undefined || wanted === null || wanted === session.id) {
      return this.#manifest(session);
    }
    if (typeof wanted !== "string") {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "session_id must be a string");
    }
    const target = this.#sessions.get(wanted);
    if (target === undefined) {
      throw new HudProtocolError(ErrorCode.INVALID_REQUEST, `unknown session: ${wanted}`);
    }
    if (target.conn !== null) {
      throw new HudProtocolError(
        ErrorCode.INVALID_REQUEST,
        `session ${wanted} has a live connection`,
      );
    }
    // Take the parked session over; the one this connection had is released
    // (parked when it holds a task, forgotten otherwise).
    clearTimeout(target.expiry);
    target.expiry = undefined;
    this.#parked.delete(target);
    target.conn = session.conn;
    this.#release(session);
    switchTo(target);
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
      if (this.#parked.size === 0) {
        throw new HudProtocolError(ErrorCode.INVALID_REQUEST, "no task in progress");
      }
      if (this.#parked.size > 1) {
        const ids = [...this.#parked].map((s) => s.id).join(", ");
        throw new HudProtocolError(
          ErrorCode.INVALID_REQUEST,
          `several parked sessions hold a task (${ids}); resume one with hello {"session_id": ...} before grading`,
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
    this.#conns.add(backend);
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
   * Where the `HUD_SERVE_PORT=<port>` line goes.
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
 * `HUD_SERVE_PORT=<port>`, and serves until SIGINT/SIGTERM, the signal, or
 * the handle stops it; then closes the listener and connections, cancels
 * held tasks and runs the shutdown hooks in reverse order.
 *
 * @returns the server handle; its `finished` resolves after the shutdown hooks
 */
export async function serve(env: Environment, options: ServeOptions = {}): Promise<HudServer> {
  if (options.signal?.aborted) throw options.signal.reason;
  await env.start();
  let server: HudServer;
  try {
    server = bind(env, options);
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
