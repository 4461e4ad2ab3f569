// Server-sent events, read by the MCP client and the model backends.

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
  let buffer = "";
  let data: string[] = [];
  let event = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let nl: number;
      while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
        if (line === "") {
          if (data.length > 0) yield { event, data: data.join("\n") };
          data = [];
          event = "";
        } else if (line.startsWith(":")) {
          continue;
        } else {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "data") data.push(value);
          else if (field === "event") event = value;
        }
      }
    }
    if (data.length > 0 && !dropUnterminated) yield { event, data: data.join("\n") };
  } finally {
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}
