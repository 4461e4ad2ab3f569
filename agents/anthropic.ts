/**
 * The Anthropic Messages API (`POST {baseUrl}/v1/messages`): `tool_use`
 * blocks from the model, `tool_result` blocks back.
 *
 * @module
 */

import {
  type ChatImage,
  type ChatMessage,
  httpError,
  maxResponseBytes,
  type ModelBackend,
  type ModelReply,
  ModelReplyError,
  type ModelRequest,
  replyJson,
  type ToolCall,
} from "./model.ts";
import { isRecord } from "../_internal/util.ts";
import { anthropicUsage } from "./_dialect.ts";
import { addSecretValue } from "../_internal/secret_values.ts";

/** Options for {@linkcode AnthropicBackend}. */
export interface AnthropicBackendOptions {
  /** The model's name. */
  model: string;
  /**
   * The API's base url (without `/v1`).
   * @default the `ANTHROPIC_BASE_URL` environment variable, else "https://api.anthropic.com"
   */
  baseUrl?: string;
  /**
   * The API key, sent as `x-api-key`.
   * @default the `ANTHROPIC_API_KEY` environment variable
   */
  apiKey?: string;
  /**
   * Past this many bytes a reply is cut off with a `ModelStreamError`.
   * @default 64 MiB
   */
  maxResponseBytes?: number;
  /**
   * The `anthropic-version` header.
   * @default "2023-06-01"
   */
  version?: string;
  /**
   * `max_tokens` when the sampling options set none (the API requires it).
   * @default 4096
   */
  defaultMaxTokens?: number;
}

function envVar(name: string): string | undefined {
  try {
    return Deno.env.get(name) || undefined;
  } catch {
    return undefined;
  }
}

/** A tool_result's content: its text, or its text and its pictures (image blocks). */
function toolResultContent(text: string, images: readonly ChatImage[] | undefined): unknown {
  if (!images?.length) return text;
  return [
    ...(text ? [{ type: "text", text }] : []),
    ...images.map((i) => ({
      type: "image",
      source: { type: "base64", media_type: i.mediaType, data: i.data },
    })),
  ];
}

/** The Messages request body for `request`. */
export function anthropicBody(
  model: string,
  request: ModelRequest,
  defaultMaxTokens = 4096,
): Record<string, unknown> {
  const s = request.sampling ?? {};
  const { system, messages } = anthropicMessages(request.messages);
  const body: Record<string, unknown> = {
    model,
    max_tokens: s.maxTokens ?? defaultMaxTokens,
    messages,
  };
  if (system.length > 0) body.system = system.join("\n\n");
  if (request.tools.length > 0) {
    body.tools = request.tools.map((t) =>
      t.anthropic?.definition ?? {
        name: t.name,
        description: t.description,
        input_schema: t.parameters,
      }
    );
    body.tool_choice = anthropicToolChoice(request);
  }
  if (s.temperature !== undefined) body.temperature = s.temperature;
  if (s.topP !== undefined) body.top_p = s.topP;
  if (s.stop !== undefined) body.stop_sequences = s.stop;
  return { ...body, ...s.extra };
}

type AnthropicMessage = { role: string; content: Record<string, unknown>[] };

/** The system prompts apart, and the turns as the Messages API takes them. */
function anthropicMessages(
  chat: readonly ChatMessage[],
): { system: string[]; messages: AnthropicMessage[] } {
  const system: string[] = [];
  const messages: AnthropicMessage[] = [];
  const push = (role: string, block: Record<string, unknown>) => {
    const last = messages.at(-1);
    // Tool results following each other go in one user turn, as the API asks.
    if (last && last.role === role) last.content.push(block);
    else messages.push({ role, content: [block] });
  };
  for (const m of chat) {
    if (m.role === "system") system.push(m.content);
    else if (m.role === "user") push("user", { type: "text", text: m.content });
    else if (m.role === "tool") {
      push("user", {
        type: "tool_result",
        tool_use_id: m.toolCallId,
        content: toolResultContent(m.content, m.images),
        ...(m.isError ? { is_error: true } : {}),
      });
    } else messages.push({ role: "assistant", content: assistantBlocks(m) });
  }
  return { system, messages };
}

/** An assistant turn's text and tool calls as content blocks. */
function assistantBlocks(
  m: Extract<ChatMessage, { role: "assistant" }>,
): Record<string, unknown>[] {
  const blocks: Record<string, unknown>[] = [];
  if (m.content) blocks.push({ type: "text", text: m.content });
  for (const c of m.toolCalls ?? []) {
    let input: unknown;
    try {
      input = JSON.parse(c.arguments);
    } catch {
      input = {};
    }
    blocks.push({ type: "tool_use", id: c.id, name: c.name, input: isRecord(input) ? input : {} });
  }
  return blocks;
}

/** `tool_choice` for the request's choice and parallelism. */
function anthropicToolChoice(request: ModelRequest): Record<string, unknown> {
  const choice = request.toolChoice ?? "auto";
  const parallel = request.parallelToolCalls ?? true;
  const out: Record<string, unknown> = typeof choice === "object"
    ? { type: "tool", name: choice.name }
    : { type: choice === "required" ? "any" : choice };
  if (!parallel && choice !== "none") out.disable_parallel_tool_use = true;
  return out;
}

/** `headers`, with the betas that tools Anthropic defines itself (the computer tool) need. */
function withBetas(headers: Record<string, string>, request: ModelRequest): Record<string, string> {
  const betas = [...new Set(request.tools.flatMap((t) => t.anthropic?.beta ?? []))];
  return betas.length > 0 ? { ...headers, "anthropic-beta": betas.join(",") } : headers;
}

/** The Anthropic Messages API as a {@linkcode ModelBackend}. */
export class AnthropicBackend implements ModelBackend {
  /** Always `anthropic`. */
  readonly format: string = "anthropic";
  /** The model's name. */
  readonly model: string;
  readonly #url: string;
  readonly #maxResponse: number;
  readonly #headers: Record<string, string>;
  readonly #defaultMaxTokens: number;

  /**
   * Makes a backend; nothing is sent until {@linkcode AnthropicBackend.complete}.
   * @throws {TypeError} for a missing model or a bad base url
   */
  constructor(options: AnthropicBackendOptions) {
    if (typeof options?.model !== "string" || options.model === "") {
      throw new TypeError("Cannot make Anthropic backend: model is required (pass --model NAME)");
    }
    const base = options.baseUrl ?? envVar("ANTHROPIC_BASE_URL") ?? "https://api.anthropic.com";
    let url: URL;
    try {
      url = new URL(base.replace(/\/+$/, "").replace(/\/v1$/, "") + "/v1/messages");
    } catch {
      throw new TypeError(`Cannot make Anthropic backend: bad base url "${base}"`);
    }
    this.model = options.model;
    this.#url = url.href;
    this.#maxResponse = maxResponseBytes(options.maxResponseBytes, "Anthropic");
    this.#defaultMaxTokens = options.defaultMaxTokens ?? 4096;
    const key = options.apiKey ?? envVar("ANTHROPIC_API_KEY");
    // Results written in this process never hold it (_internal/secret_values.ts).
    if (key) addSecretValue(key, "model API key");
    this.#headers = {
      "content-type": "application/json",
      "anthropic-version": options.version ?? "2023-06-01",
      ...(key ? { "x-api-key": key } : {}),
    };
  }

  /** The endpoint's url. */
  get url(): string {
    return this.#url;
  }

  /**
   * Sends one Messages request.
   * @throws {ModelHttpError} for an HTTP error status
   * @throws {ModelReplyError} for a reply that cannot be read
   */
  async complete(request: ModelRequest, signal: AbortSignal): Promise<ModelReply> {
    const response = await fetch(this.#url, {
      method: "POST",
      headers: withBetas(this.#headers, request),
      body: JSON.stringify(anthropicBody(this.model, request, this.#defaultMaxTokens)),
      signal,
    });
    if (!response.ok) throw await httpError(response, "Messages request");
    const body = await replyJson(response, this.#maxResponse, "messages reply");
    if (!isRecord(body) || !Array.isArray(body.content)) {
      throw new ModelReplyError("Cannot read messages reply: it has no content");
    }
    let content = "";
    const toolCalls: ToolCall[] = [];
    for (const block of body.content) {
      if (!isRecord(block)) continue;
      if (block.type === "text" && typeof block.text === "string") content += block.text;
      if (block.type === "tool_use") {
        toolCalls.push({
          id: String(block.id),
          name: String(block.name),
          arguments: JSON.stringify(block.input ?? {}),
        });
      }
    }
    const usage = anthropicUsage(body.usage);
    const reply: ModelReply = {
      content,
      toolCalls,
      finishReason: String(body.stop_reason ?? "end_turn"),
      usage,
    };
    if (body.stop_reason === "refusal") reply.refusal = content || "refused";
    return reply;
  }
}
