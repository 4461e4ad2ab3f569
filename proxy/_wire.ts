// What the proxy writes on the wire besides the replies it forwards: error
// bodies in each API's shape, server-sent events, and the one function that
// keeps the upstream key out of whatever it passes on.

import { isRecord } from "../_internal/util.ts";

/** The API a call speaks towards the agent. */
export type ProxyApi = "openai.chat" | "openai.completions" | "anthropic.messages";

/** A refusal or failure of the proxy itself, with the HTTP status it answers with. */
export class ProxyError extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** Makes one. */
  constructor(status: number, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ProxyError";
    this.status = status;
  }
}

/** An error reply in the shape of `api` (an OpenAI `error` object, or Anthropic's). */
export function errorResponse(api: ProxyApi | null, status: number, message: string): Response {
  const body = api === "anthropic.messages"
    ? { type: "error", error: { type: errorType(status), message } }
    : { error: { message, type: errorType(status), code: status } };
  return Response.json(body, { status });
}

function errorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 404) return "not_found_error";
  if (status === 413) return "request_too_large";
  if (status >= 500) return "api_error";
  return "invalid_request_error";
}

const encoder = new TextEncoder();

/** One server-sent event: `data` as JSON (a string as is), with an `event:` line when named. */
export function sseEvent(data: unknown, event?: string): Uint8Array {
  const text = typeof data === "string" ? data : JSON.stringify(data);
  return encoder.encode(`${event ? `event: ${event}\n` : ""}data: ${text}\n\n`);
}

/** The headers of an event stream. */
export const SSE_HEADERS: Readonly<Record<string, string>> = Object.freeze({
  "content-type": "text/event-stream",
  "cache-control": "no-cache",
});

/** A stream of the given events. */
export function eventStream(events: readonly Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      for (const e of events) controller.enqueue(e);
      controller.close();
    },
  });
}

/** One parsed event of a stream the upstream sent. */
export interface UpstreamEvent {
  /** The `event:` name, or "". */
  event: string;
  /** The `data:` text. */
  data: string;
  /** `data` parsed, when it is a JSON object. */
  json: Record<string, unknown> | null;
}

/** An event of the upstream's stream, its data parsed once. */
export function parseEvent({ event, data }: { event: string; data: string }): UpstreamEvent {
  let json: Record<string, unknown> | null = null;
  if (data !== "[DONE]" && data.trim() !== "[DONE]") {
    try {
      const parsed = JSON.parse(data);
      if (isRecord(parsed)) json = parsed;
    } catch {
      // Not JSON: passed on as it came, read as nothing.
    }
  }
  return { event, data, json };
}

/**
 * `text` with every occurrence of `secret` replaced, so that an upstream
 * that echoes the key (some error messages do) does not hand it on.
 */
export function scrub(text: string, secret: string | null): string {
  return secret === null || secret === "" ? text : text.replaceAll(secret, "[REDACTED key]");
}
