import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  Environment,
  functionAgent,
  integer,
  type JobProgress,
  LocalRuntime,
  Taskset,
} from "../../mod.ts";
import { type Placement, type RuntimeProvider, Shared } from "../../runtime/mod.ts";

function makeEnv() {
  const env = new Environment("sets");
  const add = env.template(
    { id: "add", args: { a: integer(), b: integer() } },
    async function* ({ a, b }) {
      const answer = yield `${a}+${b}`;
      yield Number(answer) === a + b ? 1 : 0;
    },
  );
  return { env, add };
}

const solve = functionAgent((p) => String(eval(String(p))));

test("Taskset keys rows by slug and refuses duplicates", async (t) => {
  const { add } = makeEnv();
  const set = new Taskset([
    add({ a: 1, b: 1 }),
    add({ a: 1, b: 2 }),
    add({ a: 2, b: 2 }, { slug: "four" }),
  ]);
  await t.step("lookup, filter, exclude", () => {
    assert.equal(set.size, 3);
    assert.equal(set.get("four")!.args.a, 2);
    assert.equal(set.filter({ slugs: ["four"] }).size, 1);
    assert.equal(set.exclude((r) => r.args.a === 1).size, 1);
    assert.equal(set.filter({ ids: ["nope"] }).size, 0);
  });
  await t.step("duplicates are refused", () => {
    assert.throws(() => new Taskset([add({ a: 1, b: 1 }), add({ a: 1, b: 1 })]), {
      name: "TypeError",
      message: /duplicate slug "add-/,
    });
  });
  await t.step("save and load as JSON and JSONL", async () => {
    const dir = await Deno.makeTempDir();
    try {
      for (const name of ["rows.json", "rows.jsonl"]) {
        await set.save(`${dir}/${name}`);
        const back = await Taskset.load(`${dir}/${name}`);
        assert.deepEqual(back.rows, set.rows.map((r) => ({ ...r })));
      }
      const jsonl = await Deno.readTextFile(`${dir}/rows.jsonl`);
      assert.equal(jsonl.trim().split("\n").length, 3);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
  await t.step("malformed input is refused with the line", () => {
    assert.throws(() => Taskset.parse('{"env":"e","id":"i","args":{},"slug":"s"}\n{bad'), /line 2/);
    assert.throws(
      () => Taskset.parse('[{"id":"x"}]'),
      /expected \{ env, id, args \} and an optional slug/,
    );
  });
});

test("Taskset.run() honours group and maxConcurrent", async () => {
  const { env, add } = makeEnv();
  let live = 0;
  let peak = 0;
  const agent = functionAgent(async (p) => {
    live++;
    peak = Math.max(peak, live);
    await new Promise((r) => setTimeout(r, 20));
    live--;
    return String(eval(String(p)));
  });
  const rows = Array.from({ length: 6 }, (_, i) => add({ a: i, b: 1 }));
  const progress: JobProgress[] = [];
  const job = await new Taskset(rows).run(agent, {
    group: 3,
    maxConcurrent: 4,
    onProgress: (p) => progress.push(p),
  });
  assert.equal(job.runs.length, 18);
  assert.equal(peak, 4);
  assert.equal(job.meanReward, 1);
  assert.equal(job.errored.length, 0);
  // Expansion order: task by task, repeat by repeat; repeats share a group id.
  assert.deepEqual(job.runs.slice(0, 4).map((r) => [r.task.slug, r.repeat]), [
    [rows[0].slug, 0],
    [rows[0].slug, 1],
    [rows[0].slug, 2],
    [rows[1].slug, 0],
  ]);
  assert.equal(new Set(job.runs.slice(0, 3).map((r) => r.group_id)).size, 1);
  assert.notEqual(job.runs[0].group_id, job.runs[3].group_id);
  assert.equal(job.results.get(rows[2].slug)!.records.length, 3);
  assert.equal(progress.at(-1)!.done, 18);
  assert.ok(progress.some((p) => p.running === 4));
  void env;
});

test("Taskset.run() refuses rows with no runtime up front", async () => {
  const set = new Taskset([{ env: "remote", id: "t", args: {}, slug: "t" }]);
  await assert.rejects(set.run(solve), { name: "TypeError", message: /pass a runtime/ });
  await assert.rejects(new Taskset([]).run(solve, { group: 0 }), RangeError);
});

test("Taskset.run() streams results to JSONL and resumes only what was not graded", async () => {
  const { add } = makeEnv();
  const dir = await Deno.makeTempDir();
  const out = `${dir}/results.jsonl`;
  try {
    const rows = [add({ a: 1, b: 1 }), add({ a: 2, b: 2 }), add({ a: 3, b: 3 })];
    const first = await new Taskset(rows).run(
      functionAgent((p, run) => {
        if (run.task.args.a === 2) throw new Error("flaky");
        return String(eval(String(p)));
      }),
      { out, group: 2 },
    );
    // An agent that throws is still graded (here 0), so nothing errored.
    assert.equal(first.runs.length, 6);
    assert.equal(first.errored.length, 0);
    assert.equal(first.meanReward, 4 / 6);
    const lines = (await Deno.readTextFile(out)).trim().split("\n").map((l) => JSON.parse(l));
    assert.equal(lines.length, 6);
    assert.ok(lines.every((l) => l.job_id === first.id));

    // Simulate a crash: drop two graded lines and corrupt the end.
    const kept = lines.filter((l) => !(l.task.args.a === 3 && l.repeat === 1));
    await Deno.writeTextFile(
      out,
      kept.map((l) => JSON.stringify(l)).join("\n") + '\n{"job_id":"cut',
    );
    const calls: string[] = [];
    const second = await new Taskset(rows).run(
      functionAgent((p, run) => {
        calls.push(`${run.task.args.a}`);
        return String(eval(String(p)));
      }),
      { out, group: 2, resume: true },
    );
    assert.equal(second.id, first.id, "the job id is kept");
    assert.deepEqual(calls.sort(), ["3"], "only the missing rollout ran again");
    assert.equal(second.runs.length, 6);
    // Appended, never rewritten: the old lines, the cut one, then the new attempt.
    const after = (await Deno.readTextFile(out)).trim().split("\n");
    assert.equal(after.length, 7);
    assert.deepEqual(after.slice(0, 5).map((l) => JSON.parse(l)), kept);
    assert.equal(after[5], '{"job_id":"cut');
    const appended = JSON.parse(after[6]);
    assert.deepEqual([appended.task.args.a, appended.repeat, appended.reward], [3, 1, 1]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("Taskset.run() re-runs errored rollouts on resume", async () => {
  const { add } = makeEnv();
  const dir = await Deno.makeTempDir();
  const out = `${dir}/results.jsonl`;
  try {
    const rows = [add({ a: 1, b: 1 }), add({ a: 2, b: 2 })];
    const broken: RuntimeProvider = {
      place: () => Promise.reject(new Error("no capacity")),
    };
    const first = await new Taskset(rows).run(solve, { out, runtime: broken });
    assert.equal(first.errored.length, 2);
    assert.equal(first.runs[0].failed_phase, "provisioning");
    const second = await new Taskset(rows).run(solve, { out, resume: true });
    assert.equal(second.errored.length, 0);
    assert.equal(second.meanReward, 1);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("Shared boots once per scope and waits past its width", async () => {
  const { env, add } = makeEnv();
  let placed = 0;
  let inUse = 0;
  let peak = 0;
  const inner = new LocalRuntime(env);
  const counting: RuntimeProvider = {
    async place(options) {
      placed++;
      return await inner.place(options);
    },
  };
  {
    await using shared = new Shared(counting, { width: 2 });
    const agent = functionAgent(async (p) => {
      inUse++;
      peak = Math.max(peak, inUse);
      await new Promise((r) => setTimeout(r, 30));
      inUse--;
      return String(eval(String(p)));
    });
    const rows = Array.from({ length: 6 }, (_, i) => add({ a: i, b: i }));
    const job = await new Taskset(rows).run(agent, { runtime: shared, maxConcurrent: 6 });
    assert.equal(job.errored.length, 0);
    assert.equal(job.meanReward, 1);
    assert.equal(placed, 1);
    assert.equal(shared.boots, 1);
    assert.equal(peak, 2, "never more than width at once");
  }
});

test("Shared: a failed boot fails only its own rollout", async () => {
  const { env, add } = makeEnv();
  const inner = new LocalRuntime(env);
  let attempts = 0;
  const flaky: RuntimeProvider = {
    async place(options): Promise<Placement> {
      attempts++;
      if (attempts === 1) throw new Error("boot failed");
      return await inner.place(options);
    },
  };
  await using shared = new Shared(flaky, { width: 4 });
  const job = await new Taskset([add({ a: 1, b: 1 }), add({ a: 2, b: 2 }), add({ a: 3, b: 3 })])
    .run(solve, { runtime: shared, maxConcurrent: 3 });
  assert.equal(job.errored.length, 1);
  assert.equal(job.errored[0].failed_phase, "provisioning");
  assert.equal(shared.boots, 2);
});
