// The client's copy of the screen and the FramebufferUpdate decoders (RFC
// 6143 §7.6.1, §7.7, §7.8): Raw, CopyRect, ZRLE, and the DesktopSize,
// LastRect and Cursor pseudo-encodings. Every rectangle is checked against
// the framebuffer, and every length against a bound, before anything is
// allocated or read for it.
//
// Pixels are kept as RGBA bytes (the client's pixel format puts red in the
// lowest byte; see CLIENT_FORMAT), and filled through a 32-bit view of the
// same memory, which is little-endian on every platform Deno runs on.

import { type ByteReader, Encoding, ENCODING_NAMES, RfbError } from "./_wire.ts";
import { InflateError, type Inflater } from "./_zlib.ts";

const OPAQUE = 0xff000000;

/** The screen as this client last heard of it. */
export class Framebuffer {
  #width: number;
  #height: number;
  #rgba: Uint8Array;
  #u32: Uint32Array;

  constructor(width: number, height: number) {
    this.#width = width;
    this.#height = height;
    this.#rgba = new Uint8Array(width * height * 4);
    this.#u32 = new Uint32Array(this.#rgba.buffer);
    this.#u32.fill(OPAQUE);
  }

  get width(): number {
    return this.#width;
  }

  get height(): number {
    return this.#height;
  }

  /** The pixels, RGBA, rows top to bottom (live: copy to keep). */
  get rgba(): Uint8Array {
    return this.#rgba;
  }

  /** The pixels as 32-bit values (0xAABBGGRR). */
  get u32(): Uint32Array {
    return this.#u32;
  }

  /** Starts over at a new size, black. */
  resize(width: number, height: number): void {
    this.#width = width;
    this.#height = height;
    this.#rgba = new Uint8Array(width * height * 4);
    this.#u32 = new Uint32Array(this.#rgba.buffer);
    this.#u32.fill(OPAQUE);
  }

  fill(x: number, y: number, w: number, h: number, pixel: number): void {
    for (let row = y; row < y + h; row++) {
      const start = row * this.#width + x;
      this.#u32.fill(pixel, start, start + w);
    }
  }

  /** Copies `w`×`h` pixels from (sx, sy) to (x, y); the areas may overlap. */
  copy(sx: number, sy: number, x: number, y: number, w: number, h: number): void {
    const rows = sy < y ? [...Array(h).keys()].reverse() : [...Array(h).keys()];
    for (const r of rows) {
      const from = (sy + r) * this.#width + sx;
      this.#u32.copyWithin((y + r) * this.#width + x, from, from + w);
    }
  }
}

/** What the client keeps between updates besides the framebuffer. */
export interface DecoderState {
  fb: Framebuffer;
  /** ZRLE's zlib stream, one per connection. */
  zrle: Inflater;
  /** The most pixels the desktop may have. */
  maxPixels: number;
  /** The cursor shape the server sent last, if any. */
  cursor: CursorShape | null;
}

/** The pointer's shape, which servers send instead of drawing it into the screen. */
export interface CursorShape {
  /** The hot spot's column. */
  x: number;
  /** The hot spot's row. */
  y: number;
  /** The shape's width in pixels. */
  width: number;
  /** The shape's height in pixels. */
  height: number;
  /** RGBA, alpha 0 where the mask says transparent. */
  rgba: Uint8Array;
}

/** What one FramebufferUpdate held. */
export interface UpdateStats {
  /** Rectangles that changed pixels (pseudo-encodings not counted). */
  rects: number;
  /** Pixels they covered. */
  pixels: number;
  /** Whether the desktop changed size. */
  resized: boolean;
  /** Whether a rectangle covered pixel (0, 0), which a refresh asks for in full. */
  origin: boolean;
}

function bad(message: string): RfbError {
  return new RfbError("protocol", `Cannot read framebuffer update: ${message}`);
}

function checkInside(fb: Framebuffer, x: number, y: number, w: number, h: number, what: string) {
  if (x + w > fb.width || y + h > fb.height) {
    throw bad(`${what} ${w}x${h} at (${x}, ${y}) lies outside the ${fb.width}x${fb.height} screen`);
  }
}

/** Checks a desktop size against the bound; returns its pixel count. */
export function checkSize(width: number, height: number, maxPixels: number): number {
  if (width === 0 || height === 0 || width * height > maxPixels) {
    throw bad(
      `the server's desktop is ${width}x${height}, outside the bound of 1 to ${maxPixels} pixels (maxPixels)`,
    );
  }
  return width * height;
}

async function rawRect(r: ByteReader, fb: Framebuffer, x: number, y: number, w: number, h: number) {
  const stride = fb.width * 4;
  const rowBytes = w * 4;
  // Row by row, so that no more than the rectangle is ever buffered at once.
  const rows = Math.max(1, Math.min(h, Math.floor((256 * 1024) / Math.max(1, rowBytes))));
  for (let done = 0; done < h; done += rows) {
    const n = Math.min(rows, h - done);
    const data = await r.bytes(n * rowBytes);
    for (let i = 0; i < n; i++) {
      const dest = (y + done + i) * stride + x * 4;
      fb.rgba.set(data.subarray(i * rowBytes, (i + 1) * rowBytes), dest);
      for (let a = dest + 3; a < dest + rowBytes; a += 4) fb.rgba[a] = 255;
    }
  }
}

/** The most bytes a ZRLE rectangle may decompress to: every tile raw, or run-length at worst. */
function zrleBound(w: number, h: number): number {
  const tiles = Math.ceil(w / 64) * Math.ceil(h / 64);
  return 4 * w * h + tiles * (1 + 127 * 3);
}

/** Where a ZRLE tile's decoding is: the decompressed bytes and the position in them. */
interface TileReader {
  d: Uint8Array;
  p: number;
}

/** A compact pixel (R, G, B) at the reader's position, as a 32-bit pixel. */
function cpixel(t: TileReader): number {
  const { d, p } = t;
  t.p += 3;
  return d[p] | (d[p + 1] << 8) | (d[p + 2] << 16) | OPAQUE;
}

/** A run length: 1 plus the bytes that follow, through the first one under 255; null at the end. */
function runLength(t: TileReader): number | null {
  let n = 1;
  for (;;) {
    if (t.p >= t.d.length) return null;
    const b = t.d[t.p++];
    n += b;
    if (b !== 255) return n;
  }
}

/** One ZRLE tile (subencoding, then data) at (tx, ty); false when the data ends early. */
function zrleTile(
  t: TileReader,
  fb: Framebuffer,
  tx: number,
  ty: number,
  tw: number,
  th: number,
  palette: Uint32Array,
): boolean {
  const sub = t.d[t.p++];
  const left = () => t.d.length - t.p;
  if (sub === 0) {
    if (left() < tw * th * 3) return false;
    for (let row = 0; row < th; row++) {
      let o = (ty + row) * fb.width + tx;
      for (let col = 0; col < tw; col++) fb.u32[o++] = cpixel(t);
    }
    return true;
  }
  if (sub === 1) {
    if (left() < 3) return false;
    fb.fill(tx, ty, tw, th, cpixel(t));
    return true;
  }
  const size = sub <= 16 ? sub : sub >= 130 ? sub - 128 : sub === 128 ? 0 : -1;
  if (size < 0) throw bad(`unknown ZRLE subencoding ${sub}`);
  if (left() < size * 3) return false;
  for (let i = 0; i < size; i++) palette[i] = cpixel(t);
  return sub <= 16
    ? packedTile(t, fb, tx, ty, tw, th, palette, size)
    : runTile(t, fb, tx, ty, tw, th, palette, size);
}

/** A packed-palette tile's indices: 1, 2 or 4 bits a pixel, rows padded to a byte. */
function packedTile(
  t: TileReader,
  fb: Framebuffer,
  tx: number,
  ty: number,
  tw: number,
  th: number,
  palette: Uint32Array,
  size: number,
): boolean {
  const bits = size === 2 ? 1 : size <= 4 ? 2 : 4;
  const rowBytes = Math.ceil((tw * bits) / 8);
  if (t.d.length - t.p < rowBytes * th) return false;
  const mask = (1 << bits) - 1;
  for (let row = 0; row < th; row++) {
    let o = (ty + row) * fb.width + tx;
    for (let col = 0; col < tw; col++) {
      const bit = col * bits;
      const index = (t.d[t.p + (bit >> 3)] >> (8 - bits - (bit & 7))) & mask;
      if (index >= size) throw bad(`a ZRLE palette index ${index} past its ${size} colours`);
      fb.u32[o++] = palette[index];
    }
    t.p += rowBytes;
  }
  return true;
}

/** A run-length tile: plain (`size` 0, a pixel per run) or with a palette of `size`. */
function runTile(
  t: TileReader,
  fb: Framebuffer,
  tx: number,
  ty: number,
  tw: number,
  th: number,
  palette: Uint32Array,
  size: number,
): boolean {
  const total = tw * th;
  for (let done = 0; done < total;) {
    let colour: number;
    let run: number | null = 1;
    if (size === 0) {
      if (t.d.length - t.p < 3) return false;
      colour = cpixel(t);
      run = runLength(t);
    } else {
      if (t.p >= t.d.length) return false;
      const index = t.d[t.p++];
      if ((index & 127) >= size) {
        throw bad(`a ZRLE palette index ${index & 127} past its ${size} colours`);
      }
      colour = palette[index & 127];
      if (index & 128) run = runLength(t);
    }
    if (run === null) return false;
    if (done + run > total) throw bad("a ZRLE run goes past the end of its tile");
    for (let i = 0; i < run; i++, done++) {
      fb.u32[(ty + Math.floor(done / tw)) * fb.width + tx + (done % tw)] = colour;
    }
  }
  return true;
}

/** A ZRLE rectangle's tiles, from its decompressed bytes; how many it used, or null when they end early. */
function zrleTiles(
  d: Uint8Array,
  fb: Framebuffer,
  x: number,
  y: number,
  w: number,
  h: number,
): number | null {
  const t: TileReader = { d, p: 0 };
  const palette = new Uint32Array(128);
  for (let ty = y; ty < y + h; ty += 64) {
    for (let tx = x; tx < x + w; tx += 64) {
      if (t.p >= d.length) return null;
      const tw = Math.min(64, x + w - tx);
      const th = Math.min(64, y + h - ty);
      if (!zrleTile(t, fb, tx, ty, tw, th, palette)) return null;
    }
  }
  return t.p;
}

async function zrleRect(
  r: ByteReader,
  s: DecoderState,
  x: number,
  y: number,
  w: number,
  h: number,
) {
  const bound = zrleBound(w, h);
  const length = await r.u32();
  // Incompressible data grows a little in zlib; anything past that is no ZRLE.
  const maxCompressed = bound + (bound >>> 8) + 1024;
  if (length > maxCompressed) {
    throw bad(
      `a ZRLE rectangle of ${w}x${h} claims ${length} bytes, over the ${maxCompressed} it may take`,
    );
  }
  const compressed = await r.copy(length);
  let data: Uint8Array;
  try {
    data = await s.zrle.inflate(compressed, bound);
    let used = zrleTiles(data, s.fb, x, y, w, h);
    if (used === null) {
      await s.zrle.settle();
      const late = s.zrle.take();
      const all = new Uint8Array(data.length + late.length);
      all.set(data);
      all.set(late, data.length);
      data = all;
      used = zrleTiles(data, s.fb, x, y, w, h);
    }
    if (used === null) throw bad(`ZRLE data ends inside the ${w}x${h} rectangle at (${x}, ${y})`);
    if (used !== data.length) {
      throw bad(`ZRLE data runs ${data.length - used} bytes past the rectangle at (${x}, ${y})`);
    }
  } catch (err) {
    if (err instanceof InflateError) throw bad(`ZRLE ${err.message}`);
    throw err;
  }
}

async function cursorRect(
  r: ByteReader,
  s: DecoderState,
  x: number,
  y: number,
  w: number,
  h: number,
) {
  if (w * h > 1024 * 1024) throw bad(`a cursor of ${w}x${h} is over the 1024x1024 allowed`);
  const pixels = await r.copy(w * h * 4);
  const mask = await r.bytes(Math.ceil(w / 8) * h);
  const maskRow = Math.ceil(w / 8);
  for (let i = 0; i < w * h; i++) {
    const row = Math.floor(i / w);
    const col = i % w;
    const visible = (mask[row * maskRow + (col >> 3)] >> (7 - (col & 7))) & 1;
    pixels[i * 4 + 3] = visible ? 255 : 0;
  }
  s.cursor = { x, y, width: w, height: h, rgba: pixels };
}

/**
 * Reads one FramebufferUpdate after its message type byte, into `s.fb`.
 * @throws {RfbError} "protocol" for a rectangle outside the screen, an
 *   encoding not asked for, a size past a bound, or data that does not decode
 */
export async function readUpdate(r: ByteReader, s: DecoderState): Promise<UpdateStats> {
  await r.bytes(1); // padding
  const count = await r.u16();
  const stats: UpdateStats = { rects: 0, pixels: 0, resized: false, origin: false };
  for (let i = 0; i < count; i++) {
    const head = await r.bytes(12);
    const v = new DataView(head.buffer, head.byteOffset, 12);
    const x = v.getUint16(0), y = v.getUint16(2), w = v.getUint16(4), h = v.getUint16(6);
    const encoding = v.getInt32(8);
    switch (encoding) {
      case Encoding.RAW:
        checkInside(s.fb, x, y, w, h, "a Raw rectangle");
        await rawRect(r, s.fb, x, y, w, h);
        break;
      case Encoding.COPY_RECT: {
        checkInside(s.fb, x, y, w, h, "a CopyRect rectangle");
        const sx = await r.u16();
        const sy = await r.u16();
        checkInside(s.fb, sx, sy, w, h, "a CopyRect source");
        s.fb.copy(sx, sy, x, y, w, h);
        break;
      }
      case Encoding.ZRLE:
        checkInside(s.fb, x, y, w, h, "a ZRLE rectangle");
        await zrleRect(r, s, x, y, w, h);
        break;
      case Encoding.DESKTOP_SIZE:
        checkSize(w, h, s.maxPixels);
        s.fb.resize(w, h);
        stats.resized = true;
        continue;
      case Encoding.LAST_RECT:
        return stats;
      case Encoding.CURSOR:
        await cursorRect(r, s, x, y, w, h);
        continue;
      default:
        throw bad(
          `the server sent encoding ${encoding} (${
            ENCODING_NAMES[encoding] ?? "unknown"
          }), which this client did not ask for`,
        );
    }
    stats.rects++;
    stats.pixels += w * h;
    if (x === 0 && y === 0 && w > 0 && h > 0) stats.origin = true;
  }
  return stats;
}
