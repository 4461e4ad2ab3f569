// What each OpenAI-compatible model server needs to be asked, and gives
// back, for token ids and log-probabilities: llama.cpp's llama-server, vLLM
// and sglang each have their own fields (read from their documentation and
// protocol definitions). OpenAiBackend and the recording model proxy
// (proxy/) both read replies through here, so the knowledge is in one place.
//
// - llama-server: `logprobs` (chat; `top_logprobs` sets how many
//   alternatives, and 0 turns them off altogether) or `logprobs: N`
//   (completions, its `n_probs`); each entry of `logprobs.content` carries
//   the token's `id`. Prompt ids are not in the reply: /apply-template
//   renders the chat request and /tokenize counts it. A chat stream with
//   tools refuses logprobs.
// - vLLM: `return_token_ids` puts `prompt_token_ids` (top level in chat, on
//   the choice in completions; in a stream, the first chunk) and the choice's
//   `token_ids` (deltas in a stream) in the reply; `return_tokens_as_token_ids`
//   spells logprob tokens `token_id:N`.
// - sglang: chat takes `return_token_ids` and `return_prompt_token_ids`
//   (both on the choice) but refuses them in a stream; completions take
//   `return_token_ids` (with `prompt_token_ids` on the first chunk's choice).

import type { TurnTokens } from "../eval/tokens.ts";
import type { TokenUsage, ToolCall } from "./model.ts";
import { isRecord } from "../_internal/util.ts";
import { readCapped } from "../_internal/body.ts";

/** A model server whose token fields are known; `openai` asks for nothing (api.openai.com refuses unknown fields). */
export type ModelServer = "llama-server" | "vllm" | "sglang" | "openai";

/** The model servers, for checking a name. */
export const MODEL_SERVERS: readonly ModelServer[] = ["llama-server", "vllm", "sglang", "openai"];

/** Which OpenAI API a request is for. */
export type OpenAiApi = "chat" | "completions";

/** Body fields that ask `server` for the sampled tokens of a call to `api`. */
export function tokenFields(server: ModelServer, api: OpenAiApi): Record<string, unknown> {
  switch (server) {
    case "llama-server":
      return api === "chat" ? { logprobs: true, top_logprobs: 1 } : { logprobs: 1 };
    case "vllm":
      return {
        logprobs: api === "chat" ? true : 0,
        return_token_ids: true,
        return_tokens_as_token_ids: true,
      };
    case "sglang":
      return api === "chat"
        ? { logprobs: true, return_token_ids: true, return_prompt_token_ids: true }
        : { logprobs: 0, return_token_ids: true };
    case "openai":
      return {};
  }
}

/** Whether `server` gives token ids in a stream for `body` (else the call is made without streaming). */
export function streamsTokens(
  server: ModelServer,
  api: OpenAiApi,
  body: Record<string, unknown>,
): boolean {
  if (api === "completions") return true;
  if (server === "sglang") return false;
  if (server === "llama-server") return !(Array.isArray(body.tools) && body.tools.length > 0);
  return true;
}

/** An OpenAI-compatible reply's `usage`, or `null` when it has none. */
export function openAiUsage(value: unknown): TokenUsage | null {
  if (!isRecord(value)) return null;
  const usage: TokenUsage = {
    inputTokens: Number(value.prompt_tokens ?? 0),
    outputTokens: Number(value.completion_tokens ?? 0),
  };
  const details = isRecord(value.prompt_tokens_details) ? value.prompt_tokens_details : {};
  const cached = Number(details.cached_tokens ?? 0);
  if (cached > 0) usage.cachedTokens = cached;
  if (typeof value.cost === "number" && Number.isFinite(value.cost)) usage.costUsd = value.cost;
  return usage;
}

/**
 * An Anthropic reply's `usage`, or `null` when it has none. Anthropic counts
 * cache reads and writes apart from `input_tokens`; the prompt's size is
 * their sum (as ATIF's `prompt_tokens` counts it).
 */
export function anthropicUsage(value: unknown): TokenUsage | null {
  if (!isRecord(value)) return null;
  const cached = Number(value.cache_read_input_tokens ?? 0);
  const usage: TokenUsage = {
    inputTokens: Number(value.input_tokens ?? 0) + cached +
      Number(value.cache_creation_input_tokens ?? 0),
    outputTokens: Number(value.output_tokens ?? 0),
  };
  if (cached > 0) usage.cachedTokens = cached;
  return usage;
}

/** Whether `value` is a non-empty array of integers (token ids). */
export function tokenIds(value: unknown): number[] | null {
  return Array.isArray(value) && value.length > 0 && value.every((x) => Number.isInteger(x))
    ? value
    : null;
}

function entryId(entry: Record<string, unknown>): number | null {
  if (Number.isInteger(entry.id)) return entry.id as number;
  if (Number.isInteger(entry.token_id)) return entry.token_id as number;
  return tokenIdText(entry.token);
}

/** `token_id:N` (vLLM's `return_tokens_as_token_ids` spelling) as N. */
function tokenIdText(token: unknown): number | null {
  const m = typeof token === "string" ? /^token_id:(\d+)$/.exec(token) : null;
  return m ? Number(m[1]) : null;
}

/**
 * Token ids and log-probabilities as a reply, or the chunks of a stream,
 * carry them, for Chat Completions and Completions alike.
 */
export class TokenReader {
  #promptIds: number[] | null = null;
  readonly #completionIds: number[] = [];
  #idsGiven = false;
  readonly #logprobIds: (number | null)[] = [];
  readonly #logprobs: number[] = [];

  /** Reads a body (or a chunk) and its first choice (`{}` when it has none). */
  read(body: Record<string, unknown>, choice: Record<string, unknown>): void {
    this.#promptIds ??= tokenIds(body.prompt_token_ids) ?? tokenIds(choice.prompt_token_ids);
    const ids = tokenIds(choice.token_ids) ?? tokenIds(choice.output_token_ids);
    if (ids !== null) {
      this.#completionIds.push(...ids);
      this.#idsGiven = true;
    }
    const lp = isRecord(choice.logprobs) ? choice.logprobs : null;
    if (lp === null) return;
    // Chat Completions (and llama-server's completions): one entry per token.
    for (const entry of Array.isArray(lp.content) ? lp.content : []) {
      if (!isRecord(entry) || typeof entry.logprob !== "number") continue;
      this.#logprobs.push(entry.logprob);
      this.#logprobIds.push(entryId(entry));
    }
    // Completions: parallel arrays.
    if (Array.isArray(lp.token_logprobs)) {
      const tokens = Array.isArray(lp.tokens) ? lp.tokens : [];
      lp.token_logprobs.forEach((value, i) => {
        if (typeof value !== "number") return;
        this.#logprobs.push(value);
        this.#logprobIds.push(tokenIdText(tokens[i]));
      });
    }
  }

  /** What was read, or `undefined` when nothing was. */
  result(): TurnTokens | undefined {
    let completionIds: number[] | null = this.#idsGiven ? this.#completionIds : null;
    if (
      completionIds === null && this.#logprobIds.length > 0 && !this.#logprobIds.includes(null)
    ) {
      completionIds = this.#logprobIds as number[];
    }
    let logprobs: number[] | null = this.#logprobs.length > 0 ? this.#logprobs : null;
    // Log-probabilities that do not line up with the ids are of no use for training.
    if (completionIds !== null && logprobs !== null && logprobs.length !== completionIds.length) {
      logprobs = null;
    }
    if (completionIds === null && logprobs === null && this.#promptIds === null) return undefined;
    return { promptIds: this.#promptIds, completionIds, logprobs };
  }
}

/**
 * The chunks of a streamed Chat Completions or Completions reply, put
 * together: the text (a chat delta's `content`, or a completion's `text`),
 * reasoning, refusal, tool calls (whose names and arguments come in pieces,
 * by index), finish reason, usage, model, and token ids. OpenAiBackend and
 * the recording proxy both assemble their streams with it.
 */
export class StreamAssembler {
  readonly #api: OpenAiApi;
  readonly #tokens = new TokenReader();
  readonly #calls = new Map<number, ToolCall>();
  #text = "";
  #reasoning = "";
  #refusal = "";
  #finishReason: string | null = null;
  #usage: TokenUsage | null = null;
  #model: string | null = null;

  /** An assembler of `api`'s chunks. */
  constructor(api: OpenAiApi) {
    this.#api = api;
  }

  /** The text so far. */
  get text(): string {
    return this.#text;
  }
  /** A chat delta's `reasoning_content` so far. */
  get reasoning(): string {
    return this.#reasoning;
  }
  /** A chat delta's `refusal` so far. */
  get refusal(): string {
    return this.#refusal;
  }
  /** Why the model stopped; `null` until a chunk says (a stream without one was cut short). */
  get finishReason(): string | null {
    return this.#finishReason;
  }
  /** The usage chunk's counts, once it came. */
  get usage(): TokenUsage | null {
    return this.#usage;
  }
  /** The model, as the first chunk that names one does. */
  get model(): string | null {
    return this.#model;
  }

  /** Adds one chunk. */
  add(chunk: Record<string, unknown>): void {
    if (typeof chunk.model === "string") this.#model ??= chunk.model;
    if (isRecord(chunk.usage)) this.#usage = openAiUsage(chunk.usage);
    const choice = Array.isArray(chunk.choices) && isRecord(chunk.choices[0])
      ? chunk.choices[0]
      : null;
    this.#tokens.read(chunk, choice ?? {});
    if (choice === null) return;
    if (typeof choice.finish_reason === "string") this.#finishReason = choice.finish_reason;
    if (this.#api === "completions") {
      if (typeof choice.text === "string") this.#text += choice.text;
      return;
    }
    const delta = isRecord(choice.delta) ? choice.delta : {};
    if (typeof delta.content === "string") this.#text += delta.content;
    if (typeof delta.reasoning_content === "string") this.#reasoning += delta.reasoning_content;
    if (typeof delta.refusal === "string") this.#refusal += delta.refusal;
    for (const d of Array.isArray(delta.tool_calls) ? delta.tool_calls : []) {
      if (isRecord(d)) this.#addToolCall(d);
    }
  }

  /** Adds a piece of a tool call to the call at its index. */
  #addToolCall(d: Record<string, unknown>): void {
    const index = typeof d.index === "number" ? d.index : this.#calls.size;
    const call = this.#calls.get(index) ?? { id: "", name: "", arguments: "" };
    this.#calls.set(index, call);
    if (typeof d.id === "string" && d.id !== "") call.id = d.id;
    const fn = isRecord(d.function) ? d.function : {};
    if (typeof fn.name === "string") call.name += fn.name;
    if (typeof fn.arguments === "string") call.arguments += fn.arguments;
  }

  /** The tool calls, in index order; one the stream gave no id is `call_<index>`. */
  toolCalls(): ToolCall[] {
    return [...this.#calls.entries()].sort((a, b) => a[0] - b[0]).map(([i, c]) => ({
      ...c,
      id: c.id || `call_${i}`,
    }));
  }

  /** The token ids and log-probabilities the chunks carried, or `undefined`. */
  tokens(): TurnTokens | undefined {
    return this.#tokens.result();
  }
}

/** What llama-server renders and tokenizes for {@linkcode llamaPromptIds}. */
export type LlamaPrompt =
  /** A Chat Completions request body, rendered by its chat template. */
  | { chat: Record<string, unknown> }
  /** A Completions prompt, tokenized as given. */
  | { text: string };

/**
 * The prompt's token ids as llama-server renders (`/apply-template`) and
 * tokenizes (`/tokenize`) it, or `null` when it cannot say or its count is
 * not `count` (the reply's `usage.prompt_tokens`): ids that disagree with
 * what the server counted are not the prompt it saw. `origin` is the
 * server's origin (its own endpoints sit beside `/v1`).
 * @throws the abort reason when `signal` aborts
 */
export async function llamaPromptIds(
  origin: string,
  headers: Record<string, string>,
  prompt: LlamaPrompt,
  count: number,
  signal: AbortSignal,
  maxBytes: number,
): Promise<number[] | null> {
  const post = async (path: string, body: unknown): Promise<unknown> => {
    const response = await fetch(`${origin}${path}`, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      signal,
    });
    if (!response.ok) {
      await response.body?.cancel();
      return null;
    }
    const bytes = await readCapped(response.body, maxBytes, `the reply of ${path}`);
    return JSON.parse(new TextDecoder().decode(bytes));
  };
  try {
    let text: string;
    if ("chat" in prompt) {
      const rendered = await post("/apply-template", prompt.chat);
      if (!isRecord(rendered) || typeof rendered.prompt !== "string") return null;
      text = rendered.prompt;
    } else text = prompt.text;
    const tokenized = await post("/tokenize", {
      content: text,
      add_special: true,
      parse_special: true,
    });
    const ids = isRecord(tokenized) ? tokenIds(tokenized.tokens) : null;
    return ids !== null && ids.length === count ? ids : null;
  } catch (err) {
    if (signal.aborted) throw err;
    return null; // Not llama-server, or it went away: no prompt ids, the reply stands.
  }
}
