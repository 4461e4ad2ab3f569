import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  encodeFrame,
  LineReader,
  MAX_JSON_DEPTH,
  parseLine,
  stringifyJson,
} from "../../_internal/framing.ts";

/** A reader that hands out the given chunks one read at a time. */
function chunked(chunks: Uint8Array[]): { read(p: Uint8Array): Promise<number | null> } {
  let i = 0;
  let off = 0;
  return {
    read(p) {
      if (i >= chunks.length) return Promise.resolve(null);
      const c = chunks[i];
      const n = Math.min(p.length, c.length - off);
      p.set(c.subarray(off, off + n));
      off += n;
      if (off === c.length) {
        i++;
        off = 0;
      }
      return Promise.resolve(n);
    },
  };
}

const enc = (s: string) => new TextEncoder().encode(s);
const dec = (b: Uint8Array) => new TextDecoder().decode(b);

test("LineReader splits lines across arbitrary chunk boundaries", async () => {
  const text =
    Array.from({ length: 200 }, (_, i) => `{"n":${i},"pad":"${"x".repeat(i * 37)}"}`).join("\n") +
    "\nlast-without-newline";
  const bytes = enc(text);
  for (const size of [1, 7, 4096, 100_000]) {
    const chunks: Uint8Array[] = [];
    for (let i = 0; i < bytes.length; i += size) chunks.push(bytes.subarray(i, i + size));
    const reader = new LineReader(chunked(chunks), 1 << 20);
    const lines: string[] = [];
    while (true) {
      const r = await reader.read();
      if (r === null) break;
      assert.equal(r.kind, "line");
      if (r.kind === "line") lines.push(dec(r.line));
    }
    // Compare lengths and a digest, not the text: a failure must stay readable.
    const want = text.split("\n");
    assert.equal(lines.length, want.length, `line count, chunk size ${size}`);
    assert.ok(lines.every((l, i) => l === want[i]), `line content, chunk size ${size}`);
  }
});

test("LineReader reports an oversized line without buffering it", async () => {
  const big = enc("y".repeat(300_000) + "\n");
  const reader = new LineReader(chunked([enc('{"a":1}\n'), big]), 1000);
  const first = await reader.read();
  assert.equal(first?.kind, "line");
  const second = await reader.read();
  assert.equal(second?.kind, "oversized");
  assert.ok(second!.kind === "oversized" && second!.size > 1000);
});

test("LineReader.takeBuffered() returns bytes read past the line", async () => {
  const reader = new LineReader(chunked([enc('{"m":1}\nraw bytes')]), 1000);
  const r = await reader.read();
  assert.equal(r?.kind === "line" && dec(r.line), '{"m":1}');
  assert.equal(dec(reader.takeBuffered()), "raw bytes");
});

test("encodeFrame() and parseLine() round-trip compact JSON", () => {
  const frame = encodeFrame({ jsonrpc: "2.0", id: 1, result: { s: "é\n" } });
  assert.equal(dec(frame), '{"jsonrpc":"2.0","id":1,"result":{"s":"é\\n"}}\n');
  assert.deepEqual(parseLine(frame.subarray(0, frame.length - 1)), {
    jsonrpc: "2.0",
    id: 1,
    result: { s: "é\n" },
  });
  assert.throws(() => parseLine(new Uint8Array([0xff])), SyntaxError);
  assert.throws(() => parseLine(enc("{")), SyntaxError);
});

test("stringifyJson() writes non-finite numbers as Python's json does, when asked (issue 42, point 1)", () => {
  const value = { a: [NaN, -Infinity, Infinity], n: null, s: "NaN", big: 2n ** 60n + 1n };
  const python = '{"a":[NaN,-Infinity,Infinity],"n":null,"s":"NaN","big":1152921504606846977}';
  assert.equal(stringifyJson(value, { nonFinite: true }), python);
  assert.equal(dec(encodeFrame(value, { nonFinite: true })), python + "\n");
  // Without the bigint, the same through the plain stringify's null.
  assert.equal(
    stringifyJson({ x: 1e400, y: [null, -1e400], z: "null" }, { nonFinite: true }),
    '{"x":Infinity,"y":[null,-Infinity],"z":"null"}',
  );
  // A string can never come out as a token, whatever it holds.
  assert.equal(stringifyJson(["\u0000NaN", "NaN"], { nonFinite: true }), '["\\u0000NaN","NaN"]');
  // Strict JSON by default (result files, agents' environment).
  assert.equal(
    stringifyJson(value),
    '{"a":[null,null,null],"n":null,"s":"NaN","big":1152921504606846977}',
  );
  // What is written is read back, as by a Python peer.
  assert.deepEqual(parseLine(enc(python), 64, { nonFinite: true, exactIntegers: true }), {
    ...value,
  });
});

test("parseLine() reads nesting up to MAX_JSON_DEPTH, what HUD's server reads (issue 42, point 5)", () => {
  assert.ok(MAX_JSON_DEPTH >= 990, "Python's json reads about 990 levels");
  const deep = (n: number) => "[".repeat(n - 1) + "[NaN,1152921504606846977]" + "]".repeat(n - 1);
  // The slow path (non-finite tokens and a long integer: a reviver) at the limit.
  let value = parseLine(enc(deep(MAX_JSON_DEPTH)), undefined, {
    nonFinite: true,
    exactIntegers: true,
  });
  for (let i = 1; i < MAX_JSON_DEPTH; i++) value = (value as unknown[])[0];
  assert.deepEqual(value, [NaN, 1152921504606846977n]);
  assert.throws(
    () => parseLine(enc(deep(MAX_JSON_DEPTH + 1))),
    new RangeError(`frame nests arrays and objects deeper than the limit of ${MAX_JSON_DEPTH}`),
  );
});

test("LineReader with a small initial buffer grows for a long line and shrinks back", async (t) => {
  const long = `{"pad":"${"z".repeat(20_000)}"}`;
  const text = `{"a":1}\n${long}\n{"b":2}\n`;
  await t.step("read()", async () => {
    const reader = new LineReader(chunked([enc(text)]), 1 << 20, undefined, 64);
    const lines: string[] = [];
    for (let r = await reader.read(); r !== null; r = await reader.read()) {
      if (r.kind === "line") lines.push(dec(r.line));
    }
    assert.deepEqual(lines, ['{"a":1}', long, '{"b":2}']);
  });
  await t.step(
    "next(), space() and filled(): the same lines, and the buffer back at 64",
    async () => {
      const source = chunked([enc(text)]);
      const reader = new LineReader(source, 1 << 20, undefined, 64);
      const lines: string[] = [];
      const sizes: number[] = [];
      while (true) {
        let r = reader.next();
        while (r === undefined) {
          sizes.push(reader.space().length);
          reader.filled(await source.read(reader.space()));
          r = reader.next();
        }
        if (r === null) break;
        if (r.kind === "line") lines.push(dec(r.line));
      }
      assert.deepEqual(lines, ['{"a":1}', long, '{"b":2}']);
      assert.equal(sizes[0], 64, "the first read goes into the 64-byte buffer");
      assert.ok(Math.max(...sizes) >= 4096, "the buffer grew for the long line");
      // After the last line, with nothing pending, the reader rests small again.
      assert.equal(reader.next(), null);
      assert.ok(
        sizes.at(-1)! <= 64,
        `the last read went into ${sizes.at(-1)} bytes, not 64 or fewer`,
      );
    },
  );
});
