// A workspace's network allowlist: what the egress proxy costs. Starts a
// workspace (bwrap) with network "none", then with an allowlist, and times
// env.start() and a command (`true`, agent side, sequential); then fetches
// --mib MiB from an HTTP host in a network namespace of its own, through
// the proxy (allowlist) and directly (network "public"), with curl in the
// sandbox. Root only (it makes the namespace: tests/workspace/_netns_hosts.ts).
//
//   deno run -A bench/egress.ts [--rounds=5]
//
// Prints the median of the rounds per figure, and the load average.

import { Environment } from "../env.ts";
import { addWorkspace, type NetworkPolicy, type Workspace } from "../workspace/mod.ts";
import { startNetnsHosts } from "../tests/workspace/_netns_hosts.ts";

const arg = (name: string, fallback: number) =>
  Number(Deno.args.find((a) => a.startsWith(`--${name}=`))?.split("=")[1] ?? fallback);
const ROUNDS = arg("rounds", 5);
/** The namespace's host serves 64 MiB at /bulk. */
const MIB = 64;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

async function run(ws: Workspace, script: string): Promise<string> {
  const child = await ws.spawn(["bash", "-c", script]);
  await child.stdin.close();
  const out = await child.output();
  if (!out.success) throw new Error(new TextDecoder().decode(out.stderr));
  return new TextDecoder().decode(out.stdout);
}

/** Start, command and (when `url` is given) download times of a workspace under `network`. */
async function measure(network: boolean | NetworkPolicy, url: string | null) {
  const start: number[] = [];
  const command: number[] = [];
  const download: number[] = [];
  for (let i = 0; i < ROUNDS; i++) {
    const root = await Deno.makeTempDir({ prefix: "bench-egress-" });
    const env = new Environment("bench-egress");
    const ws = addWorkspace(env, root, { isolation: "bwrap", trackFiles: false, network });
    let t = performance.now();
    await env.start();
    start.push(performance.now() - t);
    try {
      for (let j = 0; j < 5; j++) {
        t = performance.now();
        await run(ws, "true");
        command.push(performance.now() - t);
      }
      if (url !== null) {
        const secs = await run(ws, `curl -sS -o /dev/null -w '%{time_total}' ${url}`);
        download.push(Number(secs) * 1000);
      }
    } finally {
      await env.stop();
      await Deno.remove(root, { recursive: true });
    }
  }
  return { start: median(start), command: median(command), download: median(download) };
}

await using hosts = await startNetnsHosts();
const url = `http://${hosts.allowed}:8080/bulk`;
const none = await measure(false, null);
const allow = await measure({ allow: [hosts.allowed] }, url);
const open = await measure(true, url);
const ms = (x: number) => `${x.toFixed(0)} ms`;
const rate = (x: number) => `${(MIB / (x / 1000)).toFixed(0)} MiB/s`;
console.log(`env.start(): none ${ms(none.start)}, allowlist ${ms(allow.start)}`);
console.log(`command (true): none ${ms(none.command)}, allowlist ${ms(allow.command)}`);
console.log(
  `${MIB} MiB download: through the proxy ${ms(allow.download)} (${rate(allow.download)}), direct ${
    ms(open.download)
  } (${rate(open.download)})`,
);
console.log(`load average: ${Deno.loadavg().map((l) => l.toFixed(2)).join(" ")}`);
