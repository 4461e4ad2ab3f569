// Micro-benchmarks of JSON handling on the request path: decoding a
// request, building a reply, and the task machinery between them. Each
// group has a baseline (the floor, or the approach the code replaced).
//
//   deno bench bench/json_bench.ts

import { encodeFrame, parseLine } from "../_internal/framing.ts";
import { Environment } from "../env.ts";

const encoder = new TextEncoder();
const REQUEST_TEXT = JSON.stringify({
  jsonrpc: "2.0",
  id: 7,
  method: "tasks.start",
  params: { id: "t", args: { a: 1 } },
});
const REQUEST_BYTES = encoder.encode(REQUEST_TEXT);

Deno.bench({
  name: "request: JSON.parse of a string (floor)",
  group: "request",
  baseline: true,
  fn() {
    JSON.parse(REQUEST_TEXT);
  },
});

Deno.bench({
  name: "request: parseLine of the bytes (decode + parse)",
  group: "request",
  fn() {
    parseLine(REQUEST_BYTES);
  },
});

const REPLY = { jsonrpc: "2.0", id: 7, result: { prompt: "What is 2 + 3?" } };

Deno.bench({
  name: "reply: JSON.stringify only (floor)",
  group: "reply",
  baseline: true,
  fn() {
    JSON.stringify(REPLY);
  },
});

Deno.bench({
  name: "reply: encodeFrame (stringify + newline + UTF-8 bytes)",
  group: "reply",
  fn() {
    encodeFrame(REPLY);
  },
});

const env = new Environment("bench");
env.template({ id: "t" }, async function* () {
  const answer = yield "p";
  yield answer === "x" ? 1 : 0;
});

async function* bare(): AsyncGenerator<unknown, void, unknown> {
  const answer = yield "p";
  yield answer === "x" ? 1 : 0;
}

Deno.bench({
  name: "task: drive a bare async generator (floor)",
  group: "task",
  baseline: true,
  async fn() {
    const gen = bare();
    await gen.next();
    await gen.next("x");
    await gen.return(undefined);
  },
});

Deno.bench({
  name: "task: Environment.startTask + ActiveTask.grade",
  group: "task",
  async fn() {
    const task = await env.startTask("t", {});
    await task.grade("x");
  },
});
