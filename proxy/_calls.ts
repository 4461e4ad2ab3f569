// One call through the proxy, from the agent's request to the reply it
// gets: checked, sent to the model server with the token fields (holding a
// permit of the job's limit on model calls in flight), read for the record
// as it passes (a stream is relayed event by event), recorded into the
// rollout's trace, and answered with what the agent asked for.

import {
  llamaPromptIds,
  type ModelServer,
  type OpenAiApi,
  StreamAssembler,
  streamsTokens,
} from "../agents/_dialect.ts";
import { parseRetryAfter, type TokenUsage } from "../agents/model.ts";
import type { AdaptiveConcurrency } from "../eval/concurrency.ts";
import type { TurnTokens } from "../eval/tokens.ts";
import { BodyTooLargeError, headText, readCapped } from "../_internal/body.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import type { ProxyConfig } from "./_config.ts";
import { type Recorder, requestParams } from "./_recorder.ts";
import {
  agentAsked,
  assembledReply,
  checkOpenAiRequest,
  forAgent,
  readOpenAiReply,
  replyAsStream,
  upstreamOpenAiBody,
} from "./_openai.ts";
import {
  chatToMessage,
  checkMessagesRequest,
  messageAsStream,
  MessagesStreamReader,
  messagesToChat,
  readMessagesReply,
} from "./_anthropic.ts";
import {
  errorResponse,
  eventStream,
  type ProxyApi,
  ProxyError,
  scrub,
  SSE_HEADERS,
  sseEvent,
} from "./_wire.ts";
import { relay } from "./_relay.ts";

/** One call in flight: what its flow needs. */
export interface Call {
  /** The proxy's config. */
  config: ProxyConfig;
  /** The rollout's recorder. */
  recorder: Recorder;
  /** Aborts when the rollout ends, the agent goes, or the call's time is up. */
  signal: AbortSignal;
  /** The job's limit on model calls in flight, when there is one. */
  concurrency: AdaptiveConcurrency | undefined;
  /** `performance.now()` when the request came. */
  started: number;
  /** The agent's request headers (Anthropic's version and beta headers are passed on). */
  headers: Headers;
  /** Keeps the rollout open until `done` settles (a stream still being relayed). */
  track(done: Promise<unknown>): void;
}

/** The server answered with an error status: passed on to the agent as it came (without the key). */
class UpstreamError extends Error {
  readonly status: number;
  readonly body: string;
  readonly type: string;
  constructor(status: number, body: string, type: string) {
    super(`The model server answered ${status}: ${body.slice(0, 300)}`);
    this.status = status;
    this.body = body;
    this.type = type;
  }
}

const MAX_ERROR_BYTES = 64 << 10;

function upstreamHeaders(call: Call): Record<string, string> {
  const key = call.config.apiKey;
  if (call.config.server !== "anthropic") {
    return {
      "content-type": "application/json",
      ...(key ? { authorization: `Bearer ${key}` } : {}),
    };
  }
  const beta = call.headers.get("anthropic-beta");
  return {
    "content-type": "application/json",
    "anthropic-version": call.headers.get("anthropic-version") ?? "2023-06-01",
    ...(beta ? { "anthropic-beta": beta } : {}),
    ...(key ? { "x-api-key": key } : {}),
  };
}

/** Sends `body` to `path` of the server, holding a permit; an error status throws {@linkcode UpstreamError}. */
async function send(
  call: Call,
  path: string,
  body: Record<string, unknown>,
): Promise<{ response: Response; release: (ok: boolean) => void }> {
  const permit = call.concurrency ? await call.concurrency.acquire(call.signal) : null;
  let response: Response;
  try {
    response = await fetch(`${call.config.base}${path}`, {
      method: "POST",
      headers: upstreamHeaders(call),
      body: JSON.stringify(body),
      signal: call.signal,
    });
  } catch (err) {
    permit?.release("error");
    throw err;
  }
  if (!response.ok) {
    const text = scrub(await headText(response.body, MAX_ERROR_BYTES), call.config.apiKey);
    const wait = parseRetryAfter(response.headers.get("retry-after"));
    const limited = response.status === 429;
    permit?.release(
      limited ? "rate_limited" : "error",
      limited && wait !== null ? wait * 1000 : null,
    );
    throw new UpstreamError(
      response.status,
      text,
      response.headers.get("content-type") ?? "application/json",
    );
  }
  let released = false;
  return {
    response,
    release: (ok) => {
      if (!released) permit?.release(ok ? "ok" : "error");
      released = true;
    },
  };
}

async function replyJson(call: Call, response: Response): Promise<Record<string, unknown>> {
  const bytes = await readCapped(response.body, call.config.maxResponseBytes, "the model's reply");
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder().decode(bytes));
  } catch (err) {
    throw new ProxyError(502, "Model proxy: the model server's reply is not JSON", { cause: err });
  }
  if (!isRecord(json)) {
    throw new ProxyError(502, "Model proxy: the model server's reply is not an object");
  }
  return json;
}

function isEventStream(response: Response): boolean {
  return (response.headers.get("content-type") ?? "").includes("text/event-stream");
}

/** What the request said, for the record. */
interface Asked {
  api: ProxyApi;
  model: string | null;
  messages: readonly unknown[] | null;
  prompt?: unknown;
  params: Record<string, unknown>;
  stream: boolean;
  upstreamStream: boolean;
}

/** What the reply said, for the record. */
interface Said {
  reply: Record<string, unknown>;
  finishReason: string | null;
  usage: TokenUsage | null;
  model: string | null;
  tokens: TurnTokens | undefined;
}

function asked(api: ProxyApi, body: Record<string, unknown>, upstreamStream: boolean): Asked {
  return {
    api,
    model: typeof body.model === "string" ? body.model : null,
    messages: Array.isArray(body.messages) ? body.messages : null,
    ...(api === "openai.completions" ? { prompt: body.prompt } : {}),
    params: requestParams(body),
    stream: body.stream === true,
    upstreamStream,
  };
}

function record(call: Call, a: Asked, said: Said): void {
  call.recorder.record({
    ...a,
    model: said.model ?? a.model,
    reply: said.reply,
    usage: said.usage,
    finishReason: said.finishReason,
    tokens: said.tokens,
    latencyMs: performance.now() - call.started,
  });
}

/** llama-server's prompt ids (its replies carry none), when it is the server and they count the prompt. */
async function withPromptIds(
  call: Call,
  api: OpenAiApi,
  said: Said,
  upstream: Record<string, unknown>,
): Promise<void> {
  if (call.config.server !== "llama-server" || said.usage === null) return;
  if (said.tokens?.promptIds) return;
  const { stream: _s, stream_options: _o, ...chat } = upstream;
  const prompt = api === "chat"
    ? { chat }
    : typeof upstream.prompt === "string"
    ? { text: upstream.prompt }
    : null;
  if (prompt === null) return;
  const headers = upstreamHeaders(call);
  const ids = await llamaPromptIds(
    call.config.origin,
    headers,
    prompt,
    said.usage.inputTokens,
    call.signal,
    call.config.maxResponseBytes,
  );
  if (ids === null) return;
  said.tokens = {
    promptIds: ids,
    completionIds: said.tokens?.completionIds ?? null,
    logprobs: said.tokens?.logprobs ?? null,
  };
}

/** A Chat Completions or Completions call. */
export async function openAiCall(
  call: Call,
  api: OpenAiApi,
  body: Record<string, unknown>,
): Promise<Response> {
  const name: ProxyApi = api === "chat" ? "openai.chat" : "openai.completions";
  if (call.config.server === "anthropic") {
    throw new ProxyError(404, "Model proxy forwards to an Anthropic server: use /v1/messages");
  }
  checkOpenAiRequest(api, body);
  const server = call.config.server as ModelServer;
  const wants = agentAsked(api, body);
  const streamUp = wants.stream && streamsTokens(server, api, body);
  const up = upstreamOpenAiBody(api, body, server, streamUp, call.config.model);
  const path = api === "chat" ? "/chat/completions" : "/completions";
  const { response, release } = await send(call, path, up);
  const a = asked(name, body, streamUp);
  if (streamUp && isEventStream(response)) {
    const chunks = new StreamAssembler(api);
    return relay(call, name, response, release, {
      pass(event) {
        if (event.json === null) return sseEvent(event.data, event.event || undefined);
        chunks.add(event.json);
        const shown = forAgent(event.json, wants, true);
        if (shown === null) return null;
        return sseEvent(shown === event.json ? event.data : shown, event.event || undefined);
      },
      finished: () => chunks.finishReason !== null,
      async end() {
        const said = assembledReply(api, chunks);
        await withPromptIds(call, api, said, up);
        record(call, a, said);
      },
    });
  }
  try {
    const json = await replyJson(call, response);
    const said = readOpenAiReply(api, json);
    await withPromptIds(call, api, said, up);
    record(call, { ...a, upstreamStream: false }, said);
    release(true);
    const shown = forAgent(json, wants, false)!;
    if (!wants.stream) return Response.json(shown);
    return new Response(eventStream(replyAsStream(api, shown, wants)), { headers: SSE_HEADERS });
  } catch (err) {
    release(false);
    throw err;
  }
}

/** A Messages call: passed on to an Anthropic server, else translated to Chat Completions. */
export async function messagesCall(call: Call, body: Record<string, unknown>): Promise<Response> {
  checkMessagesRequest(body);
  if (call.config.server !== "anthropic") return await translatedCall(call, body);
  const up = call.config.model === null ? body : { ...body, model: call.config.model };
  const { response, release } = await send(call, "/v1/messages", up);
  const a = asked("anthropic.messages", body, body.stream === true);
  if (body.stream === true && isEventStream(response)) {
    const reader = new MessagesStreamReader();
    return relay(call, "anthropic.messages", response, release, {
      pass(event) {
        if (event.json !== null) reader.feed(event.json);
        return sseEvent(event.data, event.event || undefined);
      },
      finished: () => reader.finished,
      end() {
        record(call, a, { ...reader.result(), tokens: undefined });
        return Promise.resolve();
      },
    });
  }
  try {
    const json = await replyJson(call, response);
    record(call, { ...a, upstreamStream: false }, {
      ...readMessagesReply(json),
      tokens: undefined,
    });
    release(true);
    if (body.stream !== true) return Response.json(json);
    return new Response(eventStream(messageAsStream(json)), { headers: SSE_HEADERS });
  } catch (err) {
    release(false);
    throw err;
  }
}

/** A Messages call to an OpenAI-compatible server, whose token ids only Chat Completions carries. */
async function translatedCall(call: Call, body: Record<string, unknown>): Promise<Response> {
  const server = call.config.server as ModelServer;
  const up = upstreamOpenAiBody("chat", messagesToChat(body), server, false, call.config.model);
  const { response, release } = await send(call, "/chat/completions", up);
  try {
    const json = await replyJson(call, response);
    const said = readOpenAiReply("chat", json);
    await withPromptIds(call, "chat", said, up);
    const message = chatToMessage(json, body.model);
    record(call, asked("anthropic.messages", body, false), {
      ...said,
      reply: { role: "assistant", content: message.content },
      finishReason: String(message.stop_reason),
    });
    release(true);
    if (body.stream !== true) return Response.json(message);
    return new Response(eventStream(messageAsStream(message)), { headers: SSE_HEADERS });
  } catch (err) {
    release(false);
    throw err;
  }
}

/**
 * Runs a call's flow; a failure of any kind is recorded as a failed call and
 * answered in the API's shape (the server's own error reply passed on as
 * it came, without the key).
 */
export async function guarded(
  call: Call,
  api: ProxyApi,
  flow: () => Promise<Response>,
): Promise<Response> {
  try {
    return await flow();
  } catch (err) {
    const latencyMs = performance.now() - call.started;
    if (err instanceof UpstreamError) {
      call.recorder.fail({ api, status: err.status, message: err.message, latencyMs });
      return new Response(err.body, { status: err.status, headers: { "content-type": err.type } });
    }
    let status: number;
    let message: string;
    if (err instanceof ProxyError) [status, message] = [err.status, err.message];
    else if (err instanceof BodyTooLargeError) {
      [status, message] = [502, `Model proxy: ${err.message} (maxResponseBytes)`];
    } else if (call.signal.aborted) {
      const late = call.signal.reason instanceof DOMException &&
        call.signal.reason.name === "TimeoutError";
      status = 503;
      message = late
        ? "Model proxy: the call took longer than its callTimeout"
        : "Model proxy: the rollout ended, or the agent went away, before the reply";
    } else {
      status = 502;
      message = `Model proxy could not reach the model server: ${
        scrub(errorMessage(err), call.config.apiKey)
      }`;
    }
    call.recorder.fail({ api, status, message, latencyMs });
    return errorResponse(api, status, message);
  }
}
