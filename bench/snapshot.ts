// Snapshot, fork and restore of a workspace of 100 MiB in 10,000 files
// (100 directories of 100 files of 10 KiB), for each method this process
// can use ("auto": an overlay as root, where it works; "copy": copies), in
// interleaved rounds.
//
//   deno run -A bench/snapshot.ts [--runs=N] [--changed=N]
//
// Each round starts the workspace (its root frozen as a layer of hard links
// in the background, waited for before timing), changes `--changed` files
// (10 by default) as the environment's code would, then times:
//   snapshot   Workspace.snapshot(): the agent stopped, the changes copied
//   fork       the fork's root made from the snapshot: its layers mounted
//              (idmapped for the fork's own uid) under an empty upper
//              directory: `openSnapshotRoot()`, what `addWorkspace(env,
//              root, { from })` adds to a workspace's start
//   restore    Workspace.restore(): back to the snapshot
// and, apart, the start of a whole workspace with and without `from`.
// Prints medians and p90 in ms, and the machine's load.

import { Environment } from "../env.ts";
import { addWorkspace, type Workspace } from "../workspace/workspace.ts";
import { openSnapshotRoot, snapshotMethod } from "../workspace/_snapshot.ts";

const RUNS = Number(Deno.args.find((a) => a.startsWith("--runs="))?.slice(7) ?? 15);
const CHANGED = Number(Deno.args.find((a) => a.startsWith("--changed="))?.slice(10) ?? 10);

async function makeTree(root: string): Promise<void> {
  const block = crypto.getRandomValues(new Uint8Array(10 * 1024));
  for (let d = 0; d < 100; d++) {
    await Deno.mkdir(`${root}/d${d}`);
    for (let f = 0; f < 100; f++) {
      block[0] = f;
      await Deno.writeFile(`${root}/d${d}/f${f}.bin`, block);
    }
  }
}

const q = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.floor(p * (xs.length - 1))];

interface Target {
  method: "auto" | "copy";
  env: Environment;
  ws: Workspace;
  root: string;
  times: Record<string, number[]>;
}

const { method: available, why } = await snapshotMethod();
const targets: Target[] = [];
for (const method of ["auto", "copy"] as const) {
  const root = await Deno.makeTempDir({ prefix: `bench-snap-${method}-` });
  await makeTree(root);
  const env = new Environment(`bench-snap-${method}`);
  const ws = addWorkspace(env, root, {
    snapshots: { method, maxBytes: 64 * 1024 ** 3 },
    trackFiles: false,
    onError: () => {},
  });
  targets.push({ method, env, ws, root, times: {} });
}

const forkRoot = await Deno.makeTempDir({ prefix: "bench-snap-fork-" });
for (let round = 0; round < RUNS + 1; round++) {
  for (const t of targets) {
    const mark = (what: string, ms: number) => {
      if (round > 0) (t.times[what] ??= []).push(ms); // one warm-up round
    };
    let s = performance.now();
    await t.env.start();
    mark("start", performance.now() - s);
    // The frozen layer is made in the background: the first snapshot waits
    // for it; time that apart.
    s = performance.now();
    const first = await t.ws.snapshot();
    mark("first snapshot (freeze)", performance.now() - s);
    await first.remove();
    for (let i = 0; i < CHANGED; i++) {
      await Deno.writeFile(`${t.root}/d${i}/f${round}.bin`, new Uint8Array(10 * 1024).fill(round));
    }
    s = performance.now();
    const snapshot = await t.ws.snapshot();
    mark("snapshot", performance.now() - s);

    s = performance.now();
    const fork = await openSnapshotRoot(forkRoot, {
      owner: { uid: 59990, gid: 59990 },
      diskOwner: { uid: 59990, gid: 59990 },
      from: snapshot,
      method: t.method === "copy" ? "copy" : available,
    });
    mark("fork", performance.now() - s);
    s = performance.now();
    await fork.close();
    mark("fork close", performance.now() - s);

    await Deno.writeFile(`${t.root}/d0/f0.bin`, new Uint8Array(1));
    s = performance.now();
    await t.ws.restore(snapshot);
    mark("restore", performance.now() - s);

    const forkEnv = new Environment("bench-fork");
    addWorkspace(forkEnv, forkRoot, { from: snapshot, trackFiles: false, onError: () => {} });
    s = performance.now();
    await forkEnv.start();
    mark("fork workspace start", performance.now() - s);
    await forkEnv.stop();

    await snapshot.remove();
    s = performance.now();
    await t.env.stop();
    mark("stop", performance.now() - s);
  }
}

const load = Deno.loadavg().map((l) => l.toFixed(2)).join(" ");
console.log(
  `100 MiB in 10,000 files, ${CHANGED} changed per snapshot, ${RUNS} rounds, uid ${Deno.uid()}, load ${load}`,
);
console.log(`"auto" here: ${available}${why === null ? "" : ` (${why})`}`);
for (const t of targets) {
  for (const [what, xs] of Object.entries(t.times)) {
    console.log(
      `${t.method.padEnd(5)} ${what.padEnd(24)} median ${
        q(xs, 0.5).toFixed(1).padStart(7)
      } ms  p90 ${q(xs, 0.9).toFixed(1).padStart(7)} ms`,
    );
  }
}
for (const t of targets) await Deno.remove(t.root, { recursive: true });
await Deno.remove(forkRoot, { recursive: true });
