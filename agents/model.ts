/**
 * The model side of a chat agent: the messages a loop keeps, the
 * {@linkcode ModelBackend} interface every API format implements, and the
 * errors and retry rule they share.
 *
 * @module
 */

import type { JsonSchema } from "../schema.ts";
import type { TurnTokens } from "../eval/tokens.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { BodyTooLargeError, cappedBody, headText, readCapped } from "../_internal/body.ts";

/** A tool call the model asked for. */
export interface ToolCall {
  /** The call's id, echoed back with its result. */
  id: string;
  /** The tool's name. */
  name: string;
  /** The arguments as JSON text, exactly as the model wrote them. */
  arguments: string;
}

/** An image in a message: a screenshot a tool returned. */
export interface ChatImage {
  /** Its media type, such as `image/png`. */
  mediaType: string;
  /** Its bytes, base64. */
  data: string;
}

/** One message of a conversation, in a format-neutral shape. */
export type ChatMessage =
  | { role: "system"; content: string }
  | { role: "user"; content: string }
  | { role: "assistant"; content: string; toolCalls?: ToolCall[] }
  | {
    role: "tool";
    toolCallId: string;
    name: string;
    content: string;
    isError?: boolean;
    /** Pictures the tool returned (the computer tool's screenshots). */
    images?: ChatImage[];
  };

/**
 * A tool that Anthropic's API defines itself (such as `computer_20250124`):
 * sent as `definition` instead of a JSON-Schema tool, with `beta` in the
 * `anthropic-beta` header.
 */
export interface AnthropicToolDefinition {
  /** The tool as the Messages API takes it (`type`, `name` and its own fields). */
  definition: Record<string, unknown>;
  /** The beta the tool needs, if any. */
  beta?: string;
}

/** A tool as the model sees it. */
export interface ToolSpec {
  /** The tool's name: letters, digits, `_` and `-`. */
  name: string;
  /** What it does, for the model. */
  description: string;
  /** JSON Schema of its arguments object. */
  parameters: JsonSchema;
  /** Its Anthropic-defined form, which the Anthropic format sends instead. */
  anthropic?: AnthropicToolDefinition;
}

/** Sampling options, passed through to the API as given. */
export interface SamplingOptions {
  /** Sampling temperature. */
  temperature?: number;
  /** Nucleus sampling. */
  topP?: number;
  /** The most tokens one reply may have. */
  maxTokens?: number;
  /** Stop sequences. */
  stop?: string[];
  /** Seed, for backends that honour it. */
  seed?: number;
  /** Extra body fields, merged into every request as is (`top_k`, `min_p`...). */
  extra?: Record<string, unknown>;
}

/** Which tools the model may or must call. */
export type ToolChoice = "auto" | "required" | "none" | { name: string };

/** One request to a model. */
export interface ModelRequest {
  /** The conversation so far. */
  messages: ChatMessage[];
  /** The tools on offer. */
  tools: ToolSpec[];
  /**
   * Which tools the model may or must call.
   * @default "auto"
   */
  toolChoice?: ToolChoice;
  /** Whether the model may call several tools at once. @default true */
  parallelToolCalls?: boolean;
  /** Sampling options. */
  sampling?: SamplingOptions;
  /**
   * Ask for the sampled tokens: the completion's token ids and
   * log-probabilities, and the prompt's token ids, where the server gives them.
   * @default false
   */
  tokens?: boolean;
}

/** Token counts of one model call, as the server reported them. */
export interface TokenUsage {
  /** Prompt tokens. */
  inputTokens: number;
  /** Completion tokens. */
  outputTokens: number;
  /** Prompt tokens served from the server's cache (a part of `inputTokens`), when it said. */
  cachedTokens?: number;
  /** What the server said the call cost, in USD (OpenRouter's `usage.cost`), when it did. */
  costUsd?: number;
}

/** What a model answered. */
export interface ModelReply {
  /** The text of the reply (may be empty when it only calls tools). */
  content: string;
  /** The tools it called, in order. */
  toolCalls: ToolCall[];
  /** Why it stopped, as the API said (`stop`, `tool_calls`, `end_turn`, `length`...). */
  finishReason: string;
  /** Token counts, when the server reported them. */
  usage: TokenUsage | null;
  /** The model's refusal text, when it refused. */
  refusal?: string;
  /** The sampled tokens, when the request asked for them and the server gave any. */
  tokens?: TurnTokens;
}

/** An API format: turns a {@linkcode ModelRequest} into one HTTP exchange. */
export interface ModelBackend {
  /** `openai` or `anthropic`. */
  readonly format: string;
  /** The model's name. */
  readonly model: string;
  /**
   * The endpoint's url, which a failed call names (without credentials or
   * query, see {@linkcode publicUrl}).
   * @default unknown: failures name no url
   */
  readonly url?: string;
  /**
   * Sends one request.
   * @throws {ModelHttpError} for an HTTP error status
   * @throws {ModelStreamError} for a reply cut short
   * @throws {ModelReplyError} for a reply that is not what the API sends
   */
  complete(request: ModelRequest, signal: AbortSignal): Promise<ModelReply>;
}

/** `url` without user, password, query or fragment: safe to record and print. */
export function publicUrl(url: string): string {
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

/** An HTTP error status from a model API. */
export class ModelHttpError extends Error {
  /**
   * How a rollout that failed with it is classed: `context_overflow` for a
   * prompt over the window, `model_unavailable` for 408, 429 and 5xx (a
   * server that may answer later), `model_error` for other statuses (a bad
   * key, an unknown model, a request it refuses: it will say the same again).
   */
  get errorClass(): string {
    if (this.contextOverflow) return "context_overflow";
    return isRetryable(this) ? "model_unavailable" : "model_error";
  }

  /** The HTTP status. */
  readonly status: number;
  /** Seconds the server asked to wait (`Retry-After`), if it did. */
  readonly retryAfter: number | null;
  /** Whether the server said the request is over the context window. */
  readonly contextOverflow: boolean;

  /** Makes an error for `status` with the server's message. */
  constructor(
    message: string,
    status: number,
    options: { retryAfter?: number | null; contextOverflow?: boolean } = {},
  ) {
    super(message);
    this.name = "ModelHttpError";
    this.status = status;
    this.retryAfter = options.retryAfter ?? null;
    this.contextOverflow = options.contextOverflow ?? false;
  }
}

/**
 * A reply that is not what the API sends (not JSON, no choices, no
 * content): the server answered, so trying again would get the same. A
 * rollout that fails with it is classed `model_error`.
 */
export class ModelReplyError extends Error {
  /** How a rollout that failed with it is classed. */
  readonly errorClass: string = "model_error";
  /** Makes the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ModelReplyError";
  }
}

/** A reply that was cut short (a stream that broke or ended early, a body over its ceiling). */
export class ModelStreamError extends Error {
  /** How a rollout that failed with it is classed. */
  readonly errorClass: string = "model_unavailable";
  /** Makes the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ModelStreamError";
  }
}

/**
 * The model server could not be reached, did not answer in time, or kept
 * failing after the call's own retries; the message names its url and the
 * last cause (`cause` is the last error). A rollout that fails with it is
 * classed `model_unavailable`, which {@linkcode Taskset.run} retries.
 */
export class ModelUnavailableError extends Error {
  /** How a rollout that failed with it is classed. */
  readonly errorClass: string = "model_unavailable";
  /** Makes the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ModelUnavailableError";
  }
}

/** Default of the backends' `maxResponseBytes`: past any model's longest reply, streamed or not. */
export const MAX_RESPONSE_BYTES = 64 << 20;
/** How much of an error reply is read for its message. */
const MAX_ERROR_BYTES = 64 << 10;

/** The error for a reply past its ceiling, naming the option that sets it. */
function tooLarge(what: string, err: BodyTooLargeError): ModelStreamError {
  return new ModelStreamError(`Cannot read ${what}: ${err.message} (maxResponseBytes)`, {
    cause: err,
  });
}

/**
 * A reply's body, cut off with a {@linkcode ModelStreamError} past `limit`
 * bytes (the rest is never read), so that a server that sends without end
 * does not grow the agent without end.
 */
export function cappedReply(
  response: Response,
  limit: number,
  what: string,
): ReadableStream<Uint8Array> {
  const body = response.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
  return cappedBody(body, limit, `the ${what}`, (err) => tooLarge(what, err));
}

/**
 * A reply's JSON body, read with {@linkcode cappedReply}'s ceiling.
 * @throws {ModelStreamError} for a body over `limit` bytes
 * @throws {ModelReplyError} for a body that is not JSON
 */
export async function replyJson(response: Response, limit: number, what: string): Promise<unknown> {
  let bytes: Uint8Array;
  try {
    bytes = await readCapped(response.body, limit, `the ${what}`);
  } catch (err) {
    throw err instanceof BodyTooLargeError ? tooLarge(what, err) : err;
  }
  try {
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch (err) {
    throw new ModelReplyError(`Cannot read ${what}: the body is not JSON`, { cause: err });
  }
}

/**
 * A backend's `maxResponseBytes` option, checked.
 * @throws {RangeError} for anything but a positive integer
 */
export function maxResponseBytes(value: number | undefined, backend: string): number {
  if (value === undefined) return MAX_RESPONSE_BYTES;
  if (!Number.isSafeInteger(value) || value <= 0) {
    throw new RangeError(
      `Cannot make ${backend} backend: maxResponseBytes must be a positive integer, got "${value}"`,
    );
  }
  return value;
}

const OVERFLOW =
  /context[_ ]length|context window|maximum context|too many tokens|prompt is too long|exceeds the context/i;

/**
 * Reads an HTTP error reply into a {@linkcode ModelHttpError}, whose
 * message names the endpoint (without credentials) and what it said.
 */
export async function httpError(response: Response, what: string): Promise<ModelHttpError> {
  // Only the head: an error body is a message, however much the server sends.
  const text = await headText(response.body, MAX_ERROR_BYTES);
  let message = text.trim().slice(0, 500);
  let code = "";
  try {
    const body = JSON.parse(text);
    const err = body?.error;
    if (typeof err?.message === "string") message = err.message;
    else if (typeof err === "string") message = err;
    if (typeof err?.code === "string") code = err.code;
    if (typeof err?.type === "string" && code === "") code = err.type;
  } catch {
    // Not JSON: keep the text.
  }
  const url = publicUrl(response.url);
  return new ModelHttpError(
    `${what}${url ? ` at ${url}` : ""} failed: HTTP ${response.status}${
      message ? `: ${message}` : ""
    }`,
    response.status,
    {
      retryAfter: parseRetryAfter(response.headers.get("retry-after")),
      contextOverflow: response.status === 400 || response.status === 413
        ? code === "context_length_exceeded" || OVERFLOW.test(message)
        : false,
    },
  );
}

/** `Retry-After` as seconds (delta or HTTP date), or `null`. */
export function parseRetryAfter(value: string | null): number | null {
  if (value === null || value.trim() === "") return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : Math.max(0, (date - Date.now()) / 1000);
}

/**
 * Whether an error is worth another try: 408, 429, 5xx, a refused or
 * broken connection, a stream cut short, a try past its `attemptTimeout`.
 */
export function isRetryable(err: unknown): boolean {
  if (err instanceof ModelHttpError) {
    return err.status === 408 || err.status === 429 || err.status >= 500;
  }
  if (err instanceof ModelStreamError) return true;
  if (err instanceof DOMException && err.name === "TimeoutError") return true;
  // fetch() rejects with a TypeError when the connection fails.
  return err instanceof TypeError || err instanceof Deno.errors.ConnectionRefused ||
    err instanceof Deno.errors.ConnectionReset;
}

/**
 * What went wrong with a model call, in a few words: an HTTP status and
 * the server's message, a connection error as the operating system said it
 * (`Connection refused (os error 111)`, `connection closed before message
 * completed`), a timeout, or the error's message.
 */
export function modelCause(err: unknown): string {
  if (err instanceof ModelHttpError) return err.message.replace(/^.*? failed: /, "");
  let deepest: unknown = err;
  for (
    let depth = 0;
    deepest instanceof Error && deepest.cause !== undefined && depth < 8;
    depth++
  ) {
    deepest = deepest.cause;
  }
  const text = deepest instanceof Error ? deepest.message : String(deepest);
  // fetch's causes: "error sending request for url (URL): client error (Connect): tcp connect error: ..."
  const client = /client error \([^)]*\): (.*)$/s.exec(text);
  const cause = client ? client[1] : text;
  // Never a url: it may carry credentials; the caller names the endpoint itself.
  return cause.replace(/\b[a-z][a-z0-9+.-]*:\/\/\S+/gi, "<url>").split("\n")[0];
}

/** Options for {@linkcode withRetries}. */
export interface RetryOptions {
  /** Tries after the first. @default 4 */
  maxRetries?: number;
  /**
   * The longest one try may take, in ms: a server that hangs is given up
   * on and tried again (within the call's own timeout).
   * @default no limit beyond the call's
   */
  attemptTimeout?: number;
  /** The first backoff, in ms; it doubles each try. @default 500 */
  baseDelay?: number;
  /** The longest wait, in ms, including `Retry-After`. @default 30_000 */
  maxDelay?: number;
  /** Called before each wait. */
  onRetry?: (err: unknown, attempt: number, waitMs: number) => void;
  /** How to wait. @default a timer */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
}

/**
 * Runs `fn` until it succeeds, retrying what {@linkcode isRetryable} allows
 * with exponential backoff (and `Retry-After` when the server sends one).
 * Each try gets a signal that also aborts at `attemptTimeout`.
 * @throws the last error, or the abort reason
 */
export async function withRetries<T>(
  fn: (attempt: number, signal: AbortSignal) => Promise<T>,
  signal: AbortSignal,
  options: RetryOptions = {},
): Promise<T> {
  const maxRetries = options.maxRetries ?? 4;
  const base = options.baseDelay ?? 500;
  const max = options.maxDelay ?? 30_000;
  for (let attempt = 0;; attempt++) {
    signal.throwIfAborted();
    try {
      using tryDeadline = new Deadline(options.attemptTimeout, signal, "model call attempt");
      return await fn(attempt, tryDeadline.signal);
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      if (attempt >= maxRetries || !isRetryable(err)) throw err;
      const hinted = err instanceof ModelHttpError && err.retryAfter !== null
        ? err.retryAfter * 1000
        : null;
      const wait = Math.min(max, hinted ?? base * 2 ** attempt * (0.75 + Math.random() * 0.5));
      options.onRetry?.(err, attempt + 1, wait);
      await (options.sleep ?? delay)(wait, signal);
    }
  }
}
