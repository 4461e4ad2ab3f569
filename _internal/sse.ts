// Server-sent events, read by the MCP client and the model backends.

/** Where the first `\r` or `\n` at or after `from` is, or -1. */
function indexOfLineEnd(text: string, from: number): number {
  for (let i = from; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 10 || c === 13) return i;
  }
  return -1;
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
): AsyncGenerator<{ event: string; data: string }> {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  // The current line's text so far, in pieces: each chunk is searched once
  // and joined once, so that a long line costs linear time.
  const pieces: string[] = [];
  let skipLf = false; // the last chunk ended in "\r", which a "\n" may complete
  let data: string[] = [];
  let event = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let at = skipLf && value.startsWith("\n") ? 1 : 0;
      skipLf = false;
      for (;;) {
        const nl = indexOfLineEnd(value, at);
        if (nl < 0) {
          if (at < value.length) pieces.push(value.slice(at));
          break;
        }
        pieces.push(value.slice(at, nl));
        const line = pieces.join("");
        pieces.length = 0;
        at = nl + 1;
        if (value.charCodeAt(nl) === 13) {
          if (at === value.length) skipLf = true;
          else if (value.charCodeAt(at) === 10) at++;
        }
        if (line === "") {
          if (data.length > 0) yield { event, data: data.join("\n") };
          data = [];
          event = "";
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let fieldValue = colon < 0 ? "" : line.slice(colon + 1);
          if (fieldValue.startsWith(" ")) fieldValue = fieldValue.slice(1);
          if (field === "data") data.push(fieldValue);
          else if (field === "event") event = fieldValue;
        }
      }
    }
    if (data.length > 0 && !dropUnterminated) yield { event, data: data.join("\n") };
  } finally {
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}
