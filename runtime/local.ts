/**
 * {@linkcode LocalRuntime}: an environment served in this process, on
 * 127.0.0.1 port 0.
 *
 * @module
 */

import type { Environment } from "../env.ts";
import { type HudServer, serve } from "../server.ts";
import { abortable, Deadline } from "../_internal/async.ts";
import { generateToken } from "../_internal/auth.ts";
import {
  placementOf,
  type PlacementWithUrl,
  type PlaceOptions,
  type RuntimeProvider,
} from "./placement.ts";

/** Options for {@linkcode LocalRuntime}. */
export interface LocalRuntimeOptions {
  /**
   * How long the initialize hooks may take, in ms.
   * @default 60_000
   */
  readyTimeout?: number;
  /** Called with the server's unexpected errors. */
  onError?: (error: unknown) => void;
}

/**
 * An environment served in this process on 127.0.0.1 port 0, with a fresh
 * token per server that the placement's address carries.
 *
 * Given an {@linkcode Environment}, every placement shares one server, and
 * the hooks run on the first placement and the shutdown hooks after the
 * last is released. Given a factory, each placement gets a fresh
 * environment and server of its own.
 *
 * @example
 * ```ts
 * import { connect, Environment, LocalRuntime } from "../mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo");
 * env.template({ id: "t" }, async function* () {
 *   yield "prompt";
 *   yield 1;
 * });
 * await using placed = await new LocalRuntime(env).place();
 * await using client = await connect(placed);
 * assert.equal(client.manifest.env.name, "demo");
 * ```
 */
export class LocalRuntime implements RuntimeProvider {
  readonly #source: Environment | (() => Environment | Promise<Environment>);
  readonly #readyTimeout: number;
  readonly #onError: ((error: unknown) => void) | undefined;
  #shared: Promise<HudServer> | null = null;
  #users = 0;

  /**
   * Serves `source` in this process.
   * @param source an environment, or a factory that makes a fresh one per placement
   */
  constructor(
    source: Environment | (() => Environment | Promise<Environment>),
    options: LocalRuntimeOptions = {},
  ) {
    if (typeof source !== "function" && (typeof source !== "object" || source === null)) {
      throw new TypeError("Cannot create LocalRuntime: expected an Environment or a factory");
    }
    this.#source = source;
    this.#readyTimeout = options.readyTimeout ?? 60_000;
    this.#onError = options.onError;
  }

  /**
   * Starts the environment (bounded by the ready timeout) and serves it.
   * On failure everything started so far is torn down before the error is
   * thrown, or, for a timeout, once the initialize hooks settle.
   */
  async place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    options.signal?.throwIfAborted();
    if (typeof this.#source === "function") {
      const server = await this.#boot(await this.#source(), options.signal);
      return placement(server, () => server.shutdown());
    }
    const env = this.#source;
    this.#users++;
    try {
      this.#shared ??= this.#boot(env, options.signal);
      const server = await this.#shared;
      let released = false;
      return placement(server, async () => {
        if (released) return;
        released = true;
        await this.#release();
      });
    } catch (err) {
      this.#shared = null;
      this.#users--;
      throw err;
    }
  }

  async #release(): Promise<void> {
    if (--this.#users > 0) return;
    const shared = this.#shared;
    this.#shared = null;
    await (await shared)?.shutdown();
  }

  /**
   * The serve lifecycle, announcing nothing and leaving signals alone; the
   * handle's shutdown also runs the shutdown hooks. The ready timeout (and
   * the placement's signal) bound only the start: a late start is torn
   * down by `serve` itself once the hooks settle.
   */
  async #boot(env: Environment, signal?: AbortSignal): Promise<HudServer> {
    using deadline = new Deadline(
      this.#readyTimeout,
      signal,
      `starting environment "${env.name}"`,
    );
    const serving = serve(env, {
      signal: deadline.signal,
      token: generateToken(),
      announce: () => {},
      handleSignals: false,
      onError: this.#onError,
    });
    return await abortable(serving, deadline.signal);
  }
}

function placement(server: HudServer, release: () => Promise<void>): PlacementWithUrl {
  return placementOf(server.address, Object.freeze({ port: server.addr.port }), release);
}
