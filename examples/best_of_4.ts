// Best of four from one prepared state: the environment's setup runs once
// and is snapshotted; four rollouts start from the snapshot at the same
// time (`rollout(task, agent, { runtime, from })`), each on an environment
// of its own whose workspace is a fork of it (its own root, uid and
// sandbox), each agent trying its own fix; the best reward wins. Forks
// share the snapshot's unchanged files and never see each other's writes.
//
//   deno run -A examples/best_of_4.ts

import { addWorkspace, Environment, functionAgent, rollout, type Run } from "../mod.ts";
import { ForkRuntime } from "../eval/mod.ts";
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

/** The environment of one rollout: its workspace on a root of its own, from the snapshot. */
function fixAdd(root: string, from: WorkspaceSnapshot | null): Environment {
  const env = new Environment("best-of-4");
  const workspace = addWorkspace(env, root, { from: from ?? undefined, trackFiles: false });
  env.template(
    { id: "fix_add", description: "Make add.sh add its two arguments" },
    async function* () {
      yield `Make ${root}/add.sh print the sum of its two arguments`;
      const check = await workspace.exec(["bash", "add.sh", "2", "3"], { cwd: root });
      yield check.stdout === "5\n" ? 1 : 0;
    },
  );
  return env;
}

/** Places each rollout's environment, from the snapshot the rollout starts from. */
export const runtime: ForkRuntime = new ForkRuntime(({ from, root }) => fixAdd(root, from));

/** The task (a row: every fork's environment has the template). */
export const task = { env: "best-of-4", id: "fix_add", args: {}, slug: "fix_add" };

/** An agent that runs `fix` in the workspace's root. */
function agent(fix: string) {
  return functionAgent(async (prompt, run) => {
    const root = /^Make (\S+)\/add\.sh/.exec(String(prompt))![1];
    await using shell = await run.client.open("shell");
    const r = await shell.exec(`cd ${root} && ${fix}`);
    return `exit ${r.code}`;
  });
}

/** One rollout from `prepared` whose agent runs `fix`. */
export function attempt(prepared: WorkspaceSnapshot, fix: string): Promise<Run> {
  return rollout(task, agent(fix), { runtime, from: prepared });
}

if (import.meta.main) {
  await using prepared = await prepare();
  const runs = await Promise.all(ATTEMPTS.map((fix) => attempt(prepared, fix)));
  const rewards = runs.map((r) => r.reward ?? 0);
  const best = rewards.indexOf(Math.max(...rewards));
  console.log(`rewards ${rewards.join(" ")}; best: attempt ${best + 1} (${ATTEMPTS[best]})`);
}
