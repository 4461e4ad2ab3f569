// Adaptive model-call concurrency against a rate-limited server:
//
//   deno run -A bench/adaptive_concurrency.ts            # both modes, ~2 min
//   deno run -A bench/adaptive_concurrency.ts --quick    # a shorter run
//
// A local OpenAI-compatible server answers after 100 ms, but only CAP
// requests at once: past that it answers 429 with `Retry-After: 1`. CAP is
// 6 for the first phase, then 40 (the provider raised the tier). A job of
// ROLLOUTS rollouts, 32 at once, each making STEPS model calls (a no-op
// tool call, then an answer), runs twice: with a fixed concurrency (every
// rollout calls when it likes, backing off on its own), and with the
// adaptive limit (eval/concurrency.ts, on by default). Printed: a timeline
// of the limit and the 429s per second, and per mode the wall time, the
// calls, the 429s, the rollouts that failed (a call refused past its own
// retries) and the limit's history.

import { Environment, integer, Taskset } from "../mod.ts";
import { ChatAgent, defineTool } from "../agents/mod.ts";
import { AdaptiveConcurrency } from "../eval/mod.ts";

const quick = Deno.args.includes("--quick");
const ROLLOUTS = quick ? 80 : 160;
const STEPS = 40;
const PHASE_MS = quick ? 15_000 : 30_000;
const LATENCY_MS = 100;

interface Counters {
  calls: number;
  limited: number;
  inFlight: number;
  peak: number;
}

function startServer(counters: Counters, started: () => number) {
  return Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const body = await req.json();
    const cap = started() < PHASE_MS ? 6 : 40;
    if (counters.inFlight >= cap) {
      counters.limited++;
      return Response.json({ error: { message: "rate limit reached", type: "rate_limit" } }, {
        status: 429,
        headers: { "retry-after": "1" },
      });
    }
    counters.calls++;
    counters.inFlight++;
    counters.peak = Math.max(counters.peak, counters.inFlight);
    try {
      await new Promise((r) => setTimeout(r, LATENCY_MS));
    } finally {
      counters.inFlight--;
    }
    const tools = (body.messages as { role: string }[]).filter((m) => m.role === "tool").length;
    const message = tools < STEPS - 1
      ? {
        role: "assistant",
        content: null,
        tool_calls: [{
          id: `c${tools}`,
          type: "function",
          function: { name: "noop", arguments: '{"n": 1}' },
        }],
      }
      : { role: "assistant", content: "done" };
    return Response.json({
      choices: [{
        index: 0,
        finish_reason: tools < STEPS - 1 ? "tool_calls" : "stop",
        message,
      }],
      usage: { prompt_tokens: 100, completion_tokens: 10 },
    });
  });
}

async function measure(adaptive: boolean) {
  const counters: Counters = { calls: 0, limited: 0, inFlight: 0, peak: 0 };
  const t0 = performance.now();
  const elapsed = () => performance.now() - t0;
  const server = startServer(counters, elapsed);
  const env = new Environment("bench");
  const task = env.template({ id: "t", args: { i: integer() } }, async function* () {
    const answer = yield "go";
    yield answer === "done" ? 1 : 0;
  });
  const noop = defineTool({
    name: "noop",
    description: "Nothing",
    args: { n: integer() },
    run: () => "ok",
  });
  const agent = new ChatAgent({
    model: "bench",
    baseUrl: `http://127.0.0.1:${server.addr.port}/v1`,
    stream: false,
    capabilityTools: false,
    tools: [noop],
    maxSteps: STEPS + 5,
  });
  const limiter = adaptive ? new AdaptiveConcurrency({ max: 32 }) : false;
  const timeline: string[] = [];
  let lastLimited = 0;
  const tick = setInterval(() => {
    const s = Math.round(elapsed() / 1000);
    const limit = limiter ? String(limiter.limit).padStart(2) : " -";
    timeline.push(
      `${String(s).padStart(3)} s  limit ${limit}  in flight ${
        String(counters.inFlight).padStart(2)
      }  429s ${String(counters.limited - lastLimited).padStart(4)}`,
    );
    lastLimited = counters.limited;
  }, 1000);
  const job = await new Taskset(
    Array.from({ length: ROLLOUTS }, (_, i) => task({ i })),
  ).run(agent, { maxConcurrent: 32, concurrency: limiter, rolloutTimeout: 600_000 });
  clearInterval(tick);
  const wall = elapsed();
  await server.shutdown();
  return {
    mode: adaptive ? "adaptive" : "fixed (32)",
    wall,
    counters,
    failed: job.runs.filter((r) => r.reward !== 1).length,
    history: limiter ? limiter.history.join(" → ") : "-",
    timeline,
  };
}

console.log(
  `${ROLLOUTS} rollouts x ${STEPS} calls, 32 at once; the server takes 6 calls at once for ${
    PHASE_MS / 1000
  } s, then 40; ${LATENCY_MS} ms a call; 429 with Retry-After: 1 past that`,
);
const results = [];
for (const adaptive of [false, true]) {
  const r = await measure(adaptive);
  results.push(r);
  console.log(`\n${r.mode}: timeline (every second)`);
  for (const line of r.timeline.filter((_, i) => i % (quick ? 1 : 2) === 0)) console.log(line);
}
console.log(
  "\n| mode | wall | calls answered | 429s | rollouts failed | peak in flight | limit history |",
);
console.log("| --- | --- | --- | --- | --- | --- | --- |");
for (const r of results) {
  console.log(
    `| ${r.mode} | ${
      (r.wall / 1000).toFixed(1)
    } s | ${r.counters.calls} | ${r.counters.limited} | ${r.failed} | ${r.counters.peak} | ${r.history} |`,
  );
}
