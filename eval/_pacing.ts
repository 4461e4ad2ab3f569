// How many rollouts a job runs at once: up to maxConcurrent, and no more
// than this process keeps up with. A thousand rollouts started in the same
// instant (each a control connection, an SSH handshake, a sandboxed
// command) queue behind each other in one event loop until every peer's
// deadline passes; started at the pace the loop sustains, each gets through
// quickly. The width starts at a floor, grows while the loop runs on time
// and shrinks while it runs late (its lag, _internal/loop_lag.ts).

import { LOOP_LAG, type LoopLag } from "../_internal/loop_lag.ts";

/** Widths up to this need no pacing: a job never runs fewer at once (unless maxConcurrent says). */
export const PACING_FLOOR = 32;
/**
 * Below this lag (ms) the width grows; above BUSY_LAG it shrinks. Tight:
 * on this 2-core machine 400 sandboxed rollouts went through at 13/s at
 * width 32 and at 9/s when the width was let grow to 400 (bench/width.ts),
 * so the width grows only while the loop is nearly idle.
 */
const CALM_LAG = 15;
const BUSY_LAG = 60;
/** How often the width is reconsidered while rollouts wait, in ms. */
const ADJUST_MS = 100;

/** A rollout's place in the width, given back when it ends. */
export type Admission = Disposable;

/**
 * Admits rollouts up to a width that follows the event loop's lag, between
 * `min(max, PACING_FLOOR)` and `max`: the width grows by an eighth each
 * {@linkcode ADJUST_MS} the loop runs on time and shrinks by a fifth while
 * it runs late. Waiters are admitted in order.
 */
export class StartPacer {
  readonly #max: number;
  readonly #floor: number;
  readonly #lag: LoopLag;
  #width: number;
  #running = 0;
  /** The widest it got, for a benchmark to print. */
  #peak = 0;
  readonly #waiters: (() => void)[] = [];
  #timer: ReturnType<typeof setTimeout> | undefined;
  #watching: Disposable | null = null;
  #adjusted = 0;

  /** Paces up to `max` at once. */
  constructor(max: number, lag: LoopLag = LOOP_LAG) {
    this.#max = max;
    this.#floor = Math.min(max, PACING_FLOOR);
    this.#width = this.#floor;
    this.#lag = lag;
  }

  /** Rollouts admitted and not yet ended. */
  get running(): number {
    return this.#running;
  }

  /** The width now. */
  get width(): number {
    return this.#width;
  }

  /** The most rollouts it ran at once. */
  get peak(): number {
    return this.#peak;
  }

  /**
   * Waits for room in the width; dispose the admission when the rollout ends.
   * @throws the signal's reason when it aborts first
   */
  async admit(signal?: AbortSignal): Promise<Admission> {
    signal?.throwIfAborted();
    if (this.#max > this.#floor) this.#watching ??= this.#lag.watch();
    this.#adjust();
    if (this.#running >= this.#width || this.#waiters.length > 0) {
      await this.#wait(signal); // #wake() counted it in
    } else {
      this.#running++;
    }
    this.#peak = Math.max(this.#peak, this.#running);
    let ended = false;
    return {
      [Symbol.dispose]: () => {
        if (ended) return;
        ended = true;
        this.#running--;
        this.#wake();
      },
    };
  }

  /** Stops watching the loop; waiters left are not admitted. */
  close(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#watching?.[Symbol.dispose]();
    this.#watching = null;
  }

  #wait(signal: AbortSignal | undefined): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const admitted = () => {
        signal?.removeEventListener("abort", aborted);
        resolve();
      };
      const aborted = () => {
        const i = this.#waiters.indexOf(admitted);
        if (i >= 0) this.#waiters.splice(i, 1);
        reject(signal!.reason);
      };
      signal?.addEventListener("abort", aborted, { once: true });
      this.#waiters.push(admitted);
      this.#tick();
    });
  }

  /** Reconsiders the width (at most once per ADJUST_MS), then admits waiters it has room for. */
  #wake(): void {
    this.#adjust();
    while (this.#waiters.length > 0 && this.#running < this.#width) {
      // Counted now, not when the waiter's continuation runs: this loop
      // must not give the same room twice.
      this.#running++;
      this.#waiters.shift()!();
    }
    this.#tick();
  }

  #adjust(): void {
    const now = performance.now();
    if (this.#max <= this.#floor || now - this.#adjusted < ADJUST_MS) return;
    this.#adjusted = now;
    const lag = this.#lag.lag;
    if (lag < CALM_LAG) {
      this.#width = Math.min(this.#max, this.#width + Math.max(1, Math.floor(this.#width / 8)));
    } else if (lag > BUSY_LAG) {
      this.#width = Math.max(this.#floor, Math.floor(this.#width * 0.8));
    }
  }

  /** While rollouts wait, reconsiders the width every ADJUST_MS even if none ends. */
  #tick(): void {
    if (this.#waiters.length === 0 || this.#timer !== undefined) return;
    const timer = setTimeout(() => {
      this.#timer = undefined;
      this.#wake();
    }, ADJUST_MS);
    Deno.unrefTimer(timer);
    this.#timer = timer;
  }
}
