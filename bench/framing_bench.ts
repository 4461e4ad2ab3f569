// Micro-benchmarks of the framing layer: splitting lines out of a byte
// stream, decoding a frame, encoding a reply. Each group has a baseline.
//
//   deno bench bench/framing_bench.ts

import { encodeFrame, LineReader, parseLine } from "../_internal/framing.ts";

const encoder = new TextEncoder();
const REQUEST = JSON.stringify({
  jsonrpc: "2.0",
  id: 12345,
  method: "tasks.grade",
  params: { answer: "the answer is 42" },
});
const LINES = 1_000;
const STREAM = encoder.encode((REQUEST + "\n").repeat(LINES));
const CHUNK = 16 * 1024;

/** An in-memory reader handing out `STREAM` in `CHUNK`-sized reads. */
function memoryReader(): { read(p: Uint8Array): Promise<number | null> } {
  let off = 0;
  return {
    read(p) {
      if (off >= STREAM.length) return Promise.resolve(null);
      const n = Math.min(p.length, CHUNK, STREAM.length - off);
      p.set(STREAM.subarray(off, off + n));
      off += n;
      return Promise.resolve(n);
    },
  };
}

Deno.bench({
  name: "split 1,000 lines: string concatenation + split (baseline)",
  group: "split",
  baseline: true,
  async fn() {
    const reader = memoryReader();
    const buf = new Uint8Array(CHUNK);
    const decoder = new TextDecoder();
    let pending = "";
    let count = 0;
    while (true) {
      const n = await reader.read(buf);
      if (n === null) break;
      pending += decoder.decode(buf.subarray(0, n), { stream: true });
      const parts = pending.split("\n");
      pending = parts.pop()!;
      count += parts.length;
    }
    if (count !== LINES) throw new Error("lost lines");
  },
});

Deno.bench({
  name: "split 1,000 lines: LineReader (views into one buffer)",
  group: "split",
  async fn() {
    const reader = new LineReader(memoryReader(), 16 * 1024 * 1024);
    let count = 0;
    while ((await reader.read()) !== null) count++;
    if (count !== LINES) throw new Error("lost lines");
  },
});

const LINE = encoder.encode(REQUEST);

Deno.bench({
  name: "decode a frame: new TextDecoder per frame (baseline)",
  group: "decode",
  baseline: true,
  fn() {
    JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(LINE));
  },
});

Deno.bench({
  name: "decode a frame: parseLine (shared decoder)",
  group: "decode",
  fn() {
    parseLine(LINE);
  },
});

const REPLY = { jsonrpc: "2.0", id: 12345, result: { prompt: "What is 2 + 3?" } };

Deno.bench({
  name: "encode a reply: stringify, concat, new TextEncoder (baseline)",
  group: "encode",
  baseline: true,
  fn() {
    new TextEncoder().encode(JSON.stringify(REPLY) + "\n");
  },
});

Deno.bench({
  name: "encode a reply: encodeFrame",
  group: "encode",
  fn() {
    encodeFrame(REPLY);
  },
});

const scratch = new Uint8Array(64 * 1024);
Deno.bench({
  name: "encode a reply: encodeInto a reused buffer",
  group: "encode",
  fn() {
    const { written } = encoder.encodeInto(JSON.stringify(REPLY), scratch);
    scratch[written] = 10;
  },
});

// Issue 24's exact integers and Python's NaN/Infinity: the server reads every
// frame with both on. The common frame has no 16-digit run, so the cost is
// the digit test in the depth scan; measured against the parse as it was.
const decoderBefore = new TextDecoder("utf-8", { fatal: true });

/** parseLine as it was before exact integers: the depth scan, decode, JSON.parse. */
function parseLineBefore(line: Uint8Array, max = 64): unknown {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < line.length; i++) {
    const b = line[i];
    if (inString) {
      if (b === 0x5c) i++;
      else if (b === 0x22) inString = false;
    } else if (b === 0x22) {
      inString = true;
    } else if (b === 0x5b || b === 0x7b) {
      if (++depth > max) throw new RangeError("too deep");
    } else if (b === 0x5d || b === 0x7d) {
      depth--;
    }
  }
  return JSON.parse(decoderBefore.decode(line));
}

const SERVER_PARSE = { exactIntegers: true, nonFinite: true };
const START = encoder.encode(JSON.stringify({
  jsonrpc: "2.0",
  id: 7,
  method: "tasks.start",
  params: { id: "t", args: { a: 1, b: "two", c: [1, 2, 3] } },
}));
const BIG = encoder.encode(
  '{"jsonrpc":"2.0","id":1152921504606846977,"method":"tasks.start","params":{"id":"t","args":{"n":1152921504606846977}}}',
);

Deno.bench({
  name: "server parse, tasks.grade: as before exact integers (baseline)",
  group: "server parse, grade",
  baseline: true,
  fn() {
    parseLineBefore(LINE);
  },
});

Deno.bench({
  name: "server parse, tasks.grade: exact integers and NaN on",
  group: "server parse, grade",
  fn() {
    parseLine(LINE, 64, SERVER_PARSE);
  },
});

Deno.bench({
  name: "server parse, tasks.start: as before exact integers (baseline)",
  group: "server parse, start",
  baseline: true,
  fn() {
    parseLineBefore(START);
  },
});

Deno.bench({
  name: "server parse, tasks.start: exact integers and NaN on",
  group: "server parse, start",
  fn() {
    parseLine(START, 64, SERVER_PARSE);
  },
});

Deno.bench({
  name: "server parse, 2^60 + 1 in id and args: rounded, as before (baseline)",
  group: "server parse, big integers",
  baseline: true,
  fn() {
    parseLineBefore(BIG);
  },
});

Deno.bench({
  name: "server parse, 2^60 + 1 in id and args: exact (reviver)",
  group: "server parse, big integers",
  fn() {
    parseLine(BIG, 64, SERVER_PARSE);
  },
});

const BIG_REPLY = {
  jsonrpc: "2.0",
  id: 1152921504606846977n,
  result: { prompt: 1152921504606846977n },
};

Deno.bench({
  name: "encode a reply with bigints: encodeFrame (stringify fails, then the replacer)",
  group: "encode",
  fn() {
    encodeFrame(BIG_REPLY);
  },
});

// Issue 42: the server writes NaN and the infinities back as Python's
// tokens. A reply is stringified plainly; only one whose text holds a
// `null` (what JSON.stringify makes of NaN) is written again with the
// replacer.
const SERVER_WRITE = { nonFinite: true };
const NULL_REPLY = { jsonrpc: "2.0", id: 12345, result: { score: 1, content: null } };
const NAN_REPLY = { jsonrpc: "2.0", id: 12345, result: { score: 1, content: [NaN, -Infinity] } };

Deno.bench({
  name: "encode a reply as the server does (nonFinite), no null in it",
  group: "encode",
  fn() {
    encodeFrame(REPLY, SERVER_WRITE);
  },
});

Deno.bench({
  name: "encode a reply as the server does (nonFinite), a null in it: the replacer",
  group: "encode",
  fn() {
    encodeFrame(NULL_REPLY, SERVER_WRITE);
  },
});

Deno.bench({
  name: "encode a reply as the server does (nonFinite), NaN in it: the replacer, tokens",
  group: "encode",
  fn() {
    encodeFrame(NAN_REPLY, SERVER_WRITE);
  },
});
