// ModelProxy's options, resolved once into the complete record the proxy
// runs on (every default in this one function).

import { MODEL_SERVERS, type ModelServer } from "../agents/_dialect.ts";
import { MAX_RESPONSE_BYTES } from "../agents/model.ts";
import type { PricingTable } from "../eval/usage.ts";
import { checkPositiveInteger, type OptionSpelling, optionSpelling } from "../eval/_options.ts";

/**
 * The servers a proxy forwards to: an OpenAI-compatible one (those whose
 * token fields are known, or `openai` for any other), or Anthropic's
 * Messages API.
 */
export type ProxyServer = "llama-server" | "vllm" | "sglang" | "openai" | "anthropic";

// Spelled out above for the docs; the same servers as the dialects know.
const _SAME: Exclude<ProxyServer, "anthropic"> extends ModelServer
  ? ModelServer extends Exclude<ProxyServer, "anthropic"> ? true : never
  : never = true;

/** The servers, for checking a name. */
export const PROXY_SERVERS: readonly ProxyServer[] = [...MODEL_SERVERS, "anthropic"];

/** Options for {@linkcode serveModelProxy}. */
export interface ModelProxyOptions {
  /**
   * The model server's base url: up to and including `/v1` for an
   * OpenAI-compatible one (as `OPENAI_BASE_URL`), its origin for
   * Anthropic's (as `ANTHROPIC_BASE_URL`).
   */
  upstream: string;
  /**
   * Which server it is: `llama-server`, `vllm` or `sglang` (asked for token
   * ids in their own fields), `openai` (any other OpenAI-compatible server;
   * asked for nothing), or `anthropic` (the Messages API; no token ids).
   * @default "openai"
   */
  server?: ProxyServer;
  /**
   * The server's key (sent as a bearer token, or `x-api-key` to Anthropic).
   * The agent never gets it.
   * @default the `OPENAI_API_KEY` (or, for `anthropic`, `ANTHROPIC_API_KEY`) environment variable, else none
   */
  apiKey?: string;
  /** The model to ask for, whatever the agent names. @default the agent's */
  model?: string;
  /** Prices to cost the calls by, over the built-in list prices. @default {} */
  pricing?: PricingTable;
  /**
   * The largest request body an agent may send, in bytes; larger ones get 413.
   * @default 33_554_432 (32 MiB)
   */
  maxRequestBytes?: number;
  /**
   * The largest reply the server may send (JSON, or a whole stream), in bytes.
   * @default 64 MiB
   */
  maxResponseBytes?: number;
  /**
   * How long one call may take, in ms, before it is cut off.
   * @default 600_000
   */
  callTimeout?: number;
  /** The interface to listen on. @default "127.0.0.1" */
  hostname?: string;
  /** The port. @default 0 (any free one) */
  port?: number;
  /** Stops the proxy when it aborts. */
  signal?: AbortSignal;
  /** Called once it listens. */
  onListen?: (addr: Deno.NetAddr) => void;
  /** Called with an error the proxy could not answer with (a bug, never a call's failure). */
  onError?: (error: unknown) => void;
}

/** {@linkcode ModelProxyOptions}, complete. */
export interface ProxyConfig {
  server: ProxyServer;
  /** Where the API's endpoints are: `${base}/chat/completions`, or `${base}/v1/messages`. */
  base: string;
  /** The server's origin, where llama-server's own endpoints are. */
  origin: string;
  apiKey: string | null;
  model: string | null;
  pricing: PricingTable;
  maxRequestBytes: number;
  maxResponseBytes: number;
  callTimeout: number;
  hostname: string;
  port: number;
  signal: AbortSignal | undefined;
  onListen: (addr: Deno.NetAddr) => void;
  onError: (error: unknown) => void;
}

function envVar(name: string): string | null {
  try {
    return Deno.env.get(name) || null;
  } catch {
    return null; // No --allow-env: as if unset.
  }
}

function positive(
  s: OptionSpelling,
  name: string,
  value: number | undefined,
  fallback: number,
): number {
  if (value === undefined) return fallback;
  checkPositiveInteger(s, name, value);
  return value;
}

/** The upstream's base url, without trailing slashes. */
function upstreamBase(s: OptionSpelling, upstream: unknown): string {
  let url: URL | null = null;
  try {
    url = new URL(String(upstream).replace(/\/+$/, ""));
  } catch {
    // Refused below.
  }
  if (url === null || (url.protocol !== "http:" && url.protocol !== "https:")) {
    throw new TypeError(
      `${s.prefix}${s.name("upstream")} must be an http(s) url, got "${
        s.given("upstream", upstream)
      }"`,
    );
  }
  return url.href.replace(/\/+$/, "");
}

/**
 * The complete config of `options`, checked. `s` names what it refuses:
 * the options by default, a command line's flags when it passes its own.
 * @throws {TypeError} for a missing or bad upstream url, an unknown server or an empty model
 * @throws {RangeError} for a limit that is not a positive integer
 */
export function proxyConfig(
  options: ModelProxyOptions,
  s: OptionSpelling = optionSpelling("Cannot start model proxy"),
): ProxyConfig {
  const server = options.server ?? "openai";
  if (!PROXY_SERVERS.includes(server)) {
    throw new TypeError(
      `${s.prefix}${s.name("server")} must be one of ${PROXY_SERVERS.join(", ")}, got "${
        s.given("server", server)
      }"`,
    );
  }
  if (options.model !== undefined && String(options.model).trim() === "") {
    throw new TypeError(
      `${s.prefix}${s.name("model")} must name a model, got "${s.given("model", options.model)}"`,
    );
  }
  const base = upstreamBase(s, options.upstream);
  return {
    server,
    base: server === "anthropic" ? base.replace(/\/v1$/, "") : base,
    origin: base.replace(/\/v1$/, ""),
    apiKey: options.apiKey ??
      envVar(server === "anthropic" ? "ANTHROPIC_API_KEY" : "OPENAI_API_KEY"),
    model: options.model ?? null,
    pricing: options.pricing ?? {},
    maxRequestBytes: positive(s, "maxRequestBytes", options.maxRequestBytes, 32 << 20),
    maxResponseBytes: positive(s, "maxResponseBytes", options.maxResponseBytes, MAX_RESPONSE_BYTES),
    callTimeout: positive(s, "callTimeout", options.callTimeout, 600_000),
    hostname: options.hostname ?? "127.0.0.1",
    port: options.port ?? 0,
    signal: options.signal,
    onListen: options.onListen ?? (() => {}),
    onError: options.onError ?? (() => {}),
  };
}
