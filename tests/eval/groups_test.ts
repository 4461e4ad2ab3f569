// Taskset.run()'s onGroup: each group's records as soon as the group is
// finished, for a trainer that consumes rollouts while the job runs.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Environment, functionAgent, integer, LocalRuntime, Taskset } from "../../mod.ts";
import { type RunRecord, trainingRows } from "../../eval/mod.ts";

function makeEnv() {
  const env = new Environment("groups");
  const add = env.template(
    { id: "add", args: { a: integer(), b: integer() } },
    async function* ({ a, b }) {
      const answer = yield `${a}+${b}`;
      yield Number(answer) === a + b ? 1 : 0;
    },
  );
  return { env, add };
}

test("Taskset.run() onGroup: each group's final records, by repeat, as soon as the group is done", async () => {
  const { env, add } = makeEnv();
  const log: string[] = [];
  let n = 0;
  const agent = functionAgent((prompt) => {
    log.push(`run ${prompt}`);
    // Every third call answers wrong: rewards differ within a group.
    return ++n % 3 === 0 ? "0" : String(eval(String(prompt)));
  });
  const groups: RunRecord[][] = [];
  const job = await new Taskset([add({ a: 1, b: 1 }), add({ a: 2, b: 2 })]).run(agent, {
    runtime: new LocalRuntime(env),
    group: 3,
    maxConcurrent: 1,
    onGroup: (records) => {
      log.push(`group ${records[0].task.slug}`);
      groups.push(records);
    },
  });
  // The first group is reported before the second one's rollouts run.
  assert.deepEqual(log.map((l) => l.split(" ")[0]), [
    "run",
    "run",
    "run",
    "group",
    "run",
    "run",
    "run",
    "group",
  ]);
  assert.equal(groups.length, 2);
  for (const records of groups) {
    assert.deepEqual(records.map((r) => r.repeat), [0, 1, 2]);
    const rows = trainingRows(records);
    assert.deepEqual(rows[0].group_rewards, records.map((r) => r.reward));
    assert.equal(rows[0].group_complete, true);
  }
  assert.deepEqual(groups.flat().map((r) => r.reward), job.runs.map((r) => r.reward));
  assert.deepEqual(job.runs.map((r) => r.reward), [1, 1, 0, 1, 1, 0]);
});

test("Taskset.run() onGroup: a retried rollout's group is reported once, with the retry's record", async () => {
  const { env, add } = makeEnv();
  let calls = 0;
  const agent = functionAgent((prompt) => {
    // The first call loses the model server (an infrastructure failure): retried.
    if (++calls === 1) {
      throw Object.assign(new Error("model server down"), { errorClass: "model_unavailable" });
    }
    return String(eval(String(prompt)));
  });
  const groups: RunRecord[][] = [];
  await new Taskset([add({ a: 1, b: 2 })]).run(agent, {
    runtime: new LocalRuntime(env),
    group: 2,
    maxConcurrent: 1,
    retries: { attempts: 1, baseDelay: 1 },
    onGroup: (records) => void groups.push(records),
  });
  assert.equal(groups.length, 1);
  assert.deepEqual(groups[0].map((r) => [r.repeat, r.attempt, r.reward]), [[0, 2, 1], [1, 1, 1]]);
});

test("Taskset.run() onGroup: a group with a rollout that did not finish is reported with it masked, not as 0", async () => {
  const { env, add } = makeEnv();
  let calls = 0;
  const agent = functionAgent((prompt) => {
    if (++calls === 2) throw new Error("the agent crashed");
    return String(eval(String(prompt)));
  });
  const groups: RunRecord[][] = [];
  await new Taskset([add({ a: 1, b: 2 })]).run(agent, {
    runtime: new LocalRuntime(env),
    group: 2,
    maxConcurrent: 1,
    onGroup: (records) => void groups.push(records),
  });
  const rows = trainingRows(groups[0]);
  assert.deepEqual(rows.map((r) => r.masked), [false, false]);
  // The crash was graded (an empty answer scores 0): the agent's own failure counts.
  assert.deepEqual(rows.map((r) => r.reward), [1, 0]);
  const downAgent = functionAgent(() => {
    throw Object.assign(new Error("model server down"), { errorClass: "model_unavailable" });
  });
  const down: RunRecord[][] = [];
  await new Taskset([add({ a: 1, b: 2 })]).run(downAgent, {
    runtime: new LocalRuntime(env),
    onGroup: (records) => void down.push(records),
  });
  const [row] = trainingRows(down[0]);
  assert.equal(row.masked, true);
  assert.equal(row.reward, null);
  assert.deepEqual(
    row.group_rewards,
    [null],
    "the masked rollout's 0 is not among its group's rewards",
  );
  assert.equal(row.group_complete, false);
});

test("Taskset.run() onGroup: when it throws, the job stops and run() rejects with its error", async () => {
  const { env, add } = makeEnv();
  let ran = 0;
  const agent = functionAgent((prompt) => {
    ran++;
    return String(eval(String(prompt)));
  });
  await assert.rejects(
    new Taskset([add({ a: 1, b: 1 }), add({ a: 2, b: 2 }), add({ a: 3, b: 3 })]).run(agent, {
      runtime: new LocalRuntime(env),
      maxConcurrent: 1,
      onGroup: () => {
        throw new Error("disk full");
      },
    }),
    /disk full/,
  );
  assert.equal(ran, 1, "no rollout started after the failed write");
});
