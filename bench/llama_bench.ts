// Rollouts per second with a real model: llama.cpp's llama-server serving
// the tiny tool-calling model (tests/fixtures/llama/), robolab's tasks run by
// `cli.ts eval --model` at `--max-concurrent N`, and the chat agent loop's
// own overhead per step against the model server's latency:
//
//   deno run -A bench/llama_bench.ts [--group 8] [--concurrency 8] [--max-steps 4]
//
// The job's wall time includes serving robolab in the eval process. From
// each rollout's trace: model calls and their latency, tool calls and theirs,
// and the agent phase's length (the prompt step to the answer step); the
// loop's overhead per model call is that phase less model and tool time,
// over the model calls. Loopback only; llama-server is stopped at the end.

import { parseArgs } from "node:util";

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
    console.error(`llama_bench: ${flag} must be a positive integer`);
    Deno.exit(2);
  }
}

const DIR = Deno.env.get("HUD_LLAMA_DIR") ?? "/var/cache/hud-sdk/llama";
const SERVER = `${DIR}/bin/llama-server`;
const MODEL = Deno.env.get("HUD_LLAMA_MODEL") ??
  new URL("../tests/fixtures/llama/tiny-toolcall.gguf", import.meta.url).pathname;
const ROOT = new URL("..", import.meta.url).pathname;

for (const path of [SERVER, MODEL]) {
  try {
    Deno.statSync(path);
  } catch {
    console.error(
      `llama_bench: ${path} not found; build llama-server with ` +
        "bash tests/fixtures/llama/build_llama_server.sh /var/cache/hud-sdk/llama",
    );
    Deno.exit(1);
  }
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
}

function rssKiB(pid: number): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN);
}

const port = freePort();
const server = new Deno.Command(SERVER, {
  args: [
    ...["-m", MODEL, "--jinja", "--temp", "0", "--host", "127.0.0.1", "--port", String(port)],
    ...["-np", String(CONCURRENCY), "-c", String(4096 * CONCURRENCY), "-t", "2"],
  ],
  stdout: "null",
  stderr: "null",
}).spawn();
const work = await Deno.makeTempDir({ prefix: "llama-bench-" });
try {
  const base = `http://127.0.0.1:${port}`;
  const until = Date.now() + 60_000;
  for (;;) {
    const ok = await fetch(`${base}/health`).then(async (r) => {
      await r.body?.cancel();
      return r.ok;
    }, () => false);
    if (ok) break;
    if (Date.now() > until) throw new Error(`llama-server on ${base} not healthy after 60 s`);
    await new Promise((r) => setTimeout(r, 200));
  }
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
  server.kill("SIGTERM");
  await server.status;
  await Deno.remove(work, { recursive: true });
}
