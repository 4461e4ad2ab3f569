/**
 * {@linkcode Runtime}: an environment already served at an address, as a
 * runtime that places nothing.
 *
 * @module
 */

import { parseControlUrl } from "../_internal/control_url.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "./placement.ts";

/**
 * An environment served elsewhere, at a known address. Placing it does
 * nothing and releasing it leaves the environment running.
 *
 * @example
 * ```ts
 * import { Runtime } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const runtime = new Runtime("tcp://127.0.0.1:8765");
 * await using placed = await runtime.place();
 * assert.equal(placed.url, "tcp://127.0.0.1:8765");
 * ```
 */
export class Runtime implements RuntimeProvider, Placement {
  readonly #url: string;
  readonly #params: Readonly<Record<string, unknown>>;

  /**
   * Points at an environment served at `url`.
   * @param url `tcp://host:port` or `host:port`; `tcp://:TOKEN@host:port`
   *   when the environment requires a token (clients also read
   *   `HUD_SERVE_TOKEN`)
   * @param params data about the placement
   * @throws {TypeError} for a malformed address
   */
  constructor(url: string, params: Record<string, unknown> = {}) {
    parseControlUrl(url);
    this.#url = url.includes("://") ? url : `tcp://${url}`;
    this.#params = Object.freeze({ ...params });
  }

  /** The control address. */
  get url(): string {
    return this.#url;
  }

  /** Data about the placement. */
  get params(): Readonly<Record<string, unknown>> {
    return this.#params;
  }

  /** Returns this runtime. */
  place(options?: PlaceOptions): Promise<Placement> {
    options?.signal?.throwIfAborted();
    return Promise.resolve(this);
  }

  /** Nothing to release. */
  [Symbol.asyncDispose](): Promise<void> {
    return Promise.resolve();
  }
}
