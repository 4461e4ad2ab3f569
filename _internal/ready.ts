// Readiness: "open a TCP connection, say hello" until the environment
// answers. connect() keeps the connection; the runtimes' probe closes it.

import {
  ConnectionClosedError,
  HudProtocolError,
  NotReadyError,
  ProtocolViolationError,
} from "../errors.ts";
import { Deadline, delay } from "./async.ts";
import { isPeerGone } from "./io.ts";
import { JsonRpcCaller } from "./rpc.ts";

/** Options for {@linkcode helloUntilReady}. */
export interface HelloUntilReadyOptions {
  /** The control address as it may be shown (no token), for messages. */
  url: string;
  /** How long to keep trying, in ms. */
  readyTimeout: number;
  /**
   * How long connections may be refused, from the start, before giving up
   * with "nothing listens there" (once one was accepted, only the ready
   * timeout counts: something is there, starting).
   */
  refusedTimeout: number;
  /** Pause between attempts, in ms. */
  retryInterval: number;
  /** Largest reply accepted, in bytes. */
  maxFrameBytes: number;
  /** Aborts the wait (its reason is thrown). */
  signal?: AbortSignal;
}

/** A `hello` answered: the connection, its caller, and the reply's result. */
export interface HelloReply {
  /** The caller on the connection, for more calls (the client) or to close it (a probe). */
  caller: JsonRpcCaller;
  /** The connection itself, which the caller owns (a pool watches it for its end). */
  conn: Deno.TcpConn;
  /** The `hello` result: the manifest. */
  result: Record<string, unknown>;
}

/** One attempt that failed in a way worth another: refused, or ended before the reply. */
interface Retry {
  error: unknown;
  /** The connection was refused (nothing listens). */
  refused: boolean;
  /** A connection was made (something listens, starting). */
  connected: boolean;
}

/**
 * Connects to `addr` and sends `hello` with `params` until a reply comes: a
 * refused connection, or one closed before the reply, means "not ready
 * yet"; an error reply fails at once.
 * @returns the connection, its caller and the `hello` result
 * @throws {NotReadyError} when connections were refused for the whole
 *   refused timeout, or nothing answered within the ready timeout
 * @throws {HudProtocolError} for an error reply to `hello`
 * @throws {ProtocolViolationError} for a reply that breaks the protocol
 */
export async function helloUntilReady(
  addr: { hostname: string; port: number },
  params: Record<string, unknown>,
  options: HelloUntilReadyOptions,
): Promise<HelloReply> {
  const { url, readyTimeout, refusedTimeout, signal } = options;
  const started = Date.now();
  using deadline = new Deadline(readyTimeout, signal, "connect");
  let lastError: unknown;
  let accepted = false;
  for (let attempts = 0;;) {
    if (deadline.signal.aborted) {
      if (signal?.aborted) throw signal.reason;
      throw new NotReadyError(
        `Cannot connect to ${url}: not ready after ${readyTimeout} ms (${attempts} attempts)`,
        { cause: lastError },
      );
    }
    attempts++;
    const attempt = await helloOnce(addr, params, options, deadline.signal);
    if (!("error" in attempt)) return attempt;
    // Cut short by the deadline: the loop head says so.
    if (deadline.signal.aborted) continue;
    lastError = attempt.error;
    accepted ||= attempt.connected;
    if (attempt.refused && !accepted && Date.now() - started >= refusedTimeout) {
      // With no time allowed, one refusal says it: nothing listens there.
      const refused = refusedTimeout === 0
        ? "connection refused"
        : `connection refused for ${refusedTimeout} ms (${attempts} attempts)`;
      throw new NotReadyError(
        `Cannot connect to ${url}: ${refused}, nothing listens there; start the environment first, or pass readyTimeout to wait for one that is starting`,
        { cause: attempt.error },
      );
    }
    // The loop head reports the timeout or the abort.
    await delay(options.retryInterval, deadline.signal).catch(() => {});
  }
}

/**
 * One connection and one `hello`. Refusals, and connections that end
 * before the reply, are worth another try; other failures are thrown.
 */
async function helloOnce(
  addr: { hostname: string; port: number },
  params: Record<string, unknown>,
  options: HelloUntilReadyOptions,
  signal: AbortSignal,
): Promise<HelloReply | Retry> {
  let caller: JsonRpcCaller | null = null;
  try {
    // Deno.connect's own signal: an abandoned connect ends (raced, it went on, and left its
    // connection open when it got one).
    const conn = await Deno.connect({ hostname: addr.hostname, port: addr.port, signal });
    // Numbers on the control channel are Python's both ways: integers
    // exact, NaN and the infinities as its tokens (PROTOCOL.md).
    caller = new JsonRpcCaller(conn, {
      maxFrameBytes: options.maxFrameBytes,
      peer: options.url,
      exactIntegers: true,
      nonFinite: true,
    });
    const result = await caller.call("hello", params, { signal });
    return { caller, conn, result };
  } catch (err) {
    caller?.close();
    if (err instanceof HudProtocolError || err instanceof ProtocolViolationError) throw err;
    const refused = err instanceof Deno.errors.ConnectionRefused;
    const retry = signal.aborted || refused || isPeerGone(err) ||
      err instanceof ConnectionClosedError;
    if (!retry) throw err;
    return { error: err, refused, connected: caller !== null };
  }
}
