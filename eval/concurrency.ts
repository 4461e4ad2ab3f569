/**
 * Adaptive concurrency for model calls, as Inspect's adaptive connections
 * do it: a limit on calls in flight that starts at 20 (or the maximum, when
 * lower), shrinks by 0.8 on each rate-limit episode, and grows by about
 * 5% (at least one) after each clean window (as many calls as the limit,
 * without a rate limit, once a 15 s cool-down after the last shrink has
 * passed), never past the maximum. An episode is the 429s of the calls
 * sent under one limit: those of calls sent before a shrink count toward
 * it, and a call sent under the lowered limit and refused is a new one
 * (one shrink per round of calls, cool-down or not: a limit still too high
 * keeps shrinking). A `Retry-After` holds every new call until it has passed. The
 * clock is injectable, so that a test can drive it without sleeping.
 *
 * {@linkcode Taskset.run} makes one per job, bounded by `maxConcurrent`,
 * and hands it to agents in their context; {@linkcode ChatAgent} takes a
 * permit for each model call.
 *
 * @example
 * ```ts
 * import { AdaptiveConcurrency, virtualClock } from "./concurrency.ts";
 * import assert from "node:assert/strict";
 *
 * const clock = virtualClock();
 * const limiter = new AdaptiveConcurrency({ max: 10, clock });
 * (await limiter.acquire()).release("rate_limited", 2_000);
 * assert.equal(limiter.limit, 8);
 * clock.advance(15_000);
 * for (let i = 0; i < 8; i++) (await limiter.acquire()).release("ok");
 * assert.deepEqual(limiter.history, [10, 8, 9]);
 * ```
 *
 * @module
 */

import { delay } from "../_internal/async.ts";

/** Time as the limiter sees it. */
export interface Clock {
  /** Milliseconds, monotonic. */
  now(): number;
  /** Resolves after `ms`, or rejects with the signal's reason. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** The real clock: `performance.now()` and timers. */
export const SYSTEM_CLOCK: Clock = {
  now: () => performance.now(),
  sleep: (ms, signal) => delay(ms, signal),
};

/** A clock for tests: time moves only by `advance()` and by sleeping, at once. */
export interface VirtualClock extends Clock {
  /** Moves time on by `ms`. */
  advance(ms: number): void;
}

/** A {@linkcode VirtualClock} starting at 0: a sleep moves time on and resolves at once. */
export function virtualClock(): VirtualClock {
  let t = 0;
  return {
    now: () => t,
    advance(ms) {
      t += ms;
    },
    sleep(ms, signal) {
      if (signal?.aborted) return Promise.reject(signal.reason);
      t += Math.max(0, ms);
      return Promise.resolve();
    },
  };
}

/** How a call that held a permit went. */
export type CallOutcome = "ok" | "rate_limited" | "error";

/** A slot for one call; release it once, with how the call went. */
export interface ConcurrencyPermit {
  /**
   * Frees the slot. `retryAfterMs` (a rate limit's `Retry-After`) holds
   * new calls until it has passed. Later calls are ignored.
   */
  release(outcome: CallOutcome, retryAfterMs?: number | null): void;
}

/** Why the limit changed. */
export type LimitChange = "rate_limit" | "clean_window";

/** Options for {@linkcode AdaptiveConcurrency}. */
export interface AdaptiveConcurrencyOptions {
  /** The most calls in flight. */
  max: number;
  /** The fewest. @default 1 */
  min?: number;
  /** The first limit. @default the smaller of 20 and `max` */
  start?: number;
  /** The factor of a shrink. @default 0.8 */
  decrease?: number;
  /** The growth after a clean window, as a fraction (at least one call). @default 0.05 */
  increase?: number;
  /** The cool-down after a shrink, in ms: no growth until it has passed. @default 15_000 */
  cooldownMs?: number;
  /** The clock. @default {@linkcode SYSTEM_CLOCK} */
  clock?: Clock;
  /** Called after each change of the limit. Must not throw. */
  onChange?: (limit: number, why: LimitChange) => void;
}

interface Waiter {
  resolve: (permit: ConcurrencyPermit) => void;
  reject: (reason: unknown) => void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

/** A limit on model calls in flight that adapts to rate limits; see the module doc. */
export class AdaptiveConcurrency {
  readonly #max: number;
  readonly #min: number;
  readonly #decrease: number;
  readonly #increase: number;
  readonly #cooldown: number;
  readonly #clock: Clock;
  readonly #onChange?: (limit: number, why: LimitChange) => void;
  #limit: number;
  #inFlight = 0;
  #clean = 0;
  #shrunkAt = -Infinity;
  /** Shrinks so far: a permit handed out before the last one belongs to an old episode. */
  #epoch = 0;
  #heldUntil = -Infinity;
  #episodes = 0;
  #history: number[];
  #waiters: Waiter[] = [];
  #hold: AbortController | null = null;

  /**
   * Makes a limiter.
   * @throws {RangeError} for bounds that are not positive integers in order, or factors out of range
   */
  constructor(options: AdaptiveConcurrencyOptions) {
    const max = options?.max;
    const min = options.min ?? 1;
    const start = options.start ?? Math.min(20, max);
    for (const [name, v] of [["max", max], ["min", min], ["start", start]] as const) {
      if (!Number.isInteger(v) || v < 1) {
        throw new RangeError(
          `Cannot make AdaptiveConcurrency: ${name} must be a positive integer, got "${v}"`,
        );
      }
    }
    if (!(min <= start && start <= max)) {
      throw new RangeError(
        `Cannot make AdaptiveConcurrency: need min <= start <= max, got ${min}, ${start}, ${max}`,
      );
    }
    const decrease = options.decrease ?? 0.8;
    const increase = options.increase ?? 0.05;
    if (!(decrease > 0 && decrease < 1) || !(increase >= 0)) {
      throw new RangeError(
        `Cannot make AdaptiveConcurrency: decrease must be in (0, 1) and increase at least 0, got ${decrease} and ${increase}`,
      );
    }
    this.#max = max;
    this.#min = min;
    this.#limit = start;
    this.#decrease = decrease;
    this.#increase = increase;
    this.#cooldown = options.cooldownMs ?? 15_000;
    this.#clock = options.clock ?? SYSTEM_CLOCK;
    this.#onChange = options.onChange;
    this.#history = [start];
  }

  /** Calls allowed in flight now. */
  get limit(): number {
    return this.#limit;
  }
  /** The bound the limit never passes. */
  get max(): number {
    return this.#max;
  }
  /** Calls in flight. */
  get inFlight(): number {
    return this.#inFlight;
  }
  /** Calls waiting for a permit. */
  get waiting(): number {
    return this.#waiters.length;
  }
  /** Rate-limit episodes so far. */
  get rateLimitEpisodes(): number {
    return this.#episodes;
  }
  /** The limit at the start and after each change, in order. */
  get history(): readonly number[] {
    return this.#history;
  }
  /** The clock the limiter runs on (for waits that must keep its time, such as retries). */
  get clock(): Clock {
    return this.#clock;
  }

  /**
   * Waits for a slot (and for any `Retry-After` to pass), then holds it.
   * @throws the signal's reason when it aborts first
   */
  acquire(signal?: AbortSignal): Promise<ConcurrencyPermit> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<ConcurrencyPermit>((resolve, reject) => {
      const waiter: Waiter = { resolve, reject, signal };
      if (signal) {
        waiter.onAbort = () => {
          const i = this.#waiters.indexOf(waiter);
          if (i >= 0) this.#waiters.splice(i, 1);
          // Nobody left to hold: no timer may outlive the callers.
          if (this.#waiters.length === 0) this.#hold?.abort();
          reject(signal.reason);
        };
        signal.addEventListener("abort", waiter.onAbort, { once: true });
      }
      this.#waiters.push(waiter);
      this.#pump();
    });
  }

  #permit(): ConcurrencyPermit {
    let released = false;
    const epoch = this.#epoch;
    return {
      release: (outcome, retryAfterMs) => {
        if (released) return;
        released = true;
        this.#inFlight--;
        this.#record(outcome, retryAfterMs ?? null, epoch);
        this.#pump();
      },
    };
  }

  #record(outcome: CallOutcome, retryAfterMs: number | null, epoch: number): void {
    const now = this.#clock.now();
    if (outcome === "rate_limited") {
      if (retryAfterMs !== null && retryAfterMs > 0) {
        this.#heldUntil = Math.max(this.#heldUntil, now + retryAfterMs);
      }
      this.#clean = 0;
      // Sent before the last shrink: that shrink's episode already counted it.
      if (epoch !== this.#epoch) return;
      this.#epoch++;
      this.#episodes++;
      this.#shrunkAt = now;
      this.#set(Math.max(this.#min, Math.floor(this.#limit * this.#decrease)), "rate_limit");
    } else if (outcome === "ok") {
      this.#clean++;
      if (
        this.#clean >= this.#limit && now - this.#shrunkAt >= this.#cooldown &&
        this.#limit < this.#max
      ) {
        this.#set(
          Math.min(
            this.#max,
            Math.max(this.#limit + 1, Math.round(this.#limit * (1 + this.#increase))),
          ),
          "clean_window",
        );
      }
    }
  }

  #set(limit: number, why: LimitChange): void {
    this.#clean = 0;
    if (limit === this.#limit) return;
    this.#limit = limit;
    this.#history.push(limit);
    try {
      this.#onChange?.(limit, why);
    } catch {
      // Reporting is best effort.
    }
  }

  #pump(): void {
    if (this.#hold !== null) return;
    const wait = this.#heldUntil - this.#clock.now();
    if (wait > 0 && this.#waiters.length > 0) {
      // One timer for everyone held by a Retry-After; then hand out slots.
      const hold = this.#hold = new AbortController();
      const done = () => {
        this.#hold = null;
        this.#pump();
      };
      this.#clock.sleep(wait, hold.signal).then(done, done);
      return;
    }
    while (this.#inFlight < this.#limit && this.#waiters.length > 0) {
      const w = this.#waiters.shift()!;
      if (w.onAbort) w.signal!.removeEventListener("abort", w.onAbort);
      this.#inFlight++;
      w.resolve(this.#permit());
    }
  }
}
