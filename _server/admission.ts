// Admission of connections to the control port, apart from any socket: the
// token check of a connection's first frame, and the first-frame deadline.

import { ErrorCode } from "../errors.ts";
import { SERVE_TOKEN_VAR, TokenVerifier } from "../_internal/auth.ts";
import { isRecord } from "../_internal/util.ts";
import { errorReply, type Reply } from "./dispatcher.ts";

/** What an authenticating server tells a connection it turns away. */
export const UNAUTHORIZED_MESSAGE =
  `unauthorized: the first frame must be hello or tunnel.open with the server's token in params.token (set ${SERVE_TOKEN_VAR}, or connect to tcp://:TOKEN@host:port)`;

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
    return errorReply(request.id ?? null, ErrorCode.UNAUTHORIZED, UNAUTHORIZED_MESSAGE);
  }
}

/**
 * First-frame deadlines of many connections under one timer: every
 * connection gets the same time, so insertion order is deadline order and
 * one sweep answers the expired ones, rather than one timer and one race per
 * connection.
 */
export class FirstFrameDeadlines<K> {
  readonly #ms: number;
  readonly #onExpire: (key: K) => void;
  readonly #deadlines = new Map<K, number>();
  #timer: ReturnType<typeof setTimeout> | undefined;

  /** `onExpire` runs for each connection whose `ms` passed before its first frame. */
  constructor(ms: number, onExpire: (key: K) => void) {
    this.#ms = ms;
    this.#onExpire = onExpire;
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
    this.#deadlines.set(key, Date.now() + this.#ms);
    if (this.#timer === undefined) this.#arm(this.#ms);
  }

  /**
   * Ends the deadline of `key`; `false` when it had already expired (or was
   * never started, or everything was cleared).
   */
  arrived(key: K): boolean {
    if (!this.#deadlines.delete(key)) return false;
    if (this.#deadlines.size === 0) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
    return true;
  }

  /** How long the connection that has waited longest has waited, in ms (`null`: none waits). */
  oldestWait(): number | null {
    const first = this.#deadlines.values().next();
    return first.done ? null : Date.now() - (first.value - this.#ms);
  }

  /**
   * Ends the deadline of the connection that has waited longest, if it has
   * waited at least `minWait` ms, and returns it.
   */
  takeOldest(minWait = 0): K | undefined {
    const waited = this.oldestWait();
    if (waited === null || waited < minWait) return undefined;
    const oldest = this.#deadlines.keys().next().value as K;
    this.arrived(oldest);
    return oldest;
  }

  /** Forgets every deadline and stops the timer. */
  clear(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#deadlines.clear();
  }

  #arm(ms: number): void {
    this.#timer = setTimeout(() => this.#sweep(), ms);
  }

  #sweep(): void {
    this.#timer = undefined;
    const now = Date.now();
    for (const [key, deadline] of this.#deadlines) {
      if (deadline > now) {
        this.#arm(deadline - now);
        return;
      }
      this.#deadlines.delete(key);
      this.#onExpire(key);
    }
  }
}
