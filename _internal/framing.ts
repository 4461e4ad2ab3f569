// Newline-delimited JSON framing: a bounded line reader, frame encoding and
// the JSON-RPC reply check.

import { ErrorCode, HudProtocolError } from "../errors.ts";
import { isRecord } from "./util.ts";

// Small to start with: a server holds one reader per session, and at 64 KiB
// each, 10,000 held sessions needed 650 MiB. Long frames grow the buffer.
const INITIAL_BUFFER = 4 * 1024;
const NEWLINE = 10;

/** One frame from {@linkcode LineReader.read}. */
export type LineResult =
  /** A complete line, without its `\n`; valid until the next `read()`. */
  | { kind: "line"; line: Uint8Array }
  /**
   * A line longer than the limit (`size` is at least its length). Its bytes
   * were dropped and the reader may be mid-line: close the stream.
   */
  | { kind: "oversized"; size: number };

/**
 * Reads `\n`-terminated lines from a byte reader with a bounded buffer.
 *
 * Lines up to `maxLine` bytes are returned as views of an internal buffer
 * (no copy, no string building); a longer line is reported as `oversized`
 * as soon as the limit is passed, so memory stays bounded.
 */
export class LineReader {
  #reader: { read(p: Uint8Array): Promise<number | null> };
  #maxLine: number;
  #buf: Uint8Array;
  #start = 0;
  #end = 0;
  #eof = false;

  constructor(reader: { read(p: Uint8Array): Promise<number | null> }, maxLine: number) {
    this.#reader = reader;
    this.#maxLine = maxLine;
    this.#buf = new Uint8Array(Math.min(INITIAL_BUFFER, maxLine + 1));
  }

  /** Next line, or `null` at end of stream. A final line without `\n` counts. */
  async read(): Promise<LineResult | null> {
    let scanFrom = this.#start;
    while (true) {
      const nl = this.#buf.subarray(scanFrom, this.#end).indexOf(NEWLINE);
      if (nl >= 0) {
        const lineEnd = scanFrom + nl;
        const line = this.#buf.subarray(this.#start, lineEnd);
        this.#start = lineEnd + 1;
        if (line.length > this.#maxLine) return { kind: "oversized", size: line.length };
        return { kind: "line", line };
      }
      const pending = this.#end - this.#start;
      if (this.#eof) {
        if (pending === 0) return null;
        const line = this.#buf.subarray(this.#start, this.#end);
        this.#start = this.#end;
        if (line.length > this.#maxLine) return { kind: "oversized", size: line.length };
        return { kind: "line", line };
      }
      if (pending > this.#maxLine) {
        // Report at once rather than reading the rest of a line of unknown
        // length; the stream is mid-line afterwards, so callers close it.
        this.#start = this.#end = 0;
        return { kind: "oversized", size: pending };
      }
      // Only the bytes about to arrive need scanning; makeRoom may move the
      // pending bytes, so keep the offset relative to the line start.
      this.#makeRoom();
      scanFrom = this.#end;
      const n = await this.#reader.read(this.#buf.subarray(this.#end));
      if (n === null) this.#eof = true;
      else this.#end += n;
    }
  }

  /** Bytes read past the last returned line; clears them from the reader. */
  takeBuffered(): Uint8Array {
    const rest = this.#buf.slice(this.#start, this.#end);
    this.#start = this.#end = 0;
    return rest;
  }

  #makeRoom(): void {
    if (this.#end < this.#buf.length) return;
    const pending = this.#end - this.#start;
    if (this.#start > 0 && pending < this.#buf.length / 2) {
      this.#buf.copyWithin(0, this.#start, this.#end);
    } else {
      const size = Math.min(this.#buf.length * 2, this.#maxLine + 1 + INITIAL_BUFFER);
      const next = new Uint8Array(Math.max(size, pending + INITIAL_BUFFER));
      next.set(this.#buf.subarray(this.#start, this.#end));
      this.#buf = next;
    }
    this.#start = 0;
    this.#end = pending;
  }
}

const encoder = new TextEncoder();

/** Compact JSON plus `\n`, as bytes: one write per frame. */
export function encodeFrame(value: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(value) + "\n");
}

const decoder = new TextDecoder("utf-8", { fatal: true });

/** Decodes and parses one line; throws `SyntaxError` for bad UTF-8 or JSON. */
export function parseLine(line: Uint8Array): unknown {
  let text: string;
  try {
    text = decoder.decode(line);
  } catch {
    throw new SyntaxError("Invalid UTF-8 in frame");
  }
  return JSON.parse(text);
}

/**
 * The `result` of a JSON-RPC reply to request `id`.
 * @throws {HudProtocolError} the peer's error for an error reply; `-32603`
 *   for a reply that does not match the request or has no result object
 */
export function replyResult(reply: unknown, id: number, method: string): Record<string, unknown> {
  // An error with id null answers a request the peer could not read (too
  // large, not JSON): it is the reply to ours, and its message says why.
  if (isRecord(reply) && reply.id === null && isRecord(reply.error)) {
    const code = typeof reply.error.code === "number" ? reply.error.code : ErrorCode.SERVER_ERROR;
    throw new HudProtocolError(
      code,
      `"${method}" refused: ${String(reply.error.message ?? "unknown error")}`,
    );
  }
  if (!isRecord(reply) || reply.id !== id) {
    const got = JSON.stringify(isRecord(reply) ? reply.id : reply);
    throw new HudProtocolError(
      ErrorCode.INTERNAL_ERROR,
      `reply id mismatch for "${method}": expected ${id}, got ${got}`,
    );
  }
  if (isRecord(reply.error)) {
    const code = typeof reply.error.code === "number" ? reply.error.code : ErrorCode.SERVER_ERROR;
    throw new HudProtocolError(code, String(reply.error.message ?? "unknown error"));
  }
  if (!isRecord(reply.result)) {
    throw new HudProtocolError(
      ErrorCode.INTERNAL_ERROR,
      `reply to "${method}" has no result object`,
    );
  }
  return reply.result;
}
