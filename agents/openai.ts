/**
 * OpenAI-compatible Chat Completions (`POST {baseUrl}/chat/completions`):
 * OpenAI itself, vLLM, SGLang, llama.cpp's `llama-server`, Ollama. Function
 * calling with `tools`, parallel calls, `tool_choice`, and streaming with
 * the text and tool-call deltas assembled.
 *
 * @module
 */

import {
  cappedReply,
  type ChatMessage,
  httpError,
  maxResponseBytes,
  type ModelBackend,
  ModelHttpError,
  type ModelReply,
  ModelReplyError,
  type ModelRequest,
  ModelStreamError,
  replyJson,
  type ToolCall,
} from "./model.ts";
import { llamaPromptIds, openAiUsage, StreamAssembler, TokenReader } from "./_dialect.ts";
import { sseData } from "../_internal/sse.ts";
import { isRecord } from "../_internal/util.ts";
import { addSecretValue } from "../_internal/secret_values.ts";

/** Options for {@linkcode OpenAiBackend}. */
export interface OpenAiBackendOptions {
  /** The model's name, as the server knows it. */
  model: string;
  /**
   * The API's base url, up to and including `/v1`.
   * @default the `OPENAI_BASE_URL` environment variable, else "https://api.openai.com/v1"
   */
  baseUrl?: string;
  /**
   * The API key, sent as a bearer token.
   * @default the `OPENAI_API_KEY` environment variable, else none
   */
  apiKey?: string;
  /**
   * Past this many bytes a reply (its JSON, or the whole event stream) is
   * cut off with a {@linkcode ModelStreamError}.
   * @default 64 MiB
   */
  maxResponseBytes?: number;
  /**
   * Whether to stream the reply (server-sent events).
   * @default true
   */
  stream?: boolean;
  /** Extra request headers. */
  headers?: Record<string, string>;
  /**
   * Body fields added when a request asks for tokens, beside `logprobs`.
   * @default `{ return_token_ids: true, return_tokens_as_token_ids: true }`
   *   (vLLM's; other servers ignore them), none for api.openai.com and
   *   Azure, which refuse fields they do not know
   */
  tokenFields?: Record<string, unknown>;
  /**
   * Where the prompt's token ids come from when a request asks for tokens:
   * the reply (`"response"`: vLLM, sglang), or llama-server's
   * `/apply-template` and `/tokenize` after each call (`"llama-server"`),
   * kept only when they count what the reply's usage counts.
   * @default "response"
   */
  promptTokens?: "response" | "llama-server";
}

function envVar(name: string): string | undefined {
  try {
    return Deno.env.get(name) || undefined;
  } catch {
    return undefined; // No --allow-env: as if unset.
  }
}

function wireMessage(m: ChatMessage): Record<string, unknown> {
  switch (m.role) {
    case "assistant": {
      const out: Record<string, unknown> = { role: "assistant", content: m.content || null };
      if (m.toolCalls && m.toolCalls.length > 0) {
        out.tool_calls = m.toolCalls.map((c) => ({
          id: c.id,
          type: "function",
          function: { name: c.name, arguments: c.arguments },
        }));
      }
      return out;
    }
    case "tool":
      return {
        role: "tool",
        tool_call_id: m.toolCallId,
        content: m.content || (m.images?.length ? "(the screenshot follows)" : ""),
      };
    default:
      return { role: m.role, content: m.content };
  }
}

/**
 * The messages on the wire. Tool messages hold text only in Chat
 * Completions, so the pictures of a turn's tool results (the computer
 * tool's screenshots) follow them in one user message of image parts.
 */
function wireMessages(messages: readonly ChatMessage[]): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  let pictures: Record<string, unknown>[] = [];
  const flush = () => {
    if (pictures.length === 0) return;
    out.push({ role: "user", content: pictures });
    pictures = [];
  };
  for (const m of messages) {
    if (m.role !== "tool") flush();
    out.push(wireMessage(m));
    if (m.role === "tool" && m.images?.length) {
      pictures.push({ type: "text", text: `The screen after tool call ${m.toolCallId}:` });
      for (const i of m.images) {
        pictures.push({
          type: "image_url",
          image_url: { url: `data:${i.mediaType};base64,${i.data}` },
        });
      }
    }
  }
  flush();
  return out;
}

const NO_STREAM_LOGPROBS = /logprobs.*(not supported|unsupported).*stream|stream.*logprobs/i;

function refusesFields(url: URL): boolean {
  return url.hostname === "api.openai.com" || url.hostname.endsWith(".openai.azure.com");
}

/** The Chat Completions request body for `request`. */
export function openAiBody(
  model: string,
  request: ModelRequest,
  stream: boolean,
): Record<string, unknown> {
  const s = request.sampling ?? {};
  const body: Record<string, unknown> = {
    model,
    messages: wireMessages(request.messages),
  };
  if (request.tools.length > 0) {
    body.tools = request.tools.map((t) => ({
      type: "function",
      function: { name: t.name, description: t.description, parameters: t.parameters },
    }));
    const choice = request.toolChoice ?? "auto";
    body.tool_choice = typeof choice === "string"
      ? choice
      : { type: "function", function: { name: choice.name } };
    body.parallel_tool_calls = request.parallelToolCalls ?? true;
  }
  if (s.temperature !== undefined) body.temperature = s.temperature;
  if (s.topP !== undefined) body.top_p = s.topP;
  if (s.maxTokens !== undefined) body.max_tokens = s.maxTokens;
  if (s.stop !== undefined) body.stop = s.stop;
  if (s.seed !== undefined) body.seed = s.seed;
  if (request.tokens) body.logprobs = true;
  if (stream) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return { ...body, ...s.extra };
}

/** An OpenAI-compatible Chat Completions endpoint as a {@linkcode ModelBackend}. */
export class OpenAiBackend implements ModelBackend {
  /** Always `openai`. */
  readonly format: string = "openai";
  /** The model's name. */
  readonly model: string;
  readonly #url: string;
  readonly #maxResponse: number;
  readonly #headers: Record<string, string>;
  readonly #stream: boolean;
  readonly #tokenFields: Record<string, unknown>;
  readonly #promptTokens: "response" | "llama-server";
  readonly #origin: string;
  // Set once the server refused log-probabilities in a stream (llama-server
  // does with tools): calls that ask for tokens are not streamed from then on.
  #streamTokens = true;

  /**
   * Makes a backend; nothing is sent until {@linkcode OpenAiBackend.complete}.
   * @throws {TypeError} for a missing model or a bad base url
   */
  constructor(options: OpenAiBackendOptions) {
    if (typeof options?.model !== "string" || options.model === "") {
      throw new TypeError("Cannot make OpenAI backend: model is required (pass --model NAME)");
    }
    const base = options.baseUrl ?? envVar("OPENAI_BASE_URL") ?? "https://api.openai.com/v1";
    let url: URL;
    try {
      url = new URL(base.replace(/\/+$/, "") + "/chat/completions");
    } catch {
      throw new TypeError(`Cannot make OpenAI backend: bad base url "${base}"`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new TypeError(`Cannot make OpenAI backend: base url "${base}" is not http(s)`);
    }
    this.model = options.model;
    this.#maxResponse = maxResponseBytes(options.maxResponseBytes, "OpenAI");
    this.#url = url.href;
    this.#stream = options.stream ?? true;
    this.#tokenFields = options.tokenFields ??
      (refusesFields(url) ? {} : { return_token_ids: true, return_tokens_as_token_ids: true });
    const prompts = options.promptTokens ?? "response";
    if (prompts !== "response" && prompts !== "llama-server") {
      throw new TypeError(
        `Cannot make OpenAI backend: promptTokens must be "response" or "llama-server", got "${prompts}"`,
      );
    }
    this.#promptTokens = prompts;
    // llama-server's own endpoints sit beside /v1.
    this.#origin = new URL(url.pathname.replace(/\/v1\/chat\/completions$/, "/"), url).href
      .replace(/\/+$/, "");
    const key = options.apiKey ?? envVar("OPENAI_API_KEY");
    // Results written in this process never hold it (_internal/secret_values.ts).
    if (key) addSecretValue(key, "model API key");
    this.#headers = {
      "content-type": "application/json",
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...options.headers,
    };
  }

  /** The endpoint's url. */
  get url(): string {
    return this.#url;
  }

  /**
   * Sends one Chat Completions request.
   * @throws {ModelHttpError} for an HTTP error status
   * @throws {ModelStreamError} for a reply cut short or unreadable
   */
  async complete(request: ModelRequest, signal: AbortSignal): Promise<ModelReply> {
    const stream = this.#stream && !(request.tokens && !this.#streamTokens);
    let reply: ModelReply;
    try {
      reply = await this.#send(request, stream, signal);
    } catch (err) {
      if (
        !(stream && request.tokens && err instanceof ModelHttpError && err.status === 400 &&
          NO_STREAM_LOGPROBS.test(err.message))
      ) throw err;
      this.#streamTokens = false;
      reply = await this.#send(request, false, signal);
    }
    if (request.tokens && this.#promptTokens === "llama-server" && reply.usage !== null) {
      const promptIds = await this.#llamaPromptIds(request, reply.usage.inputTokens, signal);
      if (promptIds !== null) {
        reply.tokens = {
          promptIds,
          completionIds: reply.tokens?.completionIds ?? null,
          logprobs: reply.tokens?.logprobs ?? null,
        };
      }
    }
    return reply;
  }

  #body(request: ModelRequest, stream: boolean): Record<string, unknown> {
    const body = openAiBody(this.model, request, stream);
    return request.tokens ? { ...this.#tokenFields, ...body } : body;
  }

  async #send(request: ModelRequest, stream: boolean, signal: AbortSignal): Promise<ModelReply> {
    const response = await fetch(this.#url, {
      method: "POST",
      headers: this.#headers,
      body: JSON.stringify(this.#body(request, stream)),
      signal,
    });
    if (!response.ok) throw await httpError(response, "Chat completion");
    const type = response.headers.get("content-type") ?? "";
    if (type.includes("text/event-stream")) {
      return await readStream(cappedReply(response, this.#maxResponse, "chat completion"));
    }
    return readCompletion(await replyJson(response, this.#maxResponse, "chat completion"));
  }

  /** The prompt's token ids from llama-server, or `null` (see {@linkcode llamaPromptIds}). */
  #llamaPromptIds(
    request: ModelRequest,
    count: number,
    signal: AbortSignal,
  ): Promise<number[] | null> {
    const chat = this.#body(request, false);
    return llamaPromptIds(this.#origin, this.#headers, { chat }, count, signal, this.#maxResponse);
  }
}

function readCompletion(body: unknown): ModelReply {
  const choice = isRecord(body) && Array.isArray(body.choices) ? body.choices[0] : undefined;
  if (!isRecord(choice) || !isRecord(choice.message)) {
    throw new ModelReplyError("Cannot read chat completion: it has no choices[0].message");
  }
  const m = choice.message;
  const toolCalls: ToolCall[] = [];
  for (const c of Array.isArray(m.tool_calls) ? m.tool_calls : []) {
    if (!isRecord(c) || !isRecord(c.function)) continue;
    const args = c.function.arguments;
    toolCalls.push({
      id: String(c.id ?? `call_${toolCalls.length}`),
      name: String(c.function.name ?? ""),
      arguments: typeof args === "string" ? args : JSON.stringify(args ?? {}),
    });
  }
  const reply: ModelReply = {
    content: typeof m.content === "string" ? m.content : "",
    toolCalls,
    finishReason: String(choice.finish_reason ?? "stop"),
    usage: openAiUsage((body as Record<string, unknown>).usage),
  };
  if (typeof m.refusal === "string" && m.refusal !== "") reply.refusal = m.refusal;
  const tokens = new TokenReader();
  tokens.read(body as Record<string, unknown>, choice);
  const read = tokens.result();
  if (read) reply.tokens = read;
  return reply;
}

/** Reads a streamed completion (server-sent events) into one reply. */
async function readStream(body: ReadableStream<Uint8Array>): Promise<ModelReply> {
  const reply = new StreamedReply();
  try {
    for await (const { data } of sseData(body)) {
      if (!reply.take(data)) break;
    }
  } catch (err) {
    if (err instanceof ModelStreamError) throw err;
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ModelStreamError("Chat completion stream broke", { cause: err });
  }
  return reply.reply();
}

/**
 * A streamed completion: its events' chunks assembled (as the dialect
 * does), `[DONE]` and error events heeded.
 */
class StreamedReply {
  readonly #chunks = new StreamAssembler("chat");
  #done = false;

  /**
   * Takes one event's data.
   * @returns false once the stream says `[DONE]`
   * @throws {ModelStreamError} for an event that is not JSON, or an error event
   */
  take(data: string): boolean {
    if (data.trim() === "[DONE]") {
      this.#done = true;
      return false;
    }
    let chunk: unknown;
    try {
      chunk = JSON.parse(data);
    } catch (err) {
      throw new ModelStreamError(`Cannot read stream: bad event "${data.slice(0, 80)}"`, {
        cause: err,
      });
    }
    if (!isRecord(chunk)) return true;
    if (isRecord(chunk.error)) {
      throw new ModelStreamError(`Chat completion failed mid-stream: ${chunk.error.message}`);
    }
    this.#chunks.add(chunk);
    return true;
  }

  /**
   * The reply the chunks made.
   * @throws {ModelStreamError} for a stream cut short
   */
  reply(): ModelReply {
    const chunks = this.#chunks;
    // A stream that ends without `[DONE]` or a finish reason was cut short:
    // what it carried (a half-written tool call) must not be acted on.
    if (!this.#done && chunks.finishReason === null) {
      throw new ModelStreamError(
        "Chat completion stream ended early: no finish_reason nor [DONE]",
      );
    }
    const reply: ModelReply = {
      content: chunks.text,
      toolCalls: chunks.toolCalls(),
      finishReason: chunks.finishReason ?? "stop",
      usage: chunks.usage,
    };
    if (chunks.refusal !== "") reply.refusal = chunks.refusal;
    const read = chunks.tokens();
    if (read) reply.tokens = read;
    return reply;
  }
}
