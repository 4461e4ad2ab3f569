// Cluster figures for BENCHMARKS.md, beside Docker's and the swarm's
// (bench/containers.ts): for KubernetesRuntime and SlurmRuntime on the
// 3-node test clusters, start-to-ready of one placement (a bare pod; a job
// of its own), rollouts per second through a pool of 4 over three nodes,
// 4 at a time, and the time close() takes to clean up. Root; the clusters
// up (.ci/engine/k8s_up.sh, slurm_up.sh; .ci/run starts both) and Docker
// (for the image). Prints a table and the machine's load average.
//
//   deno run -A bench/clusters.ts [--rollouts 40] [--concurrency 4] [--only k8s|slurm]

import { parseArgs } from "node:util";
import { KubernetesRuntime } from "../engines/kubernetes.ts";
import { SlurmRuntime } from "../engines/slurm.ts";
import { buildEnvironmentImage } from "../engines/image.ts";
import { EngineClient } from "../engines/_engine.ts";
import type { RuntimeProvider } from "../runtime/placement.ts";
import { throughput } from "./_throughput.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    rollouts: { type: "string", default: "40" },
    concurrency: { type: "string", default: "4" },
    only: { type: "string" },
    k8s: { type: "string", default: "/var/lib/hud-k8s" },
    slurm: { type: "string", default: "/run/hud-slurm" },
  },
});
const ROLLOUTS = Number(values.rollouts);
const CONCURRENCY = Number(values.concurrency);
const FIXTURE = new URL("../tests/fixtures/basic_env.ts", import.meta.url).pathname;
const IMAGE = "hud-k8s-fixture:test";

const load = () => Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (ms: number) => ms >= 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;

const table: string[][] = [];
const note = (what: string, figure: string) => {
  table.push([what, figure, load()]);
  console.log(`${what}: ${figure} (load ${load()})`);
};

/** start-to-ready of one placement, `n` times, each released (and cleaned up) before the next. */
async function startToReady(runtime: RuntimeProvider, n: number): Promise<[number[], number[]]> {
  const ready: number[] = [];
  const cleanup: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const p = await runtime.place();
    ready.push(performance.now() - t0);
    const t1 = performance.now();
    await p[Symbol.asyncDispose]();
    cleanup.push(performance.now() - t1);
  }
  return [ready, cleanup];
}

const spread = (t: number[]) =>
  `${fmt(median(t))} (min ${fmt(Math.min(...t))}, max ${fmt(Math.max(...t))})`;

console.log(`load average at start: ${load()}`);
if (values.only !== "slurm") {
  await buildEnvironmentImage(FIXTURE, IMAGE, { envName: "fixture", envVersion: "0.3.0" });
  using engine = await EngineClient.open();
  const tar = new Uint8Array(
    await (await engine.raw("GET", `/images/get?names=${encodeURIComponent(IMAGE)}`)).arrayBuffer(),
  );
  for (const node of ["k8s-n1", "k8s-n2", "k8s-n3"]) {
    const child = new Deno.Command("ctr", {
      args: ["-a", `/run/hud-k8s/${node}/containerd.sock`, "-n", "k8s.io", "images", "import", "-"],
      stdin: "piped",
      stdout: "null",
    }).spawn();
    const w = child.stdin.getWriter();
    await w.write(tar);
    await w.close();
    await child.status;
  }
  const kubeconfig = `${values.k8s}/admin.kubeconfig`;
  for (const reach of ["pod-ip", "port-forward"] as const) {
    await using bare = new KubernetesRuntime(IMAGE, {
      kubeconfig,
      imagePullPolicy: "IfNotPresent",
      reach,
    });
    const [ready, cleanup] = await startToReady(bare, 7);
    note(`KubernetesRuntime (${reach}): a bare pod's start-to-ready, median of 7`, spread(ready));
    note(`KubernetesRuntime (${reach}): its release (pod deleted)`, spread(cleanup));
  }
  const pool = new KubernetesRuntime(IMAGE, {
    kubeconfig,
    imagePullPolicy: "IfNotPresent",
    reach: "pod-ip",
    pool: { minReplicas: CONCURRENCY, maxReplicas: CONCURRENCY },
  });
  const t0 = performance.now();
  await pool.ready(CONCURRENCY, { timeout: 300_000 });
  note(
    `KubernetesRuntime: a pool of ${CONCURRENCY} ready (${JSON.stringify(pool.readyByNode)})`,
    fmt(performance.now() - t0),
  );
  const [rate, s] = await throughput(pool, ROLLOUTS, CONCURRENCY);
  note(
    `KubernetesRuntime (3 nodes, pool of ${CONCURRENCY}): ${ROLLOUTS} rollouts, ${CONCURRENCY} at a time`,
    `${rate.toFixed(2)}/s (${s.toFixed(1)} s)`,
  );
  const t1 = performance.now();
  await pool.close();
  note(`KubernetesRuntime: close() of the pool (pods gone)`, fmt(performance.now() - t1));
}

if (values.only !== "k8s") {
  const slurmConf = `${values.slurm}/slurm.conf`;
  const announceHost = "10.215.0.254";
  {
    await using perJob = new SlurmRuntime({
      module: FIXTURE,
      slurmConf,
      announceHost,
      jobPerPlacement: true,
    });
    const [ready, cleanup] = await startToReady(perJob, 7);
    note("SlurmRuntime (sbatch): a job per placement, start-to-ready, median of 7", spread(ready));
    note("SlurmRuntime (sbatch): its release (scancel)", spread(cleanup));
  }
  const pool = new SlurmRuntime({
    module: FIXTURE,
    slurmConf,
    announceHost,
    tasks: CONCURRENCY,
    nodes: 3,
  });
  const t0 = performance.now();
  await pool.ready(CONCURRENCY, { timeout: 300_000 });
  note(
    `SlurmRuntime: an allocation of ${CONCURRENCY} tasks ready (${
      JSON.stringify(pool.readyByNode)
    })`,
    fmt(performance.now() - t0),
  );
  const [rate, s] = await throughput(pool, ROLLOUTS, CONCURRENCY);
  note(
    `SlurmRuntime (3 nodes, ${CONCURRENCY} tasks): ${ROLLOUTS} rollouts, ${CONCURRENCY} at a time`,
    `${rate.toFixed(2)}/s (${s.toFixed(1)} s)`,
  );
  const t1 = performance.now();
  await pool.close();
  note("SlurmRuntime: close() (job cancelled and ended)", fmt(performance.now() - t1));
}

console.log("\n| figure | value | load average (1, 5, 15 min) |\n| --- | --- | --- |");
for (const [what, figure, l] of table) console.log(`| ${what} | ${figure} | ${l} |`);
