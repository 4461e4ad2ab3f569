/**
 * Runtimes: where an environment runs. A runtime is placed for a rollout and
 * disposed after it; the client connects to its `url`.
 *
 * - {@linkcode Runtime}: an environment already served at an address.
 * - {@linkcode LocalRuntime}: an environment in this process, served on
 *   127.0.0.1 port 0.
 *
 * @module
 */

import type { Environment } from "./env.ts";
import { bind, type HudServer } from "./server.ts";
import { Deadline } from "./_async.ts";
import { parseControlUrl } from "./client.ts";

/** A placed environment: where to connect, until disposed. */
export interface Placement extends AsyncDisposable {
  /** The control address, `tcp://host:port`. */
  readonly url: string;
  /** Data about the placement (container id, pid...). */
  readonly params: Readonly<Record<string, unknown>>;
}

/** Options for {@linkcode RuntimeProvider.place}. */
export interface PlaceOptions {
  /** Aborts placing. */
  signal?: AbortSignal;
}

/** Something that can place an environment for a rollout. */
export interface RuntimeProvider {
  /** Places the environment; dispose the placement to release it. */
  place(options?: PlaceOptions): Promise<Placement>;
}

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
   * @param url `tcp://host:port` or `host:port`
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
 * An environment served in this process on 127.0.0.1 port 0.
 *
 * Given an {@linkcode Environment}, every placement shares one server, and
 * the hooks run on the first placement and the shutdown hooks after the
 * last is released. Given a factory, each placement gets a fresh
 * environment and server of its own.
 *
 * @example
 * ```ts
 * import { connect, Environment, LocalRuntime } from "./mod.ts";
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
      return bind(env, { onError: this.#options.onError });
    } catch (err) {
      await env.stop().catch(() => {});
      throw err;
    }
  }
}

function placement(server: HudServer, release: () => Promise<void>): Placement {
  return {
    url: `tcp://127.0.0.1:${server.addr.port}`,
    params: Object.freeze({ port: server.addr.port }),
    [Symbol.asyncDispose]: release,
  };
}
