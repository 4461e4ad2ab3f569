// One rollout's route through the proxy: its credential and the variables
// that point an agent at it, its recorder, and its calls in flight.

import type { ModelRoute } from "../agents/command.ts";
import type { ModelCallUsage } from "../eval/agent.ts";
import type { AdaptiveConcurrency } from "../eval/concurrency.ts";
import type { Trace } from "../eval/trace.ts";
import { timingSafeEqual } from "../_internal/auth.ts";
import type { ProxyConfig } from "./_config.ts";
import { Recorder } from "./_recorder.ts";
import type { Call } from "./_calls.ts";

/** What a route gets of the rollout it records: the trace it writes into. */
export interface ProxyRun {
  /** The rollout's trace. */
  readonly trace: Trace;
}

/** What a route gets of the job it runs in (an `AgentContext` is one). */
export interface ProxyRouteContext {
  /** Hears of each call's tokens and cost, so that the job's limits count them. */
  onUsage?: (usage: ModelCallUsage) => void;
  /** The job's limit on model calls in flight: each call holds a permit of it. */
  concurrency?: AdaptiveConcurrency;
}

/**
 * One rollout's way to the model (made by `ModelProxy.open()`): its
 * credential, the variables that point an agent at it, and the record of
 * its calls. Closing it refuses its credential from then on and cuts off
 * its calls in flight.
 */
export interface ProxyRoute extends AsyncDisposable, ModelRoute {
  /** The route's id (the credential's public part). */
  readonly id: string;
  /** The credential: the key an agent sends (it is in the base urls too). */
  readonly key: string;
  /**
   * `OPENAI_BASE_URL` (up to `/v1`), `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`
   * and `ANTHROPIC_API_KEY`, pointing at this route.
   */
  readonly env: Readonly<Record<string, string>>;
  /** Calls recorded so far (failed ones too). */
  readonly calls: number;
  /** Whether the route was closed. */
  readonly closed: boolean;
  /**
   * An agent's environment: `base` without any variable that holds the
   * model server's key, with {@linkcode ProxyRoute.env} set over it.
   */
  environment(base: Readonly<Record<string, string>>): Record<string, string>;
  /**
   * Refuses the credential from now on, cuts off the calls in flight, and
   * waits until they are recorded. Idempotent.
   */
  close(): Promise<void>;
}

function hex(bytes: number): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(bytes)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
}

/** A {@linkcode ProxyRoute}, with what the proxy needs of it besides. */
export class Route implements ProxyRoute {
  readonly #id: string;
  readonly #secret: Uint8Array;
  readonly #key: string;
  readonly #env: Readonly<Record<string, string>>;
  readonly #recorder: Recorder;
  readonly #context: ProxyRouteContext;
  readonly #upstreamKey: string | null;
  readonly #closing = new AbortController();
  readonly #inFlight = new Set<Promise<unknown>>();
  readonly #onClose: (route: Route) => void;

  /** A route recording into `run.trace`; `onClose` hears when it closes. */
  constructor(
    origin: string,
    run: ProxyRun,
    context: ProxyRouteContext,
    config: ProxyConfig,
    onClose: (route: Route) => void,
  ) {
    this.#id = hex(8);
    const secret = hex(32);
    this.#secret = new TextEncoder().encode(secret);
    this.#key = `hudr_${this.#id}_${secret}`;
    this.#context = context;
    this.#upstreamKey = config.apiKey;
    this.#onClose = onClose;
    this.#recorder = new Recorder(run.trace, context.onUsage, config.pricing);
    const base = `${origin}/r/${this.#key}`;
    this.#env = Object.freeze({
      OPENAI_BASE_URL: `${base}/v1`,
      OPENAI_API_KEY: this.#key,
      ANTHROPIC_BASE_URL: base,
      ANTHROPIC_API_KEY: this.#key,
    });
  }

  /** The route's id (the credential's public part). */
  get id(): string {
    return this.#id;
  }

  /** The credential: the key an agent sends (it is in the base urls too). */
  get key(): string {
    return this.#key;
  }

  /**
   * `OPENAI_BASE_URL` (up to `/v1`), `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`
   * and `ANTHROPIC_API_KEY`, pointing at this route.
   */
  get env(): Readonly<Record<string, string>> {
    return this.#env;
  }

  /** Calls recorded so far (failed ones too). */
  get calls(): number {
    return this.#recorder.calls;
  }

  /** Whether the route was closed. */
  get closed(): boolean {
    return this.#closing.signal.aborted;
  }

  /**
   * An agent's environment: `base` without any variable that holds the
   * model server's key, with {@linkcode ProxyRoute.env} set over it.
   */
  environment(base: Readonly<Record<string, string>>): Record<string, string> {
    const key = this.#upstreamKey;
    const out: Record<string, string> = {};
    for (const [name, value] of Object.entries(base)) {
      if (key === null || key === "" || !value.includes(key)) out[name] = value;
    }
    return { ...out, ...this.#env };
  }

  /** Whether `secret` is this route's secret (compared in constant time). */
  verify(secret: string): boolean {
    return !this.closed && timingSafeEqual(new TextEncoder().encode(secret), this.#secret);
  }

  /** A call under this route, starting now. */
  call(config: ProxyConfig, request: Request): Call {
    // Not request.signal: Deno aborts it once a reply is delivered, which
    // would cut off a stream being relayed. An agent that goes away
    // mid-stream cancels the stream; one that waits for a whole reply is
    // let be until the call ends, its time is up or the rollout ends.
    const signal = AbortSignal.any([this.#closing.signal, AbortSignal.timeout(config.callTimeout)]);
    return {
      config,
      recorder: this.#recorder,
      signal,
      concurrency: this.#context.concurrency,
      started: performance.now(),
      headers: request.headers,
      track: (done) => {
        this.#inFlight.add(done);
        done.finally(() => this.#inFlight.delete(done));
      },
    };
  }

  /**
   * Refuses the credential from now on, cuts off the calls in flight, and
   * waits until they are recorded. Idempotent.
   */
  async close(): Promise<void> {
    if (!this.closed) {
      this.#closing.abort(new DOMException("the rollout ended", "AbortError"));
      this.#onClose(this);
    }
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
  }

  /** Closes the route. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
