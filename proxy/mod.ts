/**
 * A recording model proxy, for training rows from any agent: started once
 * per job with {@linkcode serveModelProxy}, it gives each rollout a route of
 * its own ({@linkcode ModelProxy.open}) whose variables point an unmodified
 * harness at it (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
 * `ANTHROPIC_API_KEY`), and records every call into the rollout's trace:
 * request, reply, usage, latency, and the token ids and log-probabilities
 * the model server gives (llama-server, vLLM and sglang are asked in their
 * own fields). `CommandAgent`'s `modelProxy` option opens a route per run;
 * `trainingRows()` and `hud export-training` read the calls as they read
 * `ChatAgent`'s.
 *
 * @module
 */

export { ModelProxy, serveModelProxy } from "./proxy.ts";
export type { ProxyRoute, ProxyRouteContext, ProxyRun } from "./_route.ts";
export { type ModelProxyOptions, PROXY_SERVERS, type ProxyServer } from "./_config.ts";
