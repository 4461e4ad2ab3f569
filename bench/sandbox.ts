// The workspace sandbox's cost: `ssh ... true` with OpenSSH's client (one
// process, connection, key exchange and command per run) against workspaces
// that differ only in isolation, in interleaved rounds.
//
//   deno run -A bench/sandbox.ts [--runs=N] [--unshare]
//
// Prints the median and quartiles of each in milliseconds.

import { Environment } from "../env.ts";
import { addWorkspace, type WorkspaceIsolation } from "../workspace/mod.ts";
import { opensshOptions } from "../tests/ssh/_util.ts";

const runsArg = Deno.args.find((a) => a.startsWith("--runs="));
const RUNS = runsArg ? Number(runsArg.slice(7)) : 40;
const kinds: WorkspaceIsolation[] = [
  "none",
  "bwrap",
  ...(Deno.args.includes("--unshare") ? ["unshare" as const] : []),
];

interface Target {
  kind: WorkspaceIsolation;
  env: Environment;
  root: string;
  args: string[];
  times: number[];
}

const targets: Target[] = [];
for (const kind of kinds) {
  const root = await Deno.makeTempDir({ prefix: `bench-${kind}-` });
  const env = new Environment(`bench-${kind}`);
  addWorkspace(env, root, { isolation: kind, trackFiles: false, onError: () => {} });
  await env.start();
  const cap = env.capability("shell")!;
  const port = new URL(cap.url).port;
  const knownHosts = `${root}.known_hosts`;
  await Deno.writeTextFile(knownHosts, `[127.0.0.1]:${port} ${cap.params.host_pubkey}\n`);
  const args = [
    ...opensshOptions(knownHosts, cap.params.client_key_path as string),
    "-p",
    port,
    "agent@127.0.0.1",
    "true",
  ];
  targets.push({ kind, env, root, args, times: [] });
}

for (let round = 0; round < RUNS + 2; round++) {
  for (const t of targets) {
    const start = performance.now();
    const out = await new Deno.Command("ssh", { args: t.args, stdin: "null", stdout: "null" })
      .output();
    if (!out.success) throw new Error(`ssh to the ${t.kind} workspace failed`);
    if (round >= 2) t.times.push(performance.now() - start); // two warm-up rounds
  }
}

const q = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.floor(p * (xs.length - 1))];
const base = q(targets[0].times, 0.5);
for (const t of targets) {
  const m = q(t.times, 0.5);
  console.log(
    `${t.kind.padEnd(8)} median ${m.toFixed(1)} ms  (p25 ${q(t.times, 0.25).toFixed(1)}, p75 ${
      q(t.times, 0.75).toFixed(1)
    })  +${(m - base).toFixed(1)} ms over none  n=${t.times.length}`,
  );
  await t.env.stop();
  await Deno.remove(t.root, { recursive: true });
  await Deno.remove(`${t.root}.known_hosts`);
}
console.log(`uid ${Deno.uid()}, load ${Deno.loadavg().map((l) => l.toFixed(1)).join(" ")}`);
