// Shared test helpers: a raw NDJSON peer over a real socket, and small
// environments used across suites.

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

/** Waits until `predicate` holds, polling; throws after `ms`. */
export async function waitFor(predicate: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 10));
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
