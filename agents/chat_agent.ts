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
import { encodeTurnTokens, type TurnTokens } from "../eval/tokens.ts";
import { callCost, priceOf, type PricingTable } from "../eval/usage.ts";
import { isRecord } from "../_internal/util.ts";
import type { SshClient } from "../ssh/client.ts";
import { McpClient, resultText as mcpText } from "../mcp/client.ts";
import { string as stringSchema } from "../schema.ts";
import { Deadline } from "../_internal/async.ts";
import { stringifyJson } from "../_internal/framing.ts";
import {
  type ChatMessage,
  isRetryable,
  type ModelBackend,
  ModelHttpError,
  type ModelReply,
  type ModelRequest,
  ModelUnavailableError,
  type RetryOptions,
  type SamplingOptions,
  type ToolCall,
  type ToolChoice,
  type ToolSpec,
  withRetries,
} from "./model.ts";
import { OpenAiBackend } from "./openai.ts";
import { AnthropicBackend } from "./anthropic.ts";
import {
  type AgentTool,
  defineTool,
  isArgs,
  resultText,
  shellTools,
  type ShellToolsOptions,
  type ToolContext,
  truncate,
} from "./tools.ts";

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

/** The agent ran out of steps or tokens without an answer. */
export class AgentLimitError extends Error {
  /** Makes the error. */
  constructor(message: string) {
    super(message);
    this.name = "AgentLimitError";
  }
}

const DEFAULT_SYSTEM =
  "You are an agent working on a task. Use the tools to inspect and change the environment. " +
  "When you are done, call submit with your answer.";

const SUBMIT = "submit";
const DEFAULT_OUTPUT_LIMIT = 16_000;

function messageChars(m: ChatMessage): number {
  let n = m.content.length;
  if (m.role === "assistant") {
    for (const c of m.toolCalls ?? []) n += c.arguments.length + c.name.length;
  }
  return n;
}

/**
 * Cuts the oldest tool results to a note until the messages fit `budget`
 * characters; the last `keep` tool results stay whole.
 * @returns how many results were cut
 */
export function trimToolResults(messages: ChatMessage[], budget: number, keep: number): number {
  let total = messages.reduce((n, m) => n + messageChars(m), 0);
  const tools = messages.map((m, i) => [m, i] as const).filter(([m]) => m.role === "tool");
  let cut = 0;
  for (const [m, i] of tools.slice(0, Math.max(0, tools.length - keep))) {
    if (total <= budget) break;
    if (m.role !== "tool" || m.content.startsWith("[tool output trimmed")) continue;
    const note = `[tool output trimmed: ${m.content.length} characters, to fit the context]`;
    total += note.length - m.content.length;
    messages[i] = { ...m, content: note };
    cut++;
  }
  return cut;
}

function wireCall(c: ToolCall): Record<string, unknown> {
  return { id: c.id, name: c.name, arguments: c.arguments };
}

function wireMessage(m: ChatMessage): Record<string, unknown> {
  if (m.role === "assistant") {
    return {
      role: m.role,
      content: m.content,
      ...(m.toolCalls?.length ? { tool_calls: m.toolCalls.map(wireCall) } : {}),
    };
  }
  if (m.role === "tool") {
    return { role: m.role, tool_call_id: m.toolCallId, name: m.name, content: m.content };
  }
  return { role: m.role, content: m.content };
}

/** `url` without user, password, query or fragment: safe to record. */
function publicUrl(url: string): string {
  try {
    const u = new URL(url);
    u.username = "";
    u.password = "";
    u.search = "";
    u.hash = "";
    return u.href;
  } catch {
    return "";
  }
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

  /**
   * Makes an agent; nothing is sent until a run.
   * @throws {TypeError} for a missing model, a bad base url or tool names that clash
   * @throws {RangeError} for a limit that is not positive
   */
  constructor(options: ChatAgentOptions) {
    this.#options = { ...options };
    if (options.backend) this.#backend = options.backend;
    else if ((options.format ?? "openai") === "anthropic") {
      this.#backend = new AnthropicBackend({
        model: options.model ?? "",
        baseUrl: options.baseUrl,
        apiKey: options.apiKey,
      });
    } else if (options.format === undefined || options.format === "openai") {
      this.#backend = new OpenAiBackend({
        model: options.model ?? "",
        baseUrl: options.baseUrl,
        apiKey: options.apiKey,
        stream: options.stream,
        promptTokens: options.promptTokens,
      });
    } else {
      throw new TypeError(
        `Cannot make ChatAgent: unknown format "${options.format}"; use "openai" or "anthropic"`,
      );
    }
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
    const o = this.#options;
    const s = o.sampling ?? {};
    const settings: Record<string, unknown> = { api: this.#backend.format };
    const url = (this.#backend as { url?: unknown }).url;
    if (typeof url === "string") settings.url = publicUrl(url);
    settings.max_steps = o.maxSteps ?? 30;
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
    const o = this.#options;
    const trace = run.trace;
    const opened: (SshClient | McpClient)[] = [];
    const outputLimit = o.outputLimit ?? DEFAULT_OUTPUT_LIMIT;
    try {
      const tools = new Map<string, AgentTool>();
      for (const t of o.tools ?? []) tools.set(t.name, t);
      if (o.capabilityTools !== false) {
        const shell = run.capabilities.find((c) => c.family === "ssh" && c.name === "shell") ??
          run.capabilities.find((c) => c.family === "ssh");
        if (shell) {
          const ssh = await run.client.open(shell.name) as SshClient;
          opened.push(ssh);
          // The task may name where its shell starts: `bindings: { shell: { cwd } }`.
          const episode = run.bindings[shell.name];
          const cwd = isRecord(episode) && typeof episode.cwd === "string" && episode.cwd !== ""
            ? episode.cwd
            : o.shell?.cwd;
          for (const t of shellTools(ssh, { outputLimit, ...o.shell, cwd })) {
            if (!tools.has(t.name)) tools.set(t.name, t);
          }
        }
      }
      if (o.capabilityTools !== false) {
        // Each streamable-HTTP MCP server's tools, reached through the forwarder.
        for (const cap of run.capabilities) {
          if (cap.family !== "mcp" || cap.params.transport === "websocket") continue;
          const mcp = await McpClient.fromBinding(cap, { signal: context.signal });
          opened.push(mcp);
          for (const info of await mcp.listTools(context.signal)) {
            const name = tools.has(info.name) || info.name === SUBMIT
              ? `${cap.name}_${info.name}`
              : info.name;
            tools.set(name, {
              name,
              description: info.description ?? "",
              parameters: info.inputSchema,
              async call(args, { signal }) {
                const result = await mcp.callTool(info.name, args, signal);
                // A server's text is as untrusted as a command's output: cut
                // to the same limit before the model (and the trace) sees it.
                const text = truncate(mcpText(result), outputLimit);
                if (result.isError) throw new Error(text);
                return text;
              },
            });
          }
        }
      }
      let submitted: { answer: unknown } | null = null;
      tools.set(
        SUBMIT,
        defineTool({
          name: SUBMIT,
          description: "Submit your final answer and end the task.",
          args: { answer: stringSchema({ description: "The final answer" }) },
          run({ answer }) {
            submitted = { answer };
            return "submitted";
          },
        }),
      );
      const specs: ToolSpec[] = [...tools.values()].map((t) => ({
        name: t.name,
        description: t.description,
        parameters: t.parameters,
      }));
      const prompt = typeof run.prompt === "string" ? run.prompt : stringifyJson(run.prompt);
      const messages: ChatMessage[] = [
        { role: "system", content: o.system ?? DEFAULT_SYSTEM },
        { role: "user", content: prompt },
      ];
      const maxSteps = o.maxSteps ?? 30;
      let budget = o.contextChars ?? 200_000;
      const keep = o.keepToolResults ?? 4;
      let sent = 0;
      let tokens = 0;
      let lastTokens: TurnTokens | null = null;
      const limiter = context.concurrency ?? o.concurrency;
      const price = priceOf(this.#backend.model, o.pricing);
      const toolContext: ToolContext = { run, signal: context.signal };

      for (let step = 1;; step++) {
        if (step > maxSteps) {
          throw new AgentLimitError(
            `ChatAgent stopped: no answer after ${maxSteps} model calls (raise maxSteps)`,
          );
        }
        context.signal.throwIfAborted();
        const trimmed = trimToolResults(messages, budget, keep);
        const started = performance.now();
        let attempts = 0;
        const retries: string[] = [];
        let reply: ModelReply;
        const request = (): ModelRequest => ({
          messages,
          tools: specs,
          toolChoice: o.toolChoice,
          parallelToolCalls: o.parallelToolCalls,
          sampling: o.sampling,
          ...(o.tokens ? { tokens: true } : {}),
        });
        {
          using deadline = new Deadline(o.callTimeout ?? 300_000, context.signal, "model call");
          try {
            reply = await withRetries(
              async () => {
                attempts++;
                try {
                  return await this.#complete(request(), limiter, deadline.signal);
                } catch (err) {
                  // Over the window: cut harder and try again, while there is
                  // tool output left to cut.
                  if (err instanceof ModelHttpError && err.contextOverflow) {
                    const size = messages.reduce((n, m) => n + messageChars(m), 0);
                    budget = Math.min(budget, Math.floor(size * 0.6));
                    const cut = trimToolResults(messages, budget, Math.min(keep, 1)) ||
                      trimToolResults(messages, budget, 0);
                    if (cut > 0) {
                      retries.push("context_overflow");
                      return await this.#complete(request(), limiter, deadline.signal);
                    }
                  }
                  throw err;
                }
              },
              deadline.signal,
              {
                ...o.retry,
                sleep: o.retry?.sleep ?? limiter?.clock.sleep,
                onRetry: (err, attempt, wait) => {
                  retries.push(`${(err as Error)?.message ?? err}`);
                  o.retry?.onRetry?.(err, attempt, wait);
                },
              },
            );
          } catch (err) {
            // Past its own retries, the server is unavailable: a rollout
            // that fails so is an infrastructure failure, not the agent's.
            if (!deadline.signal.aborted && isRetryable(err) && !(err instanceof ModelHttpError)) {
              throw new ModelUnavailableError(
                `ChatAgent stopped: the model server is unavailable after ${attempts} attempts: ${
                  (err as Error)?.message ?? err
                }`,
                { cause: err },
              );
            }
            throw err;
          }
        }
        const latency = performance.now() - started;
        const used = (reply.usage?.inputTokens ?? 0) + (reply.usage?.outputTokens ?? 0);
        tokens += used;
        const cost = reply.usage === null
          ? null
          : reply.usage.costUsd ?? (price === null ? null : callCost(reply.usage, price));
        const assistant: ChatMessage = { role: "assistant", content: reply.content };
        if (reply.toolCalls.length > 0) assistant.toolCalls = reply.toolCalls;
        // The request's messages once, then only what is new since the last call.
        const sentNow = messages.slice(sent).map(wireMessage);
        messages.push(assistant);
        sent = messages.length;
        const info: Record<string, unknown> = {
          step,
          model: this.#backend.model,
          format: this.#backend.format,
          latency_ms: Math.round(latency * 10) / 10,
          input_tokens: reply.usage?.inputTokens ?? null,
          output_tokens: reply.usage?.outputTokens ?? null,
          finish_reason: reply.finishReason,
          attempts,
        };
        if (reply.usage?.cachedTokens !== undefined) info.cached_tokens = reply.usage.cachedTokens;
        if (cost !== null) info.cost_usd = cost;
        if (retries.length > 0) info.retries = retries;
        if (trimmed > 0) info.trimmed_tool_results = trimmed;
        if (reply.tokens) info.tokens = encodeTurnTokens(reply.tokens, lastTokens);
        lastTokens = reply.tokens ?? null;
        trace.record("model", { request: sentNow, reply: wireMessage(assistant) }, info);
        if (reply.usage !== null) {
          try {
            context.onUsage?.({
              model: this.#backend.model,
              inputTokens: reply.usage.inputTokens,
              outputTokens: reply.usage.outputTokens,
              cachedTokens: reply.usage.cachedTokens ?? 0,
              costUsd: cost,
            });
          } catch {
            // The job's accounting must not fail the agent.
          }
        }

        if (reply.refusal !== undefined) {
          trace.record("refusal", reply.refusal);
          return;
        }
        if (reply.toolCalls.length === 0) {
          run.answer = reply.content;
          return;
        }
        // One after the other, in the model's order: shell commands have
        // side effects, and the model wrote them expecting that order.
        const results = [];
        for (const call of reply.toolCalls) {
          results.push(await this.#callTool(call, tools, toolContext));
        }
        for (const [i, call] of reply.toolCalls.entries()) {
          const r = results[i];
          messages.push({
            role: "tool",
            toolCallId: call.id,
            name: call.name,
            content: r.text,
            ...(r.isError ? { isError: true } : {}),
          });
          trace.record("tool", {
            id: call.id,
            name: call.name,
            arguments: call.arguments,
            result: r.text,
          }, { latency_ms: r.latency, is_error: r.isError });
        }
        if (submitted !== null) {
          run.answer = (submitted as { answer: unknown }).answer;
          return;
        }
        if (o.maxTokens !== undefined && tokens >= o.maxTokens) {
          throw new AgentLimitError(
            `ChatAgent stopped: ${tokens} tokens used, over maxTokens ${o.maxTokens}`,
          );
        }
      }
    } finally {
      for (const client of opened) await client.close().catch(() => {});
    }
  }

  /** One model call, holding a permit of the concurrency limit while it runs. */
  async #complete(
    request: ModelRequest,
    limiter: AdaptiveConcurrency | undefined,
    signal: AbortSignal,
  ): Promise<ModelReply> {
    const permit = limiter ? await limiter.acquire(signal) : null;
    try {
      const reply = await this.#backend.complete(request, signal);
      permit?.release("ok");
      return reply;
    } catch (err) {
      const limited = err instanceof ModelHttpError && err.status === 429;
      permit?.release(
        limited ? "rate_limited" : "error",
        limited && err.retryAfter !== null ? err.retryAfter * 1000 : null,
      );
      throw err;
    }
  }

  async #callTool(
    call: ToolCall,
    tools: Map<string, AgentTool>,
    context: ToolContext,
  ): Promise<{ text: string; isError: boolean; latency: number }> {
    const started = performance.now();
    const done = (text: string, isError: boolean) => ({
      text,
      isError,
      latency: Math.round((performance.now() - started) * 10) / 10,
    });
    const tool = tools.get(call.name);
    if (!tool) {
      return done(
        `Error: unknown tool "${call.name}"; available are ${[...tools.keys()].join(", ")}`,
        true,
      );
    }
    let args: unknown;
    try {
      args = call.arguments.trim() === "" ? {} : JSON.parse(call.arguments);
    } catch (err) {
      return done(
        `Error: cannot parse the arguments of "${call.name}" as JSON: ${
          (err as Error).message
        }; send a JSON object`,
        true,
      );
    }
    if (!isArgs(args)) {
      return done(`Error: the arguments of "${call.name}" must be a JSON object`, true);
    }
    try {
      return done(resultText(await tool.call(args, context)), false);
    } catch (err) {
      if (context.signal.aborted) throw context.signal.reason;
      return done(`Error: ${(err as Error)?.message ?? err}`, true);
    }
  }
}
