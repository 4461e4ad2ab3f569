// Rollouts per second with a real model: llama.cpp's llama-server serving
// the tiny tool-calling model (tests/fixtures/llama/), robolab's tasks run by
// `cli.ts eval --model` at `--max-concurrent N`, and the chat agent loop's
// own overhead per step against the model server's latency:
//
//   deno run -A bench/llama.ts [--group 8] [--concurrency 8] [--max-steps 4]
//
// The job's wall time includes serving robolab in the eval process. From
// each rollout's trace: model calls and their latency, tool calls and theirs,
// and the agent phase's length (the prompt step to the answer step); the
// loop's overhead per model call is that phase less model and tool time,
// over the model calls. Loopback only; llama-server is stopped at the end.

import { parseArgs } from "node:util";
import { LLAMA_BUILD_HINT, missingLlama, startLlamaServer } from "../tests/agents/_llama.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    group: { type: "string", default: "8" },
    concurrency: { type: "string", default: "8" },
    "max-steps": { type: "string", default: "4" },
  },
});
const GROUP = Number(values.group);
const CONCURRENCY = Number(values.concurrency);
const MAX_STEPS = Number(values["max-steps"]);
for (
  const [flag, n] of [["--group", GROUP], ["--concurrency", CONCURRENCY], [
    "--max-steps",
    MAX_STEPS,
  ]] as const
) {
  if (!Number.isInteger(n) || n < 1) {
    console.error(`bench/llama.ts: ${flag} must be a positive integer`);
    Deno.exit(2);
  }
}

const ROOT = new URL("..", import.meta.url).pathname;

const missing = missingLlama();
if (missing.length > 0) {
  console.error(`bench/llama.ts: ${missing.join(" and ")} not found; ${LLAMA_BUILD_HINT}`);
  Deno.exit(1);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
}

function rssKiB(pid: number): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN);
}

const server = await startLlamaServer(
  ["-np", String(CONCURRENCY), "-c", String(4096 * CONCURRENCY), "-t", "2"],
  60_000,
);
const work = await Deno.makeTempDir({ prefix: "llama-bench-" });
try {
  const base = server.base;
  const out = `${work}/results.jsonl`;
  const t0 = performance.now();
  const job = await new Deno.Command(Deno.execPath(), {
    args: [
      ...["run", "-A", `${ROOT}cli.ts`, "eval", `${ROOT}examples/robolab.ts`],
      ...["--model", "tiny", "--base-url", `${base}/v1`, "--temperature", "0"],
      ...["--max-steps", String(MAX_STEPS), "--max-concurrent", String(CONCURRENCY)],
      ...["--group", String(GROUP), "--out", out, "--json"],
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const wall = (performance.now() - t0) / 1000;
  const serverRss = rssKiB(server.pid);
  const rows = (await Deno.readTextFile(out)).trim().split("\n").map((l) => JSON.parse(l));
  const modelMs: number[] = [];
  const toolMs: number[] = [];
  const overheadPerCall: number[] = [];
  let graded = 0;
  for (const row of rows) {
    if (row.reward !== null) graded++;
    const steps = (row.trace.steps ?? []) as {
      type: string;
      timestamp: string;
      info?: { latency_ms?: number };
    }[];
    const models = steps.filter((s) => s.type === "model");
    const tools = steps.filter((s) => s.type === "tool");
    const prompt = steps.find((s) => s.type === "user");
    const answer = steps.find((s) => s.type === "agent");
    const m = models.map((s) => s.info?.latency_ms ?? 0);
    const t = tools.map((s) => s.info?.latency_ms ?? 0);
    modelMs.push(...m);
    toolMs.push(...t);
    if (prompt && answer && models.length > 0) {
      const phase = Date.parse(answer.timestamp) - Date.parse(prompt.timestamp);
      const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
      overheadPerCall.push((phase - sum(m) - sum(t)) / models.length);
    }
  }
  const figures = {
    rollouts: rows.length,
    graded,
    eval_exit: job.code,
    concurrency: CONCURRENCY,
    wall_s: Math.round(wall * 100) / 100,
    rollouts_per_s: Math.round((rows.length / wall) * 100) / 100,
    model_calls: modelMs.length,
    model_latency_median_ms: Math.round(median(modelMs) * 10) / 10,
    tool_calls: toolMs.length,
    tool_latency_median_ms: Math.round(median(toolMs) * 10) / 10,
    loop_overhead_per_call_median_ms: Math.round(median(overheadPerCall) * 10) / 10,
    llama_server_rss_mib: Math.round(serverRss / 1024),
  };
  console.log(JSON.stringify(figures));
  if (rows.length === 0 || graded === 0) {
    console.error(new TextDecoder().decode(job.stderr).split("\n").slice(-10).join("\n"));
    Deno.exitCode = 1;
  }
} finally {
  await server[Symbol.asyncDispose]();
  await Deno.remove(work, { recursive: true });
}
