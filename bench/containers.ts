// Container figures for BENCHMARKS.md: start-to-ready of a container,
// rollouts per second through SubprocessRuntime, ContainerRuntime (Docker,
// and Podman when its socket is up) and a 3-node swarm (SwarmRuntime, with
// --swarm: brings the swarm up and down with swarm_up.sh/swarm_down.sh), and
// the memory of one placed environment. Root; engines started by
// .ci/engine/engine_up.sh. Prints a table and the machine's load average.
//
//   deno run -A bench/containers.ts [--rollouts 40] [--concurrency 4] [--swarm]
//   deno run -A bench/containers.ts --only swarm --rollouts 400   (the swarm alone)

import { parseArgs } from "node:util";
import { buildEnvironmentImage, ContainerRuntime } from "../engines/mod.ts";
import { SubprocessRuntime } from "../runtime/subprocess.ts";
import { SwarmRuntime } from "../engines/mod.ts";
import { EngineClient } from "../engines/_engine.ts";
import { throughput } from "./_throughput.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    rollouts: { type: "string", default: "40" },
    concurrency: { type: "string", default: "4" },
    swarm: { type: "boolean", default: false },
    only: { type: "string" },
  },
});
const ROLLOUTS = Number(values.rollouts);
const CONCURRENCY = Number(values.concurrency);
const FIXTURE = new URL("../tests/fixtures/basic_env.ts", import.meta.url).pathname;
const ENGINE_DIR = new URL("../.ci/engine/", import.meta.url).pathname;
const PODMAN = "/run/podman/podman.sock";
const TAG = "hud-test-fixture:latest";

const load = () => Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (ms: number) => `${Math.round(ms)} ms`;

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(Deno.readTextFileSync(`/proc/${pid}/status`));
  return m ? Number(m[1]) : NaN;
}

async function exists(path: string): Promise<boolean> {
  return await Deno.stat(path).then(() => true, () => false);
}

async function startToReady(socket: string | undefined, n: number): Promise<number[]> {
  const runtime = new ContainerRuntime(TAG, { socket });
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const p = await runtime.place();
    times.push(performance.now() - t0);
    await p[Symbol.asyncDispose]();
  }
  return times;
}

/** RSS of the environment's process, and the container's cgroup usage, in MiB. */
async function containerMemory(socket: string | undefined): Promise<[number, number]> {
  const runtime = new ContainerRuntime(TAG, { socket });
  await using p = await runtime.place();
  // Let it settle after the handshake.
  await new Promise((r) => setTimeout(r, 2_000));
  using engine = await EngineClient.open(socket);
  const id = String(p.params.containerId);
  const info = await engine.call("GET", `/containers/${id}/json`) as { State: { Pid: number } };
  const stats = await engine.call("GET", `/containers/${id}/stats?stream=false`) as {
    memory_stats?: { usage?: number; stats?: { cache?: number; inactive_file?: number } };
  };
  const m = stats.memory_stats ?? {};
  const usage = (m.usage ?? NaN) - (m.stats?.inactive_file ?? m.stats?.cache ?? 0);
  return [rssKiB(info.State.Pid) / 1024, usage / 2 ** 20];
}

async function subprocessMemory(): Promise<number> {
  await using p = await new SubprocessRuntime(FIXTURE).place();
  await new Promise((r) => setTimeout(r, 2_000));
  return rssKiB(Number(p.params.pid)) / 1024;
}

async function sh(script: string, env: Record<string, string>): Promise<void> {
  const out = await new Deno.Command("bash", {
    args: [`${ENGINE_DIR}${script}`],
    env,
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(300_000),
  }).output();
  if (!out.success) throw new Error(`${script}: ${new TextDecoder().decode(out.stderr)}`);
}

const rows: string[][] = [];
const note = (what: string, figure: string) => {
  rows.push([what, figure, load()]);
  console.log(`${what}: ${figure} (load ${load()})`);
};

const podman = await exists(PODMAN);
console.log(`load average at start: ${load()}`);
const onlySwarm = values.only === "swarm";
if (!onlySwarm) await local();
async function local(): Promise<void> {
  await buildEnvironmentImage(FIXTURE, TAG, { envName: "fixture", envVersion: "0.3.0" });
  if (podman) {
    await buildEnvironmentImage(FIXTURE, TAG, {
      socket: PODMAN,
      envName: "fixture",
      envVersion: "0.3.0",
    });
  }
  for (const [name, socket] of [["Docker", undefined], ...(podman ? [["Podman", PODMAN]] : [])]) {
    const t = await startToReady(socket, 7);
    note(
      `${name}: container start-to-ready (place(), median of 7)`,
      `${fmt(median(t))} (min ${fmt(Math.min(...t))}, max ${fmt(Math.max(...t))})`,
    );
    const [rss, cgroup] = await containerMemory(socket);
    note(
      `${name}: memory of one placed environment`,
      `${rss.toFixed(1)} MiB RSS of its process, ${
        cgroup.toFixed(1)
      } MiB cgroup (less inactive file)`,
    );
  }
  note(
    "SubprocessRuntime: memory of one placed environment",
    `${(await subprocessMemory()).toFixed(1)} MiB RSS`,
  );

  const [subRate, subS] = await throughput(new SubprocessRuntime(FIXTURE), ROLLOUTS, CONCURRENCY);
  note(
    `SubprocessRuntime: ${ROLLOUTS} rollouts, ${CONCURRENCY} at a time`,
    `${subRate.toFixed(2)}/s (${subS.toFixed(1)} s)`,
  );
  for (const [name, socket] of [["Docker", undefined], ...(podman ? [["Podman", PODMAN]] : [])]) {
    const [rate, s] = await throughput(
      new ContainerRuntime(TAG, { socket }),
      ROLLOUTS,
      CONCURRENCY,
    );
    note(
      `ContainerRuntime (${name}): ${ROLLOUTS} rollouts, ${CONCURRENCY} at a time`,
      `${rate.toFixed(2)}/s (${s.toFixed(1)} s)`,
    );
  }
}

if (values.swarm || onlySwarm) {
  const state = await Deno.makeTempDir({ prefix: "hud-swarm-bench-" });
  const env = { ENGINE_STATE: Deno.env.get("ENGINE_STATE") ?? state, SWARM_REGISTRY: "1" };
  try {
    const t0 = performance.now();
    await sh("swarm_up.sh", env);
    note("swarm_up.sh: 3 nodes up", fmt(performance.now() - t0));
    const tag = "10.213.0.254:5000/hud-swarm-fixture:latest";
    await buildEnvironmentImage(FIXTURE, tag, {
      socket: "/run/docker-sw1.sock",
      envName: "fixture",
      envVersion: "0.3.0",
    });
    {
      using sw1 = await EngineClient.open("/run/docker-sw1.sock");
      const res = await sw1.raw(
        "POST",
        `/images/${encodeURIComponent(tag.replace(/:latest$/, ""))}/push?tag=latest`,
        { headers: { "x-registry-auth": btoa("{}") } },
      );
      await res.text();
    }
    await using swarm = new SwarmRuntime(tag, {
      socket: "/run/docker-sw1.sock",
      minReplicas: CONCURRENCY,
      maxReplicas: CONCURRENCY,
    });
    const t1 = performance.now();
    await swarm.ready(CONCURRENCY);
    note(
      `SwarmRuntime: ${CONCURRENCY} replicas ready (${JSON.stringify(swarm.readyByNode)})`,
      fmt(performance.now() - t1),
    );
    const [rate, s] = await throughput(swarm, ROLLOUTS, CONCURRENCY);
    note(
      `SwarmRuntime (3 nodes): ${ROLLOUTS} rollouts, ${CONCURRENCY} at a time`,
      `${rate.toFixed(2)}/s (${s.toFixed(1)} s)`,
    );
  } finally {
    await sh("swarm_down.sh", env).catch((e) => console.error(String(e)));
    await Deno.remove(state, { recursive: true }).catch(() => {});
  }
}

console.log("\n| figure | value | load average (1, 5, 15 min) |\n| --- | --- | --- |");
for (const [what, figure, l] of rows) console.log(`| ${what} | ${figure} | ${l} |`);
