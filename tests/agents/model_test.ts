// The model backends read replies with a ceiling (issue 23: "the MCP client
// and ChatAgent cap response sizes"; the model's replies are the other
// half): a server that answers with more than `maxResponseBytes`, as JSON,
// as an event stream, or as an error body, is cut off, and the rest of its
// body is never read.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { AnthropicBackend, OpenAiBackend } from "../../agents/mod.ts";
import type { ModelRequest } from "../../agents/model.ts";

const MIB = 1 << 20;
/** What each server offers: far past the 1 MiB ceiling the tests set. */
const OFFERED = 32 * MIB;
const CHUNK = 64 * 1024;

interface BigServer extends AsyncDisposable {
  origin: string;
  /** Bytes the body's source handed out: what was pulled from it. */
  pulled(): number;
}

/**
 * A server that answers every request with `status`, `type` and a valid body
 * of OFFERED bytes: `head`, then filler, then `tail`.
 */
function bigServer(status: number, type: string, head: string, fill: string, tail: string) {
  let pulled = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    await req.body?.cancel();
    const enc = new TextEncoder();
    // Whole copies of `fill` (whole events, for a stream).
    const filler = enc.encode(fill.repeat(Math.max(1, Math.floor(CHUNK / fill.length))));
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(enc.encode(head));
        pulled += head.length;
      },
      pull(c) {
        if (pulled + filler.length >= OFFERED) {
          c.enqueue(enc.encode(tail));
          pulled += tail.length;
          c.close();
          return;
        }
        c.enqueue(filler);
        pulled += filler.length;
      },
    });
    return new Response(body, { status, headers: { "content-type": type } });
  });
  const big: BigServer = {
    origin: `http://127.0.0.1:${server.addr.port}`,
    pulled: () => pulled,
    async [Symbol.asyncDispose]() {
      await server.shutdown();
    },
  };
  return big;
}

const REQUEST: ModelRequest = { messages: [{ role: "user", content: "hi" }], tools: [] };

async function assertCutOff(big: BigServer, call: Promise<unknown>, pattern: RegExp) {
  const err = await call.then(() => null, (e) => e);
  assert.ok(err !== null, "a reply of 32 MiB was taken whole");
  assert.match(String(err), pattern);
  // Loopback and the socket buffers hold a few MiB; the rest was never read.
  assert.ok(big.pulled() < OFFERED / 2, `${big.pulled()} of ${OFFERED} bytes were read`);
}

test("OpenAiBackend.complete() cuts off a JSON reply past maxResponseBytes", async () => {
  await using big = bigServer(
    200,
    "application/json",
    '{"choices":[{"finish_reason":"stop","message":{"role":"assistant","content":"',
    "a",
    '"}}]}',
  );
  // Not an object literal: the same test ran against the backend before it had the option.
  const options = { model: "m", baseUrl: `${big.origin}/v1`, stream: false, maxResponseBytes: MIB };
  await assertCutOff(
    big,
    new OpenAiBackend(options).complete(REQUEST, AbortSignal.timeout(60_000)),
    /ModelStreamError: Cannot read chat completion: the chat completion is over 1 MiB \(maxResponseBytes\)/,
  );
});

test("OpenAiBackend.complete() cuts off an event stream past maxResponseBytes", async () => {
  const event = 'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n';
  await using big = bigServer(
    200,
    "text/event-stream",
    "",
    event,
    'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
  );
  const options = { model: "m", baseUrl: `${big.origin}/v1`, maxResponseBytes: MIB };
  await assertCutOff(
    big,
    new OpenAiBackend(options).complete(REQUEST, AbortSignal.timeout(60_000)),
    /ModelStreamError: Cannot read chat completion: the chat completion is over 1 MiB/,
  );
});

test("AnthropicBackend.complete() cuts off a reply past maxResponseBytes", async () => {
  await using big = bigServer(
    200,
    "application/json",
    '{"stop_reason":"end_turn","content":[{"type":"text","text":"',
    "a",
    '"}]}',
  );
  const options = { model: "m", baseUrl: big.origin, apiKey: "k", maxResponseBytes: MIB };
  await assertCutOff(
    big,
    new AnthropicBackend(options).complete(REQUEST, AbortSignal.timeout(60_000)),
    /ModelStreamError: Cannot read messages reply: the messages reply is over 1 MiB/,
  );
});

test("OpenAiBackend.complete() reads only the head of an error body", async () => {
  await using big = bigServer(500, "application/json", '{"error":{"message":"', "x", '"}}');
  const backend = new OpenAiBackend({ model: "m", baseUrl: `${big.origin}/v1`, stream: false });
  const err = await backend.complete(REQUEST, AbortSignal.timeout(60_000)).catch((e) => e);
  assert.equal(err.name, "ModelHttpError");
  assert.equal(err.status, 500);
  assert.ok(err.message.length < 600, `a ${err.message.length}-character message`);
  assert.ok(big.pulled() < OFFERED / 2, `${big.pulled()} of ${OFFERED} bytes were read`);
});

test("OpenAiBackend and AnthropicBackend reject a maxResponseBytes that is not a positive integer", () => {
  assert.throws(
    () => new OpenAiBackend({ model: "m", baseUrl: "http://127.0.0.1:1/v1", maxResponseBytes: 0 }),
    /RangeError: Cannot make OpenAI backend: maxResponseBytes must be a positive integer, got "0"/,
  );
  assert.throws(
    () =>
      new AnthropicBackend({ model: "m", baseUrl: "http://127.0.0.1:1", maxResponseBytes: 1.5 }),
    /RangeError: Cannot make Anthropic backend: maxResponseBytes must be a positive integer/,
  );
});
