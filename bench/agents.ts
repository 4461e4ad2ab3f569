// The chat agent loop's own overhead per step, against a scripted
// OpenAI-compatible server in another process that answers after a fixed
// delay:
//
//   deno run -A bench/agents.ts
//
// One rollout makes STEPS model calls, each with one tool call (a no-op
// typed tool) and its result fed back; the figure is wall time per step,
// and the overhead is that less the server's delay (so it holds the HTTP
// round trip, JSON, SSE parsing, tool dispatch and trace recording).

import { Environment, integer, rollout } from "../mod.ts";
import { ChatAgent, defineTool } from "../agents/mod.ts";

const STEPS = 50;
const REPEATS = 3;

async function measure(delay: number, stream: boolean): Promise<number> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("./_model_server.ts", import.meta.url).pathname,
      String(delay),
      String(STEPS),
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const port = Number((await reader.read()).value!.trim());
  try {
    const noop = defineTool({
      name: "noop",
      description: "Nothing",
      args: { n: integer() },
      run: () => "ok",
    });
    const env = new Environment("bench");
    const task = env.template({ id: "t" }, async function* () {
      const a = yield "go";
      yield a === "done" ? 1 : 0;
    });
    let best = Infinity;
    for (let i = 0; i < REPEATS; i++) {
      const agent = new ChatAgent({
        model: "bench",
        baseUrl: `http://127.0.0.1:${port}/v1`,
        stream,
        tools: [noop],
        maxSteps: STEPS + 1,
      });
      const t0 = performance.now();
      const run = await rollout(task(), agent, { rolloutTimeout: 120_000, fileTracking: false });
      const ms = performance.now() - t0;
      if (run.reward !== 1) {
        throw new Error(`bench rollout failed: ${JSON.stringify(run.trace.errors)}`);
      }
      best = Math.min(best, ms / (STEPS + 1));
    }
    return best;
  } finally {
    reader.releaseLock();
    child.kill("SIGTERM");
    await child.stdout.cancel().catch(() => {});
    await child.status;
  }
}

console.log(`| server delay | mode | ms per step (best of ${REPEATS}) | loop overhead per step |`);
console.log("|---|---|---|---|");
for (const delay of [0, 20]) {
  for (const stream of [false, true]) {
    const ms = await measure(delay, stream);
    console.log(
      `| ${delay} ms | ${stream ? "SSE stream" : "JSON"} | ${ms.toFixed(2)} | ${
        (ms - delay).toFixed(2)
      } ms |`,
    );
  }
}
