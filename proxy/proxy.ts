/**
 * A recording model proxy: started once per job, it stands between the
 * agents and the model server, and gives each rollout a route of its own
 * ({@linkcode ModelProxy.open}): a credential (in the base url and as the
 * key) under which every call of that rollout is recorded into its trace.
 * Towards the agent it speaks the OpenAI Chat Completions and Completions
 * APIs and Anthropic's Messages API, streamed or not, so that an unmodified
 * harness that reads `OPENAI_BASE_URL` / `OPENAI_API_KEY` (or the
 * `ANTHROPIC_` ones) is recorded; towards the server it asks for token ids
 * and log-probabilities in the server's own fields (llama-server, vLLM,
 * sglang), removing them again from what the agent gets unless it asked.
 * The server's key stays in the proxy: the agent has only its route's
 * credential, which is refused once the rollout ends.
 *
 * @example
 * ```ts
 * import { serveModelProxy } from "./proxy.ts";
 * import { Trace } from "../eval/trace.ts";
 * import assert from "node:assert/strict";
 *
 * await using server = Deno.serve({ port: 0, onListen() {} }, () =>
 *   Response.json({
 *     choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: "4" } }],
 *     usage: { prompt_tokens: 9, completion_tokens: 1 },
 *   }));
 * await using proxy = serveModelProxy({ upstream: `http://127.0.0.1:${server.addr.port}/v1` });
 * const trace = new Trace();
 * await using route = proxy.open({ trace });
 * const reply = await fetch(`${route.env.OPENAI_BASE_URL}/chat/completions`, {
 *   method: "POST",
 *   headers: { authorization: `Bearer ${route.env.OPENAI_API_KEY}` },
 *   body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "2+2?" }] }),
 * });
 * assert.equal((await reply.json()).choices[0].message.content, "4");
 * assert.equal(trace.steps[0].type, "model");
 * assert.equal(trace.steps[0].info?.input_tokens, 9);
 * ```
 *
 * @module
 */

import type { ModelRouter } from "../agents/command.ts";
import { BodyTooLargeError, readCapped } from "../_internal/body.ts";
import { formatHostPort } from "../_internal/net.ts";
import { isRecord } from "../_internal/util.ts";
import { addSecretValue } from "../_internal/secret_values.ts";
import { type ModelProxyOptions, type ProxyConfig, proxyConfig } from "./_config.ts";
import { guarded, messagesCall, openAiCall } from "./_calls.ts";
import { type ProxyRoute, type ProxyRouteContext, type ProxyRun, Route } from "./_route.ts";
import { errorResponse, type ProxyApi } from "./_wire.ts";

const ENDPOINTS: Record<string, ProxyApi | "models"> = {
  "/v1/chat/completions": "openai.chat",
  "/v1/completions": "openai.completions",
  "/v1/messages": "anthropic.messages",
  "/v1/models": "models",
};

/** `/r/<credential>` then an endpoint, exactly: anything else is not a route. */
const PATH = /^(?:\/r\/([A-Za-z0-9_]+))?(\/v1\/(?:chat\/completions|completions|messages|models))$/;
const CREDENTIAL = /^hudr_([0-9a-f]{16})_([0-9a-f]{64})$/;

/** A running proxy (see the module docs); made by {@linkcode serveModelProxy}. */
export class ModelProxy implements AsyncDisposable, ModelRouter {
  readonly #config: ProxyConfig;
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #routes = new Map<string, Route>();
  readonly #origin: string;

  /** Starts listening; use {@linkcode serveModelProxy}. */
  constructor(config: ProxyConfig) {
    this.#config = config;
    // Whatever this process writes (results, rows, logs) redacts it, as it
    // does a model backend's key.
    if (config.apiKey) addSecretValue(config.apiKey, "model API key");
    this.#server = Deno.serve({
      hostname: config.hostname,
      port: config.port,
      signal: config.signal,
      onListen: (addr) => config.onListen(addr),
      onError: (err) => {
        config.onError(err);
        return errorResponse(null, 500, "Model proxy failed");
      },
    }, (request) => this.#handle(request));
    const { hostname, port } = this.#server.addr;
    this.#origin = `http://${formatHostPort(hostname, port)}`;
  }

  /** Where it listens. */
  get addr(): Deno.NetAddr {
    return this.#server.addr;
  }

  /** `http://HOST:PORT`. */
  get url(): string {
    return this.#origin;
  }

  /** Routes open now. */
  get routes(): number {
    return this.#routes.size;
  }

  /** Resolves once the proxy has stopped. */
  get finished(): Promise<void> {
    return this.#server.finished;
  }

  /**
   * A route for one rollout, recording into `run.trace`; close it when the
   * rollout's agent is done.
   */
  open(run: ProxyRun, context: ProxyRouteContext = {}): ProxyRoute {
    const route = new Route(
      this.#origin,
      run,
      context,
      this.#config,
      (r) => this.#routes.delete(r.id),
    );
    this.#routes.set(route.id, route);
    return route;
  }

  /** Closes every route, then stops listening. Idempotent. */
  async shutdown(): Promise<void> {
    await Promise.all([...this.#routes.values()].map((r) => r.close()));
    await this.#server.shutdown();
  }

  /** Shuts the proxy down. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.shutdown();
  }

  /** The route a credential names, or `null`. */
  #route(credential: string | null | undefined): Route | null {
    const m = credential ? CREDENTIAL.exec(credential) : null;
    const route = m ? this.#routes.get(m[1]) : undefined;
    return route !== undefined && route.verify(m![2]) ? route : null;
  }

  /**
   * The route of a request: its url's credential (any key it also sends
   * that is a credential must name the same route), else its key's.
   */
  #authorize(request: Request, inPath: string | undefined): Route | null {
    const auth = request.headers.get("authorization");
    const bearer = auth?.match(/^Bearer\s+(\S+)$/i)?.[1];
    const keys = [bearer, request.headers.get("x-api-key")].filter((k): k is string => !!k);
    if (inPath !== undefined) {
      const route = this.#route(inPath);
      if (route === null) return null;
      const others = keys.filter((k) => k.startsWith("hudr_"));
      return others.every((k) => this.#route(k) === route) ? route : null;
    }
    for (const k of keys) {
      const route = this.#route(k);
      if (route !== null) return route;
    }
    return null;
  }

  async #handle(request: Request): Promise<Response> {
    const m = PATH.exec(new URL(request.url).pathname);
    const endpoint = m ? ENDPOINTS[m[2]] : undefined;
    if (!m || endpoint === undefined) {
      return errorResponse(null, 404, "Model proxy: no such endpoint");
    }
    const api = endpoint === "models" ? null : endpoint;
    const route = this.#authorize(request, m[1]);
    if (route === null) {
      await request.body?.cancel();
      return errorResponse(
        api,
        401,
        "Model proxy: no valid credential (unknown, or its rollout has ended)",
      );
    }
    if (endpoint === "models") return this.#models(request);
    if (request.method !== "POST") return errorResponse(api, 405, "Model proxy: use POST");
    const body = await this.#body(request, api!);
    if (body instanceof Response) return body;
    const call = route.call(this.#config, request);
    const reply = guarded(
      call,
      api!,
      () =>
        api === "anthropic.messages"
          ? messagesCall(call, body)
          : openAiCall(call, api === "openai.chat" ? "chat" : "completions", body),
    );
    call.track(reply);
    return await reply;
  }

  /** The request's JSON object, or the reply that refuses it. */
  async #body(request: Request, api: ProxyApi): Promise<Record<string, unknown> | Response> {
    const limit = this.#config.maxRequestBytes;
    const declared = Number(request.headers.get("content-length") ?? NaN);
    const tooLarge = () =>
      errorResponse(api, 413, `Model proxy: the request is over ${limit} bytes (maxRequestBytes)`);
    if (declared > limit) {
      await request.body?.cancel();
      return tooLarge();
    }
    let bytes: Uint8Array;
    try {
      bytes = await readCapped(request.body, limit, "the request");
    } catch (err) {
      if (err instanceof BodyTooLargeError) return tooLarge();
      throw err;
    }
    try {
      const json = JSON.parse(new TextDecoder().decode(bytes));
      if (isRecord(json)) return json;
    } catch {
      // Answered below.
    }
    return errorResponse(api, 400, "Model proxy: the request body must be a JSON object");
  }

  /** `GET /v1/models`: the server's list, or the one model the proxy asks for. */
  #models(request: Request): Response {
    if (request.method !== "GET") return errorResponse(null, 405, "Model proxy: use GET");
    const id = this.#config.model ?? "model";
    return Response.json({
      object: "list",
      data: [{ id, object: "model", type: "model", owned_by: "hud-model-proxy" }],
    });
  }
}

/**
 * Starts a recording model proxy (see the module docs).
 * @throws {TypeError} for a bad upstream url or an unknown server
 * @throws {RangeError} for a limit that is not a positive integer
 */
export function serveModelProxy(options: ModelProxyOptions): ModelProxy {
  return new ModelProxy(proxyConfig(options));
}
