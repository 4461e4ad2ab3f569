// A streamed reply relayed from the model server to the agent: the events
// of each read of the server's stream read for the record and passed on
// together, and the call recorded once, when the stream ends, breaks, or
// the agent goes away.

import { cappedBody } from "../_internal/body.ts";
import { concat } from "../_internal/io.ts";
import { type SseEvent, SseParser } from "../_internal/sse.ts";
import { errorMessage } from "../_internal/util.ts";
import type { Recorder } from "./_recorder.ts";
import {
  parseEvent,
  type ProxyApi,
  scrub,
  SSE_HEADERS,
  sseEvent,
  type UpstreamEvent,
} from "./_wire.ts";

/** What a relay needs of its call (a `Call` of `_calls.ts` is one). */
export interface RelayedCall {
  /** The most bytes of the server's stream, and the key that must not be recorded. */
  readonly config: { readonly maxResponseBytes: number; readonly apiKey: string | null };
  /** The rollout's recorder. */
  readonly recorder: Recorder;
  /** `performance.now()` when the request came. */
  readonly started: number;
  /** Keeps the rollout open until `done` settles. */
  track(done: Promise<unknown>): void;
}

/** How a relayed stream's events are read and passed on. */
export interface Relay {
  /** The bytes the agent gets for `event`, or `null` for none. */
  pass(event: UpstreamEvent): Uint8Array | null;
  /** Whether the stream said it was complete. */
  finished(): boolean;
  /** Records the call once the stream is complete. */
  end(): Promise<void>;
}

/**
 * The agent's stream of a streamed reply: the events of each read of the
 * server's stream are read and passed on together (one write, however many
 * events a read holds); at the end the call is recorded, or, when the
 * stream broke, was cut short or the agent went away, recorded as failed.
 * `release` gives back the call's permit, saying whether it went well.
 */
export function relay(
  call: RelayedCall,
  api: ProxyApi,
  response: Response,
  release: (ok: boolean) => void,
  how: Relay,
): Response {
  const relayed = new RelayedStream(call, api, response, release, how);
  const stream = new ReadableStream<Uint8Array>({
    pull: (controller) => relayed.pull(controller),
    cancel: () => relayed.cancel(),
  });
  return new Response(stream, { headers: SSE_HEADERS });
}

/** One relayed stream: the server's reader, the event parser, and whether the call is settled. */
class RelayedStream {
  readonly #call: RelayedCall;
  readonly #api: ProxyApi;
  readonly #release: (ok: boolean) => void;
  readonly #how: Relay;
  readonly #reader: ReadableStreamDefaultReader<Uint8Array>;
  readonly #decoder = new TextDecoder();
  readonly #parser = new SseParser();
  readonly #settle: () => void;
  #over = false;

  constructor(
    call: RelayedCall,
    api: ProxyApi,
    response: Response,
    release: (ok: boolean) => void,
    how: Relay,
  ) {
    this.#call = call;
    this.#api = api;
    this.#release = release;
    this.#how = how;
    this.#reader = cappedBody(response.body!, call.config.maxResponseBytes, "the model's stream")
      .getReader();
    let settle!: () => void;
    call.track(new Promise<void>((resolve) => settle = resolve));
    this.#settle = settle;
  }

  /**
   * Reads until it has something to pass on (a pull that enqueues nothing
   * is not called again), or the stream ends.
   */
  async pull(controller: ReadableStreamDefaultController<Uint8Array>): Promise<void> {
    try {
      for (;;) {
        const { value, done } = await this.#reader.read();
        const events = done
          ? [...this.#parser.push(this.#decoder.decode()), ...this.#parser.end()]
          : this.#parser.push(this.#decoder.decode(value, { stream: true }));
        const { out, sawDone } = this.#pass(events);
        if (sawDone || done) return await this.#close(controller, out, sawDone);
        if (out.length > 0) return controller.enqueue(concat(out));
      }
    } catch (err) {
      await this.#finish(false, `Model proxy: the model's stream broke: ${errorMessage(err)}`);
      controller.error(err);
    }
  }

  /** The agent closed the stream before its end. */
  async cancel(): Promise<void> {
    await this.#finish(false, "Model proxy: the agent closed the stream before its end");
    await this.#reader.cancel().catch(() => {});
  }

  /** What the agent gets for `events`, up to a `[DONE]` (whether one came). */
  #pass(events: SseEvent[]): { out: Uint8Array[]; sawDone: boolean } {
    const out: Uint8Array[] = [];
    for (const event of events) {
      if (event.data.trim() === "[DONE]") return { out, sawDone: true };
      const bytes = this.#how.pass(parseEvent(event));
      if (bytes !== null) out.push(bytes);
    }
    return { out, sawDone: false };
  }

  /** Ends the agent's stream: a server stream that ended without saying it was complete was cut short. */
  async #close(
    controller: ReadableStreamDefaultController<Uint8Array>,
    out: Uint8Array[],
    sawDone: boolean,
  ): Promise<void> {
    if (!sawDone && !this.#how.finished()) {
      await this.#finish(false, "Model proxy: the model's stream ended early");
    } else await this.#finish(true);
    if (sawDone) out.push(sseEvent("[DONE]"));
    if (out.length > 0) controller.enqueue(concat(out));
    controller.close();
    await this.#reader.cancel().catch(() => {});
  }

  /**
   * Records the call (as failed with `message` unless `ok`), once, and
   * gives back its permit. When reading the finished stream for the record
   * fails (the rollout ended while llama-server was asked for the prompt's
   * ids), the call is recorded as failed and the error rethrown; the permit
   * and the rollout's wait are released whatever happens.
   */
  async #finish(ok: boolean, message = ""): Promise<void> {
    if (this.#over) return;
    this.#over = true;
    try {
      if (ok) await this.#how.end();
      else this.#fail(message);
    } catch (err) {
      ok = false;
      const why = scrub(errorMessage(err), this.#call.config.apiKey);
      this.#fail(`Model proxy: the stream ended, but reading it for the record failed: ${why}`);
      throw err;
    } finally {
      this.#release(ok);
      this.#settle();
    }
  }

  #fail(message: string): void {
    const latencyMs = performance.now() - this.#call.started;
    this.#call.recorder.fail({ api: this.#api, status: null, message, latencyMs });
  }
}
