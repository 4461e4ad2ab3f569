/**
 * {@linkcode LocalRuntime}: an environment served in this process, on
 * 127.0.0.1 port 0.
 *
 * @module
 */

import type { Environment } from "../env.ts";
import { bind, type HudServer } from "../server.ts";
import { Deadline } from "../_internal/async.ts";
import { generateToken } from "../_internal/auth.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "./placement.ts";

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
 * token per server that the placement's url carries.
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
  readonly #options: LocalRuntimeOptions;
  #shared: Promise<{ env: Environment; server: HudServer }> | null = null;
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
    this.#options = options;
  }

  /**
   * Starts the environment (bounded by the ready timeout) and serves it.
   * On failure everything started so far is torn down before the error is
   * thrown.
   */
  async place(options: PlaceOptions = {}): Promise<Placement> {
    options.signal?.throwIfAborted();
    if (typeof this.#source === "function") {
      const env = await this.#source();
      const server = await this.#boot(env, options.signal);
      return placement(server, async () => {
        await server.shutdown();
        await env.stop();
      });
    }
    const env = this.#source;
    this.#users++;
    try {
      this.#shared ??= this.#boot(env, options.signal).then((server) => ({ env, server }));
      const { server } = await this.#shared;
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
    if (!shared) return;
    const { env, server } = await shared;
    await server.shutdown();
    await env.stop();
  }

  async #boot(env: Environment, signal?: AbortSignal): Promise<HudServer> {
    const timeout = this.#options.readyTimeout ?? 60_000;
    using deadline = new Deadline(timeout, signal, `starting environment "${env.name}"`);
    const started = env.start();
    try {
      await new Promise<void>((resolve, reject) => {
        deadline.signal.addEventListener("abort", () => reject(deadline.signal.reason), {
          once: true,
        });
        started.then(resolve, reject);
      });
    } catch (err) {
      // Tear down whatever the hooks managed, once they settle.
      started.then(() => env.stop(), () => {}).catch(() => {});
      throw err;
    }
    try {
      return bind(env, { onError: this.#options.onError, token: generateToken() });
    } catch (err) {
      await env.stop().catch(() => {});
      throw err;
    }
  }
}

function placement(server: HudServer, release: () => Promise<void>): Placement {
  return {
    url: server.url,
    params: Object.freeze({ port: server.addr.port }),
    [Symbol.asyncDispose]: release,
  };
}
