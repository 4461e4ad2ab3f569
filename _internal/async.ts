// Small async helpers built on web standards (no @std/async here).

/** Resolves after `ms`, or rejects with the signal's reason when it aborts. */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A signal that aborts after `ms` (with a `TimeoutError` DOMException) or
 * when `parent` aborts. Dispose it to clear the timer, so that nothing
 * outlives the operation it bounds.
 */
export class Deadline implements Disposable {
  readonly #controller = new AbortController();
  readonly #timer: ReturnType<typeof setTimeout> | undefined;
  readonly #parent: AbortSignal | undefined;
  readonly #onParentAbort = () => this.#controller.abort(this.#parent!.reason);

  constructor(ms: number | undefined, parent?: AbortSignal, what = "operation") {
    this.#parent = parent;
    if (parent?.aborted) {
      this.#controller.abort(parent.reason);
    } else {
      parent?.addEventListener("abort", this.#onParentAbort, { once: true });
    }
    if (ms !== undefined && Number.isFinite(ms)) {
      this.#timer = setTimeout(() => {
        this.#controller.abort(
          new DOMException(`${what} timed out after ${ms} ms`, "TimeoutError"),
        );
      }, ms);
    }
  }

  /** The combined signal. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  [Symbol.dispose](): void {
    clearTimeout(this.#timer);
    this.#parent?.removeEventListener("abort", this.#onParentAbort);
  }
}

/**
 * Races `promise` against `signal`: rejects with the signal's reason when it
 * aborts first. `onAbort` runs at that moment (close the resource the
 * promise waits on, so it settles too).
 */
export function abortable<T>(
  promise: Promise<T>,
  signal: AbortSignal | undefined,
  onAbort?: () => void,
): Promise<T> {
  if (!signal) return promise;
  if (signal.aborted) {
    onAbort?.();
    promise.catch(() => {});
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const abort = () => {
      onAbort?.();
      promise.catch(() => {});
      reject(signal.reason);
    };
    signal.addEventListener("abort", abort, { once: true });
    promise.then(
      (v) => {
        signal.removeEventListener("abort", abort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener("abort", abort);
        reject(e);
      },
    );
  });
}

/**
 * Waits for `promise` at most `ms`; returns whether it settled (resolved or
 * rejected) in time. Leaves no timer behind.
 */
export async function settleWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const settled = await Promise.race([
    promise.then(() => true, () => true),
    new Promise<boolean>((resolve) => timer = setTimeout(() => resolve(false), ms)),
  ]);
  clearTimeout(timer);
  return settled;
}
