// Admission of connections to the control port, apart from any socket: the
// token check of a connection's first frame, and the first-frame deadline.

import { ErrorCode } from "../errors.ts";
import { SERVE_TOKEN_VAR, TokenVerifier } from "../_internal/auth.ts";
import { isRecord } from "../_internal/util.ts";
import { LOOP_LAG, type LoopLag } from "../_internal/loop_lag.ts";
import { errorReply, type Reply } from "./dispatcher.ts";

/** What an authenticating server tells a connection whose first frame is not hello or tunnel.open. */
export const UNAUTHORIZED_MESSAGE =
  `unauthorized: the first frame must be hello or tunnel.open with the server's token in params.token (set ${SERVE_TOKEN_VAR}, or connect to tcp://:TOKEN@host:port)`;
/** What it tells a hello or tunnel.open that carries no token. */
export const MISSING_TOKEN_MESSAGE =
  `unauthorized: no token: this server requires its token in params.token (set ${SERVE_TOKEN_VAR} to the token it serves with, or connect to tcp://:TOKEN@host:port)`;
/** What it tells a hello or tunnel.open whose token is not the server's. */
export const WRONG_TOKEN_MESSAGE =
  `unauthorized: wrong token: params.token is not this server's token (check ${SERVE_TOKEN_VAR}, or the token in the url, against the one it serves with)`;

/**
 * The token check: a connection's first frame must be a `hello` or
 * `tunnel.open` carrying the token in `params.token`, and a later `hello`
 * that carries a token must carry the right one.
 */
export class Gate {
  readonly #verifier: TokenVerifier | null;

  /** `token` null: no authentication, every frame passes. */
  constructor(token: string | null) {
    this.#verifier = token === null ? null : new TokenVerifier(token);
  }

  /** Whether connections start unauthenticated. */
  get required(): boolean {
    return this.#verifier !== null;
  }

  /**
   * `null` when `request` may go on (on a connection that is `authenticated`
   * or becomes so with it), else the one error reply after which the
   * connection is closed.
   */
  check(request: Record<string, unknown>, authenticated: boolean): Reply | null {
    if (this.#verifier === null) return null;
    const method = request.method;
    const params = isRecord(request.params) ? request.params : {};
    if (authenticated && !(method === "hello" && "token" in params)) return null;
    if ((method === "hello" || method === "tunnel.open") && this.#verifier.verify(params.token)) {
      return null;
    }
    // Missing and wrong say apart what to do; a wrong one tells nothing of the right one.
    const message = method !== "hello" && method !== "tunnel.open"
      ? UNAUTHORIZED_MESSAGE
      : params.token === undefined
      ? MISSING_TOKEN_MESSAGE
      : WRONG_TOKEN_MESSAGE;
    return errorReply(request.id ?? null, ErrorCode.UNAUTHORIZED, message);
  }
}

/**
 * First-frame deadlines of many connections under one timer: every
 * connection gets the same time, so insertion order is (nearly) deadline
 * order and one sweep answers the expired ones, rather than one timer and
 * one race per connection.
 *
 * A deadline measures the peer's silence, not this process's queue: the
 * time the event loop ran late meanwhile (see {@linkcode LoopLag}) does not
 * count, so that a server busy with a thousand rollouts of its own process
 * does not turn away clients whose first frame is waiting unread in its
 * socket buffers.
 */
export class FirstFrameDeadlines<K> {
  readonly #ms: number;
  readonly #onExpire: (key: K) => void;
  readonly #lag: LoopLag;
  /** Each connection's start: when (ms, performance.now()) and the loop's lateness then. */
  readonly #deadlines = new Map<K, { at: number; late: number }>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #watching: Disposable | null = null;

  /**
   * `onExpire` runs for each connection whose `ms` passed before its first
   * frame, not counting the time `lag` says the loop was late.
   */
  constructor(ms: number, onExpire: (key: K) => void, lag: LoopLag = LOOP_LAG) {
    this.#ms = ms;
    this.#onExpire = onExpire;
    this.#lag = lag;
  }

  /** The time a connection has, in ms. */
  get ms(): number {
    return this.#ms;
  }

  /** Connections still owing their first frame. */
  get size(): number {
    return this.#deadlines.size;
  }

  /** Starts the deadline of a new connection. */
  start(key: K): void {
    this.#watching ??= this.#lag.watch();
    this.#deadlines.set(key, { at: performance.now(), late: this.#lag.late });
    if (this.#timer === undefined) this.#arm(this.#ms);
  }

  /**
   * Ends the deadline of `key`; `false` when it had already expired (or was
   * never started, or everything was cleared).
   */
  arrived(key: K): boolean {
    if (!this.#deadlines.delete(key)) return false;
    if (this.#deadlines.size === 0) this.#idle();
    return true;
  }

  /** How long the connection that has waited longest has waited, in ms (`null`: none waits). */
  oldestWait(): number | null {
    const first = this.#deadlines.values().next();
    return first.done ? null : this.#waited(first.value);
  }

  /**
   * Ends the deadline of the connection that has waited longest, if it has
   * waited at least `minWait` ms (its peer's silence), and returns it.
   */
  takeOldest(minWait = 0): K | undefined {
    const first = this.#deadlines.entries().next();
    if (first.done) return undefined;
    const [oldest, start] = first.value;
    if (this.#waited(start) < minWait) return undefined;
    this.arrived(oldest);
    return oldest;
  }

  /** Forgets every deadline and stops the timer. */
  clear(): void {
    this.#deadlines.clear();
    this.#idle();
  }

  /** How long a connection started at `start` has waited, less the loop's lateness since. */
  #waited(start: { at: number; late: number }): number {
    return performance.now() - start.at - (this.#lag.late - start.late);
  }

  #idle(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#watching?.[Symbol.dispose]();
    this.#watching = null;
  }

  #arm(ms: number): void {
    this.#timer = setTimeout(() => this.#sweep(), ms);
  }

  #sweep(): void {
    this.#timer = undefined;
    for (const [key, start] of this.#deadlines) {
      const left = this.#ms - this.#waited(start);
      if (left > 0) {
        this.#arm(left);
        return;
      }
      this.#deadlines.delete(key);
      this.#onExpire(key);
    }
    this.#idle();
  }
}
