// Anthropic's Messages API as the proxy speaks it: read (a message, or the
// events of a stream) for the record when the server speaks it too, and
// translated to and from Chat Completions when the server is one that
// trainers sample from (llama-server, vLLM, sglang), whose token ids only
// that API carries. The translation follows the two APIs' documented
// shapes: system and messages, text, image, tool_use and tool_result
// blocks, tools and tool_choice, sampling, stop reasons and usage.

import { anthropicUsage } from "../agents/_dialect.ts";
import type { TokenUsage } from "../agents/model.ts";
import { isRecord } from "../_internal/util.ts";
import { ProxyError, sseEvent } from "./_wire.ts";

/**
 * Refuses a request that is not a Messages request.
 * @throws {ProxyError} 400
 */
export function checkMessagesRequest(body: Record<string, unknown>): void {
  if (!Array.isArray(body.messages) || body.messages.length === 0) {
    throw new ProxyError(
      400,
      'Model proxy refused the request: "messages" must be a non-empty array',
    );
  }
}

/** What a Messages reply says, read for the record. */
export interface MessagesReply {
  /** `{ role: "assistant", content: blocks }`. */
  reply: Record<string, unknown>;
  /** The stop reason. */
  finishReason: string | null;
  /** Token counts. */
  usage: TokenUsage | null;
  /** The model, as the reply names it. */
  model: string | null;
}

/** A whole Messages reply, read. */
export function readMessagesReply(json: Record<string, unknown>): MessagesReply {
  if (!Array.isArray(json.content)) {
    throw new ProxyError(502, "Model proxy: the server's message has no content");
  }
  return {
    reply: { role: "assistant", content: json.content },
    finishReason: typeof json.stop_reason === "string" ? json.stop_reason : null,
    usage: anthropicUsage(json.usage),
    model: typeof json.model === "string" ? json.model : null,
  };
}

/** A Messages stream's events, assembled into the message they say. */
export class MessagesStreamReader {
  #message: Record<string, unknown> = {};
  readonly #blocks: Record<string, unknown>[] = [];
  readonly #json = new Map<number, string>();
  #usage: Record<string, unknown> = {};
  #stopped = false;

  /** Whether `message_stop` came (a stream that ends without it was cut short). */
  get finished(): boolean {
    return this.#stopped;
  }

  /** Reads one event. */
  feed(event: Record<string, unknown>): void {
    const index = typeof event.index === "number" ? event.index : -1;
    switch (event.type) {
      case "message_start":
        if (isRecord(event.message)) {
          this.#message = event.message;
          if (isRecord(event.message.usage)) this.#usage = { ...event.message.usage };
        }
        break;
      case "content_block_start":
        if (isRecord(event.content_block) && index >= 0) {
          this.#blocks[index] = { ...event.content_block };
        }
        break;
      case "content_block_delta":
        this.#delta(this.#blocks[index], index, isRecord(event.delta) ? event.delta : {});
        break;
      case "content_block_stop": {
        const block = this.#blocks[index];
        if (block?.type === "tool_use" && this.#json.has(index)) {
          try {
            block.input = JSON.parse(this.#json.get(index) || "{}");
          } catch {
            block.input = {}; // cut short: nothing to act on
          }
        }
        break;
      }
      case "message_delta":
        if (isRecord(event.delta)) Object.assign(this.#message, event.delta);
        if (isRecord(event.usage)) Object.assign(this.#usage, event.usage);
        break;
      case "message_stop":
        this.#stopped = true;
        break;
    }
  }

  #delta(block: Record<string, unknown> | undefined, index: number, d: Record<string, unknown>) {
    if (block === undefined) return;
    if (d.type === "text_delta" && typeof d.text === "string") {
      block.text = String(block.text ?? "") + d.text;
    } else if (d.type === "input_json_delta" && typeof d.partial_json === "string") {
      this.#json.set(index, (this.#json.get(index) ?? "") + d.partial_json);
    } else if (d.type === "thinking_delta" && typeof d.thinking === "string") {
      block.thinking = String(block.thinking ?? "") + d.thinking;
    } else if (d.type === "signature_delta" && typeof d.signature === "string") {
      block.signature = d.signature;
    }
  }

  /** What the events said. */
  result(): MessagesReply {
    return {
      reply: { role: "assistant", content: this.#blocks.filter(isRecord) },
      finishReason: typeof this.#message.stop_reason === "string"
        ? this.#message.stop_reason
        : null,
      usage: anthropicUsage(this.#usage),
      model: typeof this.#message.model === "string" ? this.#message.model : null,
    };
  }
}

function refuse(why: string): ProxyError {
  return new ProxyError(
    400,
    `Model proxy cannot translate the request for the model server: ${why}`,
  );
}

function blockText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.filter((b) => isRecord(b) && b.type === "text").map((b) => String(b.text ?? ""))
    .join("\n");
}

function imagePart(block: Record<string, unknown>): Record<string, unknown> {
  const source = isRecord(block.source) ? block.source : {};
  const url = source.type === "url"
    ? String(source.url ?? "")
    : `data:${source.media_type};base64,${source.data}`;
  return { type: "image_url", image_url: { url } };
}

/** One Messages message as Chat Completions messages (tool results become `tool` messages). */
function chatMessages(message: Record<string, unknown>): Record<string, unknown>[] {
  const role = message.role === "assistant" ? "assistant" : "user";
  if (typeof message.content === "string") return [{ role, content: message.content }];
  const blocks = Array.isArray(message.content) ? message.content.filter(isRecord) : [];
  const out: Record<string, unknown>[] = [];
  const parts: Record<string, unknown>[] = [];
  const calls: Record<string, unknown>[] = [];
  let reasoning = "";
  for (const b of blocks) {
    if (b.type === "text") parts.push({ type: "text", text: String(b.text ?? "") });
    else if (b.type === "image" && role === "user") parts.push(imagePart(b));
    else if (b.type === "tool_result" && role === "user") {
      out.push({
        role: "tool",
        tool_call_id: String(b.tool_use_id ?? ""),
        content: blockText(b.content),
      });
    } else if (b.type === "tool_use" && role === "assistant") {
      calls.push({
        id: String(b.id ?? ""),
        type: "function",
        function: { name: String(b.name ?? ""), arguments: JSON.stringify(b.input ?? {}) },
      });
    } else if (b.type === "thinking" && role === "assistant") reasoning += String(b.thinking ?? "");
    else if (b.type !== "redacted_thinking") {
      throw refuse(`a "${b.type}" block in a ${role} message`);
    }
  }
  if (parts.length === 0 && calls.length === 0 && reasoning === "") return out;
  const text = parts.every((p) => p.type === "text");
  const m: Record<string, unknown> = {
    role,
    content: text ? parts.map((p) => p.text).join("") : parts,
  };
  if (calls.length > 0) m.tool_calls = calls;
  if (reasoning !== "") m.reasoning_content = reasoning;
  out.push(m);
  return out;
}

function chatToolChoice(choice: unknown): unknown {
  if (!isRecord(choice)) return undefined;
  if (choice.type === "any") return "required";
  if (choice.type === "tool") return { type: "function", function: { name: choice.name } };
  if (choice.type === "none") return "none";
  return "auto";
}

/**
 * A Messages request as the Chat Completions request that asks the same
 * (without `stream`: the caller decides).
 * @throws {ProxyError} 400 for what Chat Completions cannot say (server tools, document blocks)
 */
export function messagesToChat(body: Record<string, unknown>): Record<string, unknown> {
  const messages: Record<string, unknown>[] = [];
  const system = blockText(body.system);
  if (system !== "") messages.push({ role: "system", content: system });
  for (const m of Array.isArray(body.messages) ? body.messages.filter(isRecord) : []) {
    messages.push(...chatMessages(m));
  }
  const out: Record<string, unknown> = { model: body.model, messages };
  if (Array.isArray(body.tools) && body.tools.length > 0) {
    out.tools = body.tools.filter(isRecord).map((t) => {
      if (t.type !== undefined && t.type !== "custom") throw refuse(`the server tool "${t.type}"`);
      return {
        type: "function",
        function: { name: t.name, description: t.description, parameters: t.input_schema },
      };
    });
    const choice = chatToolChoice(body.tool_choice);
    if (choice !== undefined) out.tool_choice = choice;
    if (isRecord(body.tool_choice) && body.tool_choice.disable_parallel_tool_use === true) {
      out.parallel_tool_calls = false;
    }
  }
  if (body.max_tokens !== undefined) out.max_tokens = body.max_tokens;
  for (const k of ["temperature", "top_p", "top_k"]) if (body[k] !== undefined) out[k] = body[k];
  if (Array.isArray(body.stop_sequences)) out.stop = body.stop_sequences;
  return out;
}

const STOP_REASONS: Record<string, string> = {
  stop: "end_turn",
  length: "max_tokens",
  tool_calls: "tool_use",
  function_call: "tool_use",
};

/** A Chat Completions reply as the Messages reply that says the same, naming `model`. */
export function chatToMessage(
  json: Record<string, unknown>,
  model: unknown,
): Record<string, unknown> {
  const choice = Array.isArray(json.choices) && isRecord(json.choices[0]) ? json.choices[0] : {};
  const m = isRecord(choice.message) ? choice.message : {};
  const content: Record<string, unknown>[] = [];
  const reasoning = m.reasoning_content ?? m.reasoning;
  if (typeof reasoning === "string" && reasoning !== "") {
    content.push({ type: "thinking", thinking: reasoning, signature: "" });
  }
  if (typeof m.content === "string" && m.content !== "") {
    content.push({ type: "text", text: m.content });
  }
  for (const c of Array.isArray(m.tool_calls) ? m.tool_calls.filter(isRecord) : []) {
    const fn = isRecord(c.function) ? c.function : {};
    let input: unknown = {};
    try {
      input = JSON.parse(String(fn.arguments ?? "{}"));
    } catch {
      // Arguments that are not JSON (cut short at max_tokens): no input.
    }
    content.push({
      type: "tool_use",
      id: String(c.id ?? `toolu_${content.length}`),
      name: String(fn.name ?? ""),
      input: isRecord(input) ? input : {},
    });
  }
  const finish = String(choice.finish_reason ?? "stop");
  const hasCalls = content.some((b) => b.type === "tool_use");
  const usage = isRecord(json.usage) ? json.usage : {};
  const details = isRecord(usage.prompt_tokens_details) ? usage.prompt_tokens_details : {};
  const cached = Number(details.cached_tokens ?? 0);
  return {
    id: `msg_${String(json.id ?? crypto.randomUUID()).replace(/^chatcmpl-/, "")}`,
    type: "message",
    role: "assistant",
    model,
    content,
    stop_reason: hasCalls && finish === "stop" ? "tool_use" : STOP_REASONS[finish] ?? "end_turn",
    stop_sequence: null,
    usage: {
      input_tokens: Number(usage.prompt_tokens ?? 0) - cached,
      output_tokens: Number(usage.completion_tokens ?? 0),
      ...(cached > 0 ? { cache_read_input_tokens: cached } : {}),
    },
  };
}

/** The events of a stream that says what the whole message `message` says. */
export function messageAsStream(message: Record<string, unknown>): Uint8Array[] {
  const event = (data: Record<string, unknown>) => sseEvent(data, String(data.type));
  const blocks = Array.isArray(message.content) ? message.content.filter(isRecord) : [];
  const usage = isRecord(message.usage) ? message.usage : {};
  const events = [event({
    type: "message_start",
    message: {
      ...message,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { ...usage, output_tokens: 0 },
    },
  })];
  blocks.forEach((b, index) => {
    let start: Record<string, unknown> = b;
    const deltas: Record<string, unknown>[] = [];
    if (b.type === "text") {
      start = { type: "text", text: "" };
      deltas.push({ type: "text_delta", text: b.text ?? "" });
    } else if (b.type === "tool_use") {
      start = { ...b, input: {} };
      deltas.push({ type: "input_json_delta", partial_json: JSON.stringify(b.input ?? {}) });
    } else if (b.type === "thinking") {
      start = { type: "thinking", thinking: "" };
      deltas.push({ type: "thinking_delta", thinking: b.thinking ?? "" });
      deltas.push({ type: "signature_delta", signature: b.signature ?? "" });
    }
    events.push(event({ type: "content_block_start", index, content_block: start }));
    for (const delta of deltas) events.push(event({ type: "content_block_delta", index, delta }));
    events.push(event({ type: "content_block_stop", index }));
  });
  events.push(event({
    type: "message_delta",
    delta: {
      stop_reason: message.stop_reason ?? null,
      stop_sequence: message.stop_sequence ?? null,
    },
    usage: { output_tokens: usage.output_tokens ?? 0 },
  }));
  events.push(event({ type: "message_stop" }));
  return events;
}
