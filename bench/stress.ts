// The test suite under load: runs the whole suite RUNS times side by side
// while HOGS CPU-bound jobs spin, and reports each run's result and wall
// time, and its slowest test. Every child is bounded in time and ended at
// the end, also on Ctrl-C.
//
//   deno task stress-tests [--runs 3] [--hogs 2] [--limit 1500] [--bound MS]
//
// Logs go to a fresh temporary directory, printed at the end. Exits 0 when
// every run passed.

import { parseArgs } from "node:util";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    runs: { type: "string", default: "3" },
    hogs: { type: "string", default: "2" },
    // Seconds after which a run (and the hogs) are killed.
    limit: { type: "string", default: "1500" },
    // Each test's bound in ms (HUD_TEST_BOUND_MS); the suite's default is 45 s.
    bound: { type: "string", default: "" },
  },
});
const runs = Number(values.runs);
const hogs = Number(values.hogs);
const limit = Number(values.limit);
if (!(Number.isInteger(runs) && runs > 0 && Number.isInteger(hogs) && hogs >= 0 && limit > 0)) {
  console.error("error: --runs must be a positive integer, --hogs a count, --limit seconds");
  Deno.exit(2);
}

const root = new URL("..", import.meta.url).pathname;
const logs = await Deno.makeTempDir({ prefix: "hud-stress-" });
const children = new Set<Deno.ChildProcess>();

function stopAll(): void {
  for (const child of children) {
    try {
      child.kill("SIGTERM");
    } catch { /* already gone */ }
  }
}
Deno.addSignalListener("SIGINT", () => {
  stopAll();
  Deno.exit(130);
});

// CPU-bound jobs, each bounded by `timeout` in case this script dies first.
for (let i = 0; i < hogs; i++) {
  const hog = new Deno.Command("timeout", {
    args: [String(limit), "yes"],
    stdout: "null",
    stderr: "null",
  }).spawn();
  children.add(hog);
}

interface Outcome {
  run: number;
  ok: boolean;
  code: number;
  seconds: number;
  summary: string;
  slowest: string;
}

async function suite(run: number): Promise<Outcome> {
  const log = `${logs}/run-${run}.log`;
  const t0 = performance.now();
  // `timeout` leads a process group of its own and signals all of it.
  const child = new Deno.Command("bash", {
    args: [
      "-c",
      `exec timeout -k 10 ${limit} "$0" task test >"$1" 2>&1`,
      Deno.execPath(),
      log,
    ],
    cwd: root,
    env: { NO_COLOR: "1", ...(values.bound ? { HUD_TEST_BOUND_MS: values.bound } : {}) },
    stdin: "null",
  }).spawn();
  children.add(child);
  const status = await child.status;
  children.delete(child);
  const seconds = (performance.now() - t0) / 1000;
  const all = await Deno.readTextFile(log);
  const summary = /^(ok|FAILED) \| .*$/m.exec(all)?.[0] ?? `no summary (exit ${status.code})`;
  return { run, ok: status.success, code: status.code, seconds, summary, slowest: slowest(all) };
}

/** The slowest test or step in a run's output: "name (12s)". */
function slowest(output: string): string {
  let best = { name: "none", ms: -1, shown: "" };
  for (const m of output.matchAll(/^\s*(.+?) \.\.\. (?:ok|FAILED) \((\d+(?:\.\d+)?)(ms|s|m)\)/gm)) {
    const ms = Number(m[2]) * (m[3] === "m" ? 60_000 : m[3] === "s" ? 1000 : 1);
    if (ms > best.ms) best = { name: m[1], ms, shown: `${m[2]}${m[3]}` };
  }
  return `${best.name} (${best.shown})`;
}

const started = performance.now();
let outcomes: Outcome[];
try {
  outcomes = await Promise.all(Array.from({ length: runs }, (_, i) => suite(i + 1)));
} finally {
  stopAll();
}
const wall = (performance.now() - started) / 1000;

const load = (await Deno.readTextFile("/proc/loadavg").catch(() => "?")).split(" ")[0];
console.log(
  `${runs} runs side by side with ${hogs} CPU-bound jobs on ${navigator.hardwareConcurrency} cores`,
);
for (const o of outcomes) {
  console.log(
    `run ${o.run}: ${o.ok ? "passed" : `FAILED (exit ${o.code})`} in ${o.seconds.toFixed(0)} s; ` +
      `${o.summary}; slowest: ${o.slowest}`,
  );
}
const passed = outcomes.filter((o) => o.ok).length;
console.log(`${passed}/${runs} passed; wall ${wall.toFixed(0)} s; load average at the end ${load}`);
console.log(`logs: ${logs}`);
Deno.exit(passed === runs ? 0 : 1);
