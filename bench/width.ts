// Width without self-harm: N concurrent sandboxed rollouts in one process
// (one LocalRuntime, one workspace; each agent runs one command over SSH,
// each grade one command in the workspace's sandbox), all started at once.
// Every rollout can pass, so every one must be graded 1. Prints the counts,
// the errors by class, the wall time, the peak resident memory, and what
// the job left behind (processes, temporary directories, the workspace's
// keys).
//
//   deno run -A bench/width.ts [--rollouts 1000] [--max-concurrent N] [--interrupt S] [--json]
//
// With --interrupt S the job is stopped S seconds in, as Ctrl-C stops
// `hud eval` (its signal aborts the job, then the held environment is
// released and its shutdown hooks run), and only leaks count.
//
// Exits 0 when every rollout was graded 1 (or, interrupted, none was
// graded below 1) and nothing leaked.

import { parseArgs } from "node:util";
import { Environment } from "../env.ts";
import { integer } from "../schema.ts";
import { addWorkspace } from "../workspace/mod.ts";
import { LocalRuntime } from "../runtime/local.ts";
import { functionAgent } from "../eval/agent.ts";
import { Taskset } from "../eval/taskset.ts";
import { leakSnapshot, leaksSince } from "./_leaks.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    rollouts: { type: "string", default: "1000" },
    // At once: all of them by default (the job paces its starts past 32).
    "max-concurrent": { type: "string" },
    interrupt: { type: "string" },
    json: { type: "boolean", default: false },
  },
});
const n = Number(values.rollouts);
const width = Number(values["max-concurrent"] ?? n);
if (!Number.isInteger(n) || n < 1 || !Number.isInteger(width) || width < 1) {
  console.error("error: --rollouts and --max-concurrent take positive integers");
  Deno.exit(2);
}

const before = await leakSnapshot();
const root = await Deno.makeTempDir({ prefix: "hud-width-" });
const env = new Environment("width");
const workspace = addWorkspace(env, root, { trackFiles: false });
const touch = env.template(
  { id: "touch", args: { i: integer() } },
  async function* ({ i }) {
    yield `Create the file ${i}.done in ${root}`;
    const check = await workspace.exec(["test", "-f", `${i}.done`], { cwd: root });
    yield check.code === 0 ? 1 : 0;
  },
);
const agent = functionAgent(async (_prompt, run) => {
  await using shell = await run.client.open("shell");
  const r = await shell.exec(`touch ${root}/${(run.task.args as { i: number }).i}.done`);
  return r.code === 0 ? "done" : `failed: ${r.stderrText}`;
});

let peak = 0;
const sampler = setInterval(() => peak = Math.max(peak, Deno.memoryUsage().rss), 200);
const started = performance.now();
// As `hud eval` does: the environment held for the whole job, released last.
const runtime = new LocalRuntime(env);
const held = await runtime.place();
const stop = new AbortController();
const interrupt = values.interrupt === undefined
  ? undefined
  : setTimeout(() => stop.abort(), Number(values.interrupt) * 1000);
const job = await new Taskset(Array.from({ length: n }, (_, i) => touch({ i }))).run(agent, {
  runtime,
  maxConcurrent: width,
  signal: stop.signal,
});
clearTimeout(interrupt);
await held[Symbol.asyncDispose]();
await env.stop();
const wall = performance.now() - started;
clearInterval(sampler);
peak = Math.max(peak, Deno.memoryUsage().rss);
await Deno.remove(root, { recursive: true });

const s = job.summary();
const zeros = job.runs.filter((r) => r.reward !== null && r.reward < 1).length;
const leaks = await leaksSince(before);
const figures = {
  rollouts: n,
  interrupted: stop.signal.aborted,
  max_concurrent: width,
  graded: s.graded,
  graded_below_1: zeros,
  errored: s.errored,
  errored_by_class: s.errored_by_class,
  first_error: s.tasks.find((t) => t.first_error !== null)?.first_error ?? null,
  wall_s: Math.round(wall / 100) / 10,
  peak_rss_mib: Math.round(peak / 2 ** 20),
  leaks,
  load: (await Deno.readTextFile("/proc/loadavg")).split(" ").slice(0, 3).join(" "),
};
if (values.json) {
  console.log(JSON.stringify(figures));
} else {
  for (const [k, v] of Object.entries(figures)) {
    console.log(`${k.padEnd(18)} ${typeof v === "object" ? JSON.stringify(v) : v}`);
  }
}
const done = stop.signal.aborted || s.graded === n;
Deno.exit(done && zeros === 0 && leaks.length === 0 ? 0 : 1);
