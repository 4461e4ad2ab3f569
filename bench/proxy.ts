// What the recording model proxy costs: the latency it adds to one call,
// and calls per second at 64 concurrent streams, each against the same
// calls made directly to the server. The server (bench/_token_server.ts)
// answers at once in vLLM's shape, with 2,000 prompt ids and 100 completion
// ids and logprobs (streamed as one chunk per token), so that the proxy's
// whole work shows: forwarding, reading the token fields, stripping them
// from what the agent gets, and recording each call into a trace. Server
// and proxy run in processes of their own; the client runs here.
//
//   deno run -A bench/proxy.ts [--calls 300] [--streams 64] [--per-stream 20] [--delay 0]

import { parseArgs } from "node:util";

const { values } = parseArgs({
  options: {
    calls: { type: "string", default: "300" },
    streams: { type: "string", default: "64" },
    "per-stream": { type: "string", default: "20" },
    delay: { type: "string", default: "0" },
  },
});
const CALLS = Number(values.calls);
const STREAMS = Number(values.streams);
const PER_STREAM = Number(values["per-stream"]);
const DELAY = Number(values.delay);
const DIR = new URL(".", import.meta.url).pathname;

interface Child {
  lines: string[];
  pid: number;
  stop(): Promise<void>;
}

/** A Deno child that prints `n` lines as it starts. */
async function start(script: string, args: string[], n: number): Promise<Child> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", `${DIR}${script}`, ...args],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (text.split("\n").length <= n) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`${script} ended before it started`);
    text += value;
  }
  reader.releaseLock();
  return {
    lines: text.trim().split("\n"),
    pid: child.pid,
    async stop() {
      child.kill("SIGTERM");
      await child.status;
      await child.stdout.cancel().catch(() => {});
    },
  };
}

/** CPU time of a process so far, in ms (utime + stime from /proc). */
function cpuMs(pid: number): number {
  const fields = Deno.readTextFileSync(`/proc/${pid}/stat`).split(") ")[1].split(" ");
  return (Number(fields[11]) + Number(fields[12])) * 10; // clock ticks of 10 ms
}

const BODY = JSON.stringify({
  model: "policy",
  messages: [
    { role: "system", content: "You are an agent." },
    { role: "user", content: "x".repeat(4000) },
  ],
  tools: [{ type: "function", function: { name: "bash", parameters: { type: "object" } } }],
});

async function call(url: string, key: string, stream: boolean): Promise<void> {
  const body = stream ? BODY.replace(/}$/, ',"stream":true}') : BODY;
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body,
  });
  if (!res.ok) throw new Error(`${url}: ${res.status} ${await res.text()}`);
  await res.arrayBuffer();
}

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

const server = await start("_token_server.ts", [String(DELAY)], 1);
const direct = `http://127.0.0.1:${server.lines[0]}/v1`;
const proxy = await start("_proxy_child.ts", [direct, String(STREAMS)], STREAMS + 1);
const [proxyUrl, ...keys] = proxy.lines;
const routes = keys.map((k) => `${proxyUrl}/r/${k}/v1`);
const figures: Record<string, unknown>[] = [];
try {
  // Warm both paths up.
  for (let i = 0; i < 30; i++) {
    await call(`${direct}/chat/completions`, "", i % 2 === 0);
    await call(`${routes[0]}/chat/completions`, keys[0], i % 2 === 0);
  }
  for (const stream of [false, true]) {
    const times = { direct: [] as number[], proxied: [] as number[] };
    // Interleaved, so that the machine's drift falls on both alike.
    for (let i = 0; i < CALLS; i++) {
      for (const [which, url, key] of [["direct", direct, ""], ["proxied", routes[0], keys[0]]]) {
        const t0 = performance.now();
        await call(`${url}/chat/completions`, key, stream);
        times[which as "direct" | "proxied"].push(performance.now() - t0);
      }
    }
    const d50 = quantile(times.direct, 0.5);
    const p50 = quantile(times.proxied, 0.5);
    figures.push({
      figure: `one call, ${stream ? "streamed (100 chunks)" : "whole"}`,
      direct_p50_ms: +d50.toFixed(2),
      proxied_p50_ms: +p50.toFixed(2),
      added_p50_ms: +(p50 - d50).toFixed(2),
      direct_p90_ms: +quantile(times.direct, 0.9).toFixed(2),
      proxied_p90_ms: +quantile(times.proxied, 0.9).toFixed(2),
      calls: CALLS,
    });
  }
  for (const stream of [true, false]) {
    const rate = { direct: [] as number[], proxied: [] as number[] };
    let proxyCpu = 0;
    for (let round = 0; round < 2; round++) {
      for (const which of ["direct", "proxied"] as const) {
        const cpu0 = which === "proxied" ? cpuMs(proxy.pid) : 0;
        const t0 = performance.now();
        await Promise.all(Array.from({ length: STREAMS }, async (_, s) => {
          for (let i = 0; i < PER_STREAM; i++) {
            if (which === "direct") await call(`${direct}/chat/completions`, "", stream);
            else await call(`${routes[s]}/chat/completions`, keys[s], stream);
          }
        }));
        rate[which].push(STREAMS * PER_STREAM / ((performance.now() - t0) / 1000));
        if (which === "proxied") proxyCpu += cpuMs(proxy.pid) - cpu0;
      }
    }
    const d = Math.max(...rate.direct);
    const p = Math.max(...rate.proxied);
    figures.push({
      figure: `${STREAMS} concurrent streams, ${stream ? "streamed" : "whole"} calls`,
      direct_calls_per_s: +d.toFixed(1),
      proxied_calls_per_s: +p.toFixed(1),
      ratio: +(p / d).toFixed(3),
      proxy_cpu_ms_per_call: +(proxyCpu / (2 * STREAMS * PER_STREAM)).toFixed(2),
      calls: STREAMS * PER_STREAM,
    });
  }
} finally {
  await proxy.stop();
  await server.stop();
}
for (const f of figures) console.log(JSON.stringify(f));
