// A ustar archive writer, enough for an image build context: regular files,
// directories and symbolic links, in memory.

const BLOCK = 512;
const encoder = new TextEncoder();

interface TarEntry {
  path: string;
  type: "file" | "dir" | "symlink";
  mode: number;
  data?: Uint8Array;
  target?: string;
}

function octal(value: number, width: number): string {
  return value.toString(8).padStart(width - 1, "0") + "\0";
}

function put(header: Uint8Array, offset: number, width: number, text: string): void {
  const bytes = encoder.encode(text);
  if (bytes.length > width) throw new RangeError(`Cannot archive: "${text}" is too long`);
  header.set(bytes, offset);
}

/** Splits a path into ustar's `prefix` (155) and `name` (100) fields. */
function splitPath(path: string): [string, string] {
  if (encoder.encode(path).length <= 100) return ["", path];
  for (let i = path.indexOf("/"); i >= 0; i = path.indexOf("/", i + 1)) {
    const prefix = path.slice(0, i);
    const name = path.slice(i + 1);
    if (encoder.encode(prefix).length <= 155 && encoder.encode(name).length <= 100) {
      return [prefix, name];
    }
  }
  throw new RangeError(`Cannot archive: path "${path}" is too long for a tar header`);
}

function header(entry: TarEntry): Uint8Array {
  const h = new Uint8Array(BLOCK);
  const [prefix, name] = splitPath(entry.path);
  put(h, 0, 100, name);
  put(h, 100, 8, octal(entry.mode, 8));
  put(h, 108, 8, octal(0, 8));
  put(h, 116, 8, octal(0, 8));
  put(h, 124, 12, octal(entry.data?.length ?? 0, 12));
  put(h, 136, 12, octal(0, 12));
  h.fill(0x20, 148, 156); // checksum field counts as spaces
  h[156] = entry.type === "file" ? 0x30 : entry.type === "dir" ? 0x35 : 0x32;
  if (entry.target !== undefined) put(h, 157, 100, entry.target);
  put(h, 257, 6, "ustar\0");
  put(h, 263, 2, "00");
  put(h, 345, 155, prefix);
  let sum = 0;
  for (const b of h) sum += b;
  put(h, 148, 8, sum.toString(8).padStart(6, "0") + "\0 ");
  return h;
}

/** Collects entries, then {@linkcode TarWriter.bytes} gives the archive. */
export class TarWriter {
  readonly #entries: TarEntry[] = [];
  readonly #seen = new Set<string>();

  /** Adds a directory (and is a no-op for one already added). */
  dir(path: string, mode = 0o755): void {
    const p = path.replace(/\/+$/, "") + "/";
    if (this.#seen.has(p)) return;
    this.#seen.add(p);
    this.#entries.push({ path: p, type: "dir", mode });
  }

  /** Adds a regular file, with its parent directories. */
  file(path: string, data: Uint8Array, mode = 0o644): void {
    this.#parents(path);
    this.#entries.push({ path, type: "file", mode, data });
  }

  /** Adds a symbolic link, with its parent directories. */
  symlink(path: string, target: string): void {
    this.#parents(path);
    this.#entries.push({ path, type: "symlink", mode: 0o777, target });
  }

  #parents(path: string): void {
    const parts = path.split("/").slice(0, -1);
    for (let i = 1; i <= parts.length; i++) this.dir(parts.slice(0, i).join("/"));
  }

  /** The archive. */
  bytes(): Uint8Array<ArrayBuffer> {
    let size = 2 * BLOCK;
    for (const e of this.#entries) size += BLOCK + Math.ceil((e.data?.length ?? 0) / BLOCK) * BLOCK;
    const out = new Uint8Array(size);
    let at = 0;
    for (const e of this.#entries) {
      out.set(header(e), at);
      at += BLOCK;
      if (e.data) {
        out.set(e.data, at);
        at += Math.ceil(e.data.length / BLOCK) * BLOCK;
      }
    }
    return out;
  }
}
