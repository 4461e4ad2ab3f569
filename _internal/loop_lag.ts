// How far behind this process's event loop runs: a probe timer that fires
// every few tens of ms while anyone watches, and notes how late it fired.
// A loop that is late is this process's own queue, not a peer's silence:
// deadlines on peers subtract it (FirstFrameDeadlines), and a scheduler
// that starts work paces itself by it (Taskset.run's start pacer).

/** The probe's period, in ms. */
const PROBE_MS = 50;
/** Weight of the newest probe in {@linkcode LoopLag.lag}. */
const SMOOTHING = 0.3;

/**
 * The lag of this process's event loop, measured only while watched: a
 * probe timer (unref'd: it never keeps the process alive) runs from the
 * first {@linkcode LoopLag.watch} to the last watcher's dispose.
 */
export class LoopLag {
  #watchers = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** When the probe should fire (ms, performance.now()). */
  #due = 0;
  /** Lateness of every probe so far, summed, in ms. */
  #late = 0;
  #lag = 0;

  /**
   * Milliseconds the loop has been late, summed over the probes so far and
   * counting the probe that is overdue now: the difference of two readings
   * is how long this process could not run its timers between them.
   */
  get late(): number {
    const overdue = this.#timer === undefined ? 0 : Math.max(0, performance.now() - this.#due);
    return this.#late + overdue;
  }

  /** The recent lateness of the loop, in ms (a moving average of the probes). */
  get lag(): number {
    const overdue = this.#timer === undefined ? 0 : Math.max(0, performance.now() - this.#due);
    return Math.max(this.#lag, overdue);
  }

  /** Whether anyone watches (the probe runs). */
  get watched(): boolean {
    return this.#watchers > 0;
  }

  /** Starts measuring until the returned handle is disposed (each handle once). */
  watch(): Disposable {
    if (this.#watchers++ === 0) {
      this.#lag = 0;
      this.#arm();
    }
    let done = false;
    return {
      [Symbol.dispose]: () => {
        if (done) return;
        done = true;
        if (--this.#watchers === 0) {
          clearTimeout(this.#timer);
          this.#timer = undefined;
        }
      },
    };
  }

  #arm(): void {
    this.#due = performance.now() + PROBE_MS;
    const timer = setTimeout(() => this.#probe(), PROBE_MS);
    Deno.unrefTimer(timer);
    this.#timer = timer;
  }

  #probe(): void {
    const late = Math.max(0, performance.now() - this.#due);
    this.#late += late;
    this.#lag = this.#lag * (1 - SMOOTHING) + late * SMOOTHING;
    this.#arm();
  }
}

/** The one measure of this process's loop, shared by all who watch it. */
export const LOOP_LAG: LoopLag = new LoopLag();
