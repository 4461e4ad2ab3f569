// This host's end of the desktop's pipe (the supervisor's stdin and
// stdout, see _desktop_main.ts). Frames are a type byte, a 32-bit id, a
// 32-bit length and the payload. Each VNC connection is a channel with the
// shape of a connection (read, write, closeWrite, close), so the tunnel
// splices a client's socket to it and RfbClient runs over it. The reader of
// the pipe never waits for a slow client: a channel whose client leaves
// more than `maxQueue` bytes unread is closed, so one client cannot stall
// the others (the grader's among them).

import { errorMessage } from "../_internal/util.ts";
import { FRAME } from "./_desktop_main.ts";

/** How a program on the desktop ended, or why it could not start. */
export interface PipeExit {
  code?: number | null;
  signal?: string | null;
  stdout?: string;
  stderr?: string;
  error?: string;
}

/**
 * The largest frame read from the supervisor (which runs as the agent's
 * user, so its output is not trusted): a program's exit with a MiB of
 * output on each stream, JSON-escaped, fits.
 */
const MAX_FRAME = 16 * 1024 * 1024;
/** The most output of a stream a program's exit may carry (the supervisor keeps the first MiB). */
const MAX_OUTPUT = 1024 * 1024;
const WRITE_CHUNK = 64 * 1024;

/** The longest reason a supervisor's frame may give (a close, a fatal error). */
const MAX_REASON = 500;

/** `text` on one line, cut to {@linkcode MAX_REASON} characters. */
function oneLine(text: string): string {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > MAX_REASON ? `${line.slice(0, MAX_REASON)}...` : line;
}

function parseJson(text: string, what: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    value = null;
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error(`a malformed ${what} frame`);
  }
  return value as Record<string, unknown>;
}

/** A program's exit as the supervisor reports it, every field checked. */
function parseExit(text: string): PipeExit {
  const v = parseJson(text, "exit");
  const optional = (key: string, ok: (x: unknown) => boolean) => v[key] === undefined || ok(v[key]);
  const str = (x: unknown) => typeof x === "string" && x.length <= MAX_OUTPUT;
  const valid = optional(
    "code",
    (x) => x === null || (Number.isInteger(x) && Math.abs(x as number) < 2 ** 31),
  ) &&
    optional(
      "signal",
      (x) => x === null || (typeof x === "string" && /^SIG[A-Z0-9]{1,10}$/.test(x)),
    ) &&
    optional("stdout", str) && optional("stderr", str) &&
    optional("error", (x) => typeof x === "string");
  if (!valid) throw new Error("a malformed exit frame");
  const exit: PipeExit = {};
  if (v.code !== undefined) exit.code = v.code as number | null;
  if (v.signal !== undefined) exit.signal = v.signal as string | null;
  if (v.stdout !== undefined) exit.stdout = v.stdout as string;
  if (v.stderr !== undefined) exit.stderr = v.stderr as string;
  if (v.error !== undefined) exit.error = oneLine(v.error as string);
  return exit;
}

/** The supervisor's READY: the X display's number. */
function parseReady(text: string): { display: number } {
  const { display } = parseJson(text, "ready");
  if (!Number.isInteger(display) || (display as number) < 0 || (display as number) > 65535) {
    throw new Error("a malformed ready frame");
  }
  return { display: display as number };
}

/** One VNC connection through the pipe. */
export class DesktopChannel {
  readonly #pipe: DesktopPipe;
  readonly #id: number;
  #chunks: Uint8Array[] = [];
  #queued = 0;
  #ended = false;
  #closed = false;
  #reason: string | null = null;
  #wake: (() => void) | null = null;

  constructor(pipe: DesktopPipe, id: number) {
    this.#pipe = pipe;
    this.#id = id;
  }

  /** Why the supervisor closed it, if it did. */
  get reason(): string | null {
    return this.#reason;
  }

  /** @internal bytes from the VNC server. */
  deliver(chunk: Uint8Array, maxQueue: number): void {
    if (this.#closed || this.#ended) return;
    this.#chunks.push(chunk);
    this.#queued += chunk.length;
    if (this.#queued > maxQueue) {
      this.#reason = "the client is not reading";
      this.close();
      return;
    }
    this.#wakeUp();
  }

  /** @internal the VNC server ended its side (or the supervisor closed it). */
  end(reason: string | null = null): void {
    this.#ended = true;
    if (reason !== null) this.#reason ??= reason;
    this.#wakeUp();
  }

  #wakeUp(): void {
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }

  async read(p: Uint8Array): Promise<number | null> {
    while (this.#chunks.length === 0) {
      if (this.#ended || this.#closed) return null;
      await new Promise<void>((resolve) => this.#wake = resolve);
    }
    const head = this.#chunks[0];
    const n = Math.min(p.length, head.length);
    p.set(head.subarray(0, n));
    if (n === head.length) this.#chunks.shift();
    else this.#chunks[0] = head.subarray(n);
    this.#queued -= n;
    return n;
  }

  async write(p: Uint8Array): Promise<number> {
    if (this.#closed || this.#pipe.dead) {
      throw new Deno.errors.BrokenPipe("the desktop channel is closed");
    }
    for (let off = 0; off < p.length; off += WRITE_CHUNK) {
      await this.#pipe.send(FRAME.DATA, this.#id, p.subarray(off, off + WRITE_CHUNK));
    }
    return p.length;
  }

  async closeWrite(): Promise<void> {
    if (this.#closed) return;
    await this.#pipe.send(FRAME.EOF, this.#id);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#chunks = [];
    this.#pipe.forget(this.#id);
    this.#pipe.send(FRAME.CLOSE, this.#id).catch(() => {});
    this.#wakeUp();
  }
}

/** The supervisor's pipe: channels, programs, and its readiness. */
export class DesktopPipe {
  readonly #child: Deno.ChildProcess;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #maxQueue: number;
  readonly #channels = new Map<number, DesktopChannel>();
  readonly #programs = new Map<number, (exit: PipeExit) => void>();
  readonly #ready = Promise.withResolvers<{ display: number }>();
  readonly #loop: Promise<void>;
  #writing: Promise<void> = Promise.resolve();
  #nextId = 1;
  #dead: string | null = null;

  constructor(child: Deno.ChildProcess, maxQueue: number) {
    this.#child = child;
    this.#maxQueue = maxQueue;
    this.#writer = child.stdin.getWriter();
    this.#writer.closed.catch(() => {});
    this.#ready.promise.catch(() => {});
    this.#loop = this.#read();
  }

  /** Resolves with the X display's number once the desktop is up. */
  get ready(): Promise<{ display: number }> {
    return this.#ready.promise;
  }

  /** Why the pipe is gone, or null while it works. */
  get dead(): string | null {
    return this.#dead;
  }

  /** Ends of the read loop (the supervisor's stdout closed). */
  get finished(): Promise<void> {
    return this.#loop;
  }

  send(type: number, id: number, payload: Uint8Array = new Uint8Array()): Promise<void> {
    const frame = new Uint8Array(9 + payload.length);
    const v = new DataView(frame.buffer);
    v.setUint8(0, type);
    v.setUint32(1, id);
    v.setUint32(5, payload.length);
    frame.set(payload, 9);
    const next = this.#writing.then(() => {
      if (this.#dead !== null) throw new Deno.errors.BrokenPipe(this.#dead);
      return this.#writer.write(frame);
    });
    this.#writing = next.catch(() => {});
    return next;
  }

  /** A new VNC connection. */
  open(): DesktopChannel {
    const id = this.#nextId++;
    const channel = new DesktopChannel(this, id);
    this.#channels.set(id, channel);
    if (this.#dead !== null) channel.end(this.#dead);
    else this.send(FRAME.OPEN, id).catch(() => channel.end("the desktop is gone"));
    return channel;
  }

  /** @internal drops a channel this side closed. */
  forget(id: number): void {
    this.#channels.delete(id);
  }

  /** Starts a program on the display; resolves with how it ended. */
  run(
    spec: { argv: string[]; env?: Record<string, string>; cwd?: string; capture?: boolean },
  ): { id: number; exit: Promise<PipeExit> } {
    const id = this.#nextId++;
    const exit = new Promise<PipeExit>((resolve) => this.#programs.set(id, resolve));
    if (this.#dead !== null) {
      this.#programs.delete(id);
      return { id, exit: Promise.resolve({ error: this.#dead }) };
    }
    this.send(FRAME.RUN, id, new TextEncoder().encode(JSON.stringify(spec))).catch(() => {});
    return { id, exit };
  }

  /** Sends `signal` to a program's process group. */
  async kill(id: number, signal: string): Promise<void> {
    if (!this.#programs.has(id)) return;
    await this.send(FRAME.KILL, id, new TextEncoder().encode(signal)).catch(() => {});
  }

  async #read(): Promise<void> {
    const reader = this.#child.stdout.getReader();
    let buf = new Uint8Array(0);
    const need = async (n: number): Promise<boolean> => {
      while (buf.length < n) {
        const { value, done } = await reader.read();
        if (done) return false;
        const next = new Uint8Array(buf.length + value.length);
        next.set(buf);
        next.set(value, buf.length);
        buf = next;
      }
      return true;
    };
    const decoder = new TextDecoder();
    try {
      while (await need(9)) {
        const v = new DataView(buf.buffer, buf.byteOffset, 9);
        const type = v.getUint8(0);
        const id = v.getUint32(1);
        const length = v.getUint32(5);
        if (length > MAX_FRAME) throw new Error(`a frame of ${length} bytes`);
        if (!await need(9 + length)) break;
        const payload = buf.slice(9, 9 + length);
        buf = buf.subarray(9 + length);
        this.#dispatch(type, id, payload, decoder);
      }
      this.#die("the desktop's supervisor exited");
    } catch (err) {
      this.#die(`the desktop's pipe broke: ${errorMessage(err)}`);
    } finally {
      // Cancelled, not released: after a bad frame nothing more is read, and
      // the stream would stay open until the supervisor exits.
      await reader.cancel().catch(() => {});
    }
  }

  #dispatch(type: number, id: number, payload: Uint8Array, decoder: TextDecoder): void {
    const channel = this.#channels.get(id);
    switch (type) {
      case FRAME.DATA:
        channel?.deliver(payload, this.#maxQueue);
        break;
      case FRAME.EOF:
        channel?.end();
        break;
      case FRAME.CLOSE:
        this.#channels.delete(id);
        channel?.end(oneLine(decoder.decode(payload)) || "closed by the desktop");
        break;
      case FRAME.EXIT: {
        // Parsed before the program is forgotten: a bad frame ends the pipe,
        // which answers every program still waiting, this one among them.
        const exit = parseExit(decoder.decode(payload));
        const resolve = this.#programs.get(id);
        this.#programs.delete(id);
        resolve?.(exit);
        break;
      }
      case FRAME.READY:
        this.#ready.resolve(parseReady(decoder.decode(payload)));
        break;
      case FRAME.FATAL:
        this.#die(oneLine(String(parseJson(decoder.decode(payload), "fatal")?.message)));
        break;
      default:
        throw new Error(`a frame of unknown type ${type}`);
    }
  }

  #die(reason: string): void {
    if (this.#dead !== null) return;
    this.#dead = reason;
    this.#ready.reject(new Error(reason));
    for (const channel of this.#channels.values()) channel.end(reason);
    this.#channels.clear();
    for (const resolve of this.#programs.values()) resolve({ error: reason });
    this.#programs.clear();
  }

  /** Closes the pipe (the supervisor exits when its stdin ends). */
  async close(): Promise<void> {
    this.#die("the desktop is stopped");
    await this.#writer.close().catch(() => {});
  }
}
