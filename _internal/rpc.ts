// The one NDJSON JSON-RPC caller: the control client, the readiness probe
// and the file tracker's client send requests through it.

import { ConnectionClosedError, HudProtocolError, ProtocolViolationError } from "../errors.ts";
import { encodeFrame, LineReader, parseLine } from "./framing.ts";
import { closeQuietly, isPeerGone, writeAll } from "./io.ts";
import { abortable, Deadline } from "./async.ts";
import { isRecord } from "./util.ts";

/** Options for {@linkcode JsonRpcCaller}. */
export interface JsonRpcCallerOptions {
  /** Largest reply accepted, in bytes; a longer one is a protocol violation. */
  maxFrameBytes: number;
  /**
   * The first request id.
   * @default 1
   */
  firstId?: number;
  /**
   * Who is called, for messages (`tcp://127.0.0.1:8765`, `the tracker`).
   * @default "the peer"
   */
  peer?: string;
  /**
   * Deepest nesting of arrays and objects read in a reply.
   * @default unlimited: replies are bounded by their size
   */
  maxDepth?: number;
  /**
   * Read integers beyond ±(2^53−1) in replies as `bigint` (digit for
   * digit) instead of rounding them.
   * @default false
   */
  exactIntegers?: boolean;
  /**
   * Read and write NaN, Infinity and -Infinity as Python's json module does
   * (the bare tokens `NaN`, `Infinity`, `-Infinity`), as HUD's peers do,
   * instead of failing on them in a reply and writing `null` in a request.
   * @default false
   */
  nonFinite?: boolean;
}

/** Options for one {@linkcode JsonRpcCaller.call}. */
export interface JsonRpcCallOptions {
  /** Aborts the call; the reply could no longer be matched, so the connection closes. */
  signal?: AbortSignal;
  /**
   * Milliseconds the reply may take, counted from when the request is sent
   * (not while it waits behind other calls); the connection closes after.
   */
  timeout?: number;
}

/**
 * JSON-RPC over one NDJSON connection: one request at a time (calls
 * queue), each reply's id checked against its request's.
 *
 * An error reply rejects with {@linkcode HudProtocolError} and leaves the
 * connection usable. Anything else that goes wrong (the peer closing, a
 * transport error, a reply that breaks the protocol, an abort or a timeout)
 * ends the connection: the call rejects, and so does every later one, with
 * {@linkcode ConnectionClosedError} (or {@linkcode ProtocolViolationError},
 * or the signal's reason, for the call that saw it).
 */
export class JsonRpcCaller {
  readonly #conn: Deno.Conn;
  readonly #reader: LineReader;
  readonly #peer: string;
  readonly #maxDepth: number;
  readonly #parse: { exactIntegers: boolean; nonFinite: boolean };
  readonly #write: { nonFinite: boolean };
  #nextId: number;
  #queue: Promise<unknown> = Promise.resolve();
  #failure: Error | null = null;
  #closed = false;

  constructor(conn: Deno.Conn, options: JsonRpcCallerOptions) {
    this.#conn = conn;
    this.#reader = new LineReader(conn, options.maxFrameBytes);
    this.#peer = options.peer ?? "the peer";
    this.#maxDepth = options.maxDepth ?? Infinity;
    const nonFinite = options.nonFinite ?? false;
    this.#parse = { exactIntegers: options.exactIntegers ?? false, nonFinite };
    this.#write = { nonFinite };
    this.#nextId = options.firstId ?? 1;
  }

  /** Whether the connection was closed or failed. */
  get closed(): boolean {
    return this.#closed || this.#failure !== null;
  }

  /** Why the connection failed, or `null` while it works (or was closed on purpose). */
  get failure(): Error | null {
    return this.#failure;
  }

  /**
   * Sends `method` with `params` once the calls before it are done, and
   * returns the reply's `result`.
   * @throws {HudProtocolError} for an error reply
   * @throws {ProtocolViolationError} for a reply that breaks the protocol
   * @throws {ConnectionClosedError} when the connection is, or gets, closed
   */
  call(
    method: string,
    params: Record<string, unknown>,
    options: JsonRpcCallOptions = {},
  ): Promise<Record<string, unknown>> {
    const run = () => this.#exchange(method, params, options);
    const result = this.#queue.then(run, run);
    this.#queue = result.catch(() => {});
    return result;
  }

  /** Resolves once every call so far has settled. */
  get idle(): Promise<void> {
    return this.#queue.then(() => {});
  }

  /** Closes the connection; calls in flight and later ones reject. Idempotent. */
  close(): void {
    this.#closed = true;
    closeQuietly(this.#conn);
  }

  /** Ends the connection because of `err` (the first reason sticks). */
  fail(err: Error): void {
    this.#failure ??= err;
    closeQuietly(this.#conn);
  }

  async #exchange(
    method: string,
    params: Record<string, unknown>,
    options: JsonRpcCallOptions,
  ): Promise<Record<string, unknown>> {
    if (this.#closed) {
      throw new ConnectionClosedError(`Cannot call "${method}": the connection is closed`);
    }
    if (this.#failure) {
      throw new ConnectionClosedError(`Cannot call "${method}": the connection failed`, {
        cause: this.#failure,
      });
    }
    options.signal?.throwIfAborted();
    const id = this.#nextId++;
    using deadline = new Deadline(options.timeout, options.signal, `"${method}"`);
    const signal = options.signal || options.timeout !== undefined ? deadline.signal : undefined;
    try {
      return await abortable(
        this.#roundTrip(id, method, params),
        signal,
        () => this.fail(new ConnectionClosedError(`Call "${method}" was aborted`)),
      );
    } catch (err) {
      if (err instanceof HudProtocolError) throw err;
      if (options.signal?.aborted && err === options.signal.reason) throw err;
      const failure = err instanceof Error ? err : new Error(String(err));
      this.fail(failure);
      if (err instanceof ProtocolViolationError || err instanceof ConnectionClosedError) throw err;
      if (this.#closed) {
        throw new ConnectionClosedError(
          `Call "${method}" interrupted: the connection was closed`,
          { cause: err },
        );
      }
      throw new ConnectionClosedError(`Connection to ${this.#peer} failed during "${method}"`, {
        cause: err,
      });
    }
  }

  async #roundTrip(
    id: number,
    method: string,
    params: Record<string, unknown>,
  ): Promise<Record<string, unknown>> {
    await writeAll(this.#conn, encodeFrame({ jsonrpc: "2.0", id, method, params }, this.#write));
    let frame;
    try {
      frame = await this.#reader.read();
    } catch (err) {
      if (this.#closed && isPeerGone(err)) {
        throw new ConnectionClosedError(
          `Call "${method}" interrupted: the connection was closed`,
          { cause: err },
        );
      }
      throw err;
    }
    if (frame === null) {
      throw new ConnectionClosedError(`Connection closed before the reply to "${method}"`);
    }
    if (frame.kind === "oversized") {
      throw new ProtocolViolationError(
        `Reply to "${method}" of ${frame.size} bytes exceeds the frame limit`,
      );
    }
    let reply: unknown;
    try {
      reply = parseLine(frame.line, this.#maxDepth, this.#parse);
    } catch (err) {
      throw new ProtocolViolationError(
        `Invalid reply to "${method}": ${(err as Error).message}`,
        { cause: err },
      );
    }
    return replyResult(reply, id, method);
  }
}

/**
 * The `result` of a JSON-RPC reply to request `id`.
 * @throws {HudProtocolError} the peer's error, for an error reply
 * @throws {ProtocolViolationError} for a reply that answers another request
 *   or has no result object
 */
export function replyResult(reply: unknown, id: number, method: string): Record<string, unknown> {
  // An error with id null answers a request the peer could not read (too
  // large, not JSON): it is the reply to ours, and its message says why.
  if (isRecord(reply) && reply.id === null && isRecord(reply.error)) {
    throw errorReply(reply.error, `"${method}" refused: `);
  }
  if (!isRecord(reply) || reply.id !== id) {
    const got = JSON.stringify(isRecord(reply) ? reply.id : reply);
    throw new ProtocolViolationError(
      `Reply id mismatch for "${method}": expected ${id}, got ${got}`,
    );
  }
  if (isRecord(reply.error)) throw errorReply(reply.error, "");
  if (!isRecord(reply.result)) {
    throw new ProtocolViolationError(`Reply to "${method}" has no result object`);
  }
  return reply.result;
}

function errorReply(error: Record<string, unknown>, prefix: string): HudProtocolError {
  const code = typeof error.code === "number" && Number.isInteger(error.code) ? error.code : -32000;
  const message = prefix + String(error.message ?? "unknown error");
  return new HudProtocolError(code, message, error.data === undefined ? {} : { data: error.data });
}
