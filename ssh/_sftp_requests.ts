// The SFTP server's request table (`_sftp.ts` frames, orders and answers):
// one function per request type of SFTP version 3, and per OpenSSH
// extension, each a function of the session's context, the request id and
// its reader, as `_server/dispatcher.ts` does for the control session. A
// handler replies, or throws; the server turns what it throws into a STATUS
// reply in one place (`statusOf`).

import { type SshReader, SshWriter } from "./_wire.ts";
import {
  FX,
  FXP,
  MAX_DATA,
  MAX_MESSAGE,
  OPEN_FLAGS,
  readAttrs,
  type SftpAttrs,
  writeAttrs,
} from "./_sftp_wire.ts";
import { attrsOf, denied, longName, SftpStatus } from "./_sftp_fs.ts";
import type { SftpPaths } from "./_sftp_paths.ts";
import { exists } from "../_internal/fs.ts";

/** Open handles a session may hold. */
const MAX_HANDLES = 256;
/** Directory entries per READDIR reply. */
const DIR_BATCH = 100;
/** Mode bits a client may set: no setuid or setgid. */
const SETTABLE_MODE = 0o1777;

/** An open file. */
interface FileHandle {
  kind: "file";
  file: Deno.FsFile;
  path: string;
  /** Requests on one handle run in order. */
  queue: Promise<void>;
}

/** An open directory, read in batches. */
interface DirHandle {
  kind: "dir";
  path: string;
  iter: AsyncIterator<Deno.DirEntry> | null;
  done: boolean;
  queue: Promise<void>;
}

/** An open file or directory. */
export type Handle = FileHandle | DirHandle;

/** The handles of one session, by the string the client names them with. */
export class HandleTable {
  readonly #handles = new Map<string, Handle>();
  #next = 1;

  get size(): number {
    return this.#handles.size;
  }

  get(key: string): Handle | undefined {
    return this.#handles.get(key);
  }

  /** Registers `h`; returns its key. */
  add(h: Handle): string {
    const key = String(this.#next++);
    this.#handles.set(key, h);
    return key;
  }

  /** Forgets `key`; returns what it named. */
  take(key: string): Handle | undefined {
    const h = this.#handles.get(key);
    this.#handles.delete(key);
    return h;
  }

  /** Closes every handle left. */
  async closeAll(): Promise<void> {
    for (const h of this.#handles.values()) {
      if (h.kind === "file") {
        try {
          h.file.close();
        } catch {
          // already closed
        }
      } else {
        await h.iter?.return?.().catch(() => {});
      }
    }
    this.#handles.clear();
  }
}

/** What a request sees of its session. */
export interface SftpContext {
  readonly paths: SftpPaths;
  readonly handles: HandleTable;
  /** Whether the session is ending: no new handles. */
  closing(): boolean;
  /** Sends a reply message (framed here), after those before it. */
  reply(w: SshWriter): Promise<void>;
  /** Sends a reply message already framed (a DATA reply built in place). */
  send(framed: Uint8Array): Promise<void>;
}

/** One request type: replies, or throws what becomes a STATUS reply. */
type Request = (c: SftpContext, id: number, r: SshReader) => Promise<void>;

/** Request types that name a handle first (they run in order on it). */
export const ON_HANDLE: ReadonlySet<number> = new Set([
  FXP.CLOSE,
  FXP.READ,
  FXP.WRITE,
  FXP.FSTAT,
  FXP.FSETSTAT,
  FXP.READDIR,
]);

function status(c: SftpContext, id: number, code: number, message: string): Promise<void> {
  return c.reply(
    new SshWriter(64).byte(FXP.STATUS).uint32(id).uint32(code).string(message).string("en"),
  );
}

/** A STATUS reply for request `id`, as the server sends for what a request throws. */
export function statusReply(c: SftpContext, id: number, s: SftpStatus): Promise<void> {
  return status(c, id, s.code, s.message);
}

function ok(c: SftpContext, id: number): Promise<void> {
  return status(c, id, FX.OK, "");
}

function attrs(c: SftpContext, id: number, a: SftpAttrs): Promise<void> {
  return c.reply(writeAttrs(new SshWriter(64).byte(FXP.ATTRS).uint32(id), a));
}

interface Name {
  name: string;
  longname: string;
  attrs: SftpAttrs;
}

function names(c: SftpContext, id: number, entries: Name[]): Promise<void> {
  const w = new SshWriter(4096).byte(FXP.NAME).uint32(id).uint32(entries.length);
  for (const e of entries) writeAttrs(w.string(e.name).string(e.longname), e.attrs);
  return c.reply(w);
}

function anyHandle(c: SftpContext, r: SshReader): Handle {
  const h = c.handles.get(r.text());
  if (h === undefined) throw new SftpStatus(FX.FAILURE, "Invalid handle");
  return h;
}

function fileHandle(c: SftpContext, r: SshReader): FileHandle {
  const h = anyHandle(c, r);
  if (h.kind !== "file") throw new SftpStatus(FX.FAILURE, "Not a file handle");
  return h;
}

function newHandle(c: SftpContext, id: number, h: Handle): Promise<void> {
  if (c.closing()) {
    if (h.kind === "file") h.file.close();
    throw new SftpStatus(FX.CONNECTION_LOST, "Session closed");
  }
  return c.reply(new SshWriter(32).byte(FXP.HANDLE).uint32(id).string(c.handles.add(h)));
}

function checkRoomForHandle(c: SftpContext): void {
  if (c.handles.size >= MAX_HANDLES) throw new SftpStatus(FX.FAILURE, "Too many open handles");
}

async function open(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const path = r.text();
  const pflags = r.uint32();
  const a = readAttrs(r);
  checkRoomForHandle(c);
  const write = (pflags & OPEN_FLAGS.WRITE) !== 0;
  const creat = (pflags & OPEN_FLAGS.CREAT) !== 0;
  const real = creat ? await c.paths.parentChecked(path, true) : await c.paths.followed(path);
  const file = await Deno.open(real, {
    read: (pflags & OPEN_FLAGS.READ) !== 0 || !write,
    write: write && (pflags & OPEN_FLAGS.APPEND) === 0,
    append: (pflags & OPEN_FLAGS.APPEND) !== 0,
    create: creat && (pflags & OPEN_FLAGS.EXCL) === 0,
    createNew: creat && (pflags & OPEN_FLAGS.EXCL) !== 0,
    truncate: (pflags & OPEN_FLAGS.TRUNC) !== 0,
    mode: (a.permissions ?? 0o666) & SETTABLE_MODE,
  });
  return newHandle(c, id, { kind: "file", file, path: real, queue: Promise.resolve() });
}

async function openDir(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const real = await c.paths.followed(r.text());
  if (!(await Deno.stat(real)).isDirectory) throw new SftpStatus(FX.FAILURE, "Not a directory");
  checkRoomForHandle(c);
  return newHandle(c, id, {
    kind: "dir",
    path: real,
    iter: null,
    done: false,
    queue: Promise.resolve(),
  });
}

async function close(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const h = c.handles.take(r.text());
  if (h === undefined) throw new SftpStatus(FX.FAILURE, "Invalid handle");
  if (h.kind === "file") h.file.close();
  else await h.iter?.return?.();
  return ok(c, id);
}

/** READ: the data goes out as read, in a reply built in place (no copy). */
async function read(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const h = fileHandle(c, r);
  const offset = Number(r.uint64());
  const len = Math.min(r.uint32(), MAX_DATA);
  const out = new Uint8Array(13 + len);
  await h.file.seek(offset, Deno.SeekMode.Start);
  let got = 0;
  while (got < len) {
    const n = await h.file.read(out.subarray(13 + got));
    if (n === null) break;
    got += n;
  }
  if (got === 0 && len > 0) return status(c, id, FX.EOF, "End of file");
  const view = new DataView(out.buffer);
  view.setUint32(0, 9 + got);
  out[4] = FXP.DATA;
  view.setUint32(5, id);
  view.setUint32(9, got);
  return c.send(out.subarray(0, 13 + got));
}

async function write(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const h = fileHandle(c, r);
  const offset = Number(r.uint64());
  const data = r.string();
  await h.file.seek(offset, Deno.SeekMode.Start);
  let off = 0;
  while (off < data.length) off += await h.file.write(data.subarray(off));
  return ok(c, id);
}

async function readDir(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const h = anyHandle(c, r);
  if (h.kind !== "dir") throw new SftpStatus(FX.FAILURE, "Not a directory handle");
  if (h.done) return status(c, id, FX.EOF, "End of directory");
  const entries: Name[] = [];
  if (h.iter === null) {
    h.iter = Deno.readDir(h.path)[Symbol.asyncIterator]();
    entries.push(...await dotEntries(h.path, c.paths.root));
  }
  while (entries.length < DIR_BATCH) {
    const next = await h.iter.next();
    if (next.done) {
      h.done = true;
      break;
    }
    const name = next.value.name;
    const info = await Deno.lstat(`${h.path}/${name}`).catch(() => null);
    if (info === null) continue; // gone since
    const a = attrsOf(info);
    entries.push({ name, longname: longName(name, a, info.nlink ?? 1), attrs: a });
  }
  if (entries.length === 0) return status(c, id, FX.EOF, "End of directory");
  return names(c, id, entries);
}

/** "." and ".." of a listing; the root's ".." describes the root itself (its parent is not shown). */
async function dotEntries(path: string, root: string): Promise<Name[]> {
  const entries: Name[] = [];
  for (const name of [".", ".."]) {
    const of = name === ".." && path === root ? "." : name;
    const info = await Deno.stat(`${path}/${of}`).catch(() => null);
    if (info === null) continue;
    const a = attrsOf(info);
    entries.push({ name, longname: longName(name, a, info.nlink ?? 1), attrs: a });
  }
  return entries;
}

async function setAttrs(path: string, file: Deno.FsFile | null, a: SftpAttrs): Promise<void> {
  if (a.uid !== undefined && a.gid !== undefined) {
    // Owners stay: only a request that names the current ones passes.
    const info = file !== null ? await file.stat() : await Deno.stat(path);
    if (a.uid !== info.uid || a.gid !== info.gid) {
      throw new SftpStatus(FX.PERMISSION_DENIED, "Permission denied: owners cannot be changed");
    }
  }
  if (a.size !== undefined) {
    if (file !== null) await file.truncate(a.size);
    else await Deno.truncate(path, a.size);
  }
  if (a.permissions !== undefined) await Deno.chmod(path, a.permissions & SETTABLE_MODE);
  if (a.atime !== undefined && a.mtime !== undefined) {
    if (file !== null) await file.utime(a.atime, a.mtime);
    else await Deno.utime(path, a.atime, a.mtime);
  }
}

async function remove(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const real = await c.paths.parentChecked(r.text());
  if ((await Deno.lstat(real)).isDirectory) throw new SftpStatus(FX.FAILURE, "Is a directory");
  await Deno.remove(real);
  return ok(c, id);
}

async function rmdir(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const real = await c.paths.parentChecked(r.text());
  if (real === c.paths.root) throw denied();
  if (!(await Deno.lstat(real)).isDirectory) throw new SftpStatus(FX.FAILURE, "Not a directory");
  await Deno.remove(real);
  return ok(c, id);
}

async function realPath(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const path = r.text();
  const abs = c.paths.absolute(path === "" ? "." : path);
  if (!c.paths.inRootLexical(abs)) throw denied();
  let real = abs;
  try {
    real = await Deno.realPath(abs);
  } catch (err) {
    // A path that does not exist yet is returned normalised (as OpenSSH does).
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  if (!c.paths.inRootLexical(real)) throw denied();
  return names(c, id, [{ name: real, longname: real, attrs: {} }]);
}

async function rename(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const from = await c.paths.parentChecked(r.text());
  const to = await c.paths.parentChecked(r.text());
  await Deno.lstat(from);
  // SFTP v3 rename does not replace (OpenSSH's posix-rename does).
  if (await exists(to)) throw new SftpStatus(FX.FAILURE, "Target exists");
  await Deno.rename(from, to);
  return ok(c, id);
}

/** Runs `fn` on two paths checked as `parentChecked` (rename, hard link), then replies OK. */
function twoPaths(fn: (from: string, to: string) => Promise<void>): Request {
  return async (c, id, r) => {
    const from = await c.paths.parentChecked(r.text());
    const to = await c.paths.parentChecked(r.text());
    await fn(from, to);
    return ok(c, id);
  };
}

async function statvfs(c: SftpContext, id: number, r: SshReader): Promise<void> {
  const path = await c.paths.followed(r.text());
  // Deno has no statvfs(); coreutils' stat -f reads it.
  const out = await new Deno.Command("stat", {
    args: ["-f", "-c", "%s %S %b %f %a %c %d %l %i", "--", path],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
    clearEnv: true,
    env: { LC_ALL: "C" },
  }).output().catch(() => null);
  if (out === null || !out.success) throw new SftpStatus(FX.FAILURE, "statvfs failed");
  const f = new TextDecoder().decode(out.stdout).trim().split(/\s+/);
  const n = (i: number) => BigInt(/^\d+$/.test(f[i] ?? "") ? f[i] : "0");
  const fsid = /^[0-9a-f]+$/i.test(f[8] ?? "") ? BigInt(`0x${f[8]}`) & 0xffffffffffffffffn : 0n;
  const w = new SshWriter(128).byte(FXP.EXTENDED_REPLY).uint32(id)
    .uint64(n(0)).uint64(n(1)).uint64(n(2)).uint64(n(3)).uint64(n(4))
    .uint64(n(5)).uint64(n(6)).uint64(n(6)).uint64(fsid).uint64(0n).uint64(n(7));
  return c.reply(w);
}

/** The OpenSSH extensions served, with the versions INIT announces. */
const EXTENSIONS: ReadonlyMap<string, { version: string; run: Request }> = new Map([
  ["posix-rename@openssh.com", { version: "1", run: twoPaths((a, b) => Deno.rename(a, b)) }],
  ["statvfs@openssh.com", { version: "2", run: statvfs }],
  ["fsync@openssh.com", {
    version: "1",
    run: async (c, id, r) => {
      const h = c.handles.get(r.text());
      if (h === undefined || h.kind !== "file") throw new SftpStatus(FX.FAILURE, "Invalid handle");
      await h.file.sync();
      return ok(c, id);
    },
  }],
  ["hardlink@openssh.com", { version: "1", run: twoPaths((a, b) => Deno.link(a, b)) }],
  ["limits@openssh.com", {
    version: "1",
    run: (c, id) =>
      c.reply(
        new SshWriter(64).byte(FXP.EXTENDED_REPLY).uint32(id).uint64(BigInt(MAX_MESSAGE))
          .uint64(BigInt(MAX_DATA)).uint64(BigInt(MAX_DATA)).uint64(BigInt(MAX_HANDLES)),
      ),
  }],
]);

/** The VERSION reply to INIT: version 3 and the extensions. */
export function versionReply(): SshWriter {
  const w = new SshWriter(256).byte(FXP.VERSION).uint32(3);
  for (const [name, { version }] of EXTENSIONS) w.string(name).string(version);
  return w;
}

/** The request table of SFTP version 3 (INIT is the server's own). */
const REQUESTS: ReadonlyMap<number, Request> = new Map<number, Request>([
  [FXP.OPEN, open],
  [FXP.OPENDIR, openDir],
  [FXP.CLOSE, close],
  [FXP.READ, read],
  [FXP.WRITE, write],
  [FXP.FSTAT, async (c, id, r) => {
    const h = anyHandle(c, r);
    return attrs(c, id, attrsOf(h.kind === "file" ? await h.file.stat() : await Deno.stat(h.path)));
  }],
  [
    FXP.STAT,
    async (c, id, r) => attrs(c, id, attrsOf(await Deno.stat(await c.paths.followed(r.text())))),
  ],
  [
    FXP.LSTAT,
    async (c, id, r) =>
      attrs(c, id, attrsOf(await Deno.lstat(await c.paths.parentChecked(r.text())))),
  ],
  [FXP.SETSTAT, async (c, id, r) => {
    await setAttrs(await c.paths.followed(r.text()), null, readAttrs(r));
    return ok(c, id);
  }],
  [FXP.FSETSTAT, async (c, id, r) => {
    const h = anyHandle(c, r);
    await setAttrs(h.path, h.kind === "file" ? h.file : null, readAttrs(r));
    return ok(c, id);
  }],
  [FXP.READDIR, readDir],
  [FXP.REMOVE, remove],
  [FXP.MKDIR, async (c, id, r) => {
    const real = await c.paths.parentChecked(r.text());
    await Deno.mkdir(real, { mode: (readAttrs(r).permissions ?? 0o777) & SETTABLE_MODE });
    return ok(c, id);
  }],
  [FXP.RMDIR, rmdir],
  [FXP.REALPATH, realPath],
  [FXP.RENAME, rename],
  [FXP.READLINK, async (c, id, r) => {
    const target = await Deno.readLink(await c.paths.parentChecked(r.text()));
    return names(c, id, [{ name: target, longname: target, attrs: {} }]);
  }],
  [FXP.SYMLINK, async (c, id, r) => {
    // OpenSSH's (and every client's) order: target first, then the link.
    const target = r.text();
    await Deno.symlink(target, await c.paths.parentChecked(r.text()));
    return ok(c, id);
  }],
  [FXP.EXTENDED, async (c, id, r) => {
    const name = r.text();
    const extension = EXTENSIONS.get(name);
    if (extension === undefined) {
      throw new SftpStatus(FX.OP_UNSUPPORTED, `Unsupported extension "${name}"`);
    }
    return await extension.run(c, id, r);
  }],
]);

/** Runs request `type`; rejects with what becomes its STATUS reply. */
export function runRequest(c: SftpContext, type: number, id: number, r: SshReader): Promise<void> {
  const request = REQUESTS.get(type);
  if (request === undefined) {
    return Promise.reject(new SftpStatus(FX.OP_UNSUPPORTED, `Unsupported request "${type}"`));
  }
  return request(c, id, r);
}
