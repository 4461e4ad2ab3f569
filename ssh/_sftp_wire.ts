// What both ends of SFTP version 3 share: message and status numbers,
// attribute flags, size limits, attributes on the wire, and the byte queue
// each end frames packets from. The server is `_sftp.ts`, the client
// `_sftp_client.ts`.

import type { SshReader, SshWriter } from "./_wire.ts";

export const FXP = {
  INIT: 1,
  VERSION: 2,
  OPEN: 3,
  CLOSE: 4,
  READ: 5,
  WRITE: 6,
  LSTAT: 7,
  FSTAT: 8,
  SETSTAT: 9,
  FSETSTAT: 10,
  OPENDIR: 11,
  READDIR: 12,
  REMOVE: 13,
  MKDIR: 14,
  RMDIR: 15,
  REALPATH: 16,
  STAT: 17,
  RENAME: 18,
  READLINK: 19,
  SYMLINK: 20,
  STATUS: 101,
  HANDLE: 102,
  DATA: 103,
  NAME: 104,
  ATTRS: 105,
  EXTENDED: 200,
  EXTENDED_REPLY: 201,
} as const;

export const FX = {
  OK: 0,
  EOF: 1,
  NO_SUCH_FILE: 2,
  PERMISSION_DENIED: 3,
  FAILURE: 4,
  BAD_MESSAGE: 5,
  NO_CONNECTION: 6,
  CONNECTION_LOST: 7,
  OP_UNSUPPORTED: 8,
} as const;

const ATTR = { SIZE: 1, UIDGID: 2, PERMISSIONS: 4, ACMODTIME: 8, EXTENDED: 0x80000000 };
export const OPEN_FLAGS = { READ: 1, WRITE: 2, APPEND: 4, CREAT: 8, TRUNC: 0x10, EXCL: 0x20 };

/** Largest SFTP packet accepted or sent (OpenSSH's SFTP_MAX_MSG_LENGTH). */
export const MAX_MESSAGE = 256 * 1024;
/** Largest READ served (and WRITE accepted), leaving room for headers. */
export const MAX_DATA = MAX_MESSAGE - 1024;

/** File attributes as SFTP v3 carries them; absent fields are undefined. */
export interface SftpAttrs {
  size?: number;
  uid?: number;
  gid?: number;
  permissions?: number;
  atime?: number;
  mtime?: number;
}

export function writeAttrs(w: SshWriter, a: SftpAttrs): SshWriter {
  let flags = 0;
  if (a.size !== undefined) flags |= ATTR.SIZE;
  if (a.uid !== undefined && a.gid !== undefined) flags |= ATTR.UIDGID;
  if (a.permissions !== undefined) flags |= ATTR.PERMISSIONS;
  if (a.atime !== undefined && a.mtime !== undefined) flags |= ATTR.ACMODTIME;
  w.uint32(flags);
  if (a.size !== undefined) w.uint64(BigInt(a.size));
  if (flags & ATTR.UIDGID) w.uint32(a.uid!).uint32(a.gid!);
  if (a.permissions !== undefined) w.uint32(a.permissions);
  if (flags & ATTR.ACMODTIME) w.uint32(a.atime!).uint32(a.mtime!);
  return w;
}

export function readAttrs(r: SshReader): SftpAttrs {
  const flags = r.uint32();
  const a: SftpAttrs = {};
  if (flags & ATTR.SIZE) a.size = Number(r.uint64());
  if (flags & ATTR.UIDGID) {
    a.uid = r.uint32();
    a.gid = r.uint32();
  }
  if (flags & ATTR.PERMISSIONS) a.permissions = r.uint32();
  if (flags & ATTR.ACMODTIME) {
    a.atime = r.uint32();
    a.mtime = r.uint32();
  }
  if (flags & ATTR.EXTENDED) {
    const n = r.uint32();
    for (let i = 0; i < n; i++) {
      r.string();
      r.string();
    }
  }
  return a;
}

/**
 * Bytes received in chunks, taken off the front without copying when a
 * request lies within one chunk: the SFTP server and client frame packets
 * from it.
 */
export class ByteQueue {
  #chunks: Uint8Array[] = [];
  #buffered = 0;

  /** Bytes held. */
  get length(): number {
    return this.#buffered;
  }

  /** Appends a chunk. */
  push(data: Uint8Array): void {
    this.#chunks.push(data);
    this.#buffered += data.length;
  }

  /** Drops everything held. */
  clear(): void {
    this.#chunks = [];
    this.#buffered = 0;
  }

  /** Takes (or, without consuming, peeks at) the next `n` bytes; `n` must be held. */
  take(n: number, consume: boolean): Uint8Array {
    let out: Uint8Array;
    const first = this.#chunks[0];
    if (first.length >= n) {
      out = first.subarray(0, n);
      if (consume) {
        if (first.length === n) this.#chunks.shift();
        else this.#chunks[0] = first.subarray(n);
      }
    } else {
      out = new Uint8Array(n);
      let off = 0;
      let i = 0;
      while (off < n) {
        const c = this.#chunks[i];
        const m = Math.min(c.length, n - off);
        out.set(c.subarray(0, m), off);
        off += m;
        if (consume && m === c.length) {
          this.#chunks.shift();
        } else {
          if (consume) this.#chunks[0] = c.subarray(m);
          i++;
        }
      }
    }
    if (consume) this.#buffered -= n;
    return out;
  }
}
