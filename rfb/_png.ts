// PNG out of RGBA pixels (RFC 2083): 8-bit RGB, one IDAT, compressed by the
// web platform's CompressionStream("deflate"), which writes the zlib format
// PNG asks for. Rows are filtered with "Up" (each byte minus the one above),
// which turns the repeated rows of a screen into zeros; measured on desktop
// screenshots it gives smaller files than no filter for the same time.

const SIGNATURE = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

let crcTable: Uint32Array | null = null;

function crc32(parts: readonly Uint8Array[]): number {
  if (crcTable === null) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let crc = 0xffffffff;
  for (const p of parts) {
    for (let i = 0; i < p.length; i++) crc = crcTable[(crc ^ p[i]) & 0xff] ^ (crc >>> 8);
  }
  return (crc ^ 0xffffffff) >>> 0;
}

function chunk(type: string, data: Uint8Array): Uint8Array {
  const out = new Uint8Array(12 + data.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, data.length);
  const tag = new TextEncoder().encode(type);
  out.set(tag, 4);
  out.set(data, 8);
  view.setUint32(8 + data.length, crc32([tag, data]));
  return out;
}

async function deflate(data: Uint8Array<ArrayBuffer>): Promise<Uint8Array> {
  const stream = new Blob([data]).stream().pipeThrough(new CompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** The filtered scanlines of `rgba` as PNG's RGB rows, each led by its filter byte. */
function scanlines(rgba: Uint8Array, width: number, height: number): Uint8Array<ArrayBuffer> {
  const stride = width * 3 + 1;
  const out = new Uint8Array(stride * height);
  const row = new Uint8Array(width * 3);
  const above = new Uint8Array(width * 3);
  for (let y = 0; y < height; y++) {
    let s = y * width * 4;
    for (let x = 0, d = 0; x < width; x++, s += 4, d += 3) {
      row[d] = rgba[s];
      row[d + 1] = rgba[s + 1];
      row[d + 2] = rgba[s + 2];
    }
    const o = y * stride;
    out[o] = 2; // Up; the first row's "above" is zeros, as PNG defines it.
    for (let i = 0; i < row.length; i++) out[o + 1 + i] = row[i] - above[i];
    above.set(row);
  }
  return out;
}

/**
 * Encodes RGBA pixels as a PNG (RGB, 8 bits a channel; alpha is dropped).
 * @param rgba `width * height * 4` bytes, rows top to bottom
 * @param width the width in pixels
 * @param height the height in pixels
 * @returns the PNG file's bytes
 */
export async function encodePng(
  rgba: Uint8Array,
  width: number,
  height: number,
): Promise<Uint8Array> {
  const header = new Uint8Array(13);
  const view = new DataView(header.buffer);
  view.setUint32(0, width);
  view.setUint32(4, height);
  header[8] = 8; // bit depth
  header[9] = 2; // colour type: RGB
  const parts = [
    SIGNATURE,
    chunk("IHDR", header),
    chunk("IDAT", await deflate(scanlines(rgba, width, height))),
    chunk("IEND", new Uint8Array()),
  ];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/**
 * Scales RGBA pixels to another size, averaging the source pixels each
 * target pixel covers (nearest pixel when enlarging): what a model that
 * expects a smaller screen sees.
 * @returns `dw * dh * 4` bytes
 */
export function scaleRgba(
  rgba: Uint8Array,
  sw: number,
  sh: number,
  dw: number,
  dh: number,
): Uint8Array {
  if (sw === dw && sh === dh) return rgba;
  const out = new Uint8Array(dw * dh * 4);
  for (let y = 0; y < dh; y++) {
    const y0 = Math.floor((y * sh) / dh);
    const y1 = Math.max(y0 + 1, Math.floor(((y + 1) * sh) / dh));
    for (let x = 0; x < dw; x++) {
      const x0 = Math.floor((x * sw) / dw);
      const x1 = Math.max(x0 + 1, Math.floor(((x + 1) * sw) / dw));
      let r = 0, g = 0, b = 0;
      for (let yy = y0; yy < y1; yy++) {
        for (let xx = x0, s = (yy * sw + x0) * 4; xx < x1; xx++, s += 4) {
          r += rgba[s];
          g += rgba[s + 1];
          b += rgba[s + 2];
        }
      }
      const n = (y1 - y0) * (x1 - x0);
      const d = (y * dw + x) * 4;
      out[d] = Math.round(r / n);
      out[d + 1] = Math.round(g / n);
      out[d + 2] = Math.round(b / n);
      out[d + 3] = 255;
    }
  }
  return out;
}
