import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { sseData } from "../../_internal/sse.ts";

function streamOf(chunks: string[]): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return ReadableStream.from(chunks.map((c) => encoder.encode(c)));
}

async function eventsOf(chunks: string[], dropUnterminated = false) {
  const out = [];
  for await (const e of sseData(streamOf(chunks), { dropUnterminated })) out.push(e);
  return out;
}

test("sseData() reads events however the stream is cut", async (t) => {
  await t.step("a \\r\\n split between chunks is one line end", async () => {
    assert.deepEqual(await eventsOf(["data: a\r", "\ndata: b\r\n\r", "\n"]), [
      { event: "", data: "a\nb" },
    ]);
  });
  await t.step("\\r and \\n alone end lines too", async () => {
    assert.deepEqual(await eventsOf(["event: x\rdata: 1\n\n: comment\ndata: 2\r\r"]), [
      { event: "x", data: "1" },
      { event: "", data: "2" },
    ]);
  });
  await t.step("one long line in many chunks", async () => {
    const chunks = ["data: ", ...Array.from({ length: 2_000 }, () => "y".repeat(4096)), "\n\n"];
    const [e] = await eventsOf(chunks);
    assert.equal(e.data.length, 2_000 * 4096);
  });
  await t.step("an unterminated event at the end, kept or dropped", async () => {
    assert.deepEqual(await eventsOf(["data: last\r"]), [{ event: "", data: "last" }]);
    assert.deepEqual(await eventsOf(["data: last\r"], true), []);
  });
});
