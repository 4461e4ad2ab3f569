// A PNG reader for the tests (8-bit RGB or RGBA, any of the five filters),
// written from RFC 2083 apart from the library's encoder, to check what it
// writes; ImageMagick checks it too where it is installed.

export interface DecodedPng {
  width: number;
  height: number;
  /** RGB, 3 bytes a pixel. */
  rgb: Uint8Array;
}

export async function decodePng(png: Uint8Array): Promise<DecodedPng> {
  const signature = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
  if (!signature.every((b, i) => png[i] === b)) throw new Error("not a PNG");
  const view = new DataView(png.buffer, png.byteOffset, png.byteLength);
  let off = 8;
  let width = 0, height = 0, channels = 0;
  const idat: Uint8Array[] = [];
  while (off < png.length) {
    const length = view.getUint32(off);
    const type = new TextDecoder().decode(png.subarray(off + 4, off + 8));
    const data = png.subarray(off + 8, off + 8 + length);
    if (type === "IHDR") {
      width = view.getUint32(off + 8);
      height = view.getUint32(off + 12);
      if (data[8] !== 8) throw new Error(`bit depth ${data[8]}`);
      channels = data[9] === 2 ? 3 : data[9] === 6 ? 4 : 0;
      if (channels === 0) throw new Error(`colour type ${data[9]}`);
    } else if (type === "IDAT") idat.push(data);
    off += 12 + length;
  }
  const stream = new Blob(idat as Uint8Array<ArrayBuffer>[]).stream()
    .pipeThrough(new DecompressionStream("deflate"));
  const raw = new Uint8Array(await new Response(stream).arrayBuffer());
  const stride = width * channels;
  const rgb = new Uint8Array(width * height * 3);
  let prev = new Uint8Array(stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.slice(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? line[i - channels] : 0;
      const b = prev[i];
      const c = i >= channels ? prev[i - channels] : 0;
      let add = 0;
      if (filter === 1) add = a;
      else if (filter === 2) add = b;
      else if (filter === 3) add = (a + b) >> 1;
      else if (filter === 4) {
        const p = a + b - c;
        const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
        add = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      } else if (filter !== 0) throw new Error(`filter ${filter}`);
      line[i] = (line[i] + add) & 0xff;
    }
    for (let x = 0; x < width; x++) {
      rgb.set(line.subarray(x * channels, x * channels + 3), (y * width + x) * 3);
    }
    prev = line;
  }
  return { width, height, rgb };
}

/** The RGB of pixel (x, y). */
export function pixel(png: DecodedPng, x: number, y: number): number[] {
  const i = (y * png.width + x) * 3;
  return [...png.rgb.subarray(i, i + 3)];
}
