// A grade whose `info.tampered` says the environment caught the agent
// tampering with its grading (issue 35: Harbor tasks' planted files, a
// killed verifier) classes the rollout `tampered`: its score (0) stands as
// the reward, the record and the trace say why, and it is not retried.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Environment, functionAgent, LocalRuntime, Taskset } from "../../mod.ts";
import { isGraded, rolloutFinished } from "../../eval/failure.ts";

function makeEnv(): Environment {
  const env = new Environment("tamper-test");
  env.template({ id: "guarded" }, async function* () {
    const answer = yield "Do the task.";
    if (answer === "forge") {
      yield { score: 0, info: { tampered: ["planted /app/pytest.py: shadows the module pytest"] } };
    } else yield answer === "ok" ? 1 : 0;
  });
  return env;
}

test("Taskset.run() classes a grade with info.tampered as tampered, its score the reward", async () => {
  const env = makeEnv();
  const rows = [{ env: env.name, id: "guarded", args: {}, slug: "guarded" }];
  const run = (answer: string) =>
    new Taskset(rows).run(functionAgent(() => answer), {
      runtime: new LocalRuntime(env),
      retries: 3,
    });
  const honest = await run("ok");
  assert.deepEqual(
    [honest.runs[0].reward, honest.runs[0].error_class, honest.runs[0].status],
    [1, null, "completed"],
  );
  const forged = await run("forge");
  const record = forged.runs[0];
  assert.deepEqual([record.reward, record.error_class, record.status], [0, "tampered", "error"]);
  assert.equal(record.attempt, 1, "a tampered rollout was retried");
  const trace = record.trace as {
    stop_reason: string;
    errors: { class: string; message: string }[];
  };
  assert.equal(trace.stop_reason, "tampered");
  assert.match(trace.errors[0].message, /tampering with its grading: planted \/app\/pytest\.py/);
  // Its reward (0) is not trusted (eval/failure.ts: tampered is not graded): not in the means.
  assert.equal(isGraded(record), false);
  assert.equal(rolloutFinished(record), false);
  // An agent out of time that answers "forge": the timeout is recorded, tampered names it.
  const late = await new Taskset(rows).run(
    functionAgent(async (_p, run, { signal }) => {
      run.answer = "forge";
      await new Promise((r) => signal.addEventListener("abort", r, { once: true }));
    }),
    { runtime: new LocalRuntime(env), agentTimeout: 50 },
  );
  const lateTrace = late.runs[0].trace as { errors: { class: string }[] };
  assert.deepEqual(lateTrace.errors.map((e) => e.class), ["agent_timeout", "tampered"]);
  assert.equal(late.runs[0].error_class, "tampered");
  assert.equal(late.runs[0].reward, 0);
});
