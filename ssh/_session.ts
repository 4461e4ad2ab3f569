/**
 * One session channel of the SSH server (`server.ts`): `env`, `pty-req`,
 * `exec`, `shell`, `subsystem sftp`, `window-change` and `signal`, the
 * command run through the spawner in its own process group, its output sent
 * in whole packets, and the configuration a server hands its connections.
 *
 * @module
 */

import { isPeerGone } from "../_internal/io.ts";
import { trySignalGroup } from "../_internal/process.ts";
import type { Channel, ChannelHandlers } from "./_channel.ts";
import type { SshReader } from "./_wire.ts";
import { SftpServer } from "./_sftp.ts";
import { shellQuote } from "../_internal/shell.ts";
import { readEnv } from "../_internal/util.ts";

/** What a {@linkcode SshSpawner} is asked to run. */
export interface SshSpawnOptions {
  /** Working directory. */
  cwd: string;
  /** The complete environment of the command (nothing else may leak in). */
  env: Record<string, string>;
}

/**
 * Starts a session's command: `argv[0]` is the program (`bash`, util-linux
 * `script`, the `sftpCommand`...), the rest its arguments. It must return a
 * child with piped stdin, stdout and stderr that leads its own process group
 * (signals and the final SIGKILL go to the group), or a promise of one: the
 * client's request is answered when it settles (a workspace holds new
 * commands this way while it grades).
 */
export type SshSpawner = (
  argv: readonly string[],
  options: SshSpawnOptions,
) => Deno.ChildProcess | Promise<Deno.ChildProcess>;

/** What a server hands each connection and session. */
export interface ServerConfig {
  spawn: SshSpawner;
  cwd: string;
  env: Record<string, string>;
  user: string | undefined;
  authorized: Uint8Array[];
  maxAuthTries: number;
  rekeyLimit: number | undefined;
  ciphers: readonly string[] | undefined;
  onError: (error: unknown) => void;
  /** The real path of `cwd` when SFTP is on, else null. */
  sftpRoot: Promise<string> | null;
  /** The program that serves SFTP on stdio, or null to serve it here. */
  sftpCommand: readonly string[] | null;
  /** Whether a channel's close kills its command's process group (never an SFTP server's: always). */
  killOnClose: boolean;
}

const SIGNALS = new Set(["HUP", "INT", "KILL", "QUIT", "TERM", "USR1", "USR2", "ALRM", "PIPE"]);
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/** util-linux `script` gives a command a terminal (Deno has no openpty). */
const SCRIPT = "/usr/bin/script";
let scriptAvailable: boolean | undefined;

function canAllocatePty(): boolean {
  if (scriptAvailable === undefined) {
    try {
      scriptAvailable = Deno.statSync(SCRIPT).isFile;
    } catch {
      scriptAvailable = false;
    }
  }
  return scriptAvailable;
}

/**
 * The terminal of the first process under `pid` (breadth first, a few
 * levels: `script`, or a sandbox wrapping it) that has one as stdin.
 */
async function findTerminal(pid: number): Promise<string | null> {
  let level = [pid];
  for (let depth = 0; depth < 5 && level.length > 0; depth++) {
    const next: number[] = [];
    for (const p of level) {
      if (p !== pid) {
        const tty = await Deno.readLink(`/proc/${p}/fd/0`).catch(() => "");
        // Through the process's own root: in a sandbox with a private /dev,
        // /dev/pts/N here would name another terminal.
        if (tty.startsWith("/dev/pts/")) return `/proc/${p}/root${tty}`;
      }
      const kids = await Deno.readTextFile(`/proc/${p}/task/${p}/children`).catch(() => "");
      for (const k of kids.trim().split(/\s+/)) if (/^\d+$/.test(k)) next.push(Number(k));
    }
    level = next;
  }
  return null;
}

/** Reads a stream chunk by chunk; a chunk is valid until the next read(). */
interface ChunkReader {
  /** The next chunk, null at the end. */
  read(): Promise<Uint8Array | null>;
  release(): void;
}

/** Size of the buffer a byte stream is read into: a pipe's default capacity. */
const PUMP_BUFFER = 65536;
/** Send buffers per output stream, each a packet plus PUMP_BUFFER. */
const PUMP_SLOTS = 4;

/**
 * A byte stream (a child's pipe) is read into one reused buffer; any other
 * stream (a custom spawner's) chunk by chunk as it comes.
 */
function chunkReader(stream: ReadableStream<Uint8Array>): ChunkReader {
  let byob: ReadableStreamBYOBReader | null = null;
  try {
    byob = stream.getReader({ mode: "byob" });
  } catch {
    // Not a byte stream.
  }
  if (byob !== null) {
    const reader = byob;
    let buffer = new Uint8Array(PUMP_BUFFER);
    return {
      async read() {
        const { value, done } = await reader.read(buffer);
        if (done || value === undefined) return null;
        // The read moved the buffer into `value`'s; keep reading into that memory.
        buffer = new Uint8Array(value.buffer);
        return value;
      },
      release: () => reader.releaseLock(),
    };
  }
  const reader = stream.getReader();
  return {
    async read() {
      const { value, done } = await reader.read();
      return done ? null : value;
    },
    release: () => reader.releaseLock(),
  };
}

/** What {@linkcode withinTick} gives when the timer tick came first. */
const TICK = Symbol("tick");

/** `next`, if it settles within a timer tick, else {@linkcode TICK}. */
async function withinTick<T>(next: Promise<T>): Promise<T | typeof TICK> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const tick = new Promise<typeof TICK>((resolve) => timer = setTimeout(() => resolve(TICK), 0));
  try {
    return await Promise.race([next, tick]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A child's output gathered into whole packets, in a few reused send
 * buffers: read bytes go into the current slot; its whole packets are sent
 * from it, and it is used again once the channel has flushed them.
 */
class SendSlots {
  readonly #max: number;
  readonly #slots = Array.from({ length: PUMP_SLOTS }, () => ({
    bytes: new Uint8Array(0),
    flushed: Promise.resolve(),
  }));
  #slot = 0;
  /** The current slot's bytes, the first `#length` of them gathered. */
  #pending: Uint8Array;
  #length = 0;

  constructor(maxPacket: number) {
    this.#max = maxPacket;
    this.#pending = this.#slots[0].bytes = new Uint8Array(maxPacket + PUMP_BUFFER);
  }

  /** Bytes gathered and not sent. */
  get length(): number {
    return this.#length;
  }

  /** Whether a whole packet or more is gathered. */
  get hasWholePackets(): boolean {
    return this.#length >= this.#max;
  }

  append(chunk: Uint8Array): void {
    if (this.#length + chunk.length > this.#pending.length) {
      const grown = new Uint8Array(this.#length + chunk.length);
      grown.set(this.#pending.subarray(0, this.#length));
      this.#pending = this.#slots[this.#slot].bytes = grown;
    }
    this.#pending.set(chunk, this.#length);
    this.#length += chunk.length;
  }

  /** Everything gathered, copied out (sent alone). */
  takeAll(): Uint8Array {
    const all = this.#pending.slice(0, this.#length);
    this.#length = 0;
    return all;
  }

  /**
   * The whole packets gathered, in place in their slot; the rest moves to
   * the next slot once what that one sent before is flushed. Call `sent()`
   * with when these are flushed.
   */
  async takeWholePackets(): Promise<{ bytes: Uint8Array; sent(flushed: Promise<void>): void }> {
    const whole = this.#length - (this.#length % this.#max);
    const bytes = this.#pending.subarray(0, whole);
    const full = this.#slots[this.#slot];
    this.#slot = (this.#slot + 1) % PUMP_SLOTS;
    const next = this.#slots[this.#slot];
    await next.flushed;
    if (next.bytes.length < this.#max + PUMP_BUFFER) {
      next.bytes = new Uint8Array(this.#max + PUMP_BUFFER);
    }
    const rest = this.#pending.subarray(whole, this.#length);
    this.#pending = next.bytes;
    this.#pending.set(rest);
    this.#length = rest.length;
    return { bytes, sent: (flushed) => full.flushed = flushed };
  }
}

/** One exec/shell session channel. */
export class Session {
  readonly #channel: Channel;
  readonly #config: ServerConfig;
  readonly #env: Record<string, string> = {};
  #proc: Deno.ChildProcess | null = null;
  /** A command requested and not started yet (the spawner is async). */
  #starting = false;
  #pty: { term: string; cols: number; rows: number } | null = null;
  #stdin: WritableStreamDefaultWriter<Uint8Array> | null = null;
  #stdinQueue: Uint8Array[] = [];
  #stdinBusy = false;
  #stdinEof = false;
  #killed = false;
  /** Whether the command outlives its channel (`killOnClose: false`). */
  #keep = false;
  #done: Promise<void> = Promise.resolve();
  #sftp: SftpServer | null = null;
  #resizing: Promise<void> = Promise.resolve();

  constructor(channel: Channel, config: ServerConfig) {
    this.#channel = channel;
    this.#config = config;
  }

  get done(): Promise<void> {
    return Promise.all([this.#done, this.#resizing]).then(() => {});
  }

  handlers(): ChannelHandlers {
    return {
      onData: (data, ext) => this.#onData(data, ext),
      onEof: () => {
        if (this.#sftp !== null) return this.#endSftp();
        this.#stdinEof = true;
        this.#pumpStdin();
      },
      onClose: () => {
        if (this.#keep) this.#letGo();
        else this.#kill();
        if (this.#sftp !== null) {
          const before = this.#done;
          this.#done = Promise.all([before, this.#sftp.close()]).then(() => {});
        }
      },
      onRequest: (type, wantReply, r) => this.#onRequest(type, wantReply, r),
    };
  }

  #onRequest(type: string, _wantReply: boolean, r: SshReader): boolean | Promise<boolean> {
    switch (type) {
      case "env": {
        const name = r.text();
        const value = r.text();
        if (!ENV_NAME.test(name) || this.#busy) return false;
        this.#env[name] = value;
        return true;
      }
      case "pty-req": {
        if (this.#busy || !canAllocatePty()) return false;
        const term = r.text();
        const cols = r.uint32();
        const rows = r.uint32();
        this.#pty = { term, cols: Math.min(cols, 9999), rows: Math.min(rows, 9999) };
        return true;
      }
      case "exec":
        return this.#spawn(["-c", r.text()]);
      case "shell":
        return this.#spawn([]);
      case "subsystem":
        return this.#subsystem(r.text());
      case "window-change": {
        if (this.#pty === null) return false;
        const cols = Math.min(r.uint32(), 9999);
        const rows = Math.min(r.uint32(), 9999);
        this.#pty = { ...this.#pty, cols, rows };
        if (this.#proc !== null) this.#resize(cols, rows);
        return true;
      }
      case "signal": {
        const name = r.text();
        if (this.#proc === null || !SIGNALS.has(name)) return false;
        this.#signalGroup(`SIG${name}` as Deno.Signal);
        return true;
      }
      default:
        // x11-req, auth-agent-req...: refused.
        return false;
    }
  }

  /** Whether a command, SFTP session or request for one holds this channel. */
  get #busy(): boolean {
    return this.#proc !== null || this.#starting || this.#sftp !== null;
  }

  async #subsystem(name: string): Promise<boolean> {
    const rootP = this.#config.sftpRoot;
    if (name !== "sftp" || rootP === null) return false;
    if (this.#busy || this.#channel.isClosing) return false;
    if (this.#config.sftpCommand !== null) {
      this.#pty = null; // a subsystem speaks bytes, not a terminal
      return this.#start([...this.#config.sftpCommand], this.#commandEnv());
    }
    let root: string;
    try {
      root = await rootP;
    } catch {
      return false;
    }
    const ch = this.#channel;
    this.#sftp = new SftpServer(root, {
      write: (data) => ch.write(data, 0, true),
      consumed: (n) => ch.consumed(n),
      close: () => this.#endSftp(),
    }, this.#config.cwd);
    return true;
  }

  #endSftp(): void {
    const sftp = this.#sftp!;
    const ch = this.#channel;
    this.#done = (async () => {
      await sftp.close();
      if (ch.isClosing) return;
      await ch.flush().catch(() => {});
      ch.eof();
      ch.request("exit-status", false, (w) => w.uint32(0));
      ch.close();
    })();
  }

  /**
   * Sets the terminal's size. Deno has no ioctl(): `stty -F` on the
   * terminal `script` made (its child's stdin) does TIOCSWINSZ, and the
   * kernel sends SIGWINCH to the terminal's foreground process group.
   */
  #resize(cols: number, rows: number): void {
    const pid = this.#proc?.pid;
    if (pid === undefined) return;
    this.#resizing = this.#resizing.then(async () => {
      try {
        const tty = await findTerminal(pid);
        if (tty === null) return;
        await new Deno.Command("stty", {
          args: ["-F", tty, "cols", String(cols), "rows", String(rows)],
          stdin: "null",
          stdout: "null",
          stderr: "null",
        }).output();
      } catch {
        // The program is gone, or has no terminal any more.
      }
    });
  }

  #commandEnv(): Record<string, string> {
    return {
      PATH: readEnv("PATH") ?? DEFAULT_PATH,
      HOME: readEnv("HOME") ?? "/",
      USER: readEnv("USER") ?? "root",
      LANG: readEnv("LANG") ?? "C.UTF-8",
      ...this.#config.env,
      ...this.#env,
    };
  }

  #spawn(args: string[]): boolean | Promise<boolean> {
    if (this.#busy || this.#channel.isClosing) return false;
    const env = this.#commandEnv();
    // No profile or rc file: what one session plants there must not run in
    // the next.
    let argv = ["bash", "--noprofile", "--norc", ...args];
    if (this.#pty !== null) {
      const { term, cols, rows } = this.#pty;
      env.TERM = term || "xterm";
      const inner = `stty cols ${cols} rows ${rows} 2>/dev/null; exec ${
        argv.map(shellQuote).join(" ")
      }`;
      argv = [SCRIPT, "-q", "-e", "-c", inner, "/dev/null"];
    }
    this.#keep = !this.#config.killOnClose;
    return this.#start(argv, env);
  }

  /** Starts `argv` through the spawner; the reply to the request that asked. */
  #start(argv: string[], env: Record<string, string>): boolean | Promise<boolean> {
    let spawned: Deno.ChildProcess | Promise<Deno.ChildProcess>;
    try {
      spawned = this.#config.spawn(argv, { cwd: this.#config.cwd, env });
    } catch (err) {
      this.#config.onError(err);
      return false;
    }
    if (!(spawned instanceof Promise)) return this.#started(spawned);
    this.#starting = true;
    return spawned.then(
      (proc) => {
        this.#starting = false;
        return this.#started(proc);
      },
      (err) => {
        this.#starting = false;
        this.#config.onError(err);
        return false;
      },
    );
  }

  #started(proc: Deno.ChildProcess): boolean {
    this.#proc = proc;
    this.#stdin = proc.stdin.getWriter();
    this.#done = this.#run(proc);
    if (this.#killed || this.#channel.isClosing) {
      // The channel went while the spawner waited.
      this.#killed = false;
      this.#kill();
      return false;
    }
    this.#pumpStdin(); // closes stdin at once if EOF came first
    return true;
  }

  async #run(proc: Deno.ChildProcess): Promise<void> {
    const [status] = await Promise.all([
      proc.status,
      this.#pumpOut(proc.stdout, 0),
      this.#pumpOut(proc.stderr, 1),
    ]);
    this.#stdinQueue = [];
    this.#stdinEof = true;
    if (!this.#stdinBusy) await this.#stdin?.close().catch(() => {});
    const ch = this.#channel;
    if (ch.isClosing) return;
    await ch.flush().catch(() => {});
    ch.eof();
    if (status.signal !== null) {
      const name = status.signal.replace(/^SIG/, "");
      ch.request("exit-signal", false, (w) => w.string(name).boolean(false).string("").string(""));
    } else {
      ch.request("exit-status", false, (w) => w.uint32(status.code));
    }
    ch.close();
  }

  /**
   * Sends a child's output as full packets: the part of a read past the last
   * whole packet waits for the next read if that comes within a timer tick
   * (bulk output, already in the pipe), else goes alone. Pipe reads end at
   * arbitrary sizes, and every packet costs a cipher call or two. Reads go
   * into one reused buffer (a byte stream's BYOB reader) and are copied into
   * a few reused send buffers: fresh memory costs a page fault per 4 KiB
   * here, and a fresh 64 KiB buffer per read tripled the pipe's CPU cost
   * (BENCHMARKS.md). Sending only two or more packets at once, to write fewer
   * and larger batches, did not help.
   */
  async #pumpOut(stream: ReadableStream<Uint8Array>, ext: number): Promise<void> {
    const reader = chunkReader(stream);
    const slots = new SendSlots(this.#channel.maxPacket);
    try {
      let next = reader.read();
      while (true) {
        const chunk = slots.length === 0 ? await next : await withinTick(next);
        if (chunk === TICK) {
          await this.#send(slots.takeAll(), ext);
          continue;
        }
        if (chunk === null) break;
        slots.append(chunk);
        next = reader.read();
        if (slots.hasWholePackets) {
          const whole = await slots.takeWholePackets();
          await this.#send(whole.bytes, ext);
          whole.sent(this.#channel.flush().catch(() => {}));
        }
      }
      if (slots.length > 0) await this.#send(slots.takeAll(), ext);
    } catch (err) {
      if (!isPeerGone(err)) this.#config.onError(err);
    } finally {
      reader.release();
    }
  }

  /** Sends output; once the channel is gone, drops it (the pipe is drained so it closes). */
  async #send(data: Uint8Array, ext: number): Promise<void> {
    if (this.#channel.isClosing) return;
    try {
      await this.#channel.write(data, ext, true);
    } catch {
      // Channel gone: keep draining, the process is being killed.
    }
  }

  #onData(data: Uint8Array, ext: number): void {
    if (this.#sftp !== null && ext === 0) return this.#sftp.receive(data);
    // Bytes may come before an async spawner has started the command.
    if (ext !== 0 || (this.#stdin === null && !this.#starting) || this.#stdinEof) {
      this.#channel.consumed(data.length);
      return;
    }
    this.#stdinQueue.push(data);
    this.#pumpStdin();
  }

  async #pumpStdin(): Promise<void> {
    if (this.#stdinBusy || this.#stdin === null) return;
    this.#stdinBusy = true;
    const w = this.#stdin;
    try {
      while (this.#stdinQueue.length > 0) {
        const chunk = this.#stdinQueue.shift()!;
        try {
          await w.write(chunk);
        } catch {
          // The command stopped reading; drop what it did not take.
          this.#stdinQueue = [];
          this.#stdinEof = true;
        }
        this.#channel.consumed(chunk.length);
      }
      if (this.#stdinEof) await w.close().catch(() => {});
    } finally {
      this.#stdinBusy = false;
    }
  }

  #signalGroup(signal: Deno.Signal): void {
    const pid = this.#proc?.pid;
    if (pid === undefined) return;
    // Tearing a channel down must not fail on a process that is gone.
    trySignalGroup(pid, signal);
  }

  #kill(): void {
    if (this.#killed) return;
    this.#killed = true;
    this.#signalGroup("SIGKILL");
    this.#letGo();
  }

  /** Stops feeding the command: what is queued for its stdin is dropped, and stdin closed. */
  #letGo(): void {
    this.#stdinQueue = [];
    this.#stdinEof = true;
    if (!this.#stdinBusy) this.#stdin?.close().catch(() => {});
  }
}
