// Just enough HTTP/1.1 and WebSocket (RFC 6455), server side, for CDP
// clients that reach the browser through a tunnel stream: one request head,
// plain responses, the upgrade handshake, and frames. The built-in
// `WebSocket` (what CdpClient uses) is a client only, and `Deno.serve`
// cannot take a stream it did not accept itself.

import { closeQuietly, concat, type Duplex, isPeerGone, writeAll } from "../_internal/io.ts";

/** A request head: method, target and headers (names lower-cased). */
export interface HttpRequest {
  readonly method: string;
  readonly target: string;
  readonly headers: ReadonlyMap<string, string>;
}

/** The most a request head may take. */
const MAX_HEAD = 16 * 1024;

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const HEAD_END = encoder.encode("\r\n\r\n");

/** Where `needle` first occurs in `haystack` at or after `from`, or -1. */
function indexOfBytes(haystack: Uint8Array, needle: Uint8Array, from: number): number {
  outer: for (let i = Math.max(0, from); i <= haystack.length - needle.length; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

/**
 * Reads one request head. Returns it with the bytes read past it, or null
 * when the stream ends first, the head is over 16 KiB or cannot be parsed.
 */
export async function readRequestHead(
  reader: { read(p: Uint8Array): Promise<number | null> },
  head: Uint8Array,
): Promise<{ request: HttpRequest; rest: Uint8Array } | null> {
  const buf = new Uint8Array(MAX_HEAD);
  let end = Math.min(head.length, MAX_HEAD);
  buf.set(head.subarray(0, end));
  let at = indexOfBytes(buf.subarray(0, end), HEAD_END, 0);
  while (at < 0) {
    if (end === MAX_HEAD) return null;
    const n = await reader.read(buf.subarray(end));
    if (n === null) return null;
    at = indexOfBytes(buf.subarray(0, end + n), HEAD_END, end - 3);
    end += n;
  }
  // Bytes past the head: the start of the first frames, which may go on
  // past what fitted in the buffer when they came with the preface.
  const rest = head.length > MAX_HEAD
    ? concat([buf.subarray(at + 4, end), head.subarray(MAX_HEAD)])
    : buf.slice(at + 4, end);
  const lines = decoder.decode(buf.subarray(0, at)).split("\r\n");
  const m = /^([A-Z]+) (\S+) HTTP\/1\.[01]$/.exec(lines[0]);
  if (m === null) return null;
  const headers = new Map<string, string>();
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(":");
    if (colon <= 0) return null;
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    headers.set(name, headers.has(name) ? `${headers.get(name)}, ${value}` : value);
  }
  return { request: { method: m[1], target: m[2], headers }, rest };
}

/** Writes a complete response and ends the stream (no keep-alive). */
export async function respond(
  conn: Duplex,
  status: number,
  body: string,
  contentType = "text/plain; charset=UTF-8",
): Promise<void> {
  const bytes = encoder.encode(body);
  const reason = { 200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found" }[status] ??
    "Error";
  const headerText = `HTTP/1.1 ${status} ${reason}\r\nContent-Type: ${contentType}\r\n` +
    `Content-Length: ${bytes.length}\r\nConnection: close\r\n\r\n`;
  try {
    await writeAll(conn, encoder.encode(headerText));
    await writeAll(conn, bytes);
    await conn.closeWrite();
  } catch (err) {
    if (!isPeerGone(err)) throw err;
  }
}

const ACCEPT_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/**
 * Answers an upgrade request with 101 and returns the connection, or writes
 * a 400 and returns null when the request is not a WebSocket handshake.
 */
export async function acceptWebSocket(
  conn: Duplex,
  request: HttpRequest,
  rest: Uint8Array,
  options: WebSocketOptions,
): Promise<WebSocketConnection | null> {
  const key = request.headers.get("sec-websocket-key") ?? "";
  const upgrade = request.headers.get("upgrade")?.toLowerCase() ?? "";
  const connection = request.headers.get("connection")?.toLowerCase() ?? "";
  if (
    request.method !== "GET" || upgrade !== "websocket" || !/\bupgrade\b/.test(connection) ||
    request.headers.get("sec-websocket-version") !== "13" || !/^[A-Za-z0-9+/]{22}==$/.test(key)
  ) {
    await respond(conn, 400, "Expected a WebSocket (version 13) upgrade request");
    return null;
  }
  const digest = await crypto.subtle.digest("SHA-1", encoder.encode(key + ACCEPT_GUID));
  await writeAll(
    conn,
    encoder.encode(
      "HTTP/1.1 101 WebSocket Protocol Handshake\r\nUpgrade: WebSocket\r\n" +
        `Connection: Upgrade\r\nSec-WebSocket-Accept: ${new Uint8Array(digest).toBase64()}\r\n\r\n`,
    ),
  );
  return new WebSocketConnection(conn, rest, options);
}

/** Limits of a {@linkcode WebSocketConnection}. */
export interface WebSocketOptions {
  /** The longest message accepted from the client, in bytes. */
  maxMessage: number;
  /** The most bytes queued for the client before it counts as stuck and is dropped. */
  maxQueued: number;
}

const OP_CONTINUATION = 0;
const OP_TEXT = 1;
const OP_BINARY = 2;
const OP_CLOSE = 8;
const OP_PING = 9;
const OP_PONG = 10;

/** Raised inside the reader for a protocol violation; becomes a close frame. */
class FrameError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.name = "FrameError";
    this.code = code;
  }
}

/** Bytes in, buffered, with exact reads for frame headers and payloads. */
class ByteSource {
  #conn: { read(p: Uint8Array): Promise<number | null> };
  #buf = new Uint8Array(16 * 1024);
  #start = 0;
  #end = 0;

  constructor(conn: { read(p: Uint8Array): Promise<number | null> }, head: Uint8Array) {
    this.#conn = conn;
    if (head.length > this.#buf.length) this.#buf = new Uint8Array(head.length);
    this.#buf.set(head);
    this.#end = head.length;
  }

  /** Exactly `n` (at most 14: a frame header's part) bytes, or null at end of stream. */
  async take(n: number): Promise<Uint8Array | null> {
    if (this.#start + n > this.#buf.length) {
      this.#buf.copyWithin(0, this.#start, this.#end);
      this.#end -= this.#start;
      this.#start = 0;
    }
    while (this.#end - this.#start < n) {
      const got = await this.#conn.read(this.#buf.subarray(this.#end));
      if (got === null) return null;
      this.#end += got;
    }
    const out = this.#buf.subarray(this.#start, this.#start + n);
    this.#start += n;
    if (this.#start === this.#end) this.#start = this.#end = 0;
    return out;
  }

  /** A payload of `n` bytes copied out, read straight into its own buffer. */
  async payload(n: number): Promise<Uint8Array | null> {
    const out = new Uint8Array(n);
    const buffered = Math.min(n, this.#end - this.#start);
    out.set(this.#buf.subarray(this.#start, this.#start + buffered));
    this.#start += buffered;
    if (this.#start === this.#end) this.#start = this.#end = 0;
    let off = buffered;
    while (off < n) {
      const got = await this.#conn.read(out.subarray(off));
      if (got === null) return null;
      off += got;
    }
    return out;
  }
}

/** A frame as read: the payload unmasked. */
interface Frame {
  fin: boolean;
  opcode: number;
  payload: Uint8Array;
}

/**
 * Checks a data frame's place: text or binary starts a message, a
 * continuation goes on with one.
 * @throws {FrameError} for a frame out of place or an unknown opcode
 */
function checkDataFrame(opcode: number, inMessage: boolean): void {
  if (opcode === OP_TEXT || opcode === OP_BINARY) {
    if (inMessage) throw new FrameError(1002, "Expected a continuation frame");
  } else if (opcode === OP_CONTINUATION) {
    if (!inMessage) throw new FrameError(1002, "Unexpected continuation frame");
  } else {
    throw new FrameError(1002, `Unknown opcode ${opcode}`);
  }
}

/**
 * A message's bytes as text.
 * @throws {FrameError} for bytes that are not UTF-8
 */
function utf8(bytes: Uint8Array): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new FrameError(1007, "Invalid UTF-8");
  }
}

/** Server side of one WebSocket: text messages in and out, pings answered. */
class WebSocketConnection {
  readonly #conn: Duplex;
  readonly #source: ByteSource;
  readonly #options: WebSocketOptions;
  #writing: Promise<void> = Promise.resolve();
  #queued = 0;
  #closeSent = false;
  #closed = false;

  constructor(conn: Duplex, head: Uint8Array, options: WebSocketOptions) {
    this.#conn = conn;
    this.#source = new ByteSource(conn, head);
    this.#options = options;
  }

  /**
   * The next message as text (binary ones are read as UTF-8 too), or null
   * once the client closed, broke the protocol or went away (then the
   * closing handshake has been answered).
   */
  async read(): Promise<string | null> {
    const parts: Uint8Array[] = [];
    let size = 0;
    try {
      while (true) {
        const f = await this.#readFrame(size);
        if (f === null) return this.#gone();
        if (f.opcode === OP_PING) {
          this.#enqueue(frame(OP_PONG, f.payload));
          continue;
        }
        if (f.opcode === OP_PONG) continue;
        if (f.opcode === OP_CLOSE) {
          const code = f.payload.length >= 2 ? (f.payload[0] << 8) | f.payload[1] : 1000;
          this.#sendClose(code === 1005 || code === 1006 ? 1000 : code, "");
          await this.#finish();
          return null;
        }
        checkDataFrame(f.opcode, parts.length > 0);
        parts.push(f.payload);
        size += f.payload.length;
        if (f.fin) return utf8(parts.length === 1 ? parts[0] : joined(parts, size));
      }
    } catch (err) {
      if (err instanceof FrameError) {
        this.#sendClose(err.code, err.message);
        await this.#finish();
        return null;
      }
      if (isPeerGone(err)) return this.#gone();
      throw err;
    }
  }

  /**
   * One frame, its header checked and its payload unmasked; null once the
   * stream ended. `size` is what the message holds so far.
   * @throws {FrameError} for a frame the protocol or `maxMessage` forbids
   */
  async #readFrame(size: number): Promise<Frame | null> {
    const head = await this.#source.take(2);
    if (head === null) return null;
    const fin = (head[0] & 0x80) !== 0;
    const opcode = head[0] & 0x0f;
    if ((head[0] & 0x70) !== 0) throw new FrameError(1002, "Reserved bits set");
    if ((head[1] & 0x80) === 0) throw new FrameError(1002, "Client frames must be masked");
    const length = await this.#length(head[1] & 0x7f);
    if (length === null) return null;
    const control = opcode >= 8;
    if (control && (!fin || length > 125)) throw new FrameError(1002, "Bad control frame");
    if (!control && size + length > this.#options.maxMessage) {
      throw new FrameError(1009, "Message too big");
    }
    const maskBytes = await this.#source.take(4);
    if (maskBytes === null) return null;
    const mask = maskBytes.slice();
    const payload = await this.#source.payload(length);
    if (payload === null) return null;
    for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
    return { fin, opcode, payload };
  }

  /** The payload length: the header's 7 bits, or the 16- or 64-bit length after it. */
  async #length(short: number): Promise<number | null> {
    if (short === 126) {
      const ext = await this.#source.take(2);
      return ext === null ? null : (ext[0] << 8) | ext[1];
    }
    if (short !== 127) return short;
    const ext = await this.#source.take(8);
    if (ext === null) return null;
    const big = new DataView(ext.buffer, ext.byteOffset, 8).getBigUint64(0);
    if (big > BigInt(this.#options.maxMessage)) throw new FrameError(1009, "Message too big");
    return Number(big);
  }

  /**
   * Queues a text message. Returns false (and drops the connection) when
   * more than `maxQueued` bytes wait for a client that does not read.
   */
  send(text: string): boolean {
    if (this.#closeSent || this.#closed) return false;
    const data = frame(OP_TEXT, encoder.encode(text));
    if (this.#queued + data.length > this.#options.maxQueued) {
      this.abort();
      return false;
    }
    this.#enqueue(data);
    return true;
  }

  /** Starts the closing handshake (idempotent); `read()` then returns null. */
  close(code = 1000, reason = ""): void {
    this.#sendClose(code, reason);
    // A client that never answers the close frame is not waited for.
    this.#writing.then(() => this.#conn.closeWrite()).catch(() => {});
  }

  /** Drops the stream at once. */
  abort(): void {
    this.#closed = true;
    closeQuietly(this.#conn);
  }

  /** Resolves once everything queued is written (or the stream broke). */
  flushed(): Promise<void> {
    return this.#writing;
  }

  #sendClose(code: number, reason: string): void {
    if (this.#closeSent || this.#closed) return;
    this.#closeSent = true;
    const text = encoder.encode(reason).subarray(0, 123);
    const payload = new Uint8Array(2 + text.length);
    payload[0] = code >> 8;
    payload[1] = code & 0xff;
    payload.set(text, 2);
    this.#enqueue(frame(OP_CLOSE, payload));
  }

  #enqueue(data: Uint8Array): void {
    this.#queued += data.length;
    this.#writing = this.#writing.then(async () => {
      try {
        if (!this.#closed) await writeAll(this.#conn, data);
      } catch (err) {
        if (!isPeerGone(err)) throw err;
        this.#closed = true;
      } finally {
        this.#queued -= data.length;
      }
    });
  }

  async #finish(): Promise<void> {
    await this.#writing.catch(() => {});
    try {
      await this.#conn.closeWrite();
    } catch (err) {
      if (!isPeerGone(err)) throw err;
    }
  }

  #gone(): null {
    this.#closed = true;
    return null;
  }
}

function joined(parts: Uint8Array[], size: number): Uint8Array {
  const out = new Uint8Array(size);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/** One unmasked (server) frame with FIN set. */
function frame(opcode: number, payload: Uint8Array): Uint8Array {
  const n = payload.length;
  const headerSize = n < 126 ? 2 : n < 65536 ? 4 : 10;
  const out = new Uint8Array(headerSize + n);
  out[0] = 0x80 | opcode;
  if (n < 126) {
    out[1] = n;
  } else if (n < 65536) {
    out[1] = 126;
    out[2] = n >> 8;
    out[3] = n & 0xff;
  } else {
    out[1] = 127;
    new DataView(out.buffer).setBigUint64(2, BigInt(n));
  }
  out.set(payload, headerSize);
  return out;
}
