/**
 * {@linkcode Runtime}: an environment already served at an address, as a
 * runtime that places nothing.
 *
 * @module
 */

import { type ControlAddress, parseControlUrl } from "../_internal/auth.ts";
import type { PlacementWithUrl, PlaceOptions, RuntimeProvider } from "./placement.ts";

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
 * assert.deepEqual(placed.address, { hostname: "127.0.0.1", port: 8765 });
 * ```
 */
export class Runtime implements RuntimeProvider, PlacementWithUrl {
  readonly #url: string;
  readonly #address: ControlAddress;
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
    this.#address = parseControlUrl(url);
    this.#url = url.includes("://") ? url : `tcp://${url}`;
    this.#params = Object.freeze({ ...params });
  }

  /** The control address as given (it may hold the token: do not print it). */
  get url(): string {
    return this.#url;
  }

  /** The control address: host, port and the url's token. */
  get address(): ControlAddress {
    return this.#address;
  }

  /** Data about the placement. */
  get params(): Readonly<Record<string, unknown>> {
    return this.#params;
  }

  /** Returns this runtime. */
  place(options?: PlaceOptions): Promise<PlacementWithUrl> {
    options?.signal?.throwIfAborted();
    return Promise.resolve(this);
  }

  /** Nothing to release. */
  [Symbol.asyncDispose](): Promise<void> {
    return Promise.resolve();
  }
}
