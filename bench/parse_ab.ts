// What reading integers exactly (issue 24) costs the server's parse: the
// parse as it was (depth scan, decode, JSON.parse) against parseLine with
// exact integers and Python's NaN/Infinity on, in interleaved rounds (the
// order alternates), the best round of each. The best round is what a
// loaded machine still shows faithfully; means are not.
//
//   deno run -A bench/parse_ab.ts [rounds=300]

import { parseLine } from "../_internal/framing.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** parseLine before issue 24: the depth scan, decode, JSON.parse. */
function parseBefore(line: Uint8Array, max = 64): unknown {
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
  return JSON.parse(decoder.decode(line));
}

const SERVER = { exactIntegers: true, nonFinite: true };
const FRAMES: Record<string, Uint8Array> = {
  hello: encoder.encode(JSON.stringify({
    jsonrpc: "2.0",
    id: 1,
    method: "hello",
    params: { token: "3f9c".repeat(16) },
  })),
  start: encoder.encode(JSON.stringify({
    jsonrpc: "2.0",
    id: 7,
    method: "tasks.start",
    params: { id: "t", args: { a: 1, b: "two", c: [1, 2, 3] } },
  })),
  grade: encoder.encode(JSON.stringify({
    jsonrpc: "2.0",
    id: 12345,
    method: "tasks.grade",
    params: { answer: "the answer is 42" },
  })),
  "2^60+1": encoder.encode(
    '{"jsonrpc":"2.0","id":1152921504606846977,"method":"tasks.start","params":{"id":"t","args":{"n":1152921504606846977}}}',
  ),
};
const PER_ROUND = 5_000;
const ROUNDS = Number(Deno.args[0] ?? 300);

for (const [name, frame] of Object.entries(FRAMES)) {
  let before = Infinity;
  let after = Infinity;
  const time = (fn: () => unknown) => {
    const t = performance.now();
    for (let i = 0; i < PER_ROUND; i++) fn();
    return (performance.now() - t) / PER_ROUND;
  };
  for (let r = 0; r < ROUNDS; r++) {
    const a = () => before = Math.min(before, time(() => parseBefore(frame)));
    const b = () => after = Math.min(after, time(() => parseLine(frame, 64, SERVER)));
    if (r % 2) {
      a();
      b();
    } else {
      b();
      a();
    }
  }
  console.log(
    `${name.padEnd(7)} before ${Math.round(before * 1e6)} ns, after ${
      Math.round(after * 1e6)
    } ns, ratio ${(after / before).toFixed(3)}`,
  );
}
console.log(`load average ${Deno.loadavg().map((l) => l.toFixed(2)).join(" ")}`);
