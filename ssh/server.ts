/**
 * An SSH-2 server on Deno's WebCrypto, interoperable with OpenSSH: public-key
 * (`ssh-ed25519`) logins against a fixed set of authorised keys, and session
 * channels that run `bash -lc <command>` (or `bash -l`) in a working
 * directory with a clean environment, each in its own process group, killed
 * when its channel or connection goes. A `pty-req` is served through
 * util-linux `script` where it is installed, and refused otherwise;
 * `window-change` resizes that terminal (coreutils `stty -F` on it, which
 * also signals SIGWINCH). The `sftp` subsystem (SFTP version 3, see
 * `_sftp.ts`) serves files under the working directory, in this process,
 * refusing paths whose real location leaves it, or runs a program that
 * speaks SFTP on stdio (`sftpCommand`, as OpenSSH's `Subsystem sftp`)
 * through the `spawn` hook; OpenSSH's `scp` uses it.
 *
 * @module
 */

import { closeQuietly, isPeerGone, prefixed } from "../_internal/io.ts";
import { trySignalGroup } from "../_internal/process.ts";
import { acceptLoop } from "../_internal/accept.ts";
import { type Channel, type ChannelHandlers, ChannelMux } from "./_channel.ts";
import { DISCONNECT, SshError } from "./_errors.ts";
import {
  ED25519,
  Ed25519Signer,
  type Ed25519Signer as Signer,
  formatPublicKey,
  parsePrivateKey,
  parsePublicKey,
  verifyEd25519,
} from "./_keys.ts";
import { MSG, SshTransport } from "./_transport.ts";
import { CIPHERS } from "./_cipher.ts";
import { bytesEqual, SshReader, SshWriter } from "./_wire.ts";
import { SftpServer } from "./_sftp.ts";
import { shellQuote } from "../_internal/shell.ts";

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

/** Limits on connections that have not logged in yet, as OpenSSH's `MaxStartups`. */
export interface SshStartupLimits {
  /** Unauthenticated connections accepted before random early drop begins. */
  start: number;
  /** Percent chance of dropping a new connection when `start` are pending. */
  rate: number;
  /** Unauthenticated connections at which every new one is dropped. */
  full: number;
}

/** Options for {@linkcode startSshServer}. */
export interface SshServerOptions {
  /**
   * Address to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Port to listen on; 0 picks a free one.
   * @default 0
   */
  port?: number;
  /** Shuts the server down when aborted. */
  signal?: AbortSignal;
  /** Called once listening. */
  onListen?: (addr: Deno.NetAddr) => void;
  /**
   * Called with unexpected errors (not with a peer's misbehaviour, which
   * only ends that peer's connection).
   * @default ignores them
   */
  onError?: (error: unknown) => void;
  /** The host key: an unencrypted OpenSSH Ed25519 private key. */
  hostKey: string;
  /** Public keys (`ssh-ed25519 AAAA...`) allowed to log in. */
  authorizedKeys: readonly string[];
  /**
   * The only user name accepted; any name when unset.
   * @default undefined
   */
  user?: string;
  /**
   * Working directory of commands.
   * @default Deno.cwd()
   */
  cwd?: string;
  /**
   * Variables set for commands, on top of PATH, HOME, USER and LANG taken
   * from this process. Nothing else of this process's environment leaks in.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * Failed authentication attempts allowed per connection.
   * @default 6
   */
  maxAuthTries?: number;
  /**
   * Milliseconds a connection may take to log in.
   * @default 30000
   */
  loginGraceTime?: number;
  /**
   * Connections from the listener served at once; more are refused (those
   * handed over through `attach` are not counted).
   * @default 256
   */
  maxConnections?: number;
  /**
   * Cap on connections from the listener that have not logged in: from
   * `start` pending, a new one is dropped with a chance growing from `rate`
   * percent to 100 at `full` (OpenSSH's `MaxStartups 10:30:100`).
   * @default { start: 10, rate: 30, full: 100 }
   */
  maxStartups?: SshStartupLimits;
  /**
   * Milliseconds a connection may take to send its version line.
   * @default 10000
   */
  versionTimeout?: number;
  /**
   * Starts each session's command.
   * @default runs `argv` directly with `clearEnv` in a new session
   */
  spawn?: SshSpawner;
  /**
   * Bytes sent plus received after which a connection renews its keys.
   * @default 1073741824 (1 GiB)
   */
  rekeyLimit?: number;
  /**
   * Ciphers offered, from `chacha20-poly1305@openssh.com`,
   * `aes128-gcm@openssh.com`, `aes256-gcm@openssh.com`, `aes128-ctr` and
   * `aes256-ctr`. The client's order decides among them; OpenSSH's `ssh`
   * and Dropbear's pick chacha20-poly1305 (WebAssembly here, the cheapest
   * per packet), PuTTY aes256-ctr.
   * @default ["chacha20-poly1305@openssh.com", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr"]
   */
  ciphers?: readonly string[];
  /**
   * Whether to serve the `sftp` subsystem (also what `scp` uses), confined
   * to `cwd`: paths whose real location leaves it are refused.
   * @default true
   */
  sftp?: boolean;
  /**
   * A program speaking SFTP on stdin and stdout (OpenSSH's `sftp-server`,
   * or the SDK's own in a workspace sandbox) to start through `spawn` for
   * each `sftp` subsystem request, in `cwd` with the commands'
   * environment, instead of serving SFTP in this process.
   * @default undefined: SFTP in this process (when `sftp` is on)
   */
  sftpCommand?: readonly string[];
}

/** A running SSH server, as returned by {@linkcode startSshServer}. */
export interface SshServer {
  /** The address it listens on. */
  readonly addr: Deno.NetAddr;
  /** The host public key, `ssh-ed25519 AAAA...`. */
  readonly hostPublicKey: string;
  /** Resolves once the server has shut down. */
  readonly finished: Promise<void>;
  /**
   * Serves one connection accepted elsewhere (a control server's
   * `tunnel.open`) as if it had come to the listener; `head` holds bytes
   * already read from it. Resolves when it ends. Such connections were
   * authenticated by whoever hands them over, and are bounded there: they
   * neither count towards nor wait for `maxConnections` and `maxStartups`,
   * so anonymous TCP connections cannot crowd them out.
   */
  attach(conn: Deno.Conn, head?: Uint8Array): Promise<void>;
  /** Stops listening, ends every connection (killing its commands) and waits. */
  shutdown(): Promise<void>;
  /** Same as `shutdown()`. */
  [Symbol.asyncDispose](): Promise<void>;
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

function hostEnv(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

/** The default {@linkcode SshSpawner}: `argv` as is, in its own session. */
function spawnDirect(argv: readonly string[], options: SshSpawnOptions): Deno.ChildProcess {
  return new Deno.Command(argv[0], {
    args: argv.slice(1),
    cwd: options.cwd,
    env: options.env,
    clearEnv: true,
    // setsid(): the command leads its own process group, which we kill.
    detached: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
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

function checkCiphers(ciphers: readonly string[] | undefined): readonly string[] | undefined {
  if (ciphers === undefined) return undefined;
  if (!Array.isArray(ciphers) || ciphers.length === 0) {
    throw new TypeError("Cannot start SSH server: ciphers must be a non-empty array of names");
  }
  for (const c of ciphers) {
    if (!Object.hasOwn(CIPHERS, c)) {
      throw new RangeError(
        `Cannot start SSH server: unknown cipher "${c}" (known: ${
          Object.keys(CIPHERS).join(", ")
        })`,
      );
    }
  }
  return [...ciphers];
}

interface ServerConfig {
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
}

/** One exec/shell session channel. */
class Session {
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
        this.#kill();
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
      PATH: hostEnv("PATH") ?? DEFAULT_PATH,
      HOME: hostEnv("HOME") ?? "/",
      USER: hostEnv("USER") ?? "root",
      LANG: hostEnv("LANG") ?? "C.UTF-8",
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
    const send = async (data: Uint8Array) => {
      if (this.#channel.isClosing) return; // drain so the pipe closes
      try {
        await this.#channel.write(data, ext, true);
      } catch {
        // Channel gone: keep draining, the process is being killed.
      }
    };
    const reader = chunkReader(stream);
    const max = this.#channel.maxPacket;
    // Read bytes go into the current slot; its whole packets are sent from
    // it, and it is used again once the channel has flushed them.
    const slots = Array.from({ length: PUMP_SLOTS }, () => ({
      bytes: new Uint8Array(0),
      flushed: Promise.resolve(),
    }));
    let slot = 0;
    let pending = new Uint8Array(max + PUMP_BUFFER);
    slots[0].bytes = pending;
    let pendingLength = 0;
    try {
      let next = reader.read();
      while (true) {
        let chunk: Uint8Array | null;
        if (pendingLength === 0) {
          chunk = await next;
        } else {
          let timer: ReturnType<typeof setTimeout> | undefined;
          const tick = new Promise<"tick">((resolve) =>
            timer = setTimeout(() => resolve("tick"), 0)
          );
          const first = await Promise.race([next, tick]);
          clearTimeout(timer);
          if (first === "tick") {
            const t = pending.slice(0, pendingLength);
            pendingLength = 0;
            await send(t);
            continue;
          }
          chunk = first;
        }
        if (chunk === null) break;
        if (pendingLength + chunk.length > pending.length) {
          const grown = new Uint8Array(pendingLength + chunk.length);
          grown.set(pending.subarray(0, pendingLength));
          pending = slots[slot].bytes = grown;
        }
        pending.set(chunk, pendingLength);
        pendingLength += chunk.length;
        next = reader.read();
        if (pendingLength >= max) {
          const whole = pendingLength - (pendingLength % max);
          const out = pending.subarray(0, whole);
          const full = slots[slot];
          slot = (slot + 1) % PUMP_SLOTS;
          await slots[slot].flushed;
          if (slots[slot].bytes.length < max + PUMP_BUFFER) {
            slots[slot].bytes = new Uint8Array(max + PUMP_BUFFER);
          }
          const rest = pending.subarray(whole, pendingLength);
          pending = slots[slot].bytes;
          pending.set(rest);
          pendingLength = rest.length;
          await send(out);
          full.flushed = this.#channel.flush().catch(() => {});
        }
      }
      if (pendingLength > 0) await send(pending.slice(0, pendingLength));
    } catch (err) {
      if (!isPeerGone(err)) this.#config.onError(err);
    } finally {
      reader.release();
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
    this.#stdinQueue = [];
    this.#stdinEof = true;
    if (!this.#stdinBusy) this.#stdin?.close().catch(() => {});
  }
}

/** One client connection: authentication, then channels. */
class ServerConnection {
  readonly transport: SshTransport;
  readonly #config: ServerConfig;
  readonly #mux: ChannelMux;
  readonly #sessions = new Set<Session>();
  #service = false;
  #authed = false;
  #failures = 0;
  #authedResolve!: () => void;
  readonly authed: Promise<void> = new Promise((resolve) => this.#authedResolve = resolve);

  constructor(conn: Deno.Conn, hostKey: Promise<Signer>, config: ServerConfig) {
    this.#config = config;
    this.transport = new SshTransport(conn, {
      role: "server",
      hostKey,
      rekeyBytes: config.rekeyLimit,
      ciphers: config.ciphers,
      onPacket: (p) => this.#onPacket(p),
    });
    this.#mux = new ChannelMux(this.transport, (type, channel) => {
      if (type !== "session") return { reason: 3, message: `unsupported channel type "${type}"` };
      const session = new Session(channel, this.#config);
      this.#sessions.add(session);
      channel.closed.then(() => session.done).finally(() => this.#sessions.delete(session));
      return { handlers: session.handlers() };
    });
  }

  async run(graceMs: number, versionMs: number): Promise<void> {
    const timer = setTimeout(() => {
      this.transport.disconnect(DISCONNECT.PROTOCOL_ERROR, "login grace time exceeded")
        .catch(() => {});
    }, graceMs);
    // A silent peer gets no binary DISCONNECT: it has not spoken SSH yet.
    const versionTimer = setTimeout(() => {
      if (this.transport.peerVersion === "") this.transport.close();
    }, versionMs);
    try {
      await this.transport.handshake();
      await Promise.race([this.authed, this.transport.closed]);
    } catch {
      // Handshake failures only end this connection.
    } finally {
      clearTimeout(timer);
      clearTimeout(versionTimer);
    }
    const err = await this.transport.closed;
    this.#mux.abortAll(err ?? new SshError("Connection closed"));
    await this.transport.wait();
    await Promise.allSettled([...this.#sessions].map((s) => s.done));
    if (err !== null && !(err instanceof SshError) && !isPeerGone(err)) this.#config.onError(err);
  }

  async #onPacket(payload: Uint8Array): Promise<void> {
    const type = payload[0];
    if (type === MSG.SERVICE_REQUEST) {
      const name = new SshReader(payload, 1).text();
      if (name !== "ssh-userauth" || this.#service) {
        throw new SshError(`Cannot serve: unknown service "${name}"`, {
          reason: DISCONNECT.SERVICE_NOT_AVAILABLE,
        });
      }
      this.#service = true;
      this.transport.post(new SshWriter(32).byte(MSG.SERVICE_ACCEPT).string(name).bytes());
      return;
    }
    if (type === MSG.USERAUTH_REQUEST) {
      if (!this.#service) throw new SshError("Cannot serve: no ssh-userauth", { reason: 2 });
      if (!this.#authed) await this.#auth(payload);
      return; // Requests after success are ignored (RFC 4252 section 5.1).
    }
    if (this.#authed && await this.#mux.handle(payload)) return;
    throw new SshError(`Cannot serve: unexpected message "${type}"`, {
      reason: DISCONNECT.PROTOCOL_ERROR,
    });
  }

  async #auth(payload: Uint8Array): Promise<void> {
    const r = new SshReader(payload, 1);
    const user = r.text();
    const service = r.text();
    const method = r.text();
    if (service !== "ssh-connection") {
      throw new SshError(`Cannot serve: unknown service "${service}"`, {
        reason: DISCONNECT.SERVICE_NOT_AVAILABLE,
      });
    }
    const userOk = this.#config.user === undefined || this.#config.user === user;
    if (method === "publickey") {
      const hasSig = r.boolean();
      const alg = r.text();
      const blob = r.string();
      const known = alg === ED25519 && userOk &&
        this.#config.authorized.some((k) => bytesEqual(k, blob));
      if (!hasSig) {
        if (known) {
          this.transport.post(
            new SshWriter(80).byte(MSG.USERAUTH_PK_OK).string(alg).string(blob).bytes().slice(),
          );
          return;
        }
      } else if (known) {
        const sig = r.string();
        const signed = new SshWriter(256).string(this.transport.sessionId).byte(
          MSG.USERAUTH_REQUEST,
        ).string(user).string(service).string("publickey").boolean(true).string(alg).string(blob)
          .bytes();
        if (await verifyEd25519(blob.subarray(19), sig, signed)) {
          this.#authed = true;
          this.transport.post(new Uint8Array([MSG.USERAUTH_SUCCESS]));
          this.#authedResolve();
          return;
        }
      }
    }
    if (method !== "none") this.#failures++;
    if (this.#failures > this.#config.maxAuthTries) {
      throw new SshError("Cannot log in: too many authentication failures", {
        reason: DISCONNECT.NO_MORE_AUTH_METHODS_AVAILABLE,
      });
    }
    this.transport.post(
      new SshWriter(32).byte(MSG.USERAUTH_FAILURE).nameList(["publickey"]).boolean(false).bytes()
        .slice(),
    );
  }
}

function checkStartups(limits: SshStartupLimits): SshStartupLimits {
  const { start, rate, full } = limits ?? {};
  const ok = Number.isInteger(start) && Number.isInteger(rate) && Number.isInteger(full) &&
    start >= 1 && start <= full && rate >= 0 && rate <= 100;
  if (!ok) {
    throw new RangeError(
      `Cannot start SSH server: invalid maxStartups "${start}:${rate}:${full}" (want start:rate:full with 1 <= start <= full, 0 <= rate <= 100)`,
    );
  }
  return { start, rate, full };
}

class Server implements SshServer {
  readonly #listener: Deno.TcpListener;
  readonly #hostKey: Promise<Signer>;
  readonly #config: ServerConfig;
  readonly #grace: number;
  readonly #versionTimeout: number;
  readonly #maxConnections: number;
  readonly #startups: SshStartupLimits;
  readonly #conns = new Map<ServerConnection, Promise<void>>();
  /** Connections from our listener that have not logged in yet. */
  readonly #unauthed = new Set<ServerConnection>();
  /** Connections from our listener being served. */
  #listened = 0;
  readonly #hostPublicKey: string;
  readonly #finished: Promise<void>;
  #finishedResolve!: () => void;
  #accepting: Promise<void>;
  #shuttingDown: Promise<void> | null = null;

  constructor(options: SshServerOptions) {
    if (typeof options !== "object" || options === null) {
      throw new TypeError("Cannot start SSH server: expected an options object");
    }
    const parsed = parsePrivateKey(options.hostKey);
    if (!Array.isArray(options.authorizedKeys)) {
      throw new TypeError("Cannot start SSH server: authorizedKeys must be an array");
    }
    const authorized = options.authorizedKeys.map((k) => parsePublicKey(k).blob);
    const maxAuthTries = options.maxAuthTries ?? 6;
    if (!Number.isInteger(maxAuthTries) || maxAuthTries < 1) {
      throw new RangeError(`Cannot start SSH server: invalid maxAuthTries "${maxAuthTries}"`);
    }
    this.#grace = options.loginGraceTime ?? 30_000;
    this.#versionTimeout = options.versionTimeout ?? 10_000;
    if (!(this.#versionTimeout > 0)) {
      throw new RangeError(
        `Cannot start SSH server: invalid versionTimeout "${this.#versionTimeout}"`,
      );
    }
    this.#maxConnections = options.maxConnections ?? 256;
    this.#startups = checkStartups(options.maxStartups ?? { start: 10, rate: 30, full: 100 });
    if (options.spawn !== undefined && typeof options.spawn !== "function") {
      throw new TypeError("Cannot start SSH server: spawn must be a function");
    }
    this.#hostKey = Ed25519Signer.fromParsed(parsed);
    this.#hostKey.catch(() => {});
    this.#hostPublicKey = formatPublicKey(parsed.publicKey);
    this.#config = {
      spawn: options.spawn ?? spawnDirect,
      cwd: options.cwd ?? Deno.cwd(),
      env: { ...(options.env ?? {}) },
      user: options.user,
      authorized,
      maxAuthTries,
      rekeyLimit: options.rekeyLimit,
      ciphers: checkCiphers(options.ciphers),
      onError: options.onError ?? (() => {}),
      sftpRoot: null,
      sftpCommand: null,
    };
    const sftpCommand = options.sftpCommand;
    if (sftpCommand !== undefined) {
      if (
        !Array.isArray(sftpCommand) || sftpCommand.length === 0 ||
        !sftpCommand.every((a) => typeof a === "string")
      ) {
        throw new TypeError(
          "Cannot start SSH server: sftpCommand must be a non-empty string array",
        );
      }
      this.#config.sftpCommand = [...sftpCommand];
    }
    if (options.sftp ?? true) {
      this.#config.sftpRoot = Deno.realPath(this.#config.cwd);
      this.#config.sftpRoot.catch(() => {});
    }
    this.#finished = new Promise((resolve) => this.#finishedResolve = resolve);
    this.#listener = Deno.listen({
      hostname: options.hostname ?? "127.0.0.1",
      port: options.port ?? 0,
      transport: "tcp",
    });
    const signal = options.signal;
    if (signal?.aborted) {
      this.#accepting = Promise.resolve();
      this.shutdown();
      return;
    }
    signal?.addEventListener("abort", () => this.shutdown(), { once: true });
    options.onListen?.(this.addr);
    this.#accepting = this.#accept();
  }

  get addr(): Deno.NetAddr {
    return this.#listener.addr;
  }

  get hostPublicKey(): string {
    return this.#hostPublicKey;
  }

  get finished(): Promise<void> {
    return this.#finished;
  }

  async #accept(): Promise<void> {
    await acceptLoop(this.#listener, (conn) => void this.#serve(conn), {
      closing: () => this.#shuttingDown !== null,
      onError: this.#config.onError,
    });
  }

  attach(conn: Deno.Conn, head?: Uint8Array): Promise<void> {
    if (this.#shuttingDown !== null) {
      closeQuietly(conn);
      return Promise.resolve();
    }
    if (head === undefined || head.length === 0) return this.#serve(conn, true);
    const from = prefixed(conn, head);
    // The transport reads, writes and closes; nothing else of a Conn.
    const joined = {
      read: (p: Uint8Array) => from.read(p),
      write: (p: Uint8Array) => conn.write(p),
      closeWrite: () => conn.closeWrite(),
      close: () => conn.close(),
    } as unknown as Deno.Conn;
    return this.#serve(joined, true);
  }

  /**
   * Serves a connection. Only those from our listener count towards the
   * connection cap and the unauthenticated slots: handed-over ones were
   * authenticated (the control token) and are capped by whoever handed
   * them over.
   */
  #serve(conn: Deno.Conn, attached = false): Promise<void> {
    if (!attached && (this.#listened >= this.#maxConnections || this.#dropStartup())) {
      closeQuietly(conn);
      return Promise.resolve();
    }
    if ("setNoDelay" in conn) (conn as Deno.TcpConn).setNoDelay(true);
    const c = new ServerConnection(conn, this.#hostKey, this.#config);
    if (!attached) {
      this.#listened++;
      this.#unauthed.add(c);
      c.authed.then(() => this.#unauthed.delete(c));
    }
    const task = c.run(this.#grace, this.#versionTimeout).catch((err) => this.#config.onError(err))
      .finally(() => {
        if (!attached) {
          this.#listened--;
          this.#unauthed.delete(c);
        }
        this.#conns.delete(c);
      });
    this.#conns.set(c, task);
    return task;
  }

  /** OpenSSH's random early drop: whether to refuse a new connection. */
  #dropStartup(): boolean {
    const { start, rate, full } = this.#startups;
    const n = this.#unauthed.size;
    if (n >= full) return true;
    if (n < start) return false;
    const p = rate + ((100 - rate) * (n - start)) / (full - start);
    return Math.random() * 100 < p;
  }

  shutdown(): Promise<void> {
    this.#shuttingDown ??= (async () => {
      closeQuietly(this.#listener);
      await this.#accepting;
      for (const c of this.#conns.keys()) {
        c.transport.disconnect(DISCONNECT.BY_APPLICATION, "server shutting down").catch(() => {});
      }
      await Promise.allSettled([...this.#conns.values()]);
      // Operations the constructor started end before the server is done.
      await this.#hostKey.catch(() => {});
      await this.#config.sftpRoot?.catch(() => {});
      this.#finishedResolve();
    })();
    return this.#shuttingDown;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.shutdown();
  }
}

/**
 * Starts an SSH server. Commands run as this process's user (or however the
 * `spawn` hook starts them); only the keys in `authorizedKeys` may log in.
 *
 * @example Serve a directory over SSH
 * ```ts
 * import { generateSshKeyPair } from "./keys.ts";
 * import { startSshServer } from "./server.ts";
 * import assert from "node:assert/strict";
 *
 * const host = await generateSshKeyPair();
 * const client = await generateSshKeyPair();
 * await using server = startSshServer({
 *   hostKey: host.privateKey,
 *   authorizedKeys: [client.publicKey],
 *   cwd: Deno.cwd(),
 * });
 * // Log in with: ssh -i <client key> -p <port> agent@127.0.0.1
 * assert.ok(server.addr.port > 0);
 * assert.equal(server.hostPublicKey, host.publicKey);
 * ```
 *
 * @param options keys, address, working directory, environment
 * @returns the running server
 * @throws {TypeError} when a key does not parse
 * @throws {RangeError} when a limit is out of range
 */
export function startSshServer(options: SshServerOptions): SshServer {
  return new Server(options);
}
