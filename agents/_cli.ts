// The flags `eval` takes to run a ChatAgent, kept here so that cli/eval.ts
// only spreads them in. Secrets come from the environment, never from argv.

import { ChatAgent } from "./chat_agent.ts";
import { loadPricing, type PricingTable } from "../eval/usage.ts";
import { errorMessage } from "../_internal/util.ts";

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

/** The model flags, checked. */
interface ModelFlags {
  model: string;
  api: "openai" | "anthropic";
  maxSteps: number | undefined;
  temperature: number | undefined;
  maxTokens: number | undefined;
  system: string | undefined;
  promptTokens: "response" | "llama-server" | undefined;
}

type Fail = (message: string) => Error;

function text(values: Record<string, unknown>, key: string): string | undefined {
  return typeof values[key] === "string" ? values[key] as string : undefined;
}

/**
 * A {@linkcode ChatAgent} from the parsed flags, `null` when `--model` is
 * not given; `fail` makes the usage error for a bad flag.
 */
export async function modelAgentFromFlags(
  values: Record<string, unknown>,
  fail: Fail,
): Promise<{ agent: ChatAgent; label: string; pricing: PricingTable } | null> {
  const flags = modelFlags(values, fail);
  if (flags === null) return null;
  const pricing = await pricingFlag(text(values, "pricing"), fail);
  const sampling: Record<string, number> = {};
  if (flags.temperature !== undefined) sampling.temperature = flags.temperature;
  if (flags.maxTokens !== undefined) sampling.maxTokens = flags.maxTokens;
  let agent: ChatAgent;
  try {
    agent = new ChatAgent({
      model: flags.model,
      format: flags.api,
      baseUrl: text(values, "base-url"),
      maxSteps: flags.maxSteps,
      sampling: Object.keys(sampling).length === 0 ? undefined : sampling,
      system: flags.system,
      tokens: values.tokens === true,
      promptTokens: flags.promptTokens,
      pricing,
    });
  } catch (err) {
    throw fail(errorMessage(err));
  }
  return { agent, label: `${flags.api} model "${flags.model}"`, pricing };
}

/**
 * Checks the model flags: `null` without `--model` (when none of the flags
 * that need it is given either).
 */
function modelFlags(values: Record<string, unknown>, fail: Fail): ModelFlags | null {
  const model = text(values, "model");
  if (model === undefined) {
    for (const k of NEEDS_MODEL) {
      if (text(values, k) !== undefined) throw fail(`--${k} needs --model`);
    }
    if (values.tokens === true) throw fail("--tokens needs --model");
    return null;
  }
  if (model.trim() === "") throw fail("--model must name a model");
  const api = text(values, "api") ?? "openai";
  if (api !== "openai" && api !== "anthropic") {
    throw fail(`--api must be "openai" or "anthropic", got "${api}"`);
  }
  const maxSteps = positiveInteger(values, "max-steps", fail);
  const temp = text(values, "temperature");
  if (temp !== undefined && !(temp.trim() !== "" && Number(temp) >= 0 && Number(temp) <= 2)) {
    throw fail(`--temperature must be a number from 0 to 2, got "${temp}"`);
  }
  const maxTokens = positiveInteger(values, "max-tokens", fail);
  const system = text(values, "system");
  if (system !== undefined && system.trim() === "") {
    throw fail("--system must not be empty; leave it out for the default prompt");
  }
  const promptTokens = promptTokensFlag(values, api, fail);
  const temperature = temp === undefined ? undefined : Number(temp);
  return { model, api, maxSteps, temperature, maxTokens, system, promptTokens };
}

function positiveInteger(
  values: Record<string, unknown>,
  key: string,
  fail: Fail,
): number | undefined {
  const v = text(values, key);
  if (v !== undefined && (!/^\d+$/.test(v) || Number(v) < 1)) {
    throw fail(`--${key} must be a positive integer, got "${v}"`);
  }
  return v === undefined ? undefined : Number(v);
}

/** `--prompt-tokens`, which needs `--tokens` and the OpenAI format. */
function promptTokensFlag(
  values: Record<string, unknown>,
  api: string,
  fail: Fail,
): ModelFlags["promptTokens"] {
  const promptTokens = text(values, "prompt-tokens");
  if (promptTokens === undefined) return undefined;
  if (promptTokens !== "response" && promptTokens !== "llama-server") {
    throw fail(`--prompt-tokens must be "response" or "llama-server", got "${promptTokens}"`);
  }
  if (values.tokens !== true) throw fail("--prompt-tokens needs --tokens");
  if (api !== "openai") throw fail("--prompt-tokens needs --api openai");
  return promptTokens;
}

/** The prices of `--pricing FILE`, or none. */
async function pricingFlag(file: string | undefined, fail: Fail): Promise<PricingTable> {
  if (file === undefined) return {};
  try {
    return await loadPricing(file);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) throw fail(`--pricing: no file "${file}"`);
    throw fail(errorMessage(err));
  }
}
