// What the fork tests share: a prepared state (a workspace's snapshot with
// `log.txt` of n lines), a ForkRuntime whose environments grade by the
// lines of `log.txt` in their fork, rows of its task, and an agent that
// appends a line.

import type { TaskRow } from "../../env.ts";
import { Environment, taskSlug } from "../../env.ts";
import { integer } from "../../schema.ts";
import { addWorkspace, type Workspace } from "../../workspace/workspace.ts";
import type { WorkspaceSnapshot } from "../../workspace/mod.ts";
import { functionAgent, type Run } from "../../eval/mod.ts";
import { ForkRuntime } from "../../eval/fork.ts";
import type { Agent } from "../../eval/agent.ts";

/** A snapshot of a workspace whose `log.txt` holds `lines` lines (`setup`). */
export async function prepared(lines: number): Promise<WorkspaceSnapshot> {
  const root = await Deno.makeTempDir({ prefix: "fork-test-setup-" });
  const env = new Environment("fork-test-setup");
  const workspace = addWorkspace(env, root, { snapshots: true, trackFiles: false });
  await env.start();
  try {
    await Deno.writeTextFile(`${root}/log.txt`, "setup\n".repeat(lines));
    // The agent of a fork (its own uid) appends to it.
    await Deno.chmod(`${root}/log.txt`, 0o666);
    return await workspace.snapshot();
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
}

/** The environments of a {@linkcode forkRuntime}, by root: a test's agent snapshots its own. */
export const WORKSPACES = new Map<string, Workspace>();

/**
 * Environments named "forked", each on its placement's root, from the
 * rollout's snapshot; its task `append` grades by the lines of `log.txt`.
 */
export function forkRuntime(): ForkRuntime {
  return new ForkRuntime(({ from, root }) => {
    const env = new Environment("forked");
    ROOTS.add(root);
    // Registered first, so run last: once the workspace stopped.
    env.shutdown(() => void WORKSPACES.delete(root));
    const workspace = addWorkspace(env, root, {
      from: from ?? undefined,
      snapshots: true,
      trackFiles: false,
    });
    WORKSPACES.set(root, workspace);
    env.template({ id: "append", args: { n: integer() } }, async function* () {
      yield `In ${root}: append a line to log.txt`;
      const r = await workspace.exec(["cat", "log.txt"], { cwd: root });
      yield r.stdout.split("\n").filter(Boolean).length;
    });
    return env;
  });
}

/** Every root a fork was placed on. */
const ROOTS = new Set<string>();

/**
 * Waits until every fork's environment stopped and its root is gone: an
 * interrupted rollout's teardown goes on after the job returns.
 */
export async function forksGone(): Promise<void> {
  const gone = async () =>
    WORKSPACES.size === 0 &&
    (await Promise.all([...ROOTS].map((r) => Deno.stat(r).then(() => false, () => true))))
      .every(Boolean);
  for (let i = 0; i < 200 && !(await gone()); i++) await new Promise((r) => setTimeout(r, 50));
  if (!(await gone())) throw new Error(`forks still running: ${[...WORKSPACES.keys()]}`);
  ROOTS.clear();
}

/** Rows of `append`, one per n (n only tells them apart). */
export function appendRows(...ns: number[]): TaskRow[] {
  return ns.map((n) => ({
    env: "forked",
    id: "append",
    args: { n },
    slug: taskSlug("append", { n }),
  }));
}

/** The root a prompt names. */
export function rootOf(prompt: unknown): string {
  return /^In (\S+):/.exec(String(prompt))![1];
}

/** An agent that appends a line to log.txt in its root, then runs `then` (host side). */
export function appendAgent(then?: (root: string, run: Run) => Promise<void>): Agent {
  return functionAgent(async (prompt, run) => {
    const root = rootOf(prompt);
    await using shell = await run.client.open("shell");
    const r = await shell.exec(`cd ${root} && echo agent >> log.txt`);
    if (r.code !== 0) throw new Error(`append failed: ${r.stderrText}`);
    await then?.(root, run);
    return "done";
  });
}
