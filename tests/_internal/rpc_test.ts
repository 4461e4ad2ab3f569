import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { JsonRpcCaller } from "../../_internal/rpc.ts";
import { LineReader, parseLine } from "../../_internal/framing.ts";
import { writeAll } from "../../_internal/io.ts";
import { ConnectionClosedError, HudProtocolError, ProtocolViolationError } from "../../errors.ts";
import { connect } from "../../client.ts";
import { FileTrackerClient } from "../../filetracking/tracker.ts";
import { tcpServer } from "../_helpers.ts";

/** Answers each request with `reply(request, n)`; "hang" sends nothing. */
function scripted(reply: (req: Record<string, unknown>, n: number) => unknown) {
  return tcpServer(async (conn) => {
    const reader = new LineReader(conn, 1 << 20);
    for (let n = 0;; n++) {
      const frame = await reader.read();
      if (frame === null || frame.kind !== "line") return;
      const out = reply(parseLine(frame.line) as Record<string, unknown>, n);
      if (out === "hang") continue;
      await writeAll(conn, new TextEncoder().encode(JSON.stringify(out) + "\n"));
    }
  });
}

test("JsonRpcCaller: error replies keep the connection, violations end it", async (t) => {
  const server = scripted((req, n) =>
    n === 0
      ? { jsonrpc: "2.0", id: req.id, result: { n } }
      : n === 1
      ? { jsonrpc: "2.0", id: req.id, error: { code: -32602, message: "bad" } }
      : n === 2
      ? { jsonrpc: "2.0", id: req.id, result: "not an object" }
      : { jsonrpc: "2.0", id: 999, result: {} }
  );
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.port });
  const caller = new JsonRpcCaller(conn, { maxFrameBytes: 1 << 20, peer: "the test" });
  try {
    await t.step("calls queue, one at a time, ids counting up", async () => {
      const [a, b] = await Promise.allSettled([caller.call("a", {}), caller.call("b", {})]);
      assert.deepEqual(a, { status: "fulfilled", value: { n: 0 } });
      assert.equal(b.status, "rejected");
      assert.ok((b as PromiseRejectedResult).reason instanceof HudProtocolError);
      assert.equal(caller.closed, false, "an error reply keeps the connection");
    });
    await t.step("a reply with no result object is a violation", async () => {
      await assert.rejects(caller.call("c", {}), {
        name: "ProtocolViolationError",
        message: /"c" has no result object/,
      });
      assert.equal(caller.closed, true);
      await assert.rejects(caller.call("d", {}), ConnectionClosedError);
    });
  } finally {
    caller.close();
    await server.close();
  }
});

test("HudClient and FileTrackerClient report a mismatched reply alike", async () => {
  const server = scripted((req, n) =>
    n === 0 && req.method === "hello"
      ? {
        jsonrpc: "2.0",
        id: req.id,
        result: { session_id: "sess-1", env: { name: "e", version: "1" }, bindings: [] },
      }
      : { jsonrpc: "2.0", id: 999, result: {} }
  );
  try {
    const control = await connect(`tcp://127.0.0.1:${server.port}`, { readyTimeout: 10_000 });
    const tracker = await FileTrackerClient.connect(`tcp://127.0.0.1:${server.port}`);
    try {
      for (const call of [() => control.listTasks(), () => tracker.diff()]) {
        await assert.rejects(call(), (e: unknown) => {
          assert.ok(e instanceof ProtocolViolationError, String(e));
          assert.match(
            e.message,
            /Reply id mismatch for "(tasks\.list|diff)": expected \d+, got 999/,
          );
          return true;
        });
        await assert.rejects(call(), ConnectionClosedError);
      }
      assert.equal(control.closed, true);
      assert.equal(tracker.closed, true);
    } finally {
      await control.close();
      tracker.close();
    }
  } finally {
    await server.close();
  }
});

test("JsonRpcCaller: a timeout counts from the send and ends the connection", async () => {
  const server = scripted(() => "hang");
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.port });
  const caller = new JsonRpcCaller(conn, { maxFrameBytes: 1024 });
  try {
    await assert.rejects(caller.call("slow", {}, { timeout: 50 }), ConnectionClosedError);
    assert.ok(caller.failure !== null);
    await assert.rejects(caller.call("next", {}), /the connection failed/);
  } finally {
    caller.close();
    await server.close();
  }
});
