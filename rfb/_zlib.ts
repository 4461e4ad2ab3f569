// One zlib stream fed piece by piece: ZRLE (RFC 6143 §7.7.6) keeps a single
// zlib stream for the whole connection, and the server ends each
// rectangle's part of it with a sync flush, so each part decompresses to
// exactly that rectangle's bytes. The web platform's DecompressionStream
// does the inflating; this feeds it one part at a time and collects what
// that part produced.
//
// How a part's output is known to be complete: a read is always pending on
// the readable side, so the transform is never held back and runs when the
// part is written; it decompresses synchronously and enqueues its output,
// which goes straight to the pending read. The read's callback runs one
// microtask later, before the write's promise resolves (several microtasks
// through the writable side). Should a runtime deliver later than that, one
// macrotask more is waited for before a short part is called an error.

import { errorMessage } from "../_internal/util.ts";

/** Bad compressed data from the server. */
export class InflateError extends Error {
  /** Makes the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "InflateError";
  }
}

/** Slices fed to the decompressor, so that output is checked against the bound as it grows. */
const SLICE = 64 * 1024;

/** A persistent zlib stream: {@linkcode Inflater.inflate} one part at a time. */
export class Inflater {
  readonly #writer: WritableStreamDefaultWriter<BufferSource>;
  readonly #reader: ReadableStreamDefaultReader<Uint8Array>;
  #out: Uint8Array[] = [];
  #outBytes = 0;
  #error: unknown = null;
  #closed = false;

  constructor() {
    const stream = new DecompressionStream("deflate");
    this.#writer = stream.writable.getWriter();
    this.#reader = stream.readable.getReader();
    this.#writer.closed.catch(() => {});
    this.#pull();
  }

  #pull(): void {
    this.#reader.read().then(({ value, done }) => {
      if (done) return;
      this.#out.push(value);
      this.#outBytes += value.length;
      this.#pull();
    }, (err) => {
      this.#error = err;
    });
  }

  /**
   * Decompresses one part of the stream.
   * @param part the compressed bytes
   * @param limit the most bytes the part may decompress to
   * @returns everything the part decompressed to
   * @throws {InflateError} for bad data, or output past `limit`
   */
  async inflate(part: Uint8Array, limit: number): Promise<Uint8Array> {
    if (this.#closed) throw new InflateError("stream is closed");
    for (let off = 0; off < part.length; off += SLICE) {
      try {
        await this.#writer.write(part.slice(off, off + SLICE));
      } catch (err) {
        throw new InflateError(`data is not zlib (${errorMessage(err)})`, {
          cause: err,
        });
      }
      if (this.#outBytes > limit) {
        throw new InflateError(
          `data decompresses to more than the ${limit} bytes it may hold`,
        );
      }
    }
    if (this.#error !== null) {
      throw new InflateError(`data is not zlib (${errorMessage(this.#error)})`);
    }
    return this.take();
  }

  /** Waits one macrotask, for output a runtime delivers late (see the module comment). */
  async settle(): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, 0));
  }

  /** What the stream produced and nobody took yet. */
  take(): Uint8Array {
    const parts = this.#out;
    this.#out = [];
    this.#outBytes = 0;
    if (parts.length === 1) return parts[0];
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let off = 0;
    for (const p of parts) {
      out.set(p, off);
      off += p.length;
    }
    return out;
  }

  /** Ends the stream, dropping what it holds. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#writer.abort().catch(() => {});
    this.#reader.cancel().catch(() => {});
  }
}
