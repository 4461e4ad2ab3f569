// Shared test helpers: a raw NDJSON peer over a real socket, child processes
// read line by line, and small environments used across suites.

import { waitingFor } from "./_deadline.ts";
import { LineReader, parseLine } from "../_internal/framing.ts";
import { writeAll } from "../_internal/io.ts";
import { Environment } from "../env.ts";
import { integer, withDefault } from "../schema.ts";

const encoder = new TextEncoder();

/** A raw protocol peer: sends lines, reads parsed frames. */
export class RawPeer implements AsyncDisposable {
  readonly conn: Deno.TcpConn;
  readonly reader: LineReader;
  #id = 0;

  private constructor(conn: Deno.TcpConn) {
    this.conn = conn;
    this.reader = new LineReader(conn, 64 * 1024 * 1024);
  }

  static async open(port: number): Promise<RawPeer> {
    return new RawPeer(await Deno.connect({ hostname: "127.0.0.1", port }));
  }

  /**
   * Opens a control session on a bound server and authenticates it with a
   * first `hello` carrying the server's token (when it has one).
   */
  static async login(
    server: { addr: Deno.NetAddr; token: string | null },
  ): Promise<RawPeer> {
    const peer = await RawPeer.open(server.addr.port);
    if (server.token === null) return peer;
    const reply = await peer.call("hello", { token: server.token });
    if (!reply.result) throw new Error(`login refused: ${JSON.stringify(reply.error)}`);
    return peer;
  }

  /** Sends a raw line (a `\n` is added) or an object as compact JSON. */
  async send(frame: string | Record<string, unknown>): Promise<void> {
    const text = typeof frame === "string" ? frame : JSON.stringify(frame);
    await writeAll(this.conn, encoder.encode(text + "\n"));
  }

  /** Next frame, or `null` at EOF. */
  async recv(): Promise<Record<string, unknown> | null> {
    const r = await this.reader.read();
    if (r === null) return null;
    if (r.kind === "oversized") throw new Error("oversized reply");
    return parseLine(r.line) as Record<string, unknown>;
  }

  /** Sends a request and returns its reply frame. */
  async call(method: string, params?: unknown): Promise<Record<string, unknown>> {
    const id = ++this.#id;
    await this.send({ jsonrpc: "2.0", id, method, ...(params === undefined ? {} : { params }) });
    const reply = await this.recv();
    if (reply === null) throw new Error(`EOF waiting for ${method}`);
    return reply;
  }

  /** Whether the server closed the connection (reads EOF). */
  async atEof(): Promise<boolean> {
    try {
      return (await this.reader.read()) === null;
    } catch {
      return true;
    }
  }

  close(): void {
    try {
      this.conn.close();
    } catch {
      // already closed
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    this.close();
    return Promise.resolve();
  }
}

/** Records of task lifecycles, to check that `finally` blocks ran. */
export interface Journal {
  events: string[];
}

/** An environment with a few templates that log their lifecycle. */
export function demoEnv(journal: Journal = { events: [] }): Environment {
  const env = new Environment("demo", { version: "1.2.3" });
  env.template(
    { id: "add", args: { a: integer(), b: withDefault(integer(), 2) } },
    async function* ({ a, b }) {
      journal.events.push(`start add ${a}`);
      try {
        const answer = yield `add:${a}:${b}`;
        yield Number(answer) === a + b ? 1.0 : 0.0;
      } finally {
        journal.events.push(`finally add ${a}`);
      }
    },
  );
  env.template({ id: "echo" }, async function* (args) {
    journal.events.push("start echo");
    try {
      const answer = yield { prompt: "echo", bindings: { shell: { seed: 7 } }, args };
      yield { score: 0.5, content: answer };
    } finally {
      journal.events.push("finally echo");
    }
  });
  return env;
}

/**
 * Waits until `predicate` holds, polling; throws after `ms`, or at the
 * test's deadline, naming `what` (by default the predicate's source).
 */
export async function waitFor(
  predicate: () => boolean,
  ms = 5000,
  what: string = predicate.toString(),
): Promise<void> {
  const end = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > end) throw new Error(`Condition not met within ${ms} ms: ${what}`);
    await waitingFor(what, new Promise((r) => setTimeout(r, 10)));
  }
}

/** A TCP server on 127.0.0.1:0 running `handle` per connection; `close()` ends everything. */
export function tcpServer(
  handle: (conn: Deno.Conn) => Promise<void>,
): { port: number; close(): Promise<void> } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns = new Set<Deno.Conn>();
  const tasks = new Set<Promise<void>>();
  const loop = (async () => {
    for await (const conn of listener) {
      conns.add(conn);
      const t = handle(conn).catch(() => {}).finally(() => {
        conns.delete(conn);
        try {
          conn.close();
        } catch { /* closed */ }
      });
      tasks.add(t);
      t.finally(() => tasks.delete(t));
    }
  })().catch(() => {});
  return {
    port: listener.addr.port,
    async close() {
      listener.close();
      for (const c of conns) {
        try {
          c.close();
        } catch { /* closed */ }
      }
      await loop;
      await Promise.allSettled([...tasks]);
    },
  };
}

/** A TCP echo daemon on 127.0.0.1:0 that half-closes when its peer does. */
export function echoServer(): { port: number; close(): Promise<void> } {
  return tcpServer(async (conn) => {
    const buf = new Uint8Array(64 * 1024);
    while (true) {
      const n = await conn.read(buf);
      if (n === null) break;
      await writeAll(conn, buf.subarray(0, n));
    }
    await conn.closeWrite();
  });
}

/** Options for {@linkcode waitForLine}. */
export interface WaitForLineOptions {
  /** What the line announces, for the failure message. */
  what: string;
  /** Gives up after this many ms. @default 20_000 */
  ms?: number;
  /** Says why no more output will come (the producer exited), or null while it may. */
  ended?: () => string | null;
}

/**
 * Waits until a complete line of `read()` matches `pattern`, looking at every
 * line (never only the first chunk), and returns the match. Fails naming
 * `what` with the output so far when `ended()` reports an end first, or
 * when the time runs out.
 */
export async function waitForLine(
  read: () => string,
  pattern: RegExp,
  options: WaitForLineOptions,
): Promise<RegExpExecArray> {
  const ms = options.ms ?? 20_000;
  const end = Date.now() + ms;
  while (true) {
    // An end is read before the text, so that the last lines are not missed.
    const ended = options.ended?.() ?? null;
    const text = read();
    for (const line of text.split("\n").slice(0, -1)) {
      const match = pattern.exec(line);
      if (match) return match;
    }
    if (ended !== null) {
      throw new Error(`No ${options.what} (a line matching ${pattern}): ${ended}`);
    }
    if (Date.now() > end) {
      throw new Error(
        `No ${options.what} (a line matching ${pattern}) within ${ms} ms; output so far: ` +
          JSON.stringify(text.slice(-2000)),
      );
    }
    await waitingFor(options.what, new Promise((r) => setTimeout(r, 10)));
  }
}

/**
 * The text of `stream` up to its first newline (or its end), the lock
 * released after: the rest stays readable, or cancel it.
 */
export async function firstLine(stream: ReadableStream<Uint8Array>): Promise<string> {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let text = "";
  try {
    while (!text.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
  } finally {
    reader.releaseLock();
  }
  return text.split("\n")[0];
}

/** Options for {@linkcode ChildProcess}. */
export interface ChildProcessOptions {
  /** Arguments after the program. */
  args?: string[];
  /** Extra environment variables. */
  env?: Record<string, string>;
  /** Working directory. */
  cwd?: string;
}

/**
 * A child process whose standard output and error are read to the end in
 * the background, so that a test can wait for a line and, when it fails,
 * say how the child ended and what it printed. `await using` stops it.
 */
export class ChildProcess implements AsyncDisposable {
  /** The program, as the failure messages name it. */
  readonly name: string;
  readonly #process: Deno.ChildProcess;
  #stdout = "";
  #stderr = "";
  #status: Deno.CommandStatus | null = null;
  readonly #drained: Promise<unknown>;
  readonly #exited: Promise<Deno.CommandStatus>;
  readonly #readers: ReadableStreamDefaultReader<string>[] = [];

  constructor(program: string, options: ChildProcessOptions = {}) {
    this.name = [program, ...(options.args ?? [])].map((a) => a.split("/").pop()).join(" ");
    this.#process = new Deno.Command(program, {
      args: options.args,
      env: options.env,
      cwd: options.cwd,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#drained = Promise.all([
      this.#drain(this.#process.stdout, (t) => this.#stdout += t),
      this.#drain(this.#process.stderr, (t) => this.#stderr += t),
    ]);
    this.#exited = this.#process.status.then(async (status) => {
      // The output is complete once the pipes close; a grandchild may hold them.
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([this.#drained, new Promise((r) => timer = setTimeout(r, 200))]);
      clearTimeout(timer);
      this.#status = status;
      return status;
    });
  }

  async #drain(stream: ReadableStream<Uint8Array>, add: (text: string) => void): Promise<void> {
    const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
    this.#readers.push(reader);
    try {
      while (true) {
        const { value, done } = await reader.read();
        if (done) return;
        add(value);
      }
    } catch {
      // Cancelled by stop().
    }
  }

  /** The process id. */
  get pid(): number {
    return this.#process.pid;
  }

  /** What it printed on standard output so far. */
  get stdout(): string {
    return this.#stdout;
  }

  /** What it printed on standard error so far. */
  get stderr(): string {
    return this.#stderr;
  }

  /** How it ended, or null while it runs. */
  get status(): Deno.CommandStatus | null {
    return this.#status;
  }

  /** How it ended and what it printed, for a failure message. */
  describe(): string {
    const s = this.#status;
    const how = s === null
      ? `${this.name} (pid ${this.pid}) is running`
      : `${this.name} (pid ${this.pid}) exited with code ${s.code}` +
        (s.signal ? ` (signal ${s.signal})` : "");
    const tail = (text: string) => JSON.stringify(text.slice(-2000));
    return `${how}; stdout: ${tail(this.#stdout)}; stderr: ${tail(this.#stderr)}`;
  }

  /**
   * Waits for a standard output line matching `pattern` and returns the
   * match; fails with {@linkcode describe} when the child exits first.
   */
  waitForLine(pattern: RegExp, what: string, ms = 20_000): Promise<RegExpExecArray> {
    return waitForLine(() => this.#stdout, pattern, {
      what: `${what} from ${this.name}`,
      ms,
      ended: () => this.#status === null ? null : this.describe(),
    }).catch((err) => {
      if (this.#status !== null) throw err;
      throw new Error(`${err.message}; ${this.describe()}`);
    });
  }

  /**
   * Sends `signal` unless the child has exited, then SIGKILL after `grace`
   * ms; resolves with how it ended. Never throws over a test's failure: a
   * child that is already gone is the one case it expects and ignores.
   */
  async stop(signal: Deno.Signal = "SIGTERM", grace = 5_000): Promise<Deno.CommandStatus> {
    this.#kill(signal);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const inTime = await Promise.race([
      this.#exited.then(() => true),
      new Promise<boolean>((r) => timer = setTimeout(() => r(false), grace)),
    ]);
    clearTimeout(timer);
    if (!inTime) this.#kill("SIGKILL");
    const status = await this.#exited;
    // A grandchild holding a pipe open must not keep a read pending.
    for (const reader of this.#readers) reader.cancel().catch(() => {});
    await this.#drained;
    return status;
  }

  #kill(signal: Deno.Signal): void {
    try {
      this.#process.kill(signal);
    } catch (err) {
      if (!(err instanceof TypeError && /already terminated/.test(err.message))) throw err;
    }
  }

  /** Stops the child: {@linkcode stop} with SIGTERM. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}
