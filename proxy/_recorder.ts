// One rollout's record of its model calls: each call through the proxy
// becomes a `model` step of the rollout's trace, as ChatAgent's are (the
// same `info` fields, so that usage, cost, the viewer and training rows read
// both), storing each request only past what it shares with the call
// before, so that a long episode does not store its history once per turn.

import type { Trace } from "../eval/trace.ts";
import type { ModelCallUsage } from "../eval/agent.ts";
import { encodeTurnTokens, type TurnTokens } from "../eval/tokens.ts";
import { callCost, priceOf, type PricingTable } from "../eval/usage.ts";
import type { ProxyApi } from "./_wire.ts";

/** Token counts of a call, as the server reported them. */
export interface CallUsage {
  /** Prompt tokens, cached ones included. */
  inputTokens: number;
  /** Completion tokens. */
  outputTokens: number;
  /** The part of `inputTokens` served from a cache. */
  cachedTokens?: number;
  /** What the server said the call cost, in USD. */
  costUsd?: number;
}

/** What the proxy saw of one call that the server answered. */
export interface CallRecord {
  /** The API it spoke towards the agent. */
  api: ProxyApi;
  /** The model, as the reply names it, else as the request did. */
  model: string | null;
  /** The request's messages (chat and messages APIs), else `null`. */
  messages: readonly unknown[] | null;
  /** The request's prompt (completions), else `undefined`. */
  prompt?: unknown;
  /** The rest of the request (tools, sampling...), without messages, prompt and transport fields. */
  params: Record<string, unknown>;
  /** The answer as the agent received it: the assistant message, or `{ text }`. */
  reply: Record<string, unknown>;
  /** Token counts, when the server gave them. */
  usage: CallUsage | null;
  /** Why the model stopped, as the API said it. */
  finishReason: string | null;
  /** The sampled tokens, when the server gave any. */
  tokens: TurnTokens | undefined;
  /** From the request's arrival to the reply's end, in ms. */
  latencyMs: number;
  /** Whether the agent asked for a stream. */
  stream: boolean;
  /** Whether the upstream call streamed. */
  upstreamStream: boolean;
}

/** A call that failed: the server's error, the agent gone, a reply cut short. */
export interface FailedCall {
  /** The API it spoke towards the agent. */
  api: ProxyApi;
  /** The HTTP status the server answered with, or `null` when none came. */
  status: number | null;
  /** What went wrong (the server's message, without the key). */
  message: string;
  /** From the request's arrival to the failure, in ms. */
  latencyMs: number;
}

/** Request fields that are the transport's, not the model's: never recorded as parameters. */
const TRANSPORT_FIELDS = new Set(["messages", "prompt", "stream", "stream_options"]);

/** The request's parameters (see {@linkcode CallRecord.params}). */
export function requestParams(body: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(body)) if (!TRANSPORT_FIELDS.has(k)) out[k] = v;
  return out;
}

/** Writes one rollout's calls into its trace, in the order they end. */
export class Recorder {
  readonly #trace: Trace;
  readonly #onUsage: ((usage: ModelCallUsage) => void) | undefined;
  readonly #pricing: PricingTable;
  #steps = 0;
  #messages: string[] = []; // the previous call's messages, each as JSON
  #params = "";
  #prompt = "";
  #tokens: TurnTokens | null = null;

  /** A recorder into `trace`; `onUsage` hears of each call's tokens and cost. */
  constructor(
    trace: Trace,
    onUsage: ((usage: ModelCallUsage) => void) | undefined,
    pricing: PricingTable,
  ) {
    this.#trace = trace;
    this.#onUsage = onUsage;
    this.#pricing = pricing;
  }

  /** Calls recorded so far, failed ones included. */
  get calls(): number {
    return this.#steps;
  }

  /** Records a call the server answered, as a `model` step. */
  record(call: CallRecord): void {
    const content: Record<string, unknown> = {};
    const info: Record<string, unknown> = {
      step: ++this.#steps,
      via: "proxy",
      api: call.api,
      model: call.model,
      format: call.api === "anthropic.messages" ? "anthropic" : "openai",
      latency_ms: Math.round(call.latencyMs * 10) / 10,
      input_tokens: call.usage?.inputTokens ?? null,
      output_tokens: call.usage?.outputTokens ?? null,
      finish_reason: call.finishReason,
      stream: call.stream,
    };
    if (call.upstreamStream !== call.stream) info.upstream_stream = call.upstreamStream;
    if (call.messages !== null) {
      const json = call.messages.map((m) => JSON.stringify(m));
      let shared = 0;
      const max = Math.min(json.length, this.#messages.length);
      while (shared < max && json[shared] === this.#messages[shared]) shared++;
      this.#messages = json;
      content.request = call.messages.slice(shared);
      info.messages_shared = shared;
    }
    if (typeof call.prompt === "string") {
      let shared = 0;
      const max = Math.min(call.prompt.length, this.#prompt.length);
      while (shared < max && call.prompt[shared] === this.#prompt[shared]) shared++;
      this.#prompt = call.prompt;
      content.prompt = call.prompt.slice(shared);
      info.prompt_shared_chars = shared;
    } else if (call.prompt !== undefined) content.prompt = call.prompt;
    const params = JSON.stringify(call.params);
    if (params !== this.#params) content.params = call.params;
    this.#params = params;
    content.reply = call.reply;
    const cost = this.#cost(call);
    if (call.usage?.cachedTokens !== undefined) info.cached_tokens = call.usage.cachedTokens;
    if (cost !== null) info.cost_usd = cost;
    if (call.tokens) info.tokens = encodeTurnTokens(call.tokens, this.#tokens);
    this.#tokens = call.tokens ?? null;
    this.#trace.record("model", content, info);
    if (call.usage !== null) this.#report(call, cost);
  }

  /** Records a call that failed, as a `model_error` step (neither usage nor training counts it). */
  fail(call: FailedCall): void {
    this.#trace.record("model_error", call.message, {
      step: ++this.#steps,
      via: "proxy",
      api: call.api,
      status: call.status,
      latency_ms: Math.round(call.latencyMs * 10) / 10,
    });
  }

  #cost(call: CallRecord): number | null {
    if (call.usage === null) return null;
    if (call.usage.costUsd !== undefined) return call.usage.costUsd;
    const price = call.model === null ? null : priceOf(call.model, this.#pricing);
    return price === null ? null : callCost(call.usage, price);
  }

  #report(call: CallRecord, cost: number | null): void {
    try {
      this.#onUsage?.({
        model: call.model ?? "",
        inputTokens: call.usage!.inputTokens,
        outputTokens: call.usage!.outputTokens,
        cachedTokens: call.usage!.cachedTokens ?? 0,
        costUsd: cost,
      });
    } catch {
      // The job's accounting must not fail the call.
    }
  }
}
