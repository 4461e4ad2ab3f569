// Rollout retries by error class (Taskset.run's retries): infrastructure
// failures are tried again and every attempt is in the results file; the
// agent's own failures, timeouts and context overflows are not.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  Environment,
  functionAgent,
  integer,
  Job,
  type JobProgress,
  LocalRuntime,
  Taskset,
} from "../../mod.ts";
import type { Placement, RuntimeProvider } from "../../runtime/mod.ts";
import { formatJobTable } from "../../eval/mod.ts";
import { ChatAgent, ModelHttpError } from "../../agents/mod.ts";
import { completion, failure, scriptedServer } from "../agents/_scripted.ts";

function makeEnv() {
  const env = new Environment("retries");
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

/** A runtime whose place() fails on the calls numbered in `failing` (from 1), with `error`. */
function flakyRuntime(
  env: Environment,
  failing: Set<number>,
  error = () => new Error("no capacity left on the node"),
): RuntimeProvider & { calls: number } {
  const local = new LocalRuntime(env);
  const runtime = {
    calls: 0,
    place(options?: { signal?: AbortSignal }): Promise<Placement> {
      runtime.calls++;
      if (failing.has(runtime.calls)) return Promise.reject(error());
      return local.place(options);
    },
  };
  return runtime;
}

async function lines(path: string): Promise<Record<string, unknown>[]> {
  return (await Deno.readTextFile(path)).trim().split("\n").map((l) => JSON.parse(l));
}

test("Taskset.run() retries a provisioning failure; every attempt is in the file, the latest counts", async () => {
  const { env, add } = makeEnv();
  const dir = await Deno.makeTempDir();
  const out = `${dir}/results.jsonl`;
  try {
    const runtime = flakyRuntime(env, new Set([1]));
    const progress: JobProgress[] = [];
    const job = await new Taskset([add({ a: 1, b: 2 })]).run(solve, {
      runtime,
      out,
      retries: { attempts: 2, baseDelay: 1 },
      onProgress: (p) => progress.push(p),
    });
    assert.equal(runtime.calls, 2);
    assert.equal(job.runs[0].reward, 1);
    assert.equal(job.runs[0].attempt, 2);
    const file = await lines(out);
    assert.deepEqual(
      file.map((l) => [l.attempt, l.status, l.reward, l.error_class]),
      [[1, "error", null, "provisioning"], [2, "completed", 1, null]],
    );
    assert.equal(progress.at(-1)!.retried, 1);
    const loaded = await Job.load(out);
    assert.equal(loaded.runs.length, 1);
    assert.equal(loaded.meanReward, 1);
    assert.deepEqual(loaded.incompleteGroups, []);
    // Without retries the failure stands (the default is none).
    const once = await new Taskset([add({ a: 1, b: 2 })]).run(solve, {
      runtime: flakyRuntime(env, new Set([1])),
    });
    assert.equal(once.runs[0].error_class, "provisioning");
    assert.equal(once.runs[0].reward, null);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("Taskset.run() never retries the agent's own failure, a timeout or a context overflow", async (t) => {
  const { add } = makeEnv();
  const cases: [string, () => Promise<unknown>, string, { agentTimeout?: number }][] = [
    ["an agent that throws", () => Promise.reject(new Error("bad plan")), "agent_error", {}],
    [
      "an agent past its deadline",
      () => new Promise(() => {}),
      "agent_timeout",
      { agentTimeout: 50 },
    ],
    [
      "a context overflow",
      () =>
        Promise.reject(
          new ModelHttpError("Chat completion failed: HTTP 400: maximum context length", 400, {
            contextOverflow: true,
          }),
        ),
      "context_overflow",
      {},
    ],
  ];
  for (const [name, behave, errorClass, extra] of cases) {
    await t.step(name, async () => {
      let runs = 0;
      const agent = functionAgent(() => {
        runs++;
        return behave();
      });
      const job = await new Taskset([add({ a: 1, b: 1 })]).run(agent, {
        retries: { attempts: 3, baseDelay: 1 },
        rolloutTimeout: 20_000,
        ...extra,
      });
      assert.equal(runs, 1, `${name} was retried`);
      assert.equal(job.runs[0].error_class, errorClass);
      assert.equal(job.runs[0].attempt, 1);
    });
  }
});

test("Taskset.run() retries a model server that stays unavailable after ChatAgent's own retries", async () => {
  const { add } = makeEnv();
  // Attempt 1: three 503s (the call and its two retries) end the rollout;
  // attempt 2: the server answers.
  await using model = scriptedServer([
    failure(503, "overloaded"),
    failure(503, "overloaded"),
    failure(503, "overloaded"),
    completion({ content: "3" }),
  ]);
  const agent = new ChatAgent({
    model: "m",
    baseUrl: model.baseUrl,
    stream: false,
    capabilityTools: false,
    retry: { maxRetries: 2, baseDelay: 1 },
  });
  const job = await new Taskset([add({ a: 1, b: 2 })]).run(agent, {
    retries: { attempts: 1, baseDelay: 1 },
  });
  assert.equal(model.received.length, 4);
  assert.equal(job.runs[0].attempt, 2);
  assert.equal(job.runs[0].reward, 1);

  // Nothing listens: fetch fails; past the call's retries it is "model_unavailable" too.
  const port = (() => {
    const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const p = (l.addr as Deno.NetAddr).port;
    l.close();
    return p;
  })();
  const gone = new ChatAgent({
    model: "m",
    baseUrl: `http://127.0.0.1:${port}/v1`,
    capabilityTools: false,
    retry: { maxRetries: 1, baseDelay: 1 },
  });
  const down = await new Taskset([add({ a: 1, b: 2 })]).run(gone);
  assert.equal(down.runs[0].error_class, "model_unavailable");
  // The message names the endpoint and why, never only "fetch failed".
  assert.match(
    (down.runs[0].trace.errors ?? [])[0].message,
    new RegExp(
      `^model server http://127\\.0\\.0\\.1:${port}/v1/chat/completions unavailable after 2 attempts in [\\d.]+ s: .*Connection refused`,
    ),
  );
  // Not graded: a model server that is down is no zero of the agent's.
  assert.equal(down.runs[0].reward, null);
  assert.equal(down.errored.length, 1);
  assert.deepEqual(down.incompleteGroups, [down.runs[0].group_id]);
  assert.equal(down.summary().tasks[0].group_complete, false);
  assert.equal(down.exportTraining()[0].group_complete, false);
});

test("Taskset.run(): a group with a rollout that could not finish says so in its rows and the summary", async () => {
  const { env, add } = makeEnv();
  // Repeat 0 places (call 1); repeat 1 fails on its try and its retry (calls 2, 3).
  const runtime = flakyRuntime(env, new Set([2, 3]));
  const job = await new Taskset([add({ a: 2, b: 2 }), add({ a: 1, b: 1 })]).run(solve, {
    runtime,
    group: 2,
    maxConcurrent: 1,
    retries: { attempts: 1, baseDelay: 1 },
  });
  assert.deepEqual(job.runs.map((r) => r.reward), [1, null, 1, 1]);
  const [broken, whole] = [job.runs[0].group_id, job.runs[2].group_id];
  assert.deepEqual(job.incompleteGroups, [broken]);
  const summary = job.summary();
  assert.equal(summary.incomplete_groups, 1);
  assert.deepEqual(summary.tasks.map((t) => t.group_complete), [false, true]);
  const rows = job.exportTraining();
  assert.deepEqual(rows.map((r) => [r.group_id, r.group_complete]), [
    [broken, false],
    [broken, false],
    [whole, true],
    [whole, true],
  ]);
  assert.deepEqual(rows[0].group_rewards, [1, null]);
  assert.equal(job.exportTraining({ completeGroupsOnly: true }).length, 2);
  assert.match(formatJobTable(job), /1 group\(s\) incomplete \(a rollout could not finish\): add-/);
});

test("Taskset.run() refuses bad retries up front", async () => {
  const { add } = makeEnv();
  await assert.rejects(
    new Taskset([add({ a: 1, b: 1 })]).run(solve, { retries: -1 }),
    { name: "RangeError", message: /retries must be an integer of at least 0, got "-1"/ },
  );
});
