/**
 * Sharing one placement between rollouts: {@linkcode Shared} places its
 * provider once and leases the placement to up to `width` rollouts at once.
 *
 * @example One boot for three rollouts
 * ```ts
 * import { Environment, LocalRuntime } from "../mod.ts";
 * import { Shared } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo");
 * await using shared = new Shared(new LocalRuntime(env), { width: 2 });
 * for (let i = 0; i < 3; i++) {
 *   await using placed = await shared.place();
 *   assert.equal(placed.address.hostname, "127.0.0.1");
 * }
 * assert.equal(shared.boots, 1);
 * ```
 *
 * @module
 */

import {
  type Placement,
  placementOf,
  type PlacementWithUrl,
  type PlaceOptions,
  type RuntimeProvider,
} from "./placement.ts";

/** Options for {@linkcode Shared}. */
export interface SharedOptions {
  /**
   * Rollouts one placement serves at once; more wait for a free slot.
   * @default 8
   */
  width?: number;
}

/**
 * One environment substrate for many rollouts: placed on first use, serving
 * up to `width` rollouts at once (more wait), released when the `Shared`
 * is disposed. A failed boot fails only the rollout that asked for it; the
 * next one boots again.
 */
export class Shared implements RuntimeProvider, AsyncDisposable {
  readonly #provider: RuntimeProvider;
  readonly #width: number;
  #placement: Promise<Placement> | null = null;
  #inUse = 0;
  #waiters: (() => void)[] = [];
  #disposed = false;
  #boots = 0;

  /**
   * Shares `provider`'s placement.
   * @throws {RangeError} for a width below 1
   */
  constructor(provider: RuntimeProvider, options: SharedOptions = {}) {
    const width = options.width ?? 8;
    if (!Number.isInteger(width) || width < 1) {
      throw new RangeError(
        `Cannot share runtime: width must be a positive integer, got "${width}"`,
      );
    }
    this.#provider = provider;
    this.#width = width;
  }

  /** How many times the substrate was booted. */
  get boots(): number {
    return this.#boots;
  }

  /** A lease on the shared placement; dispose it to free the slot. */
  async place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    if (this.#disposed) throw new Error("Cannot place: the shared runtime was disposed");
    await this.#acquire(options.signal);
    try {
      let placement: Placement;
      while (true) {
        const mine = this.#placement === null;
        if (mine) {
          this.#boots++;
          const booting = this.#provider.place(options);
          this.#placement = booting;
          booting.catch(() => {
            if (this.#placement === booting) this.#placement = null;
          });
        }
        try {
          placement = await this.#placement!;
          break;
        } catch (err) {
          // Someone else's failed boot is not ours to report: boot again.
          if (mine) throw err;
        }
      }
      let released = false;
      return placementOf(placement.address, placement.params, () => {
        if (!released) {
          released = true;
          this.#release();
        }
        return Promise.resolve();
      });
    } catch (err) {
      this.#release();
      throw err;
    }
  }

  #acquire(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    if (this.#inUse < this.#width) {
      this.#inUse++;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const grant = () => {
        signal?.removeEventListener("abort", onAbort);
        this.#inUse++;
        resolve();
      };
      const onAbort = () => {
        this.#waiters = this.#waiters.filter((w) => w !== grant);
        reject(signal!.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#waiters.push(grant);
    });
  }

  #release(): void {
    this.#inUse--;
    this.#waiters.shift()?.();
  }

  /** Releases the shared placement. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    const placement = this.#placement;
    this.#placement = null;
    if (placement) {
      const p = await placement.catch(() => null);
      if (p) await p[Symbol.asyncDispose]();
    }
  }
}
