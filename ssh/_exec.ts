/**
 * What `SshClient` (`client.ts`) needs to run a command over a
 * session channel: its output as streams with flow control, its exit
 * status, and the result of a command run to the end.
 *
 * @module
 */

import type { Channel } from "./_channel.ts";
import { concat, fromUtf8, type SshReader } from "./_wire.ts";

/** What `SshClient.exec()` returns. */
// The shape of `SshExecResult` (client.ts), which checks it where `exec()`
// returns one; importing the type here would make an import cycle.
export class ExecResult {
  readonly code: number;
  readonly signal: string | null;
  readonly stdout: Uint8Array;
  readonly stderr: Uint8Array;

  constructor(
    status: { code: number; signal: string | null },
    stdout: Uint8Array,
    stderr: Uint8Array,
  ) {
    this.code = status.code;
    this.signal = status.signal;
    this.stdout = stdout;
    this.stderr = stderr;
  }
  get success(): boolean {
    return this.code === 0;
  }
  get stdoutText(): string {
    return fromUtf8(this.stdout);
  }
  get stderrText(): string {
    return fromUtf8(this.stderr);
  }
}

/** Collects exit status from channel requests. */
export function statusFrom(
  type: string,
  r: SshReader,
  into: { code: number; signal: string | null; received: boolean },
): boolean {
  if (type === "exit-status") {
    into.code = r.uint32();
    into.received = true;
  } else if (type === "exit-signal") {
    into.signal = r.text();
    into.code = -1;
    into.received = true;
  }
  return false;
}

/** Everything a stream yields, as one array. */
export async function collectStream(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const part of stream) parts.push(part);
  return concat(parts);
}

/** A ReadableStream fed by channel data; window returned as chunks are read. */
export class StreamSink {
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
