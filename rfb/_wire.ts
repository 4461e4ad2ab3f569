// RFB's bytes (RFC 6143 §7): a buffered reader with a count of what came in,
// the pixel format, the client's messages, the encoding numbers, and the
// one error class of the subsystem.

import { errorMessage } from "../_internal/util.ts";

/** What an {@linkcode RfbError} is about. */
export type RfbErrorKind =
  | "protocol" // the server broke the protocol, or does not speak RFB
  | "security" // no security type both sides speak
  | "auth" // the server refused the password, or wants one that was not given
  | "closed"; // the connection ended

/** An RFB connection failed; `kind` says how. */
export class RfbError extends Error {
  /** What went wrong. */
  readonly kind: RfbErrorKind;

  /** Makes the error. */
  constructor(kind: RfbErrorKind, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RfbError";
    this.kind = kind;
  }
}

/** A byte stream to a VNC server: a `Deno.Conn`, or anything with these three calls. */
export interface RfbTransport {
  /** Reads into `p`; resolves to the count, or null at the end. */
  read(p: Uint8Array): Promise<number | null>;
  /** Writes from `p`; resolves to the count written. */
  write(p: Uint8Array): Promise<number>;
  /** Closes both directions. */
  close(): void;
}

/** How a pixel is laid out (RFC 6143 §7.4). */
export interface PixelFormat {
  bitsPerPixel: number;
  depth: number;
  bigEndian: boolean;
  trueColour: boolean;
  redMax: number;
  greenMax: number;
  blueMax: number;
  redShift: number;
  greenShift: number;
  blueShift: number;
}

/**
 * The format this client asks for: 32 bits, red in the lowest byte, so the
 * pixels' bytes in memory are R, G, B, X: RGBA with a padding byte, and
 * ZRLE's compact pixels are R, G, B.
 */
export const CLIENT_FORMAT: PixelFormat = {
  bitsPerPixel: 32,
  depth: 24,
  bigEndian: false,
  trueColour: true,
  redMax: 255,
  greenMax: 255,
  blueMax: 255,
  redShift: 0,
  greenShift: 8,
  blueShift: 16,
};

/** Encoding numbers (RFC 6143 §7.7, §7.8). */
export const Encoding = {
  RAW: 0,
  COPY_RECT: 1,
  ZRLE: 16,
  DESKTOP_SIZE: -223,
  LAST_RECT: -224,
  CURSOR: -239,
} as const;

/** Encoding names for messages. */
export const ENCODING_NAMES: Readonly<Record<number, string>> = {
  0: "Raw",
  1: "CopyRect",
  2: "RRE",
  5: "Hextile",
  6: "Zlib",
  7: "Tight",
  15: "TRLE",
  16: "ZRLE",
  [-223]: "DesktopSize",
  [-224]: "LastRect",
  [-239]: "Cursor",
  [-308]: "ExtendedDesktopSize",
};

/** Reads `n`-byte values from a transport, buffering, counting every byte. */
export class ByteReader {
  readonly #src: RfbTransport;
  #buf = new Uint8Array(64 * 1024);
  #start = 0;
  #end = 0;
  #total = 0;

  constructor(src: RfbTransport) {
    this.#src = src;
  }

  /** Every byte read from the transport so far. */
  get total(): number {
    return this.#total;
  }

  /** Bytes that arrived and were not taken yet. */
  get buffered(): number {
    return this.#end - this.#start;
  }

  /**
   * The next `n` bytes, as a view that holds until the next call.
   * @throws {RfbError} (kind "closed") when the stream ends first
   */
  async bytes(n: number): Promise<Uint8Array> {
    if (this.#end - this.#start < n) await this.#fill(n);
    const out = this.#buf.subarray(this.#start, this.#start + n);
    this.#start += n;
    return out;
  }

  /** The next `n` bytes, as a copy of their own. */
  async copy(n: number): Promise<Uint8Array> {
    return (await this.bytes(n)).slice();
  }

  async u8(): Promise<number> {
    return (await this.bytes(1))[0];
  }

  async u16(): Promise<number> {
    const b = await this.bytes(2);
    return (b[0] << 8) | b[1];
  }

  async u32(): Promise<number> {
    const b = await this.bytes(4);
    return ((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]) >>> 0;
  }

  async s32(): Promise<number> {
    const b = await this.bytes(4);
    return (b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
  }

  async #fill(n: number): Promise<void> {
    const have = this.#end - this.#start;
    if (this.#buf.length - this.#start < n) {
      // Move what is left to the front, into a larger buffer if needed.
      const next = n > this.#buf.length
        ? new Uint8Array(Math.max(n, this.#buf.length * 2))
        : this.#buf;
      next.set(this.#buf.subarray(this.#start, this.#end), 0);
      this.#buf = next;
      this.#start = 0;
      this.#end = have;
    }
    while (this.#end - this.#start < n) {
      let got: number | null;
      try {
        got = await this.#src.read(this.#buf.subarray(this.#end));
      } catch (err) {
        throw new RfbError("closed", `Cannot read from the VNC server: ${errorMessage(err)}`, {
          cause: err,
        });
      }
      if (got === null) {
        throw new RfbError("closed", "Cannot read from the VNC server: it closed the connection");
      }
      this.#end += got;
      this.#total += got;
    }
  }
}

/** A pixel format's 16 bytes. */
export function encodePixelFormat(f: PixelFormat): Uint8Array {
  const out = new Uint8Array(16);
  const v = new DataView(out.buffer);
  v.setUint8(0, f.bitsPerPixel);
  v.setUint8(1, f.depth);
  v.setUint8(2, f.bigEndian ? 1 : 0);
  v.setUint8(3, f.trueColour ? 1 : 0);
  v.setUint16(4, f.redMax);
  v.setUint16(6, f.greenMax);
  v.setUint16(8, f.blueMax);
  v.setUint8(10, f.redShift);
  v.setUint8(11, f.greenShift);
  v.setUint8(12, f.blueShift);
  return out;
}

/** A pixel format read from its 16 bytes. */
export function decodePixelFormat(b: Uint8Array): PixelFormat {
  const v = new DataView(b.buffer, b.byteOffset, 16);
  return {
    bitsPerPixel: v.getUint8(0),
    depth: v.getUint8(1),
    bigEndian: v.getUint8(2) !== 0,
    trueColour: v.getUint8(3) !== 0,
    redMax: v.getUint16(4),
    greenMax: v.getUint16(6),
    blueMax: v.getUint16(8),
    redShift: v.getUint8(10),
    greenShift: v.getUint8(11),
    blueShift: v.getUint8(12),
  };
}

/** SetPixelFormat (§7.5.1). */
export function setPixelFormat(f: PixelFormat): Uint8Array {
  const out = new Uint8Array(20);
  out[0] = 0;
  out.set(encodePixelFormat(f), 4);
  return out;
}

/** SetEncodings (§7.5.2). */
export function setEncodings(encodings: readonly number[]): Uint8Array {
  const out = new Uint8Array(4 + 4 * encodings.length);
  const v = new DataView(out.buffer);
  v.setUint8(0, 2);
  v.setUint16(2, encodings.length);
  encodings.forEach((e, i) => v.setInt32(4 + 4 * i, e));
  return out;
}

/** FramebufferUpdateRequest (§7.5.3). */
export function updateRequest(
  incremental: boolean,
  x: number,
  y: number,
  w: number,
  h: number,
): Uint8Array {
  const out = new Uint8Array(10);
  const v = new DataView(out.buffer);
  v.setUint8(0, 3);
  v.setUint8(1, incremental ? 1 : 0);
  v.setUint16(2, x);
  v.setUint16(4, y);
  v.setUint16(6, w);
  v.setUint16(8, h);
  return out;
}

/** KeyEvent (§7.5.4). */
export function keyEvent(down: boolean, keysym: number): Uint8Array {
  const out = new Uint8Array(8);
  const v = new DataView(out.buffer);
  v.setUint8(0, 4);
  v.setUint8(1, down ? 1 : 0);
  v.setUint32(4, keysym >>> 0);
  return out;
}

/** PointerEvent (§7.5.5). */
export function pointerEvent(buttons: number, x: number, y: number): Uint8Array {
  const out = new Uint8Array(6);
  const v = new DataView(out.buffer);
  v.setUint8(0, 5);
  v.setUint8(1, buttons);
  v.setUint16(2, x);
  v.setUint16(4, y);
  return out;
}

/** ClientCutText (§7.5.6): Latin-1 text; other characters become "?". */
export function clientCutText(text: string): Uint8Array {
  const out = new Uint8Array(8 + text.length);
  const v = new DataView(out.buffer);
  v.setUint8(0, 6);
  v.setUint32(4, text.length);
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    out[8 + i] = c <= 0xff ? c : 0x3f;
  }
  return out;
}

/** Latin-1 bytes as text (RFB's strings and cut text). */
export function latin1(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 8192) {
    s += String.fromCharCode(...bytes.subarray(i, i + 8192));
  }
  return s;
}
