/**
 * Token and cost accounting: a {@linkcode PricingTable} (USD per million
 * tokens by model, a few vendors' list prices built in, extended by the
 * user's own, from a JSON file with {@linkcode loadPricing}), the cost of
 * a call ({@linkcode callCost}) and the usage of a rollout's trace
 * ({@linkcode traceUsage}), which budgets and summaries count.
 *
 * @example
 * ```ts
 * import { callCost, priceOf } from "./usage.ts";
 * import assert from "node:assert/strict";
 *
 * const price = priceOf("my-model", { "my-model": { input: 1, output: 4 } })!;
 * const cost = callCost({ inputTokens: 1_000_000, outputTokens: 500_000 }, price);
 * assert.equal(cost, 3);
 * ```
 *
 * @module
 */

import { isRecord } from "../_internal/util.ts";

/** What a model's tokens cost, in USD per million tokens. */
export interface ModelPrice {
  /** Prompt tokens not served from a cache. */
  input: number;
  /** Completion tokens. */
  output: number;
  /** Prompt tokens served from the server's cache. @default `input` */
  cachedInput?: number;
}

/** Prices by model name. A name matches itself and its dated versions (`gpt-4o-2024-08-06`). */
export type PricingTable = Record<string, ModelPrice>;

/**
 * List prices as the vendors published them (mid-2025), per million
 * tokens. Check them against your contract; pass your own table (or
 * `--pricing FILE`) to add models or override these.
 */
export const DEFAULT_PRICING: Readonly<PricingTable> = Object.freeze({
  "gpt-4o": { input: 2.5, output: 10, cachedInput: 1.25 },
  "gpt-4o-mini": { input: 0.15, output: 0.6, cachedInput: 0.075 },
  "gpt-4.1": { input: 2, output: 8, cachedInput: 0.5 },
  "gpt-4.1-mini": { input: 0.4, output: 1.6, cachedInput: 0.1 },
  "gpt-4.1-nano": { input: 0.1, output: 0.4, cachedInput: 0.025 },
  "o3": { input: 2, output: 8, cachedInput: 0.5 },
  "o3-mini": { input: 1.1, output: 4.4, cachedInput: 0.55 },
  "o4-mini": { input: 1.1, output: 4.4, cachedInput: 0.275 },
  "claude-opus-4": { input: 15, output: 75, cachedInput: 1.5 },
  "claude-sonnet-4": { input: 3, output: 15, cachedInput: 0.3 },
  "claude-3-7-sonnet": { input: 3, output: 15, cachedInput: 0.3 },
  "claude-3-5-sonnet": { input: 3, output: 15, cachedInput: 0.3 },
  "claude-3-5-haiku": { input: 0.8, output: 4, cachedInput: 0.08 },
});

/**
 * The price of `model` in `table` (then in {@linkcode DEFAULT_PRICING}):
 * the exact name, else the longest name it starts with followed by `-`
 * (a dated version), with any `vendor/` prefix dropped; `null` when none.
 */
export function priceOf(model: string, table: PricingTable = {}): ModelPrice | null {
  const names = [model, model.includes("/") ? model.slice(model.lastIndexOf("/") + 1) : null];
  for (const source of [table, DEFAULT_PRICING]) {
    for (const name of names) {
      if (name === null) continue;
      if (Object.hasOwn(source, name)) return source[name];
      let best: string | null = null;
      for (const key of Object.keys(source)) {
        if (name.startsWith(`${key}-`) && (best === null || key.length > best.length)) best = key;
      }
      if (best !== null) return source[best];
    }
  }
  return null;
}

/** Token counts of one call. */
export interface CallTokens {
  /** Prompt tokens, cached ones included. */
  inputTokens: number;
  /** Completion tokens. */
  outputTokens: number;
  /** The part of `inputTokens` served from a cache. @default 0 */
  cachedTokens?: number;
}

/** What a call cost at `price`, in USD (ATIF's formula: cached prompt tokens at their own price). */
export function callCost(tokens: CallTokens, price: ModelPrice): number {
  const cached = Math.min(tokens.cachedTokens ?? 0, tokens.inputTokens);
  return ((tokens.inputTokens - cached) * price.input +
    cached * (price.cachedInput ?? price.input) +
    tokens.outputTokens * price.output) / 1_000_000;
}

function price(value: unknown, name: string, path: string): ModelPrice {
  const fail = (what: string) =>
    new TypeError(`Cannot read pricing file "${path}": model "${name}": ${what}`);
  if (!isRecord(value)) throw fail("expected an object of prices");
  const num = (v: unknown, field: string) => {
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
      throw fail(`${field} must be a number of at least 0`);
    }
    return v;
  };
  // LiteLLM's model_prices_and_context_window.json: USD per token.
  if ("input_cost_per_token" in value || "output_cost_per_token" in value) {
    const out: ModelPrice = {
      input: num(value.input_cost_per_token ?? 0, "input_cost_per_token") * 1e6,
      output: num(value.output_cost_per_token ?? 0, "output_cost_per_token") * 1e6,
    };
    if (value.cache_read_input_token_cost !== undefined) {
      out.cachedInput = num(value.cache_read_input_token_cost, "cache_read_input_token_cost") *
        1e6;
    }
    return out;
  }
  const out: ModelPrice = { input: num(value.input, "input"), output: num(value.output, "output") };
  const cached = value.cached_input ?? value.cachedInput;
  if (cached !== undefined) out.cachedInput = num(cached, "cached_input");
  return out;
}

/**
 * Reads a pricing file: a JSON object from model name to
 * `{ "input": 2.5, "output": 10, "cached_input": 1.25 }` (USD per million
 * tokens), or LiteLLM's `model_prices_and_context_window.json` (per-token
 * `input_cost_per_token`, `output_cost_per_token`,
 * `cache_read_input_token_cost`; entries without prices are skipped).
 * @throws {TypeError} naming the file and the model, for a malformed one
 */
export async function loadPricing(path: string): Promise<PricingTable> {
  let data: unknown;
  try {
    data = JSON.parse(await Deno.readTextFile(path));
  } catch (err) {
    if (err instanceof SyntaxError) {
      throw new TypeError(`Cannot read pricing file "${path}": invalid JSON: ${err.message}`);
    }
    throw err;
  }
  if (!isRecord(data)) {
    throw new TypeError(`Cannot read pricing file "${path}": expected an object keyed by model`);
  }
  const table: PricingTable = {};
  for (const [name, value] of Object.entries(data)) {
    // LiteLLM's file has a sample entry and entries with no token prices.
    if (name === "sample_spec") continue;
    if (
      isRecord(value) && !("input" in value) && !("input_cost_per_token" in value) &&
      !("output_cost_per_token" in value)
    ) continue;
    Object.defineProperty(table, name, {
      value: price(value, name, path),
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return table;
}

/** Tokens and cost of one rollout, or of many. */
export interface Usage {
  /** Prompt tokens, cached ones included. */
  inputTokens: number;
  /** Completion tokens. */
  outputTokens: number;
  /** The part of `inputTokens` served from a cache. */
  cachedTokens: number;
  /** What the calls cost in USD, over the calls whose cost is known. */
  costUsd: number;
  /** Model calls whose cost is not known (no price for their model). */
  unpricedCalls: number;
  /** Model calls. */
  modelCalls: number;
}

/** A {@linkcode Usage} of nothing. */
export function emptyUsage(): Usage {
  return {
    inputTokens: 0,
    outputTokens: 0,
    cachedTokens: 0,
    costUsd: 0,
    unpricedCalls: 0,
    modelCalls: 0,
  };
}

/** Adds `b` into `a`, and returns `a`. */
export function addUsage(a: Usage, b: Usage): Usage {
  a.inputTokens += b.inputTokens;
  a.outputTokens += b.outputTokens;
  a.cachedTokens += b.cachedTokens;
  a.costUsd += b.costUsd;
  a.unpricedCalls += b.unpricedCalls;
  a.modelCalls += b.modelCalls;
  return a;
}

function count(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) && v >= 0 ? v : 0;
}

/**
 * The usage a trace records: the tokens and cost of its `model` steps
 * (`info.input_tokens`, `output_tokens`, `cached_tokens`, `cost_usd`, as
 * {@linkcode ChatAgent} writes them).
 */
export function traceUsage(trace: unknown): Usage {
  const usage = emptyUsage();
  const steps = isRecord(trace) && Array.isArray(trace.steps) ? trace.steps : [];
  for (const step of steps) {
    if (!isRecord(step) || step.type !== "model" || !isRecord(step.info)) continue;
    const info = step.info;
    usage.modelCalls++;
    usage.inputTokens += count(info.input_tokens);
    usage.outputTokens += count(info.output_tokens);
    usage.cachedTokens += count(info.cached_tokens);
    if (typeof info.cost_usd === "number" && Number.isFinite(info.cost_usd)) {
      usage.costUsd += info.cost_usd;
    } else usage.unpricedCalls++;
  }
  return usage;
}
