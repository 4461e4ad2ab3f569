// One sandboxed rollout, end to end, and where its time goes: a workspace
// (started for the rollout and stopped after it), the agent's SSH login
// through the client's forwarder and one command, one grading command in
// the sandbox. Each rollout is `rollout(task, agent, { runtime })` on a
// `LocalRuntime` of an environment with one workspace, as README's second
// example.
//
//   deno run -A bench/sandboxed_rollout.ts [--runs=N]
//   deno run -A bench/sandboxed_rollout.ts --compare=/tmp/before/mod.ts [--batches=B] [--runs=N]
//
// The second form measures another checkout too (its mod.ts: `git worktree
// add --detach /tmp/before <commit>`), in alternating batches of N rollouts
// in child processes, so that both see the same machine.
//
// Prints the median and p90 of the whole rollout and of its parts, in ms:
//   start     connect, the environment started (the workspace's keys, SSH
//             server, sandbox, SFTP, file tracker) and tasks.start, to the
//             template's first line
//   agent     the agent: its SSH login through the forwarder (key exchange,
//             authentication) and one command (`echo ... > note.txt`) in
//             the sandbox
//   grade     `workspace.exec(["grep", ...])`: the agent stopped, one
//             grading command in the sandbox, the agent resumed
//   rest      answer, score, trace, the environment stopped
// The parts come from timestamps taken inside the same rollouts.

const args = new Map(
  Deno.args.map((a) => a.replace(/^--/, "").split("=", 2) as [string, string]),
);
const RUNS = Number(args.get("runs") ?? 40);
const PARTS = ["total", "start", "agent", "grade", "rest"] as const;
type Samples = Record<(typeof PARTS)[number], number[]>;

const q = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.floor(p * (xs.length - 1))];

/** Runs `runs` rollouts (after 3 to warm up) with the SDK at `sdkUrl`; the samples. */
async function measure(sdkUrl: string, runs: number): Promise<Samples> {
  // deno-lint-ignore no-explicit-any
  const sdk: any = await import(sdkUrl);
  const { addWorkspace, Environment, functionAgent, LocalRuntime, rollout, string } = sdk;
  let marks: Record<string, number> = {};
  const root = await Deno.makeTempDir({ prefix: "bench-rollout-" });
  const env = new Environment("bench-rollout", { version: "1.0.0" });
  const workspace = addWorkspace(env, root, { onError: () => {} });
  const write = env.template(
    { id: "write", description: "Write a word into note.txt", args: { word: string() } },
    async function* ({ word }: { word: string }) {
      marks.prompt = performance.now();
      yield `Write ${word} into ${root}/note.txt`;
      marks.gradeStart = performance.now();
      const check = await workspace.exec(["grep", "-qx", word, "note.txt"], { cwd: root });
      marks.gradeEnd = performance.now();
      yield check.code === 0 ? 1 : 0;
    },
  );
  // deno-lint-ignore no-explicit-any
  const agent = functionAgent(async (_prompt: string, run: any) => {
    marks.agent = performance.now();
    await using shell = await run.client.open("shell");
    const r = await shell.exec(`echo hello > ${root}/note.txt`);
    marks.agentEnd = performance.now();
    if (r.code !== 0) throw new Error(`agent command failed: ${r.stderrText}`);
    return "done";
  });
  const runtime = new LocalRuntime(env);
  const samples = Object.fromEntries(PARTS.map((p) => [p, [] as number[]])) as Samples;
  for (let i = 0; i < runs + 3; i++) {
    marks = { t0: performance.now() };
    const run = await rollout(write({ word: "hello" }), agent, { runtime });
    const end = performance.now();
    if (run.reward !== 1) {
      throw new Error(`rollout ${i} failed: ${JSON.stringify(run.trace.errors)}`);
    }
    await Deno.remove(`${root}/note.txt`);
    if (i < 3) continue;
    samples.total.push(end - marks.t0);
    samples.start.push(marks.prompt - marks.t0);
    samples.agent.push(marks.agentEnd - marks.agent);
    samples.grade.push(marks.gradeEnd - marks.gradeStart);
    samples.rest.push(end - marks.gradeEnd);
  }
  await Deno.remove(root, { recursive: true });
  return samples;
}

function table(label: string, s: Samples): string[] {
  return PARTS.map((p) =>
    `${label.padEnd(8)} ${p.padEnd(6)} median ${q(s[p], 0.5).toFixed(1).padStart(6)} ms  p90 ${
      q(s[p], 0.9).toFixed(1).padStart(6)
    } ms`
  );
}

const load = () => Deno.loadavg().map((l) => l.toFixed(2)).join(" ");
const compare = args.get("compare");
if (args.has("child")) {
  console.log(JSON.stringify(await measure(args.get("sdk")!, RUNS)));
} else if (compare === undefined) {
  const s = await measure(new URL("../mod.ts", import.meta.url).href, RUNS);
  for (const line of table("this", s)) console.log(line);
  console.log(`${RUNS} rollouts, uid ${Deno.uid()}, load ${load()}`);
} else {
  const batches = Number(args.get("batches") ?? 5);
  const sdks = {
    before: new URL(compare, `file://${Deno.cwd()}/`).href,
    after: new URL("../mod.ts", import.meta.url).href,
  };
  const all = { before: {} as Samples, after: {} as Samples };
  const loads: string[] = [load()];
  for (let b = 0; b < batches; b++) {
    for (const which of ["before", "after"] as const) {
      const out = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          import.meta.filename!,
          "--child",
          `--sdk=${sdks[which]}`,
          `--runs=${RUNS}`,
        ],
        stderr: "inherit",
      }).output();
      if (!out.success) throw new Error(`the ${which} batch failed`);
      const s = JSON.parse(new TextDecoder().decode(out.stdout)) as Samples;
      for (const p of PARTS) (all[which][p] ??= []).push(...s[p]);
    }
    loads.push(load());
  }
  for (const which of ["before", "after"] as const) {
    for (const line of table(which, all[which])) console.log(line);
  }
  const ratio = q(all.after.total, 0.5) / q(all.before.total, 0.5);
  console.log(
    `${batches} batches of ${RUNS} rollouts each, alternating; after/before ${
      ratio.toFixed(2)
    }; uid ${Deno.uid()}; load ${loads.join(" | ")}`,
  );
}
