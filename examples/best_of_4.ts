// Best of four from one prepared state: the environment's setup runs once
// and is snapshotted; four rollouts, each on a fork of the snapshot (a
// workspace of its own, with its own uid and sandbox), try a fix at the
// same time; the best reward wins. Forks share the snapshot's unchanged
// files and never see each other's writes.
//
//   deno run -A examples/best_of_4.ts

import { addWorkspace, Environment, functionAgent, LocalRuntime, rollout } from "../mod.ts";
import type { WorkspaceSnapshot } from "../workspace/mod.ts";

/** The four attempts: what each agent runs in its fork's root. */
export const ATTEMPTS: readonly string[] = [
  "sed -i 's/-/+/' add.sh", // right
  "sed -i 's/-/*/' add.sh", // wrong
  "true", // changes nothing
  "sed -i 's/[$]1 - [$]2/$2 + $1/' add.sh", // right too
];

/** The environment's setup, once: a program with a bug, snapshotted. */
export async function prepare(): Promise<WorkspaceSnapshot> {
  const root = await Deno.makeTempDir({ prefix: "best-of-4-setup-" });
  const env = new Environment("best-of-4-setup");
  const workspace = addWorkspace(env, root, { snapshots: true, trackFiles: false });
  await env.start();
  try {
    await Deno.writeTextFile(`${root}/add.sh`, "echo $(($1 - $2))\n");
    return await workspace.snapshot();
  } finally {
    await env.stop();
    // The snapshot holds the files: the setup's root can go.
    await Deno.remove(root, { recursive: true });
  }
}

/** One rollout on a fork of `prepared`, whose agent runs `fix`; its reward. */
export async function attempt(prepared: WorkspaceSnapshot, fix: string): Promise<number> {
  const root = await Deno.makeTempDir({ prefix: "best-of-4-" });
  const env = new Environment("best-of-4");
  const workspace = addWorkspace(env, root, { from: prepared, trackFiles: false });
  const task = env.template(
    { id: "fix_add", description: "Make add.sh add its two arguments" },
    async function* () {
      yield `Make ${root}/add.sh print the sum of its two arguments`;
      const check = await workspace.exec(["bash", "add.sh", "2", "3"], { cwd: root });
      yield check.stdout === "5\n" ? 1 : 0;
    },
  );
  const agent = functionAgent(async (_prompt, run) => {
    await using shell = await run.client.open("shell");
    const r = await shell.exec(`cd ${root} && ${fix}`);
    return `exit ${r.code}`;
  });
  try {
    const run = await rollout(task(), agent, { runtime: new LocalRuntime(env) });
    return run.reward ?? 0;
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

if (import.meta.main) {
  await using prepared = await prepare();
  const rewards = await Promise.all(ATTEMPTS.map((fix) => attempt(prepared, fix)));
  const best = rewards.indexOf(Math.max(...rewards));
  console.log(`rewards ${rewards.join(" ")}; best: attempt ${best + 1} (${ATTEMPTS[best]})`);
}
