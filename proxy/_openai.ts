// The OpenAI Chat Completions and Completions APIs as the proxy speaks
// them: what a request may not carry, what is added to it for the server to
// give token ids, how a reply (JSON or a stream's chunks) is read for the
// record, what of it the agent gets back (only what it asked for), and a
// stream made of a whole reply for a call that the server could not stream
// with token ids.

import {
  type ModelServer,
  type OpenAiApi,
  openAiUsage,
  type StreamAssembler,
  tokenFields,
  TokenReader,
} from "../agents/_dialect.ts";
import type { TokenUsage } from "../agents/model.ts";
import type { TurnTokens } from "../eval/tokens.ts";
import { isRecord } from "../_internal/util.ts";
import { ProxyError, sseEvent } from "./_wire.ts";

/** What the agent asked for, which the reply it gets keeps to. */
export interface AgentAsked {
  /** A stream of events. */
  stream: boolean;
  /** With a stream: the usage chunk at its end. */
  usage: boolean;
  /** Log-probabilities. */
  logprobs: boolean;
  /** Token ids (vLLM's `return_token_ids`, sglang's `return_prompt_token_ids`). */
  tokenIds: boolean;
}

/** What `body` asks for (see {@linkcode AgentAsked}). */
export function agentAsked(api: OpenAiApi, body: Record<string, unknown>): AgentAsked {
  const options = isRecord(body.stream_options) ? body.stream_options : {};
  return {
    stream: body.stream === true,
    usage: options.include_usage === true,
    logprobs: api === "chat"
      ? body.logprobs === true
      : typeof body.logprobs === "number" && body.logprobs >= 0,
    tokenIds: body.return_token_ids === true || body.return_prompt_token_ids === true,
  };
}

/**
 * Fields by which a request would have the model see or sample something
 * other than what the proxy records: token ids or embeddings in place of
 * the messages (sglang's `input_ids`...), several samples, beam search, or
 * the prompt echoed into the completion and its log-probabilities.
 */
const FORGING_FIELDS = ["input_ids", "prompt_token_ids", "prompt_embeds", "input_embeds"];

/**
 * Refuses a request that the proxy cannot record faithfully.
 * @throws {ProxyError} 400, naming the field and the way out
 */
export function checkOpenAiRequest(api: OpenAiApi, body: Record<string, unknown>): void {
  const refuse = (why: string) => new ProxyError(400, `Model proxy refused the request: ${why}`);
  if (api === "chat") {
    if (!Array.isArray(body.messages) || body.messages.length === 0) {
      throw refuse('"messages" must be a non-empty array');
    }
  } else {
    const p = body.prompt;
    if (!(typeof p === "string" || (Array.isArray(p) && p.every((x) => Number.isInteger(x))))) {
      throw refuse('"prompt" must be one string or one array of token ids');
    }
  }
  for (const field of FORGING_FIELDS) {
    if (body[field] !== undefined) {
      throw refuse(`"${field}" would make the model see other tokens than the ones recorded`);
    }
  }
  for (const field of ["n", "best_of"]) {
    if (body[field] !== undefined && body[field] !== null && body[field] !== 1) {
      throw refuse(`"${field}" must be 1: the proxy records one sample per call`);
    }
  }
  if (body.use_beam_search === true) {
    throw refuse('"use_beam_search": beam search does not sample from the policy');
  }
  if (body.echo === true) {
    throw refuse('"echo" would put the prompt among the sampled tokens');
  }
}

/** The request body sent to `server`: the agent's, with the token fields, streamed or not. */
export function upstreamOpenAiBody(
  api: OpenAiApi,
  body: Record<string, unknown>,
  server: ModelServer,
  stream: boolean,
  model: string | null,
): Record<string, unknown> {
  const asked = agentAsked(api, body);
  const out: Record<string, unknown> = { ...body };
  if (model !== null) out.model = model;
  for (const [k, v] of Object.entries(tokenFields(server, api))) {
    // What the agent asked for itself stays as it asked: its logprobs' tokens
    // as text, its number of alternatives.
    if (k === "return_tokens_as_token_ids" && asked.logprobs) continue;
    if (k === "top_logprobs" && typeof body.top_logprobs === "number" && body.top_logprobs > 0) {
      continue;
    }
    if (k === "logprobs" && api === "completions" && asked.logprobs) continue;
    out[k] = v;
  }
  if (stream) {
    out.stream = true;
    out.stream_options = {
      ...(isRecord(body.stream_options) ? body.stream_options : {}),
      include_usage: true,
    };
  } else {
    delete out.stream;
    delete out.stream_options;
  }
  return out;
}

const ID_FIELDS = ["prompt_token_ids", "token_ids", "output_token_ids"];

/**
 * A reply (or one chunk of a stream) as the agent gets it: without what it
 * did not ask for. `null` for a chunk it would not have had at all (the
 * usage chunk of a stream that did not ask for usage).
 */
export function forAgent(
  json: Record<string, unknown>,
  asked: AgentAsked,
  chunk: boolean,
): Record<string, unknown> | null {
  const choices = Array.isArray(json.choices) ? json.choices : [];
  const strips = (c: unknown) =>
    isRecord(c) &&
    ((!asked.logprobs && c.logprobs !== undefined) ||
      (!asked.tokenIds && ID_FIELDS.some((f) => c[f] !== undefined)));
  if (
    !(chunk && !asked.usage && json.usage !== undefined) &&
    !(!asked.tokenIds && json.prompt_token_ids !== undefined) && !choices.some(strips)
  ) return json; // nothing to take out: the caller may pass the bytes on as they came
  const out = { ...json };
  if (chunk && !asked.usage && out.usage !== undefined) {
    if (choices.length === 0) return null;
    delete out.usage;
  }
  if (!asked.tokenIds) delete out.prompt_token_ids;
  if (!asked.logprobs || !asked.tokenIds) {
    out.choices = choices.map((c) => {
      if (!isRecord(c)) return c;
      const choice = { ...c };
      if (!asked.logprobs) delete choice.logprobs;
      if (!asked.tokenIds) { for (const f of ID_FIELDS) delete choice[f]; }
      return choice;
    });
  }
  return out;
}

/** What a reply says, read for the record. */
export interface OpenAiReply {
  /** The answer: the assistant message (chat), or `{ text }` (completions). */
  reply: Record<string, unknown>;
  /** Why the model stopped. */
  finishReason: string | null;
  /** Token counts. */
  usage: TokenUsage | null;
  /** The model, as the reply names it. */
  model: string | null;
  /** The sampled tokens, when given. */
  tokens: TurnTokens | undefined;
}

function firstChoice(json: Record<string, unknown>): Record<string, unknown> | null {
  const choice = Array.isArray(json.choices) ? json.choices[0] : undefined;
  return isRecord(choice) ? choice : null;
}

/** A whole (not streamed) reply, read. */
export function readOpenAiReply(api: OpenAiApi, json: Record<string, unknown>): OpenAiReply {
  const choice = firstChoice(json);
  if (choice === null) {
    throw new ProxyError(502, "Model proxy: the server's reply has no choices[0]");
  }
  const tokens = new TokenReader();
  tokens.read(json, choice);
  let reply: Record<string, unknown>;
  if (api === "chat") {
    reply = isRecord(choice.message) ? { ...choice.message } : { role: "assistant", content: "" };
  } else reply = { text: typeof choice.text === "string" ? choice.text : "" };
  return {
    reply,
    finishReason: typeof choice.finish_reason === "string" ? choice.finish_reason : null,
    usage: openAiUsage(json.usage),
    model: typeof json.model === "string" ? json.model : null,
    tokens: tokens.result(),
  };
}

/** What the chunks `assembled` said, as {@linkcode readOpenAiReply} reads a whole reply. */
export function assembledReply(api: OpenAiApi, assembled: StreamAssembler): OpenAiReply {
  let reply: Record<string, unknown>;
  if (api === "chat") {
    const text = assembled.text;
    reply = { role: "assistant", content: text === "" ? null : text };
    if (assembled.reasoning !== "") reply.reasoning_content = assembled.reasoning;
    if (assembled.refusal !== "") reply.refusal = assembled.refusal;
    const calls = assembled.toolCalls();
    if (calls.length > 0) {
      reply.tool_calls = calls.map((c) => ({
        id: c.id,
        type: "function",
        function: { name: c.name, arguments: c.arguments },
      }));
    }
  } else reply = { text: assembled.text };
  return {
    reply,
    finishReason: assembled.finishReason,
    usage: assembled.usage,
    model: assembled.model,
    tokens: assembled.tokens(),
  };
}

/**
 * The events of a stream that says what the whole reply `json` says (as
 * the agent gets it: `json` already passed through {@linkcode forAgent}),
 * for an agent that asked for a stream of a call made without one.
 */
export function replyAsStream(
  api: OpenAiApi,
  json: Record<string, unknown>,
  asked: AgentAsked,
): Uint8Array[] {
  const head = {
    id: json.id ?? "proxy",
    object: api === "chat" ? "chat.completion.chunk" : "text_completion",
    created: json.created ?? Math.floor(Date.now() / 1000),
    model: json.model ?? "",
  };
  const events: Uint8Array[] = [];
  const choices = Array.isArray(json.choices) ? json.choices.filter(isRecord) : [];
  for (const c of choices) {
    const { message, finish_reason: finish, ...rest } = c;
    const body: Record<string, unknown> = { ...rest, finish_reason: null };
    if (api === "chat") {
      const m = isRecord(message) ? message : {};
      const delta: Record<string, unknown> = { ...m, role: "assistant" };
      if (Array.isArray(m.tool_calls)) {
        delta.tool_calls = m.tool_calls.map((t, index) => isRecord(t) ? { index, ...t } : t);
      }
      body.delta = delta;
    }
    events.push(sseEvent({ ...head, choices: [body] }));
    const end = api === "chat"
      ? { index: c.index ?? 0, delta: {} }
      : { index: c.index ?? 0, text: "" };
    events.push(sseEvent({ ...head, choices: [{ ...end, finish_reason: finish ?? "stop" }] }));
  }
  if (asked.usage && json.usage !== undefined) {
    events.push(sseEvent({ ...head, choices: [], usage: json.usage }));
  }
  events.push(sseEvent("[DONE]"));
  return events;
}
