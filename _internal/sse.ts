// Server-sent events, read by the MCP client, the model backends and the
// model proxy.

/** Where the first `\r` or `\n` at or after `from` is, or -1. */
function indexOfLineEnd(text: string, from: number): number {
  for (let i = from; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 10 || c === 13) return i;
  }
  return -1;
}

/** One event: its `event` field ("" when none) and its `data` fields, joined. */
export interface SseEvent {
  /** The `event:` field, or "". */
  event: string;
  /** The `data:` lines, joined with "\n". */
  data: string;
}

/**
 * A `text/event-stream` read as its text comes, in pieces of any size:
 * {@linkcode SseParser.push} returns the events each piece completes, so
 * that a reader can handle all the events of one network read at once.
 */
export class SseParser {
  // The current line's text so far, in pieces: each chunk is searched once
  // and joined once, so that a long line costs linear time.
  readonly #pieces: string[] = [];
  #skipLf = false; // the last chunk ended in "\r", which a "\n" may complete
  #data: string[] = [];
  #event = "";

  /** The events that `text` (the stream's next piece) completes. */
  push(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    let at = this.#skipLf && text.startsWith("\n") ? 1 : 0;
    this.#skipLf = false;
    for (;;) {
      const nl = indexOfLineEnd(text, at);
      if (nl < 0) {
        if (at < text.length) this.#pieces.push(text.slice(at));
        return out;
      }
      this.#pieces.push(text.slice(at, nl));
      const line = this.#pieces.join("");
      this.#pieces.length = 0;
      at = nl + 1;
      if (text.charCodeAt(nl) === 13) {
        if (at === text.length) this.#skipLf = true;
        else if (text.charCodeAt(at) === 10) at++;
      }
      this.#line(line, out);
    }
  }

  /**
   * The event the stream ended in without its closing blank line, if any
   * (an empty list when `dropUnterminated` is set, as the SSE
   * specification says).
   */
  end(dropUnterminated = false): SseEvent[] {
    const last = this.#data.length > 0 && !dropUnterminated
      ? [{ event: this.#event, data: this.#data.join("\n") }]
      : [];
    this.#data = [];
    this.#event = "";
    return last;
  }

  #line(line: string, out: SseEvent[]): void {
    if (line === "") {
      if (this.#data.length > 0) out.push({ event: this.#event, data: this.#data.join("\n") });
      this.#data = [];
      this.#event = "";
    } else if (!line.startsWith(":")) {
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") this.#data.push(value);
      else if (field === "event") this.#event = value;
    }
  }
}

/**
 * Reads a `text/event-stream` body into its events' `data` fields (joined
 * lines), one per event. An event the stream ends in without its closing
 * blank line is yielded too, unless `dropUnterminated` is set (as the SSE
 * specification says).
 */
export async function* sseData(
  body: ReadableStream<Uint8Array>,
  { dropUnterminated = false }: { dropUnterminated?: boolean } = {},
): AsyncGenerator<SseEvent> {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new SseParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      yield* parser.push(value);
    }
    yield* parser.end(dropUnterminated);
  } finally {
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}
