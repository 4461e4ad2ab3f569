/**
 * {@linkcode ChatAgent}: a model as an {@linkcode Agent}. It offers the
 * model the tools of the run's capabilities (a `shell` gives `bash`,
 * `read_file`, `write_file`, `list_dir`) plus the author's own and
 * `submit`, runs the tool calls it makes, feeds the results back, and stops
 * at `submit(answer)` or at a reply without tool calls, whose text is the
 * answer.
 *
 * With `tokens`, each model step of the trace also keeps what the model
 * sampled (completion token ids, log-probabilities, the prompt's ids where
 * the server gives them) in `info.tokens`, compactly (see `eval/tokens.ts`);
 * {@linkcode Job.exportTraining} turns them into training rows. Each call's
 * tokens and cost (from the pricing table) are in its step's info and
 * reported to the job, whose budgets count them; model calls take permits
 * from the job's adaptive concurrency limit.
 *
 * @module
 */

import type { Agent, AgentContext, AgentInfo } from "../eval/agent.ts";
import type { Run } from "../eval/run.ts";
import type { AdaptiveConcurrency } from "../eval/concurrency.ts";
import type { PricingTable } from "../eval/usage.ts";
import {
  type ModelBackend,
  publicUrl,
  type RetryOptions,
  type SamplingOptions,
  type ToolChoice,
} from "./model.ts";
import { OpenAiBackend } from "./openai.ts";
import { AnthropicBackend } from "./anthropic.ts";
import type { AgentTool, ShellToolsOptions } from "./tools.ts";
import type { ComputerToolOptions } from "./computer.ts";
import { type Closable, openToolbox, SUBMIT } from "./_toolbox.ts";
import { type ChatConfig, ChatLoop } from "./_chat_loop.ts";

export { AgentLimitError, trimToolResults } from "./_chat_loop.ts";

/** Options for {@linkcode ChatAgent}. */
export interface ChatAgentOptions {
  /** The model's name (unless `backend` is given). */
  model?: string;
  /**
   * The API format (unless `backend` is given).
   * @default "openai"
   */
  format?: "openai" | "anthropic";
  /** The API's base url; see {@linkcode OpenAiBackend} and {@linkcode AnthropicBackend} for defaults. */
  baseUrl?: string;
  /** The API key. @default from the environment: `OPENAI_API_KEY` or `ANTHROPIC_API_KEY` */
  apiKey?: string;
  /** Whether to stream (OpenAI format). @default true */
  stream?: boolean;
  /** A ready backend; overrides `model`, `format`, `baseUrl`, `apiKey`. */
  backend?: ModelBackend;
  /** The system prompt. @default a short one naming the tools and `submit` */
  system?: string;
  /** The author's own tools, beside those of the capabilities. */
  tools?: AgentTool[];
  /**
   * Whether to offer the tools of the run's capabilities.
   * @default true
   */
  capabilityTools?: boolean;
  /**
   * The most characters of a capability tool's result that the model sees
   * (an MCP tool's text; for the shell tools, each of stdout, stderr and a
   * file read, unless `shell.outputLimit` says otherwise); the rest is cut
   * with a note, keeping the head and the tail.
   * @default 16_000
   */
  outputLimit?: number;
  /** Limits of the shell tools. */
  shell?: ShellToolsOptions;
  /** The model's screen size and settling of the computer tool (an `rfb` binding's). */
  computer?: ComputerToolOptions;
  /** Sampling options, passed through. */
  sampling?: SamplingOptions;
  /**
   * Which tools the model may or must call.
   * @default "auto"
   */
  toolChoice?: ToolChoice;
  /**
   * Whether the model may call several tools at once.
   * @default true
   */
  parallelToolCalls?: boolean;
  /**
   * The most model calls per run.
   * @default 30
   */
  maxSteps?: number;
  /**
   * The most tokens (prompt plus completion, summed over calls) per run.
   * @default no limit
   */
  maxTokens?: number;
  /**
   * The context budget in characters of message text: above it, the
   * oldest tool results are cut to a note (the last `keepToolResults` stay).
   * @default 200_000
   */
  contextChars?: number;
  /** Tool results never trimmed, counted from the end. @default 4 */
  keepToolResults?: number;
  /** The longest one model call may take, in ms, retries included. @default 300_000 */
  callTimeout?: number;
  /** Retries on 429, 5xx and broken connections. */
  retry?: RetryOptions;
  /**
   * Ask the server for the sampled tokens and keep them in the trace (see
   * the module doc).
   * @default false
   */
  tokens?: boolean;
  /**
   * Where the prompt's token ids come from (OpenAI format); see
   * {@linkcode OpenAiBackendOptions.promptTokens}.
   * @default "response"
   */
  promptTokens?: "response" | "llama-server";
  /**
   * Prices for the cost of each call, over the built-in list prices
   * ({@linkcode DEFAULT_PRICING}). A cost the server reports wins.
   * @default the built-in prices only
   */
  pricing?: PricingTable;
  /**
   * A limit on model calls in flight, when the run's context brings none
   * (a job's does).
   * @default none outside a job
   */
  concurrency?: AdaptiveConcurrency;
}

const DEFAULT_SYSTEM =
  "You are an agent working on a task. Use the tools to inspect and change the environment. " +
  "When you are done, call submit with your answer.";

const DEFAULT_OUTPUT_LIMIT = 16_000;

/**
 * Checks `options` and resolves every default, once.
 * @throws {RangeError} for a limit that is not positive
 * @throws {TypeError} for tool names that clash
 */
function chatConfig(options: ChatAgentOptions): ChatConfig {
  for (
    const key of ["maxSteps", "maxTokens", "contextChars", "callTimeout", "outputLimit"] as const
  ) {
    const v = options[key];
    if (v !== undefined && !(v > 0)) {
      throw new RangeError(`Cannot make ChatAgent: ${key} must be positive, got "${v}"`);
    }
  }
  const names = new Set<string>();
  for (const t of options.tools ?? []) {
    if (names.has(t.name) || t.name === SUBMIT) {
      throw new TypeError(`Cannot make ChatAgent: tool name "${t.name}" is used twice`);
    }
    names.add(t.name);
  }
  return {
    tools: [...options.tools ?? []],
    capabilityTools: options.capabilityTools !== false,
    outputLimit: options.outputLimit ?? DEFAULT_OUTPUT_LIMIT,
    shell: options.shell,
    computer: options.computer,
    system: options.system ?? DEFAULT_SYSTEM,
    sampling: options.sampling,
    toolChoice: options.toolChoice,
    parallelToolCalls: options.parallelToolCalls,
    maxSteps: options.maxSteps ?? 30,
    maxTokens: options.maxTokens,
    contextChars: options.contextChars ?? 200_000,
    keepToolResults: options.keepToolResults ?? 4,
    callTimeout: options.callTimeout ?? 300_000,
    retry: options.retry,
    tokens: options.tokens ?? false,
    pricing: options.pricing,
    concurrency: options.concurrency,
  };
}

/**
 * The backend that `options` names.
 * @throws {TypeError} for an unknown format (and what the backends refuse)
 */
function chatBackend(options: ChatAgentOptions): ModelBackend {
  if (options.backend) return options.backend;
  const format = options.format ?? "openai";
  if (format === "anthropic") {
    return new AnthropicBackend({
      model: options.model ?? "",
      baseUrl: options.baseUrl,
      apiKey: options.apiKey,
    });
  }
  if (format === "openai") {
    return new OpenAiBackend({
      model: options.model ?? "",
      baseUrl: options.baseUrl,
      apiKey: options.apiKey,
      stream: options.stream,
      promptTokens: options.promptTokens,
    });
  }
  throw new TypeError(
    `Cannot make ChatAgent: unknown format "${format}"; use "openai" or "anthropic"`,
  );
}

/**
 * A model as an {@linkcode Agent}, over an OpenAI-compatible Chat
 * Completions endpoint or the Anthropic Messages API.
 *
 * Each model call is a `model` step in the trace (the request's new
 * messages, the reply, tokens and latency), each tool call a `tool` step.
 *
 * @example
 * ```ts ignore
 * import { ChatAgent } from "@hud/sdk/agents";
 * const agent = new ChatAgent({ model: "qwen2.5", baseUrl: "http://127.0.0.1:8080/v1" });
 * ```
 */
export class ChatAgent implements Agent {
  readonly #backend: ModelBackend;
  readonly #options: ChatAgentOptions;
  readonly #config: ChatConfig;

  /**
   * Makes an agent; nothing is sent until a run.
   * @throws {TypeError} for a missing model, a bad base url or tool names that clash
   * @throws {RangeError} for a limit that is not positive
   */
  constructor(options: ChatAgentOptions) {
    this.#options = { ...options };
    this.#backend = chatBackend(options);
    this.#config = chatConfig(options);
  }

  /** The backend the agent calls. */
  get backend(): ModelBackend {
    return this.#backend;
  }

  /**
   * What ran, for results files and the viewer: the model, the API and its
   * endpoint (without credentials or query), sampling and limits. Never the key.
   */
  get info(): AgentInfo {
    // The options as given: a setting left to its default is not recorded.
    const o = this.#options;
    const s = o.sampling ?? {};
    const settings: Record<string, unknown> = { api: this.#backend.format };
    const url = this.#backend.url;
    if (typeof url === "string") settings.url = publicUrl(url);
    settings.max_steps = this.#config.maxSteps;
    const optional: [string, unknown][] = [
      ["temperature", s.temperature],
      ["top_p", s.topP],
      ["max_reply_tokens", s.maxTokens],
      ["seed", s.seed],
      ["max_tokens", o.maxTokens],
      ["tool_choice", o.toolChoice],
      ["tools", o.tools?.map((t) => t.name)],
      ["capability_tools", o.capabilityTools],
    ];
    for (const [k, v] of optional) if (v !== undefined) settings[k] = v;
    return { kind: "model", name: this.#backend.model, settings };
  }

  /** Works on the run until the model submits or answers; sets `run.answer`. */
  async run(run: Run, context: AgentContext): Promise<void> {
    const opened: Closable[] = [];
    try {
      const toolbox = await openToolbox(run, this.#config, context.signal, opened);
      await new ChatLoop(this.#backend, this.#config, run, context, toolbox).run();
    } finally {
      for (const client of opened) await client.close().catch(() => {});
    }
  }
}
