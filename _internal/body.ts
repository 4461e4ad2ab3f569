// HTTP bodies read with a ceiling: a peer that sends more than it may is
// cut off as the bytes arrive, never buffered whole (the MCP server's
// request bodies, the MCP client's replies).

import { concat } from "./io.ts";

/** A body that went past its ceiling; `limit` is the ceiling in bytes. */
export class BodyTooLargeError extends RangeError {
  /** The ceiling, in bytes. */
  readonly limit: number;
  /** Makes the error. */
  constructor(what: string, limit: number) {
    super(`${what} is over ${formatBytes(limit)}`);
    this.name = "BodyTooLargeError";
    this.limit = limit;
  }
}

/** `16 MiB`, `64 KiB`, `100 bytes`. */
export function formatBytes(n: number): string {
  if (n >= 1 << 20 && n % (1 << 20) === 0) return `${n / (1 << 20)} MiB`;
  if (n >= 1 << 10 && n % (1 << 10) === 0) return `${n / (1 << 10)} KiB`;
  return `${n} bytes`;
}

/**
 * `body` passed through unchanged until more than `limit` bytes have come,
 * then errored with a {@linkcode BodyTooLargeError} (or what `wrap` makes of
 * it, for a caller whose callers catch their own class) and the source
 * cancelled, so that the rest is never read.
 */
export function cappedBody(
  body: ReadableStream<Uint8Array>,
  limit: number,
  what: string,
  wrap: (err: BodyTooLargeError) => unknown = (err) => err,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let seen = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { value, done } = await reader.read();
      if (done) {
        controller.close();
        return;
      }
      seen += value.byteLength;
      if (seen > limit) {
        const err = new BodyTooLargeError(what, limit);
        await reader.cancel(err).catch(() => {});
        controller.error(wrap(err));
        return;
      }
      controller.enqueue(value);
    },
    async cancel(reason) {
      await reader.cancel(reason).catch(() => {});
    },
  });
}

/**
 * Every byte of `body`, or a {@linkcode BodyTooLargeError} as soon as more
 * than `limit` bytes have come (the source cancelled).
 */
export async function readCapped(
  body: ReadableStream<Uint8Array> | null,
  limit: number,
  what: string,
): Promise<Uint8Array> {
  if (body === null) return new Uint8Array(0);
  const parts: Uint8Array[] = [];
  const reader = cappedBody(body, limit, what).getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return concat(parts);
      parts.push(value);
    }
  } finally {
    reader.releaseLock();
  }
}

/** The first `limit` bytes of `body` as text (for an error message); the rest is cancelled. */
export async function headText(
  body: ReadableStream<Uint8Array> | null,
  limit: number,
): Promise<string> {
  if (body === null) return "";
  const reader = body.getReader();
  const parts: Uint8Array[] = [];
  let n = 0;
  try {
    while (n < limit) {
      const { value, done } = await reader.read();
      if (done) break;
      parts.push(value);
      n += value.byteLength;
    }
  } catch {
    // What came is enough for a message.
  } finally {
    await reader.cancel().catch(() => {});
  }
  return new TextDecoder().decode(concat(parts).subarray(0, limit));
}
