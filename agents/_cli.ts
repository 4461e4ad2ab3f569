// The flags `eval` takes to run a ChatAgent, kept here so that cli.ts only
// spreads them in. Secrets come from the environment, never from argv.

import { ChatAgent } from "./chat_agent.ts";

/** parseArgs options for the model agent. */
export const MODEL_FLAGS = {
  model: { type: "string" },
  "base-url": { type: "string" },
  api: { type: "string" },
  "max-steps": { type: "string" },
  temperature: { type: "string" },
} as const;

/** The help lines for {@linkcode MODEL_FLAGS}. */
export const MODEL_FLAGS_HELP =
  `  --model NAME          run a model as the agent (instead of --agent)
  --base-url URL        its API (default: OPENAI_BASE_URL, or the vendor's)
  --api FORMAT          openai (default) or anthropic; keys come from
                        OPENAI_API_KEY / ANTHROPIC_API_KEY, never from argv
  --max-steps N         model calls per rollout (default: 30)
  --temperature T       sampling temperature (default: the server's)
`;

/**
 * A {@linkcode ChatAgent} from the parsed flags, `null` when `--model` is
 * not given; `fail` makes the usage error for a bad flag.
 */
export function modelAgentFromFlags(
  values: Record<string, unknown>,
  fail: (message: string) => Error,
): { agent: ChatAgent; label: string } | null {
  const text = (k: string) => typeof values[k] === "string" ? values[k] as string : undefined;
  const model = text("model");
  if (model === undefined) {
    for (const k of ["base-url", "api", "max-steps", "temperature"]) {
      if (text(k) !== undefined) throw fail(`--${k} needs --model`);
    }
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
  let agent: ChatAgent;
  try {
    agent = new ChatAgent({
      model,
      format: api,
      baseUrl: text("base-url"),
      maxSteps: steps === undefined ? undefined : Number(steps),
      sampling: temp === undefined ? undefined : { temperature: Number(temp) },
    });
  } catch (err) {
    throw fail((err as Error).message);
  }
  return { agent, label: `${api} model "${model}"` };
}
