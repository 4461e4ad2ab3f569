// The SFTP server subsystem: protocol version 3 (draft-ietf-secsh-filexfer-02,
// what OpenSSH's sftp and scp, paramiko, asyncssh and PuTTY speak) with the
// OpenSSH extensions posix-rename, statvfs, fsync, hardlink and limits.
//
// It serves one root directory: every path is resolved under the root,
// relative paths from a starting directory (the commands' working
// directory), and refused with SSH_FX_PERMISSION_DENIED when its real path
// (symbolic links followed, the last component too for operations that
// follow it) leaves the root. Owners cannot be changed and setuid/setgid
// bits cannot be set, whoever runs it.
//
// Two ways to run it. In the SSH server's process (startSshServer's default),
// confined to the working directory: the checks race with a command that
// swaps a directory for a symbolic link between check and use, so this is
// for servers whose commands run as this process's user anyway. Or as its
// own process speaking SFTP on stdin and stdout (`_sftp_main.ts`), which a
// workspace starts inside its sandbox as the sandbox's user, rooted at "/"
// (the sandbox is the boundary there, as OpenSSH's sftp-server runs as the
// logged-in user).
//
// Requests on one handle run in order (Deno has no pread/pwrite, so a read is
// a seek then a read); other handles, and path requests (in order among
// themselves), run alongside. Replies go out as each finishes, each waiting
// for channel window, so a pipelined transfer streams and memory stays
// bounded: incoming window is returned only as requests finish.

import { SshReader, SshWriter } from "./_wire.ts";
import { ByteQueue, FX, FXP, MAX_MESSAGE } from "./_sftp_wire.ts";
import { SftpStatus, statusOf } from "./_sftp_fs.ts";
import { SftpPaths } from "./_sftp_paths.ts";
import {
  type Handle,
  HandleTable,
  ON_HANDLE,
  runRequest,
  type SftpContext,
  statusReply,
  versionReply,
} from "./_sftp_requests.ts";

/** Where an SFTP server subsystem sends its bytes and returns window. */
export interface SftpSink {
  /** Sends bytes the server owns (never changed afterwards). */
  write(data: Uint8Array): Promise<void>;
  /** Returns window for `n` received bytes now dealt with. */
  consumed(n: number): void;
  /** Ends the session (after a fatal framing error). */
  close(): void;
}

/** One SFTP session over one channel. */
export class SftpServer {
  readonly #sink: SftpSink;
  readonly #queue = new ByteQueue();
  #version = 0;
  readonly #handles = new HandleTable();
  #pathQueue: Promise<void> = Promise.resolve();
  #out: Promise<void> = Promise.resolve();
  #tasks = new Set<Promise<void>>();
  #closed = false;
  /** What the request table sees of this session. */
  readonly #context: SftpContext;

  /**
   * `root` must be a real path (no symbolic links in it); `alias` is the
   * same directory as the commands see it (their working directory, which
   * may go through links), accepted in paths too. Relative paths start at
   * `start` (inside the root), the root by default.
   */
  constructor(root: string, sink: SftpSink, alias: string = root, start: string = root) {
    this.#sink = sink;
    this.#context = {
      paths: new SftpPaths(root, alias, start),
      handles: this.#handles,
      closing: () => this.#closed,
      reply: (w) => this.#reply(w),
      send: (framed) => this.#send(framed),
    };
  }

  /** Bytes from the channel. */
  receive(data: Uint8Array): void {
    if (this.#closed) {
      this.#sink.consumed(data.length);
      return;
    }
    this.#queue.push(data);
    while (this.#queue.length >= 4) {
      const head = this.#queue.take(4, false);
      const len = new DataView(head.buffer, head.byteOffset, 4).getUint32(0);
      if (len < 5 || len > MAX_MESSAGE + 1024) return this.#lostFraming(len);
      if (this.#queue.length < 4 + len) return;
      this.#queue.take(4, true);
      this.#dispatch(this.#queue.take(len, true));
    }
  }

  /** The framing is lost: say so, and end the session. */
  #lostFraming(len: number): void {
    this.#reply(
      new SshWriter(64).byte(FXP.STATUS).uint32(0).uint32(FX.BAD_MESSAGE)
        .string(`Bad message length "${len}"`).string(""),
    );
    this.#closed = true;
    this.#sink.consumed(this.#queue.length);
    this.#queue.clear();
    this.#out.finally(() => this.#sink.close());
  }

  /** Waits for requests under way, then closes every handle. */
  async close(): Promise<void> {
    this.#closed = true;
    await Promise.allSettled([...this.#tasks]);
    await this.#handles.closeAll();
    await this.#out;
  }

  #reply(w: SshWriter): Promise<void> {
    const body = w.bytes();
    const msg = new Uint8Array(4 + body.length);
    new DataView(msg.buffer).setUint32(0, body.length);
    msg.set(body, 4);
    return this.#send(msg);
  }

  /** Sends a framed message after every one before it. */
  #send(framed: Uint8Array): Promise<void> {
    const sent = this.#out.then(() => this.#sink.write(framed));
    this.#out = sent.catch(() => {});
    return sent;
  }

  /**
   * Starts a request: INIT is answered at once; others run in order after
   * those on the same handle, or after the other path requests, and give
   * their window back once answered.
   */
  #dispatch(msg: Uint8Array): void {
    const size = 4 + msg.length;
    const type = msg[0];
    const r = new SshReader(msg, 1);
    if (type === FXP.INIT) {
      this.#version = 3;
      this.#reply(versionReply()).catch(() => {});
      this.#sink.consumed(size);
      return;
    }
    let id = 0;
    let handle: Handle | undefined;
    try {
      id = r.uint32();
      if (this.#version === 0) throw new SftpStatus(FX.BAD_MESSAGE, "INIT expected first");
      if (ON_HANDLE.has(type)) {
        handle = this.#handles.get(new TextDecoder().decode(new SshReader(msg, 5).string()));
        if (handle === undefined) throw new SftpStatus(FX.FAILURE, "Invalid handle");
      }
    } catch (err) {
      statusReply(this.#context, id, statusOf(err)).catch(() => {});
      this.#sink.consumed(size);
      return;
    }
    const run = async () => {
      try {
        await runRequest(this.#context, type, id, r);
      } catch (err) {
        await statusReply(this.#context, id, statusOf(err)).catch(() => {});
      } finally {
        this.#sink.consumed(size);
      }
    };
    const task = handle !== undefined
      ? handle.queue = handle.queue.then(run)
      : this.#pathQueue = this.#pathQueue.then(run);
    this.#tasks.add(task);
    task.finally(() => this.#tasks.delete(task));
  }
}
