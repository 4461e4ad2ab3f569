// Rollouts from workspace snapshots: rollout({ from }) on a ForkRuntime,
// Taskset.run({ from, group }) for n rollouts from one state, the lineage
// each trace records and the summary groups by, the bounds and removal of
// the snapshots a job takes, and what one fork's agent can reach of
// another's.

import { test } from "../_test.ts";
import { BWRAP, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { LocalRuntime } from "../../runtime/local.ts";
import type { WorkspaceSnapshot } from "../../workspace/mod.ts";
import { formatJobTable, Job, rollout, type RunRecord, Taskset } from "../../eval/mod.ts";
import { storeOf } from "../workspace/_snapshot_util.ts";
import { snapshotMethod } from "../../workspace/_snapshot.ts";
import { appendAgent, appendRows, forkRuntime, forksGone, prepared, WORKSPACES } from "./_forks.ts";

// Loads libc's mount calls (once per process) before any test's sanitizer counts them.
await snapshotMethod();

const [ROW] = appendRows(1);

async function records(path: string): Promise<RunRecord[]> {
  return (await Deno.readTextFile(path)).trim().split("\n").map((l) => JSON.parse(l));
}

test({
  name: "rollout() starts from a snapshot on a fork, and its trace records the snapshot's lineage",
  needs: [BWRAP],
}, async (t) => {
  const runtime = forkRuntime();
  const a = await prepared(1);
  let midway: WorkspaceSnapshot | null = null;
  try {
    await t.step("a rollout from the setup's snapshot, snapshotted midway", async () => {
      const agent = appendAgent(async (root) => {
        midway = await WORKSPACES.get(root)!.snapshot();
      });
      const run = await rollout(ROW, agent, { runtime, from: a });
      assert.equal(run.trace.status, "completed", JSON.stringify(run.trace.errors));
      assert.equal(run.reward, 2, "the setup's line and the agent's");
      assert.deepEqual(run.trace.fromSnapshot, { id: a.id, workspace: "shell", parents: [] });
      assert.deepEqual(run.trace.toJSON().from_snapshot, run.trace.fromSnapshot);
      assert.ok(midway !== null);
      const mid: WorkspaceSnapshot = midway;
      assert.equal(mid.parent, a.id);
      assert.deepEqual(mid.lineage, [a.id]);
    });
    await t.step("a rollout from the midway snapshot knows its whole ancestry", async () => {
      const mid: WorkspaceSnapshot = midway!;
      const run = await rollout(ROW, appendAgent(), { runtime, from: mid });
      assert.equal(run.reward, 3, JSON.stringify(run.trace.errors));
      assert.deepEqual(run.trace.toJSON().from_snapshot, {
        id: mid.id,
        workspace: "shell",
        parents: [a.id],
      });
    });
    await t.step("the setup's snapshot is as it was: forks wrote their own", async () => {
      const run = await rollout(ROW, appendAgent(), { runtime, from: a });
      assert.equal(run.reward, 2);
    });
    await t.step(
      "without from, the runtime's environment starts empty and records none",
      async () => {
        const run = await rollout(ROW, appendAgent(), { runtime });
        assert.equal(run.reward, 1, JSON.stringify(run.trace.errors));
        assert.equal(run.trace.fromSnapshot, null);
        assert.equal("from_snapshot" in run.trace.toJSON(), false);
      },
    );
    await t.step("a snapshot it cannot start from is refused up front", async () => {
      const env = new Environment("forked");
      await assert.rejects(
        rollout(ROW, appendAgent(), { runtime: new LocalRuntime(env), from: a }),
        { name: "TypeError", message: /cannot place an environment from a snapshot.*ForkRuntime/ },
      );
      await assert.rejects(
        rollout(ROW, appendAgent(), { runtime, from: {} as WorkspaceSnapshot }),
        { name: "TypeError", message: /not a snapshot/ },
      );
      const gone = await prepared(1);
      await gone.remove();
      await assert.rejects(
        rollout(ROW, appendAgent(), { runtime, from: gone }),
        new RegExp(`snapshot "${gone.id}" was removed`),
      );
      await assert.rejects(
        new Taskset([ROW]).run(appendAgent(), { from: a }),
        /Cannot run taskset from a snapshot: the default runtime \(LocalRuntime\) cannot place/,
      );
      await assert.rejects(
        new Taskset([ROW]).run(appendAgent(), { runtime, from: a, snapshots: { maxCount: 0 } }),
        { name: "RangeError", message: /invalid snapshots.maxCount "0"/ },
      );
    });
  } finally {
    await (midway as WorkspaceSnapshot | null)?.remove();
    await a.remove();
  }
  assert.equal(WORKSPACES.size, 0, "every fork's environment stopped");
});

test({
  name: "Taskset.run() runs n rollouts from one snapshot; the summary groups them as its branches",
  needs: [BWRAP],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "fork-job-" });
  const a = await prepared(2);
  try {
    const out = `${dir}/r.jsonl`;
    const job = await new Taskset(appendRows(1, 2)).run(appendAgent(), {
      runtime: forkRuntime(),
      from: a,
      group: 3,
      maxConcurrent: 6,
      out,
    });
    assert.deepEqual(job.runs.map((r) => r.reward), [3, 3, 3, 3, 3, 3]);
    for (const r of await records(out)) {
      assert.deepEqual(r.trace.from_snapshot, { id: a.id, workspace: "shell", parents: [] });
    }
    assert.equal(a.removed, false, "a snapshot given stays the caller's");
    const branches = [{
      id: a.id,
      workspace: "shell",
      parents: [],
      rollouts: 6,
      graded: 6,
      mean_reward: 3,
      best_reward: 3,
    }];
    assert.deepEqual(job.summary().snapshots, branches);
    const loaded = await Job.load(out);
    assert.deepEqual(loaded.summary().snapshots, branches);
    assert.match(
      formatJobTable(loaded),
      new RegExp(`\\nfrom ${a.id}: 6 rollouts, 6 graded, mean 3.000, best 3\\n`),
    );
  } finally {
    await a.remove();
    await Deno.remove(dir, { recursive: true });
  }
});

/** A `from` function that prepares `n` lines for task n, and notes what it made. */
function tracked() {
  const taken: WorkspaceSnapshot[] = [];
  let mostAlive = 0;
  return {
    taken,
    get mostAlive() {
      return mostAlive;
    },
    from: async (task: { args: Record<string, unknown> }) => {
      const s = await prepared(Number(task.args.n));
      taken.push(s);
      mostAlive = Math.max(mostAlive, taken.filter((x) => !x.removed).length);
      return s;
    },
  };
}

test({
  name:
    "Taskset.run() takes one snapshot per task with from a function, within maxCount, and removes each with its task",
  needs: [BWRAP],
}, async () => {
  const made = tracked();
  const dir = await Deno.makeTempDir({ prefix: "fork-job-" });
  try {
    const out = `${dir}/r.jsonl`;
    const removedWhenGraded: boolean[] = [];
    const job = await new Taskset(appendRows(1, 2, 3)).run(appendAgent(), {
      runtime: forkRuntime(),
      from: made.from,
      group: 2,
      maxConcurrent: 6,
      snapshots: { maxCount: 1 },
      out,
      onGroup: (records) => {
        const id = records[0].trace.from_snapshot?.id;
        removedWhenGraded.push(made.taken.find((s) => s.id === id)!.removed);
      },
    });
    assert.deepEqual(job.runs.map((r) => r.reward), [2, 2, 3, 3, 4, 4]);
    assert.equal(made.taken.length, 3, "once per task");
    assert.equal(made.mostAlive, 1, "snapshots.maxCount: 1");
    assert.ok(made.taken.every((s) => s.removed), "every one removed with the job");
    // Removed once the task's last rollout was done: before its group was reported.
    assert.deepEqual(removedWhenGraded, [true, true, true]);
    const byTask = (await records(out)).map((r) => [r.task.args.n, r.trace.from_snapshot?.id]);
    assert.deepEqual(byTask.sort(), [
      [1, made.taken[0].id],
      [1, made.taken[0].id],
      [2, made.taken[1].id],
      [2, made.taken[1].id],
      [3, made.taken[2].id],
      [3, made.taken[2].id],
    ]);
    assert.deepEqual(job.summary().snapshots.map((s) => [s.id, s.rollouts]), [
      [made.taken[0].id, 2],
      [made.taken[1].id, 2],
      [made.taken[2].id, 2],
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test({
  name: "Taskset.run() removes the job's snapshots when it fails, and refuses one past maxBytes",
  needs: [BWRAP],
}, async (t) => {
  await t.step("a job that fails (onGroup throws) removes them", async () => {
    const made = tracked();
    await assert.rejects(
      new Taskset(appendRows(1, 2)).run(appendAgent(), {
        runtime: forkRuntime(),
        from: made.from,
        group: 2,
        maxConcurrent: 1,
        onGroup: () => {
          throw new Error("the trainer fell over");
        },
      }),
      /the trainer fell over/,
    );
    assert.ok(made.taken.length >= 1);
    assert.ok(made.taken.every((s) => s.removed), "removed when the job failed");
    await forksGone();
  });
  await t.step("a snapshot past snapshots.maxBytes fails its rollouts and is removed", async () => {
    const made = tracked();
    const job = await new Taskset(appendRows(1)).run(appendAgent(), {
      runtime: forkRuntime(),
      from: made.from,
      group: 2,
      maxConcurrent: 1,
      snapshots: { maxBytes: 1 },
    });
    assert.deepEqual(job.runs.map((r) => r.reward), [null, null]);
    for (const run of job.runs) {
      assert.equal(run.trace.errors[0].class, "provisioning");
      assert.match(run.trace.errors[0].message, /snapshots\.maxBytes \(1\).*raise it/);
    }
    // Each rollout tried again (the failure is not kept): two made, both removed.
    assert.equal(made.taken.length, 2);
    assert.ok(made.taken.every((s) => s.removed));
    await forksGone();
  });
  await t.step("an aborted job removes them", async () => {
    const made = tracked();
    const controller = new AbortController();
    // No timer of its own after the abort: the rollout stops waiting for
    // an agent once its signal aborts, and a timer the agent left would
    // outlive the test (Deno's sanitizer fails it and the next one).
    const agent = appendAgent(() => {
      controller.abort();
      return Promise.resolve();
    });
    const job = await new Taskset(appendRows(1, 2)).run(agent, {
      runtime: forkRuntime(),
      from: made.from,
      group: 2,
      signal: controller.signal,
    });
    assert.ok(job.runs.some((r) => r.trace.status === "cancelled"));
    assert.ok(made.taken.length >= 1);
    assert.ok(made.taken.every((s) => s.removed), "removed when the job was aborted");
    await forksGone();
  });
});

test({
  name: "ForkRuntime: a rollout's agent reaches neither a sibling fork's files nor the snapshots",
  needs: [BWRAP, ROOT_USER],
}, async () => {
  const secret = (root: string) => `secret-of-${root.split("/").pop()}`;
  const roots: string[] = [];
  const said = new Map<string, string>();
  let bothWrote: () => void;
  const wrote = new Promise<void>((r) => bothWrote = r);
  const a = await prepared(1);
  try {
    const agent = appendAgent(async (root, run) => {
      await using shell = await run.client.open("shell");
      await shell.exec(`cd ${root} && echo ${secret(root)} > secret.txt`);
      roots.push(root);
      if (roots.length === 2) bothWrote();
      await wrote;
      // The other rollout's root and the store its overlay uses, known to
      // this agent (a mount table, a log may tell them).
      const other = roots.find((r) => r !== root)!;
      const store = storeOf(root) ?? "/nonexistent-store";
      const r = await shell.exec(
        `ls -la ${other} 2>&1; cat ${other}/secret.txt 2>&1; ls ${store} 2>&1; ` +
          `grep -rs secret-of- /tmp ${store} 2>/dev/null | grep -v ${root}; echo done`,
      );
      // On the host, as this fork's uid (isolation "none" would run it so).
      const uid = String(WORKSPACES.get(root)!.uid);
      const host = await new Deno.Command("setpriv", {
        args: [`--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", "--", "bash", "-c"].concat(
          `cat ${other}/secret.txt 2>&1; ls ${store} 2>&1; true`,
        ),
        stdout: "piped",
      }).output();
      said.set(root, r.stdoutText + r.stderrText + new TextDecoder().decode(host.stdout));
    });
    const job = await new Taskset([ROW]).run(agent, {
      runtime: forkRuntime(),
      from: a,
      group: 2,
      maxConcurrent: 2,
    });
    assert.deepEqual(job.runs.map((r) => r.reward), [2, 2], "each graded on its own fork");
    assert.equal(said.size, 2);
    for (const [root, out] of said) {
      const other = roots.find((r) => r !== root)!;
      assert.match(out, /done\n/, out);
      assert.match(out, /Permission denied/, "the host refuses this uid another fork's root");
      assert.doesNotMatch(out, new RegExp(secret(other)), out);
      assert.match(out, /No such file or directory|Permission denied/, out);
    }
  } finally {
    await a.remove();
  }
});
