// SSH wire encoding (RFC 4251 section 5): a growable writer and a bounds-
// checked reader. Every read past the end throws SshWireError, which the
// transport turns into a protocol-error disconnect.

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: false });

/** A message that does not parse. */
export class SshWireError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "SshWireError";
  }
}

/** Appends SSH wire values to a buffer that grows as needed. */
export class SshWriter {
  #buf: Uint8Array;
  #view: DataView;
  #len = 0;

  constructor(capacity = 256) {
    this.#buf = new Uint8Array(capacity);
    this.#view = new DataView(this.#buf.buffer);
  }

  get length(): number {
    return this.#len;
  }

  #reserve(n: number): void {
    const need = this.#len + n;
    if (need <= this.#buf.length) return;
    let size = this.#buf.length * 2;
    while (size < need) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.#buf.subarray(0, this.#len));
    this.#buf = next;
    this.#view = new DataView(next.buffer);
  }

  byte(v: number): this {
    this.#reserve(1);
    this.#buf[this.#len++] = v;
    return this;
  }

  boolean(v: boolean): this {
    return this.byte(v ? 1 : 0);
  }

  uint32(v: number): this {
    this.#reserve(4);
    this.#view.setUint32(this.#len, v >>> 0);
    this.#len += 4;
    return this;
  }

  uint64(v: bigint): this {
    this.#reserve(8);
    this.#view.setBigUint64(this.#len, v);
    this.#len += 8;
    return this;
  }

  raw(bytes: Uint8Array): this {
    this.#reserve(bytes.length);
    this.#buf.set(bytes, this.#len);
    this.#len += bytes.length;
    return this;
  }

  /** A `string`: uint32 length, then the bytes (text is UTF-8 encoded). */
  string(v: Uint8Array | string): this {
    const bytes = typeof v === "string" ? encoder.encode(v) : v;
    this.uint32(bytes.length);
    return this.raw(bytes);
  }

  /** An `mpint` from unsigned big-endian bytes. */
  mpint(unsigned: Uint8Array): this {
    let i = 0;
    while (i < unsigned.length && unsigned[i] === 0) i++;
    const body = unsigned.subarray(i);
    const pad = body.length > 0 && (body[0] & 0x80) !== 0;
    this.uint32(body.length + (pad ? 1 : 0));
    if (pad) this.byte(0);
    return this.raw(body);
  }

  nameList(names: readonly string[]): this {
    return this.string(names.join(","));
  }

  /** The bytes written so far (a view, not a copy). */
  bytes(): Uint8Array {
    return this.#buf.subarray(0, this.#len);
  }
}

/** Reads SSH wire values from a message, throwing on truncation. */
export class SshReader {
  readonly #buf: Uint8Array;
  readonly #view: DataView;
  #pos: number;

  constructor(buf: Uint8Array, pos = 0) {
    this.#buf = buf;
    this.#view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    this.#pos = pos;
  }

  get remaining(): number {
    return this.#buf.length - this.#pos;
  }

  #need(n: number): void {
    if (this.#pos + n > this.#buf.length) throw new SshWireError("Cannot parse message: truncated");
  }

  byte(): number {
    this.#need(1);
    return this.#buf[this.#pos++];
  }

  boolean(): boolean {
    return this.byte() !== 0;
  }

  uint32(): number {
    this.#need(4);
    const v = this.#view.getUint32(this.#pos);
    this.#pos += 4;
    return v;
  }

  uint64(): bigint {
    this.#need(8);
    const v = this.#view.getBigUint64(this.#pos);
    this.#pos += 8;
    return v;
  }

  raw(n: number): Uint8Array {
    this.#need(n);
    const v = this.#buf.subarray(this.#pos, this.#pos + n);
    this.#pos += n;
    return v;
  }

  /** A `string` as bytes (a view into the message). */
  string(): Uint8Array {
    return this.raw(this.uint32());
  }

  /** A `string` decoded as UTF-8. */
  text(): string {
    return decoder.decode(this.string());
  }

  nameList(): string[] {
    const s = this.text();
    return s === "" ? [] : s.split(",");
  }

  /** The rest of the message. */
  rest(): Uint8Array {
    const v = this.#buf.subarray(this.#pos);
    this.#pos = this.#buf.length;
    return v;
  }
}

/** UTF-8 bytes of a string. */
export function utf8(s: string): Uint8Array {
  return encoder.encode(s);
}

/** A string from UTF-8 bytes (invalid sequences replaced). */
export function fromUtf8(b: Uint8Array): string {
  return decoder.decode(b);
}

export { concat } from "../_internal/io.ts";

/** Constant-time comparison of two byte arrays. */
export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let d = 0;
  for (let i = 0; i < a.length; i++) d |= a[i] ^ b[i];
  return d === 0;
}

/** Standard base64 of bytes. */
export function toBase64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

/** Bytes of standard base64 text; throws SshWireError when it is not base64. */
export function fromBase64(text: string): Uint8Array {
  let bin: string;
  try {
    bin = atob(text);
  } catch (err) {
    throw new SshWireError("Cannot decode base64: invalid text", { cause: err });
  }
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** base64url without padding (JWK fields). */
export function toBase64Url(bytes: Uint8Array): string {
  return toBase64(bytes).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

/** Bytes of base64url text. */
export function fromBase64Url(text: string): Uint8Array {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  return fromBase64(b64 + "=".repeat((4 - b64.length % 4) % 4));
}

/** Views bytes as WebCrypto's `BufferSource` (our buffers are never shared). */
export function bs(b: Uint8Array): Uint8Array<ArrayBuffer> {
  return b as Uint8Array<ArrayBuffer>;
}
