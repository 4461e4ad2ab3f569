import assert from "node:assert/strict";
import type { LineResult } from "../../_internal/framing.ts";
import { parseRequest } from "../../_server/requests.ts";

const limits = { maxFrameBytes: 1024, maxBufferedBytes: 4096, maxJsonDepth: 64 };
const line = (text: string): LineResult => ({ kind: "line", line: new TextEncoder().encode(text) });
const errorOf = (text: string) => {
  const parsed = parseRequest(line(text), limits);
  if (!("error" in parsed)) return assert.fail(`expected an error for ${text}`);
  return parsed;
};

Deno.test("parseRequest() turns frames into requests or the replies bad frames get", async (t) => {
  await t.step("a request object", () => {
    assert.deepEqual(parseRequest(line('{"id":1,"method":"hello"}'), limits), {
      request: { id: 1, method: "hello" },
    });
  });
  await t.step("bad JSON, a blank line, bad UTF-8: -32700 with id null; the stream goes on", () => {
    for (const text of ["{not json", "", "\u00ff"]) {
      const { error, fatal } = errorOf(text);
      assert.equal(fatal, false);
      assert.equal(error.id, null);
      assert.ok("error" in error && error.error.code === -32700, JSON.stringify(error));
    }
    const bad = parseRequest({ kind: "line", line: new Uint8Array([0x7b, 0xff, 0x7d]) }, limits);
    assert.ok("error" in bad && "error" in bad.error && bad.error.error.code === -32700);
  });
  await t.step("a JSON value that is not an object: -32600", () => {
    for (const text of ["[1,2]", "42", '"str"', "null"]) {
      assert.deepEqual(errorOf(text), {
        error: {
          jsonrpc: "2.0",
          id: null,
          error: { code: -32600, message: "invalid request: expected a JSON object" },
        },
        fatal: false,
      });
    }
  });
  await t.step("nesting deeper than the limit: -32600 before parsing", () => {
    assert.deepEqual(errorOf("[".repeat(65) + "]".repeat(65)).error, {
      jsonrpc: "2.0",
      id: null,
      error: {
        code: -32600,
        message: "frame nests arrays and objects deeper than the limit of 64",
      },
    });
    assert.ok("request" in parseRequest(line(`{"a":${"[".repeat(63)}${"]".repeat(63)}}`), limits));
    assert.ok("request" in parseRequest(line(`{"a":"${"[".repeat(100)}"}`), limits));
  });
  await t.step("oversized frames end the stream, naming the limit", () => {
    assert.deepEqual(parseRequest({ kind: "oversized", size: 5000 }, limits), {
      error: {
        jsonrpc: "2.0",
        id: null,
        error: { code: -32600, message: "frame exceeds the limit of 1024 bytes" },
      },
      fatal: true,
    });
    const over = parseRequest({ kind: "oversized", size: 900, overBudget: true }, limits);
    assert.ok("error" in over && over.fatal && "error" in over.error);
    assert.equal(over.error.error.code, -32002);
    assert.match(over.error.error.message, /limit of 4096 bytes/);
  });
});
