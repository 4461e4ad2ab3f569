// How deep a frame can nest before something here exhausts the stack: the
// bound MAX_JSON_DEPTH must stay well below every figure (issue 42, point 5).
// JSON.parse and JSON.stringify are iterative in V8; what recurses is a
// reviver (exact integers, Python's NaN), a replacer (bigints, NaN written
// back), structuredClone and pyJson. The last figure goes through a real
// server: a grade whose answer holds NaN and 2^60 + 1 at the bottom (so both
// the reviver and the replacer run) is echoed back, on a server whose own
// depth limit is lifted.
//
//   deno run -A bench/json_depth.ts

import { Environment } from "../env.ts";
import { bind } from "../server.ts";
import { LineReader, MAX_JSON_DEPTH, parseLine, stringifyJson } from "../_internal/framing.ts";
import { pyJson } from "../_internal/pyjson.ts";
import { writeAll } from "../_internal/io.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const BOTTOM = "[NaN,1152921504606846977]";
const nested = (n: number) => "[".repeat(n - 1) + BOTTOM + "]".repeat(n - 1);
const PYTHON = { exactIntegers: true, nonFinite: true } as const;

/** The largest depth in [1, 2^20] at which `works` holds (it holds at 1 and fails past it). */
async function largest(works: (n: number) => boolean | Promise<boolean>): Promise<number> {
  let lo = 1;
  let hi = 1 << 20;
  if (await works(hi)) return hi;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (await works(mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

function survives(f: () => unknown): boolean {
  try {
    f();
    return true;
  } catch (err) {
    if (err instanceof RangeError) return false;
    throw err;
  }
}

/** `nested(n)` as a value, built without recursion; `plain` leaves the bigint out. */
function value(n: number, plain = false): unknown {
  let v: unknown = plain ? [NaN, 1] : [NaN, 2n ** 60n + 1n];
  for (let i = 1; i < n; i++) v = [v];
  return v;
}

const rows: [string, number][] = [
  ["JSON.parse", await largest((n) => survives(() => JSON.parse("[".repeat(n) + "]".repeat(n))))],
  [
    "parseLine, exact integers and NaN (a reviver)",
    await largest((n) => survives(() => parseLine(encoder.encode(nested(n)), n, PYTHON))),
  ],
  ["JSON.stringify", await largest((n) => survives(() => JSON.stringify(value(n, true))))],
  [
    "stringifyJson, NaN written back (a replacer)",
    await largest((n) => survives(() => stringifyJson(value(n), { nonFinite: true }))),
  ],
  ["structuredClone", await largest((n) => survives(() => structuredClone(value(n))))],
  ["pyJson (task slugs)", await largest((n) => survives(() => pyJson(value(n))))],
];

// Through the server: one connection per probe (a failure may close it).
const env = new Environment("depth");
env.template({ id: "echo", args: {} }, async function* () {
  const answer = yield "echo";
  yield { score: 1, content: answer };
});
await using server = bind(env, { auth: false, maxJsonDepth: 1 << 21, maxFrameBytes: 1 << 24 });
async function echoes(n: number): Promise<boolean> {
  // The frame nests two levels more than its answer.
  const answer = nested(n - 2);
  using conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  const reader = new LineReader(conn, 1 << 24);
  await writeAll(
    conn,
    encoder.encode(
      `{"jsonrpc":"2.0","id":1,"method":"tasks.start","params":{"id":"echo"}}\n` +
        `{"jsonrpc":"2.0","id":2,"method":"tasks.grade","params":{"answer":${answer}}}\n`,
    ),
  );
  for (let i = 0; i < 2; i++) {
    const line = await reader.read();
    if (line === null || line.kind !== "line") return false;
    if (i === 1) {
      return decoder.decode(line.line) ===
        `{"jsonrpc":"2.0","id":2,"result":{"score":1,"content":${answer}}}`;
    }
  }
  return false;
}
rows.push(["a grade echoed by bind(), frame depth", await largest(echoes)]);

console.log(JSON.stringify({ maxJsonDepth: MAX_JSON_DEPTH, date: new Date().toISOString() }));
console.log(`\n| path | deepest that works | × MAX_JSON_DEPTH (${MAX_JSON_DEPTH}) |`);
console.log("| --- | --- | --- |");
for (const [name, depth] of rows) {
  const shown = depth === 1 << 20 ? `≥ ${depth.toLocaleString("en")}` : depth.toLocaleString("en");
  console.log(`| ${name} | ${shown} | ${(depth / MAX_JSON_DEPTH).toFixed(1)} |`);
}
