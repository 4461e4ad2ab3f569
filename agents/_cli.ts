// The flags `eval` takes to run a ChatAgent, kept here so that cli/eval.ts
// only spreads them in. Secrets come from the environment, never from argv.

import { ChatAgent } from "./chat_agent.ts";
import { loadPricing, type PricingTable } from "../eval/usage.ts";

/** parseArgs options for the model agent. */
export const MODEL_FLAGS = {
  model: { type: "string" },
  "base-url": { type: "string" },
  api: { type: "string" },
  "max-steps": { type: "string" },
  temperature: { type: "string" },
  "max-tokens": { type: "string" },
  system: { type: "string" },
  tokens: { type: "boolean" },
  "prompt-tokens": { type: "string" },
  pricing: { type: "string" },
} as const;

/** The help lines for {@linkcode MODEL_FLAGS}. */
export const MODEL_FLAGS_HELP =
  `  --model NAME          run a model as the agent (instead of --agent)
  --base-url URL        its API (default: OPENAI_BASE_URL, or the vendor's)
  --api FORMAT          openai (default) or anthropic; keys come from
                        OPENAI_API_KEY / ANTHROPIC_API_KEY, never from argv
  --max-steps N         model calls per rollout (default: 30)
  --temperature T       sampling temperature (default: the server's)
  --max-tokens N        the most tokens of one reply (default: the server's)
  --system TEXT         the system prompt (default: a short one naming the
                        tools and submit)
  --tokens              keep what the model sampled (token ids and
                        log-probabilities) in the traces, for
                        "hud export-training"; OpenAI-compatible servers
                        that return them (vLLM, sglang, llama-server)
  --prompt-tokens FROM  where the prompt's token ids come from with --tokens:
                        "response" (default: vLLM, sglang) or "llama-server"
                        (its /apply-template and /tokenize)
  --pricing FILE        model prices (USD per million tokens, or LiteLLM's
                        per-token file) over the built-in list prices
`;

const NEEDS_MODEL = [
  "base-url",
  "api",
  "max-steps",
  "temperature",
  "max-tokens",
  "system",
  "prompt-tokens",
  "pricing",
];

/**
 * A {@linkcode ChatAgent} from the parsed flags, `null` when `--model` is
 * not given; `fail` makes the usage error for a bad flag.
 */
export async function modelAgentFromFlags(
  values: Record<string, unknown>,
  fail: (message: string) => Error,
): Promise<{ agent: ChatAgent; label: string; pricing: PricingTable } | null> {
  const text = (k: string) => typeof values[k] === "string" ? values[k] as string : undefined;
  const model = text("model");
  if (model === undefined) {
    for (const k of NEEDS_MODEL) {
      if (text(k) !== undefined) throw fail(`--${k} needs --model`);
    }
    if (values.tokens === true) throw fail("--tokens needs --model");
    return null;
  }
  if (model.trim() === "") throw fail("--model must name a model");
  const api = text("api") ?? "openai";
  if (api !== "openai" && api !== "anthropic") {
    throw fail(`--api must be "openai" or "anthropic", got "${api}"`);
  }
  const steps = text("max-steps");
  if (steps !== undefined && (!/^\d+$/.test(steps) || Number(steps) < 1)) {
    throw fail(`--max-steps must be a positive integer, got "${steps}"`);
  }
  const temp = text("temperature");
  if (temp !== undefined && !(temp.trim() !== "" && Number(temp) >= 0 && Number(temp) <= 2)) {
    throw fail(`--temperature must be a number from 0 to 2, got "${temp}"`);
  }
  const maxTokens = text("max-tokens");
  if (maxTokens !== undefined && (!/^\d+$/.test(maxTokens) || Number(maxTokens) < 1)) {
    throw fail(`--max-tokens must be a positive integer, got "${maxTokens}"`);
  }
  const system = text("system");
  if (system !== undefined && system.trim() === "") {
    throw fail("--system must not be empty; leave it out for the default prompt");
  }
  const promptTokens = text("prompt-tokens");
  if (promptTokens !== undefined) {
    if (promptTokens !== "response" && promptTokens !== "llama-server") {
      throw fail(`--prompt-tokens must be "response" or "llama-server", got "${promptTokens}"`);
    }
    if (values.tokens !== true) throw fail("--prompt-tokens needs --tokens");
    if (api !== "openai") throw fail("--prompt-tokens needs --api openai");
  }
  const pricingFile = text("pricing");
  let pricing: PricingTable = {};
  if (pricingFile !== undefined) {
    try {
      pricing = await loadPricing(pricingFile);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) {
        throw fail(`--pricing: no file "${pricingFile}"`);
      }
      throw fail((err as Error).message);
    }
  }
  const sampling: Record<string, number> = {};
  if (temp !== undefined) sampling.temperature = Number(temp);
  if (maxTokens !== undefined) sampling.maxTokens = Number(maxTokens);
  let agent: ChatAgent;
  try {
    agent = new ChatAgent({
      model,
      format: api,
      baseUrl: text("base-url"),
      maxSteps: steps === undefined ? undefined : Number(steps),
      sampling: Object.keys(sampling).length === 0 ? undefined : sampling,
      system,
      tokens: values.tokens === true,
      promptTokens: promptTokens as "response" | "llama-server" | undefined,
      pricing,
    });
  } catch (err) {
    throw fail((err as Error).message);
  }
  return { agent, label: `${api} model "${model}"`, pricing };
}
