import { test } from "../_test.ts";
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

test("parseRequest() turns frames into requests or the replies bad frames get", async (t) => {
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
    const head = new TextEncoder().encode('{"jsonrpc":"2.0","method":"hello","params":{"pad":"xxx');
    assert.deepEqual(parseRequest({ kind: "oversized", size: 5000, head }, limits), {
      error: {
        jsonrpc: "2.0",
        id: null,
        error: { code: -32600, message: "frame exceeds the limit of 1024 bytes" },
      },
      fatal: true,
    });
    const over = parseRequest({ kind: "oversized", size: 900, overBudget: true, head }, limits);
    assert.ok("error" in over && over.fatal && "error" in over.error);
    assert.equal(over.error.error.code, -32002);
    assert.match(over.error.error.message, /limit of 4096 bytes/);
  });
});

test("parseRequest() reads numbers as HUD's server (Python's json) does", async (t) => {
  await t.step("integers beyond 2^53 stay exact, in the id and in params", () => {
    const parsed = parseRequest(
      line(
        '{"jsonrpc":"2.0","id":1152921504606846977,"method":"tasks.start","params":{"id":"t","args":{"n":1152921504606846977,"m":-9007199254740993,"s":9007199254740991,"f":1.5}}}',
      ),
      limits,
    );
    assert.deepEqual(parsed, {
      request: {
        jsonrpc: "2.0",
        id: 1152921504606846977n,
        method: "tasks.start",
        params: {
          id: "t",
          args: { n: 1152921504606846977n, m: -9007199254740993n, s: 9007199254740991, f: 1.5 },
        },
      },
    });
  });
  await t.step("NaN, Infinity and -Infinity, as Python's json.dumps writes them", () => {
    assert.deepEqual(
      parseRequest(line('{"id":4,"params":{"x":NaN,"y":[Infinity,-Infinity],"s":"NaN"}}'), limits),
      { request: { id: 4, params: { x: NaN, y: [Infinity, -Infinity], s: "NaN" } } },
    );
  });
});

test("parseRequest() answers with the request's id whenever it can be read", async (t) => {
  const idOf = (text: string) => errorOf(text).error.id;
  await t.step("a frame nested too deep", () => {
    assert.equal(idOf(`{"jsonrpc":"2.0","id":7,"params":${"[".repeat(70)}${"]".repeat(70)}}`), 7);
  });
  await t.step("JSON that breaks after the id", () => {
    assert.equal(idOf('{"jsonrpc":"2.0","id":"x-1","method":"hello","params":{oops}}'), "x-1");
    assert.equal(idOf('{"id":1152921504606846977,"method":nope}'), 1152921504606846977n);
  });
  await t.step("an oversized frame, from its first bytes", () => {
    const head = new TextEncoder().encode(
      '{"jsonrpc":"2.0","id":42,"method":"hello","params":{"p":"',
    );
    const parsed = parseRequest({ kind: "oversized", size: 5000, head }, limits);
    assert.ok("error" in parsed);
    assert.equal(parsed.error.id, 42);
  });
  await t.step("null when there is none to read", () => {
    assert.equal(idOf("{not json"), null);
    assert.equal(idOf('{"a":{"id":5},"x":oops}'), null, "a nested id is not the request's");
    assert.equal(idOf('{"method":"x","id":{"a":1},"p":oops}'), null);
  });
});
