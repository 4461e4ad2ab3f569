// A model endpoint that always knows the answer and often fails to give it:
// an OpenAI-compatible Chat Completions server (one request per
// connection, no streaming) whose scripted "model" solves bench/faults.ts's
// task every time (a bash call that writes the number, then submit), and
// which, at random, resets the connection, hangs, answers 500, or stops
// listening for a moment (connections refused), or goes down for a spell
// (every request answered 503 for OUTAGE_MS: longer than a call's retries
// last). Raw TCP, so that a reset
// and a refusal are what a client really sees.

import { closeQuietly, writeAll } from "../_internal/io.ts";

/** How often each fault happens, per request (refusals: share of the time closed). */
export interface ModelFaults {
  reset: number;
  hang: number;
  error500: number;
  /** Of every second, how much the listener is closed (refusing connections). */
  refuse: number;
  /** Of the time, how much is spent in outages (spells of OUTAGE_MS answering 503 to all). */
  outage: number;
}

/** How long an outage lasts: more than a model call's retries (bench/faults.ts: about 3 s) wait. */
export const OUTAGE_MS = 5_000;

/** What the server counts. */
export interface ModelCounts {
  requests: number;
  ok: number;
  reset: number;
  hang: number;
  error500: number;
  refusals: number;
  outages: number;
  outage503: number;
}

const encoder = new TextEncoder();

/** The number a conversation's task asks for (its key in bench/faults.ts), or null. */
function numberOf(messages: { role: string; content?: string | null }[]): string | null {
  const user = messages.find((m) => m.role === "user")?.content ?? "";
  return /number (\d+)/.exec(user)?.[1] ?? null;
}

/** The scripted model's next message for a conversation, from its task and what its tools said. */
function nextMessage(
  messages: { role: string; content?: string | null }[],
): Record<string, unknown> {
  const user = messages.find((m) => m.role === "user")?.content ?? "";
  const n = /number (\d+)/.exec(user)?.[1] ?? "0";
  const file = /file (\S+\.txt)/.exec(user)?.[1] ?? `${n}.txt`;
  const last = messages.at(-1);
  const wrote = last?.role === "tool" && /^exit_code: 0\b/.test(last.content ?? "");
  if (wrote) {
    return {
      role: "assistant",
      content: null,
      tool_calls: [call("submit", { answer: `wrote ${n}` })],
    };
  }
  // First try, or the last one failed (killed, disk full, a cut connection): again.
  return {
    role: "assistant",
    content: null,
    tool_calls: [call("bash", { command: `sleep 0.2 && echo ${n} > ${file}` })],
  };
}

let calls = 0;
function call(name: string, args: Record<string, unknown>): Record<string, unknown> {
  return {
    id: `call_${++calls}`,
    type: "function",
    function: { name, arguments: JSON.stringify(args) },
  };
}

const REASONS: Record<number, string> = {
  200: "OK",
  500: "Internal Server Error",
  503: "Service Unavailable",
};

function response(status: number, body: unknown): Uint8Array {
  const text = JSON.stringify(body);
  return encoder.encode(
    `HTTP/1.1 ${status} ${REASONS[status] ?? "Error"}\r\n` +
      `content-type: application/json\r\ncontent-length: ${encoder.encode(text).length}\r\n` +
      `connection: close\r\n\r\n${text}`,
  );
}

/** Reads one HTTP request's body (the head up to its blank line, then content-length bytes). */
async function readRequest(conn: Deno.Conn): Promise<string | null> {
  let buf = new Uint8Array(0);
  const chunk = new Uint8Array(64 * 1024);
  let headEnd = -1;
  let length = 0;
  while (true) {
    const n = await conn.read(chunk);
    if (n === null) return null;
    const next = new Uint8Array(buf.length + n);
    next.set(buf);
    next.set(chunk.subarray(0, n), buf.length);
    buf = next;
    if (headEnd < 0) {
      const text = new TextDecoder().decode(buf);
      headEnd = text.indexOf("\r\n\r\n");
      if (headEnd < 0) continue;
      length = Number(/content-length: *(\d+)/i.exec(text.slice(0, headEnd))?.[1] ?? 0);
      headEnd += 4;
    }
    if (buf.length - headEnd >= length) {
      return new TextDecoder().decode(buf.subarray(headEnd, headEnd + length));
    }
  }
}

/**
 * A listener on a port below Linux's ephemeral range (32768 and up), so
 * that while it is closed (refusing) no connection of this machine's is
 * given its port, and it can listen there again.
 */
function listenBelowEphemeral(): Deno.Listener {
  for (let tries = 0; tries < 200; tries++) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    try {
      return Deno.listen({ hostname: "127.0.0.1", port });
    } catch (err) {
      if (!(err instanceof Deno.errors.AddrInUse)) throw err;
    }
  }
  throw new Error("Cannot listen: no free port between 20000 and 32000");
}

/** The fault server: `baseUrl`, what it counted, and `faults` to change (zero them for a calm run). */
export class FaultModel implements AsyncDisposable {
  readonly counts: ModelCounts = {
    requests: 0,
    ok: 0,
    reset: 0,
    hang: 0,
    error500: 0,
    refusals: 0,
    outages: 0,
    outage503: 0,
  };
  /** Faults served at random (resets, hangs, 500s) by the number each conversation's task asks for. */
  readonly faultsByKey = new Map<string, number>();
  /** 503s served in outages, by the same key. */
  readonly outagesByKey = new Map<string, number>();
  faults: ModelFaults;
  readonly #port: number;
  #listener: Deno.Listener | null;
  readonly #conns = new Set<Deno.Conn>();
  readonly #handlers = new Set<Promise<void>>();
  #closed = false;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #outageTimer: ReturnType<typeof setTimeout> | undefined;
  #down = false;

  constructor(faults: ModelFaults) {
    this.faults = faults;
    this.#listener = listenBelowEphemeral();
    this.#port = (this.#listener.addr as Deno.NetAddr).port;
    void this.#accept(this.#listener);
    this.#cycle();
    this.#outages(true);
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${this.#port}/v1`;
  }

  /** Outages of OUTAGE_MS, spaced so that they take `outage` of the time. */
  #outages(first = false): void {
    if (this.#closed) return;
    const share = this.faults.outage;
    // The first one early, so that a short run meets one too.
    const gap = (share > 0 ? OUTAGE_MS * (1 / share - 1) : 1000) * (first ? 0.3 : 1);
    this.#outageTimer = setTimeout(() => {
      if (this.#closed || this.faults.outage <= 0) return this.#outages();
      this.#down = true;
      this.counts.outages++;
      this.#outageTimer = setTimeout(() => {
        this.#down = false;
        this.#outages();
      }, OUTAGE_MS);
    }, gap * (0.5 + Math.random()));
  }

  /** Each second: closed (refusing) for `refuse` of it, then listening again on the same port. */
  #cycle(): void {
    this.#timer = setTimeout(() => {
      if (this.#closed) return;
      const closedFor = 1000 * this.faults.refuse;
      if (closedFor > 0 && this.#listener !== null) {
        closeQuietly(this.#listener);
        this.#listener = null;
        this.counts.refusals++;
        this.#timer = setTimeout(() => this.#reopen(250), closedFor);
        return;
      }
      this.#cycle();
    }, 1000 * (1 - this.faults.refuse) * (0.5 + Math.random()));
  }

  /**
   * Listens on the same port again. The old listener's socket can outlive
   * its close() for a moment (an accept in flight), so a port still in use
   * is tried again every 20 ms, `tries` times at most.
   */
  #reopen(tries: number): void {
    if (this.#closed) return;
    try {
      this.#listener = Deno.listen({ hostname: "127.0.0.1", port: this.#port });
    } catch (err) {
      if (!(err instanceof Deno.errors.AddrInUse) || tries <= 1) throw err;
      this.#timer = setTimeout(() => this.#reopen(tries - 1), 20);
      return;
    }
    void this.#accept(this.#listener);
    this.#cycle();
  }

  async #accept(listener: Deno.Listener): Promise<void> {
    try {
      for await (const conn of listener) {
        this.#conns.add(conn);
        const handler = this.#serve(conn).catch(() => {}).finally(() => {
          this.#conns.delete(conn);
          closeQuietly(conn);
          this.#handlers.delete(handler);
        });
        this.#handlers.add(handler);
      }
    } catch {
      // closed
    }
  }

  async #serve(conn: Deno.Conn): Promise<void> {
    const body = await readRequest(conn);
    if (body === null) return;
    this.counts.requests++;
    const request = JSON.parse(body) as { messages: { role: string; content?: string | null }[] };
    const fault = this.#fault();
    if (fault !== null) {
      this.counts[fault]++;
      const key = numberOf(request.messages);
      const byKey = fault === "outage503" ? this.outagesByKey : this.faultsByKey;
      if (key !== null) byKey.set(key, (byKey.get(key) ?? 0) + 1);
    }
    if (fault === "reset") return; // closed without a word
    if (fault === "hang") {
      // Held until the client gives up (its attempt timeout) and closes.
      while ((await conn.read(new Uint8Array(1024))) !== null) { /* until the client goes */ }
      return;
    }
    if (fault === "error500" || fault === "outage503") {
      const status = fault === "error500" ? 500 : 503;
      await writeAll(conn, response(status, { error: { message: "injected fault" } }));
      return;
    }
    this.counts.ok++;
    await writeAll(
      conn,
      response(200, {
        id: "chatcmpl-fault",
        object: "chat.completion",
        choices: [{
          index: 0,
          message: nextMessage(request.messages),
          finish_reason: "tool_calls",
        }],
        usage: { prompt_tokens: 50, completion_tokens: 10 },
      }),
    );
  }

  /** This request's fault, drawn at random, or null to answer it. */
  #fault(): "reset" | "hang" | "error500" | "outage503" | null {
    if (this.#down) return "outage503";
    const f = this.faults;
    const roll = Math.random();
    if (roll < f.reset) return "reset";
    if (roll < f.reset + f.hang) return "hang";
    if (roll < f.reset + f.hang + f.error500) return "error500";
    return null;
  }

  /** Every fault off from now on, an outage under way ended. */
  calm(): void {
    this.faults = { reset: 0, hang: 0, error500: 0, refuse: 0, outage: 0 };
    this.#down = false;
    clearTimeout(this.#outageTimer);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    clearTimeout(this.#outageTimer);
    if (this.#listener) closeQuietly(this.#listener);
    for (const conn of this.#conns) closeQuietly(conn);
    await Promise.allSettled([...this.#handlers]);
  }
}
