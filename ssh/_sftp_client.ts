// The client side of SFTP version 3 over one session channel: requests
// multiplexed by id, so several calls share the channel; whole-file reads
// and writes pipelined (many requests in flight) at streaming speed.

import type { Channel, ChannelMux } from "./_channel.ts";
import { SshError, SshFileError } from "./_errors.ts";
import {
  ByteQueue,
  FX,
  FXP,
  MAX_DATA,
  OPEN_FLAGS,
  readAttrs,
  type SftpAttrs,
  writeAttrs,
} from "./_sftp_wire.ts";
import { SshReader, SshWriter } from "./_wire.ts";

/** Requests in flight per transfer. */
const PIPELINE = 32;
/** Request size without the limits extension (what every server takes). */
const DEFAULT_CHUNK = 32768;
/** Largest reply we accept. */
const MAX_REPLY = 256 * 1024 + 1024;

export const S_IFMT = 0o170000;
export const S_IFDIR = 0o040000;
export const S_IFREG = 0o100000;
export const S_IFLNK = 0o120000;

interface Reply {
  type: number;
  r: SshReader;
}

/** One SFTP session. */
export class SftpClient {
  readonly #channel: Channel;
  readonly #pending = new Map<number, { resolve(r: Reply): void; reject(e: Error): void }>();
  #nextId = 1;
  readonly #queue = new ByteQueue();
  #out: Promise<void> = Promise.resolve();
  #closedErr: Error | null = null;
  #version: ((r: Reply) => void) | null = null;
  #extensions = new Map<string, string>();
  #readChunk = DEFAULT_CHUNK;
  #writeChunk = DEFAULT_CHUNK;

  constructor(channel: Channel) {
    this.#channel = channel;
  }

  /** Opens a session channel and starts SFTP; null when the server refuses the subsystem. */
  static async open(mux: ChannelMux): Promise<SftpClient | null> {
    let client: SftpClient | null = null;
    const channel = await mux.open("session", {
      onData: (data, ext) => {
        if (ext !== 0 || client === null) return channel.consumed(data.length);
        client.#receive(data);
      },
      onEof: () => {
        if (client !== null) client.#fail(new SshError("Cannot use SFTP: the server ended it"));
      },
      onClose: () => {
        if (client !== null) client.#fail(new SshError("Cannot use SFTP: the channel closed"));
      },
      onRequest: () => false,
    });
    client = new SftpClient(channel);
    if (!(await channel.request("subsystem", true, (w) => w.string("sftp")))) {
      channel.close();
      await channel.closed;
      return null;
    }
    const version = new Promise<Reply>((resolve) => client!.#version = resolve);
    client.#send(new SshWriter(16).byte(FXP.INIT).uint32(3));
    const v = await Promise.race([
      version,
      channel.closed.then(() => null),
    ]);
    if (v === null || v.type !== FXP.VERSION) {
      channel.close();
      return null;
    }
    v.r.uint32();
    while (v.r.remaining > 0) client.#extensions.set(v.r.text(), v.r.text());
    if (client.#extensions.has("limits@openssh.com")) await client.#askLimits();
    return client;
  }

  /** Reads and writes as large as the server's limits extension allows. */
  async #askLimits(): Promise<void> {
    try {
      const lim = await this.#request(FXP.EXTENDED, (w) => w.string("limits@openssh.com"), "");
      if (lim.type === FXP.EXTENDED_REPLY) {
        lim.r.uint64();
        const read = Number(lim.r.uint64());
        const write = Number(lim.r.uint64());
        if (read > 0) this.#readChunk = Math.min(read, MAX_DATA);
        if (write > 0) this.#writeChunk = Math.min(write, MAX_DATA);
      }
    } catch {
      // keep the defaults
    }
  }

  /** Whether the session still works. */
  get usable(): boolean {
    return this.#closedErr === null;
  }

  /** Ends the session. */
  async close(): Promise<void> {
    this.#fail(new SshError("Cannot use SFTP: closed"));
    this.#channel.close();
    await this.#channel.closed;
  }

  #fail(err: Error): void {
    this.#closedErr ??= err;
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
  }

  #receive(data: Uint8Array): void {
    this.#queue.push(data);
    while (this.#queue.length >= 4) {
      const head = this.#queue.take(4, false);
      const len = new DataView(head.buffer, head.byteOffset, 4).getUint32(0);
      if (len < 5 || len > MAX_REPLY) {
        this.#fail(new SshError(`Cannot use SFTP: bad reply length "${len}"`));
        this.#channel.close();
        return;
      }
      if (this.#queue.length < 4 + len) return;
      this.#queue.take(4, true);
      const msg = this.#queue.take(len, true);
      this.#channel.consumed(4 + len);
      this.#dispatch(msg);
    }
  }

  #dispatch(msg: Uint8Array): void {
    const type = msg[0];
    const r = new SshReader(msg, 1);
    if (type === FXP.VERSION) {
      this.#version?.({ type, r });
      this.#version = null;
      return;
    }
    try {
      const id = r.uint32();
      const p = this.#pending.get(id);
      if (p === undefined) return;
      this.#pending.delete(id);
      p.resolve({ type, r });
    } catch {
      // A reply too short to carry an id: nothing waits for it.
    }
  }

  #send(w: SshWriter): void {
    const body = w.bytes();
    const msg = new Uint8Array(4 + body.length);
    new DataView(msg.buffer).setUint32(0, body.length);
    msg.set(body, 4);
    // One message at a time: a channel write may be split into packets.
    this.#out = this.#out.then(() => this.#channel.write(msg, 0, true)).catch(() => {});
  }

  /** Sends a request; the reply, or a rejection when the session dies. */
  #request(type: number, build: (w: SshWriter) => void, path: string): Promise<Reply> {
    if (this.#closedErr !== null) return Promise.reject(this.#closedErr);
    const id = this.#nextId;
    this.#nextId = (this.#nextId + 1) >>> 0 || 1;
    const w = new SshWriter(64).byte(type).uint32(id);
    build(w);
    const reply = new Promise<Reply>((resolve, reject) =>
      this.#pending.set(id, { resolve, reject })
    );
    this.#send(w);
    return reply.catch((err) => {
      throw new SshError(`Cannot ${describe(type)} "${path}": ${err.message}`, { cause: err });
    });
  }

  /** Fails with SshFileError unless the reply is `want` (or STATUS OK when `want` is STATUS). */
  #expect(rep: Reply, want: number, what: string, path: string): SshReader {
    if (rep.type === FXP.STATUS) {
      const code = rep.r.uint32();
      const message = rep.r.text();
      if (want === FXP.STATUS && code === FX.OK) return rep.r;
      throw new SshFileError(
        `Cannot ${what} "${path}": ${message || statusName(code)}`,
        code,
        path,
      );
    }
    if (rep.type !== want) {
      throw new SshError(`Cannot ${what} "${path}": unexpected SFTP reply "${rep.type}"`);
    }
    return rep.r;
  }

  async #simple(type: number, what: string, path: string, build: (w: SshWriter) => void) {
    const rep = await this.#request(type, build, path);
    this.#expect(rep, FXP.STATUS, what, path);
  }

  async #open(path: string, pflags: number, attrs: SftpAttrs = {}): Promise<Uint8Array> {
    const rep = await this.#request(
      FXP.OPEN,
      (w) => writeAttrs(w.string(path).uint32(pflags), attrs),
      path,
    );
    return this.#expect(rep, FXP.HANDLE, "open", path).string().slice();
  }

  async #closeHandle(handle: Uint8Array, path: string): Promise<void> {
    await this.#simple(FXP.CLOSE, "close", path, (w) => w.string(handle));
  }

  /** Reads a whole file, many reads in flight. */
  async readFile(path: string): Promise<Uint8Array> {
    const handle = await this.#open(path, OPEN_FLAGS.READ);
    try {
      const { pieces, eofAt } = await this.#readPieces(handle, path);
      return assemble(pieces, eofAt, path);
    } finally {
      await this.#closeHandle(handle, path).catch(() => {});
    }
  }

  /**
   * Reads `handle` to its end in chunks, PIPELINE lanes at once, each lane
   * taking the next chunk; a short read asks again for the rest.
   * @returns the pieces read, by offset, and where the file ended
   */
  async #readPieces(
    handle: Uint8Array,
    path: string,
  ): Promise<{ pieces: Map<number, Uint8Array>; eofAt: number }> {
    const pieces = new Map<number, Uint8Array>();
    let eofAt = Infinity;
    let next = 0;
    let failure: unknown = null;
    const chunk = this.#readChunk;
    const readAt = async (offset: number, len: number): Promise<void> => {
      while (len > 0 && offset < eofAt && failure === null) {
        const rep = await this.#request(
          FXP.READ,
          (w) => w.string(handle).uint64(BigInt(offset)).uint32(len),
          path,
        );
        if (this.#isEof(rep, "read", path)) {
          eofAt = Math.min(eofAt, offset);
          return;
        }
        const data = this.#expect(rep, FXP.DATA, "read", path).string();
        pieces.set(offset, data);
        offset += data.length;
        len -= data.length;
      }
    };
    const lane = async () => {
      while (failure === null && next < eofAt) {
        const offset = next;
        next += chunk;
        await readAt(offset, chunk).catch((err) => failure ??= err);
      }
    };
    await Promise.all(Array.from({ length: PIPELINE }, lane));
    if (failure !== null) throw failure;
    return { pieces, eofAt };
  }

  /** Whether `rep` is STATUS EOF; throws for any other status. */
  #isEof(rep: Reply, what: string, path: string): boolean {
    if (rep.type !== FXP.STATUS) return false;
    const code = rep.r.uint32();
    const message = rep.r.text();
    if (code === FX.EOF) return true;
    throw new SshFileError(`Cannot ${what} "${path}": ${message || statusName(code)}`, code, path);
  }

  /** Writes a whole file (created or truncated), many writes in flight. */
  async writeFile(
    path: string,
    data: Uint8Array | ReadableStream<Uint8Array>,
    mode = 0o644,
  ): Promise<void> {
    const handle = await this.#open(
      path,
      OPEN_FLAGS.WRITE | OPEN_FLAGS.CREAT | OPEN_FLAGS.TRUNC,
      { permissions: mode },
    );
    const inflight = new Set<Promise<void>>();
    let failure: unknown = null;
    let offset = 0;
    const chunk = this.#writeChunk;
    const put = async (bytes: Uint8Array) => {
      for (let i = 0; i < bytes.length && failure === null; i += chunk) {
        const part = bytes.subarray(i, i + chunk);
        const at = offset;
        offset += part.length;
        const p = this.#request(
          FXP.WRITE,
          (w) => w.string(handle).uint64(BigInt(at)).string(part),
          path,
        ).then((rep) => {
          this.#expect(rep, FXP.STATUS, "write", path);
        }).catch((err) => {
          failure ??= err;
        });
        inflight.add(p);
        p.finally(() => inflight.delete(p));
        if (inflight.size >= PIPELINE) await Promise.race(inflight);
      }
    };
    try {
      for await (const part of data instanceof Uint8Array ? [data] : data) {
        await put(part);
        if (failure !== null) break;
      }
      await Promise.all(inflight);
      if (failure !== null) throw failure;
    } finally {
      await Promise.all(inflight);
      const closing = this.#closeHandle(handle, path);
      if (failure === null) await closing;
      else await closing.catch(() => {});
    }
  }

  /** Lists a directory (without `.` and `..`). */
  async listDir(path: string): Promise<{ name: string; attrs: SftpAttrs }[]> {
    const rep = await this.#request(FXP.OPENDIR, (w) => w.string(path), path);
    const handle = this.#expect(rep, FXP.HANDLE, "list", path).string().slice();
    const out: { name: string; attrs: SftpAttrs }[] = [];
    try {
      while (true) {
        const page = await this.#request(FXP.READDIR, (w) => w.string(handle), path);
        if (this.#isEof(page, "list", path)) break;
        const r = this.#expect(page, FXP.NAME, "list", path);
        const n = r.uint32();
        for (let i = 0; i < n; i++) {
          const name = r.text();
          r.string();
          const attrs = readAttrs(r);
          if (name !== "." && name !== "..") out.push({ name, attrs });
        }
      }
    } finally {
      await this.#closeHandle(handle, path).catch(() => {});
    }
    return out;
  }

  /** stat (follow = true) or lstat. */
  async stat(path: string, follow: boolean): Promise<SftpAttrs> {
    const rep = await this.#request(follow ? FXP.STAT : FXP.LSTAT, (w) => w.string(path), path);
    return readAttrs(this.#expect(rep, FXP.ATTRS, "stat", path));
  }

  remove(path: string): Promise<void> {
    return this.#simple(FXP.REMOVE, "remove", path, (w) => w.string(path));
  }

  rmdir(path: string): Promise<void> {
    return this.#simple(FXP.RMDIR, "remove", path, (w) => w.string(path));
  }

  mkdir(path: string): Promise<void> {
    return this.#simple(FXP.MKDIR, "create directory", path, (w) => writeAttrs(w.string(path), {}));
  }

  /** Renames, replacing `to` when the server has posix-rename (OpenSSH does). */
  rename(from: string, to: string): Promise<void> {
    if (this.#extensions.has("posix-rename@openssh.com")) {
      return this.#simple(
        FXP.EXTENDED,
        "rename",
        from,
        (w) => w.string("posix-rename@openssh.com").string(from).string(to),
      );
    }
    return this.#simple(FXP.RENAME, "rename", from, (w) => w.string(from).string(to));
  }
}

/**
 * The file from the pieces read (by offset), cut at `eofAt`.
 * @throws {SshError} when the server skipped bytes
 */
function assemble(pieces: Map<number, Uint8Array>, eofAt: number, path: string): Uint8Array {
  const offsets = [...pieces.keys()].filter((o) => o < eofAt).sort((a, b) => a - b);
  let size = 0;
  for (const o of offsets) {
    if (o !== size) {
      throw new SshError(`Cannot read "${path}": the server skipped bytes at ${size}`);
    }
    size += Math.min(pieces.get(o)!.length, eofAt - o);
  }
  const out = new Uint8Array(size);
  for (const o of offsets) {
    const p = pieces.get(o)!;
    out.set(p.subarray(0, Math.min(p.length, size - o)), o);
  }
  return out;
}

function describe(type: number): string {
  switch (type) {
    case FXP.OPEN:
      return "open";
    case FXP.READ:
      return "read";
    case FXP.WRITE:
      return "write";
    case FXP.OPENDIR:
    case FXP.READDIR:
      return "list";
    default:
      return "access";
  }
}

function statusName(code: number): string {
  const names: Record<number, string> = {
    [FX.EOF]: "end of file",
    [FX.NO_SUCH_FILE]: "no such file",
    [FX.PERMISSION_DENIED]: "permission denied",
    [FX.FAILURE]: "failure",
    [FX.BAD_MESSAGE]: "bad message",
    [FX.OP_UNSUPPORTED]: "operation unsupported",
  };
  return names[code] ?? `status ${code}`;
}
