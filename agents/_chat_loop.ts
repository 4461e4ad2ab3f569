// One ChatAgent run: the conversation with the model (its messages, trimmed
// to the context budget), each model call with its retries, the tool calls
// it asks for, and what goes into the trace and the job's usage. Private to
// the SDK: ChatAgent is the face.

import type { AgentContext } from "../eval/agent.ts";
import type { Run } from "../eval/run.ts";
import type { Trace } from "../eval/trace.ts";
import type { AdaptiveConcurrency } from "../eval/concurrency.ts";
import { encodeTurnTokens, type TurnTokens } from "../eval/tokens.ts";
import { callCost, type ModelPrice, priceOf, type PricingTable } from "../eval/usage.ts";
import { errorMessage } from "../_internal/util.ts";
import { Deadline } from "../_internal/async.ts";
import { stringifyJson } from "../_internal/framing.ts";
import {
  type ChatMessage,
  isRetryable,
  type ModelBackend,
  modelCause,
  ModelHttpError,
  type ModelReply,
  type ModelRequest,
  ModelUnavailableError,
  publicUrl,
  type RetryOptions,
  type SamplingOptions,
  type TokenUsage,
  type ToolCall,
  type ToolChoice,
  type ToolSpec,
  withRetries,
} from "./model.ts";
import { type AgentTool, isArgs, resultText, type ToolContext } from "./tools.ts";
import type { Toolbox, ToolboxConfig } from "./_toolbox.ts";
import { ImageResult, type ToolImage } from "./computer.ts";

/** The agent ran out of steps or tokens without an answer. */
export class AgentLimitError extends Error {
  /** Makes the error. */
  constructor(message: string) {
    super(message);
    this.name = "AgentLimitError";
  }
}

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

/** Every option of a ChatAgent that a run reads, resolved. */
export interface ChatConfig extends ToolboxConfig {
  readonly system: string;
  readonly sampling: SamplingOptions | undefined;
  readonly toolChoice: ToolChoice | undefined;
  readonly parallelToolCalls: boolean | undefined;
  readonly maxSteps: number;
  readonly maxTokens: number | undefined;
  readonly contextChars: number;
  readonly keepToolResults: number;
  readonly callTimeout: number;
  readonly retry: RetryOptions | undefined;
  readonly tokens: boolean;
  readonly pricing: PricingTable | undefined;
  readonly concurrency: AdaptiveConcurrency | undefined;
}

/** What one model call gave, and how it went. */
interface ModelCall {
  readonly reply: ModelReply;
  /** Tries, the first included. */
  readonly attempts: number;
  /** Why each retry was made. */
  readonly retries: readonly string[];
  /** Milliseconds from the first try to the reply. */
  readonly latency: number;
}

/**
 * One run's conversation with the model: the messages, the budget they are
 * trimmed to, and the tokens spent, which every step reads and changes.
 */
export class ChatLoop {
  readonly #backend: ModelBackend;
  readonly #config: ChatConfig;
  readonly #run: Run;
  readonly #context: AgentContext;
  readonly #toolbox: Toolbox;
  readonly #specs: ToolSpec[];
  readonly #limiter: AdaptiveConcurrency | undefined;
  readonly #price: ModelPrice | null;
  readonly #messages: ChatMessage[];
  #budget: number;
  /** How many messages the trace has seen. */
  #sent = 0;
  #tokens = 0;
  #lastTokens: TurnTokens | null = null;

  constructor(
    backend: ModelBackend,
    config: ChatConfig,
    run: Run,
    context: AgentContext,
    toolbox: Toolbox,
  ) {
    this.#backend = backend;
    this.#config = config;
    this.#run = run;
    this.#context = context;
    this.#toolbox = toolbox;
    this.#specs = toolbox.specs;
    this.#limiter = context.concurrency ?? config.concurrency;
    this.#price = priceOf(backend.model, config.pricing);
    this.#budget = config.contextChars;
    const prompt = typeof run.prompt === "string" ? run.prompt : stringifyJson(run.prompt);
    this.#messages = [
      { role: "system", content: config.system },
      { role: "user", content: prompt },
    ];
  }

  /** Calls the model and its tools until an answer, a refusal, or a limit. */
  async run(): Promise<void> {
    const { maxSteps, keepToolResults } = this.#config;
    for (let step = 1;; step++) {
      if (step > maxSteps) {
        throw new AgentLimitError(
          `ChatAgent stopped: no answer after ${maxSteps} model calls (raise maxSteps)`,
        );
      }
      this.#context.signal.throwIfAborted();
      const trimmed = trimToolResults(this.#messages, this.#budget, keepToolResults);
      const call = await this.#call();
      this.#record(step, call, trimmed);
      if (await this.#act(call.reply)) return;
    }
  }

  /**
   * Follows a reply: a refusal or plain text ends the run, tool calls run.
   * @returns whether the run is over
   * @throws {AgentLimitError} when the tokens spent reach `maxTokens`
   */
  async #act(reply: ModelReply): Promise<boolean> {
    if (reply.refusal !== undefined) {
      this.#run.trace.record("refusal", reply.refusal);
      return true;
    }
    if (reply.toolCalls.length === 0) {
      this.#run.answer = reply.content;
      return true;
    }
    await this.#callTools(reply.toolCalls);
    const submitted = this.#toolbox.submitted;
    if (submitted !== null) {
      this.#run.answer = submitted.answer;
      return true;
    }
    const { maxTokens } = this.#config;
    if (maxTokens !== undefined && this.#tokens >= maxTokens) {
      throw new AgentLimitError(
        `ChatAgent stopped: ${this.#tokens} tokens used, over maxTokens ${maxTokens}`,
      );
    }
    return false;
  }

  /** One model call with its retries, all within `callTimeout`. */
  async #call(): Promise<ModelCall> {
    const started = performance.now();
    const tally = { attempts: 0, retries: [] as string[] };
    let reply: ModelReply;
    {
      using deadline = new Deadline(this.#config.callTimeout, this.#context.signal, "model call");
      try {
        reply = await withRetries(
          (_, signal) => this.#attempt(tally, signal),
          deadline.signal,
          this.#retryOptions(tally.retries),
        );
      } catch (err) {
        throw modelFailure(err, {
          url: this.#backend.url,
          attempts: tally.attempts,
          elapsed: performance.now() - started,
          callTimeout: this.#config.callTimeout,
          agentStopped: this.#context.signal.aborted,
        });
      }
    }
    return { reply, ...tally, latency: performance.now() - started };
  }

  /** The agent's retry options, with each retry's reason noted in `retries`. */
  #retryOptions(retries: string[]): RetryOptions {
    const retry = this.#config.retry;
    return {
      ...retry,
      sleep: retry?.sleep ?? this.#limiter?.clock.sleep,
      onRetry: (err, attempt, wait) => {
        retries.push(errorMessage(err));
        retry?.onRetry?.(err, attempt, wait);
      },
    };
  }

  /**
   * One try. Over the model's context window it cuts harder and tries once
   * more, while there is tool output left to cut.
   */
  async #attempt(
    tally: { attempts: number; retries: string[] },
    signal: AbortSignal,
  ): Promise<ModelReply> {
    tally.attempts++;
    try {
      return await this.#complete(signal);
    } catch (err) {
      if (!(err instanceof ModelHttpError && err.contextOverflow) || this.#shrink() === 0) {
        throw err;
      }
      tally.retries.push("context_overflow");
      return await this.#complete(signal);
    }
  }

  /**
   * Lowers the budget to 60% of the messages' size and trims to it, down to
   * the last tool result, then none.
   * @returns how many results were cut
   */
  #shrink(): number {
    const size = this.#messages.reduce((n, m) => n + messageChars(m), 0);
    this.#budget = Math.min(this.#budget, Math.floor(size * 0.6));
    const keep = Math.min(this.#config.keepToolResults, 1);
    return trimToolResults(this.#messages, this.#budget, keep) ||
      trimToolResults(this.#messages, this.#budget, 0);
  }

  /** One request, holding a permit of the concurrency limit while it runs. */
  async #complete(signal: AbortSignal): Promise<ModelReply> {
    const c = this.#config;
    const request: ModelRequest = {
      messages: this.#messages,
      tools: this.#specs,
      toolChoice: c.toolChoice,
      parallelToolCalls: c.parallelToolCalls,
      sampling: c.sampling,
      ...(c.tokens ? { tokens: true } : {}),
    };
    const permit = this.#limiter ? await this.#limiter.acquire(signal) : null;
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

  /**
   * Adds the reply to the conversation, and records the call: a `model`
   * step in the trace (the messages new since the last one), and its
   * tokens and cost to the job.
   */
  #record(step: number, call: ModelCall, trimmed: number): void {
    const { reply } = call;
    const usage = reply.usage;
    this.#tokens += (usage?.inputTokens ?? 0) + (usage?.outputTokens ?? 0);
    const cost = usage === null
      ? null
      : usage.costUsd ?? (this.#price === null ? null : callCost(usage, this.#price));
    const assistant: ChatMessage = { role: "assistant", content: reply.content };
    if (reply.toolCalls.length > 0) assistant.toolCalls = reply.toolCalls;
    const request = this.#messages.slice(this.#sent).map(wireMessage);
    this.#messages.push(assistant);
    this.#sent = this.#messages.length;
    const info = modelStepInfo(step, this.#backend, call, trimmed, cost);
    if (reply.tokens) info.tokens = encodeTurnTokens(reply.tokens, this.#lastTokens);
    this.#lastTokens = reply.tokens ?? null;
    this.#run.trace.record("model", { request, reply: wireMessage(assistant) }, info);
    if (usage !== null) this.#reportUsage(usage, cost);
  }

  #reportUsage(usage: TokenUsage, cost: number | null): void {
    try {
      this.#context.onUsage?.({
        model: this.#backend.model,
        inputTokens: usage.inputTokens,
        outputTokens: usage.outputTokens,
        cachedTokens: usage.cachedTokens ?? 0,
        costUsd: cost,
      });
    } catch {
      // The job's accounting must not fail the agent.
    }
  }

  /** Runs the calls, then adds their results to the conversation and the trace. */
  async #callTools(calls: readonly ToolCall[]): Promise<void> {
    const context: ToolContext = { run: this.#run, signal: this.#context.signal };
    // One after the other, in the model's order: shell commands have side
    // effects, and the model wrote them expecting that order.
    const results = [];
    for (const call of calls) results.push(await callTool(call, this.#toolbox.tools, context));
    for (const [i, call] of calls.entries()) {
      await recordToolResult(this.#run.trace, this.#messages, call, results[i]);
    }
  }
}

/** The info of a `model` step: the call's model, tokens, latency, cost and retries. */
function modelStepInfo(
  step: number,
  backend: ModelBackend,
  call: ModelCall,
  trimmed: number,
  cost: number | null,
): Record<string, unknown> {
  const { reply } = call;
  const info: Record<string, unknown> = {
    step,
    model: backend.model,
    format: backend.format,
    latency_ms: Math.round(call.latency * 10) / 10,
    input_tokens: reply.usage?.inputTokens ?? null,
    output_tokens: reply.usage?.outputTokens ?? null,
    finish_reason: reply.finishReason,
    attempts: call.attempts,
  };
  if (reply.usage?.cachedTokens !== undefined) info.cached_tokens = reply.usage.cachedTokens;
  if (cost !== null) info.cost_usd = cost;
  if (call.retries.length > 0) info.retries = call.retries;
  if (trimmed > 0) info.trimmed_tool_results = trimmed;
  return info;
}

/** How a model call that failed went, for its error. */
interface CallFailure {
  /** The endpoint, when the backend says. */
  readonly url: string | undefined;
  /** Tries made. */
  readonly attempts: number;
  /** Milliseconds since the first try. */
  readonly elapsed: number;
  readonly callTimeout: number;
  /** Whether the agent itself was stopped (its deadline, the rollout's). */
  readonly agentStopped: boolean;
}

/**
 * What a call that failed past its retries throws. A server that did not
 * answer (refused, reset, 408, 429, 5xx, no reply within `callTimeout`) is
 * a {@linkcode ModelUnavailableError} naming the endpoint (without
 * credentials), the tries, the time and the last cause: a rollout that
 * fails so is the infrastructure's failure, not the agent's. The agent
 * stopped from outside, a context overflow, and the errors that will
 * repeat (`model_error`: a bad status, an unreadable reply) are thrown as
 * they are; each names the endpoint itself.
 */
function modelFailure(err: unknown, how: CallFailure): unknown {
  if (how.agentStopped) return err;
  const where = how.url === undefined ? "the model server" : `model server ${publicUrl(how.url)}`;
  const after = `after ${how.attempts} attempt${how.attempts === 1 ? "" : "s"} in ${
    (how.elapsed / 1000).toFixed(1)
  } s`;
  if (
    err instanceof DOMException && err.name === "TimeoutError" &&
    err.message.startsWith("model call timed out")
  ) {
    return new ModelUnavailableError(
      `${where} did not answer within ${how.callTimeout} ms (callTimeout), ${after}`,
      { cause: err },
    );
  }
  if (!isRetryable(err)) return err;
  return new ModelUnavailableError(`${where} unavailable ${after}: ${modelCause(err)}`, {
    cause: err,
  });
}

/** What a tool call came to. */
interface ToolOutcome {
  text: string;
  isError: boolean;
  latency: number;
  images: readonly ToolImage[];
}

/**
 * Gives a tool's result to the model (its pictures base64) and to the trace
 * (its pictures as files of the trace, referenced from the step).
 */
async function recordToolResult(
  trace: Trace,
  messages: ChatMessage[],
  call: ToolCall,
  r: ToolOutcome,
): Promise<void> {
  const images = r.images.map((i) => ({ mediaType: i.mediaType, data: i.data.toBase64() }));
  messages.push({
    role: "tool",
    toolCallId: call.id,
    name: call.name,
    content: r.text,
    ...(r.isError ? { isError: true } : {}),
    ...(images.length > 0 ? { images } : {}),
  });
  const files = await Promise.all(r.images.map((i) => trace.attach(i.data, i.mediaType)));
  trace.record("tool", {
    id: call.id,
    name: call.name,
    arguments: call.arguments,
    result: r.text,
    ...(files.length > 0 ? { images: files } : {}),
  }, { latency_ms: r.latency, is_error: r.isError });
}

/** Runs one tool call; a bad call or a failing tool is an error result for the model. */
async function callTool(
  call: ToolCall,
  tools: ReadonlyMap<string, AgentTool>,
  context: ToolContext,
): Promise<ToolOutcome> {
  const started = performance.now();
  const done = (text: string, isError: boolean, images: readonly ToolImage[] = []) => ({
    text,
    isError,
    latency: Math.round((performance.now() - started) * 10) / 10,
    images,
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
        errorMessage(err)
      }; send a JSON object`,
      true,
    );
  }
  if (!isArgs(args)) {
    return done(`Error: the arguments of "${call.name}" must be a JSON object`, true);
  }
  try {
    const value = await tool.call(args, context);
    if (value instanceof ImageResult) return done(value.text, false, value.images);
    return done(resultText(value), false);
  } catch (err) {
    if (context.signal.aborted) throw context.signal.reason;
    return done(`Error: ${errorMessage(err)}`, true);
  }
}
