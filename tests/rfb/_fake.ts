// A scripted VNC server for the client's tests: each test writes the bytes
// a server would (or a broken or hostile one), over a real socket on
// 127.0.0.1, and reads what the client sent. Messages are built here from
// RFC 6143's layouts, independently of the client's own encoders.

import { tcpServer } from "../_helpers.ts";
import { ByteReader } from "../../rfb/_wire.ts";
import { writeAll } from "../../_internal/io.ts";

/** One scripted server: `port` to connect to, `done` when the script ends. */
export interface FakeServer extends AsyncDisposable {
  port: number;
  /** Resolves when the script returns; rejects with what it threw. */
  done: Promise<void>;
}

/** What a script gets: a reader and a writer of the accepted connection. */
export interface FakeIo {
  read: ByteReader;
  write(...parts: (Uint8Array | number[])[]): Promise<void>;
  conn: Deno.Conn;
}

/** Serves the first connection with `script`. */
export function fakeServer(script: (io: FakeIo) => Promise<void>): FakeServer {
  const done = Promise.withResolvers<void>();
  done.promise.catch(() => {});
  let first = true;
  const server = tcpServer(async (conn) => {
    if (!first) return;
    first = false;
    const io: FakeIo = {
      conn,
      read: new ByteReader(conn),
      write: (...parts) => writeAll(conn, bytes(...parts)),
    };
    try {
      await script(io);
      done.resolve();
    } catch (err) {
      done.reject(err);
    }
  });
  return {
    port: server.port,
    done: done.promise,
    async [Symbol.asyncDispose]() {
      await server.close();
    },
  };
}

export function bytes(...parts: (Uint8Array | number[])[]): Uint8Array {
  const arrays = parts.map((p) => p instanceof Uint8Array ? p : new Uint8Array(p));
  const out = new Uint8Array(arrays.reduce((n, a) => n + a.length, 0));
  let off = 0;
  for (const a of arrays) {
    out.set(a, off);
    off += a.length;
  }
  return out;
}

export function u16(n: number): number[] {
  return [(n >> 8) & 0xff, n & 0xff];
}

export function u32(n: number): number[] {
  return [(n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff];
}

export function text(s: string): number[] {
  return [...u32(s.length), ...new TextEncoder().encode(s)];
}

/** The server's 32-bit true-colour format (it does not matter: the client sets its own). */
const SERVER_FORMAT = [32, 24, 0, 1, ...u16(255), ...u16(255), ...u16(255), 16, 8, 0, 0, 0, 0];

/** ServerInit for a `width`×`height` desktop. */
export function serverInit(width: number, height: number, name = "fake"): number[] {
  return [...u16(width), ...u16(height), ...SERVER_FORMAT, ...text(name)];
}

/**
 * The handshake of a 3.8 server with security None, up to ServerInit.
 * Returns what the client sent after it: SetPixelFormat and SetEncodings.
 */
export async function accept38(
  io: FakeIo,
  width: number,
  height: number,
): Promise<{ format: Uint8Array; encodings: number[] }> {
  await io.write(new TextEncoder().encode("RFB 003.008\n"));
  await io.read.bytes(12);
  await io.write([1, 1]);
  await io.read.u8();
  await io.write(u32(0));
  await io.read.u8(); // ClientInit
  await io.write(serverInit(width, height));
  const type = await io.read.u8();
  if (type !== 0) throw new Error(`expected SetPixelFormat, got ${type}`);
  await io.read.bytes(3);
  const format = await io.read.copy(16);
  if (await io.read.u8() !== 2) throw new Error("expected SetEncodings");
  await io.read.u8();
  const n = await io.read.u16();
  const encodings: number[] = [];
  for (let i = 0; i < n; i++) encodings.push(await io.read.s32());
  return { format, encodings };
}

/** Reads (and drops) what the client sends until it closes the connection. */
export async function drain(io: FakeIo): Promise<void> {
  while (await io.read.bytes(1).then(() => true, () => false)) {
    // dropped
  }
}

/** Reads one FramebufferUpdateRequest: [incremental, x, y, w, h]. */
export async function readRequest(io: FakeIo): Promise<number[]> {
  const type = await io.read.u8();
  if (type !== 3) throw new Error(`expected FramebufferUpdateRequest, got message ${type}`);
  const incremental = await io.read.u8();
  return [
    incremental,
    await io.read.u16(),
    await io.read.u16(),
    await io.read.u16(),
    await io.read.u16(),
  ];
}

/** A rectangle's header. */
export function rect(x: number, y: number, w: number, h: number, encoding: number): number[] {
  return [...u16(x), ...u16(y), ...u16(w), ...u16(h), ...u32(encoding >>> 0)];
}

/** A FramebufferUpdate holding `count` rectangles (written after it). */
export function update(count: number): number[] {
  return [0, 0, ...u16(count)];
}

/** A Raw rectangle of one colour, in the client's format (R, G, B, X). */
export function rawRect(x: number, y: number, w: number, h: number, rgb: number[]): number[] {
  const out = rect(x, y, w, h, 0);
  for (let i = 0; i < w * h; i++) out.push(rgb[0], rgb[1], rgb[2], 0);
  return out;
}

/**
 * A zlib stream written as stored (uncompressed) blocks: each `part()` is
 * whole blocks ending on a byte boundary, as a sync flush leaves a real
 * stream, so a client must keep one inflater across parts to read it.
 */
export class StoredZlib {
  #started = false;

  part(data: Uint8Array): Uint8Array {
    const out: number[] = [];
    if (!this.#started) {
      out.push(0x78, 0x01);
      this.#started = true;
    }
    for (let off = 0; off < data.length || off === 0; off += 65535) {
      const block = data.subarray(off, off + 65535);
      out.push(
        0x00,
        block.length & 0xff,
        block.length >> 8,
        ~block.length & 0xff,
        (~block.length >> 8) & 0xff,
      );
      out.push(...block);
      if (data.length === 0) break;
    }
    return new Uint8Array(out);
  }
}
