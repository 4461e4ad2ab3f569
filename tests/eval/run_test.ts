import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  bind,
  connect,
  Environment,
  functionAgent,
  integer,
  LocalRuntime,
  rollout,
  Run,
} from "../../mod.ts";
import { Runtime, type RuntimeProvider } from "../../runtime/mod.ts";
import { CommandAgent } from "../../agents/mod.ts";

function arithEnv(log: string[] = []): Environment {
  const env = new Environment("arith");
  env.template({ id: "add", args: { a: integer(), b: integer() } }, async function* ({ a, b }) {
    log.push(`start ${a}+${b}`);
    try {
      const answer = yield { prompt: `${a}+${b}`, bindings: { calc: { hint: "sum" } } };
      log.push(`graded ${JSON.stringify(answer)}`);
      yield { score: Number(answer) === a + b ? 1 : 0, info: { expected: a + b } };
    } finally {
      log.push(`finally ${a}+${b}`);
    }
  });
  env.template({ id: "broken_grader" }, async function* () {
    yield "anything";
    throw new Error("grader exploded");
  });
  env.template({ id: "broken_start" }, async function* () {
    throw new Error("setup exploded");
    // deno-lint-ignore no-unreachable
    yield "never";
  });
  return env;
}

test("Run records setup, user, agent and evaluate steps", async () => {
  const env = arithEnv();
  await using server = bind(env);
  await using client = await connect(server, { readyTimeout: 10_000 });
  const row = { env: "arith", id: "add", args: { a: 2, b: 3 }, slug: "x" };
  const run = await Run.start(client, row);
  assert.equal(run.prompt, "2+3");
  assert.deepEqual(run.bindings, { calc: { hint: "sum" } });
  run.answer = "5";
  const grade = await run.finish();
  assert.deepEqual(grade, {
    reward: 1,
    done: true,
    info: { expected: 5 },
    isError: false,
    raw: { score: 1, info: { expected: 5 } },
  });
  assert.deepEqual(run.trace.steps.map((s) => s.type), ["setup", "user", "agent", "evaluate"]);
  assert.equal(run.trace.status, "completed");
  assert.equal(run.trace.stopReason, "graded");
  assert.equal(run.trace.content, "5");
  assert.match(run.trace.steps[0].timestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.equal((await run.finish()).reward, 1, "finish is idempotent");
});

test("Run disposal grades an unfinished run", async () => {
  const env = arithEnv();
  await using server = bind(env);
  await using client = await connect(server, { readyTimeout: 10_000 });
  let run: Run;
  {
    await using r = await Run.start(client, {
      env: "arith",
      id: "add",
      args: { a: 1, b: 1 },
      slug: "s",
    });
    r.answer = 2;
    run = r;
  }
  assert.equal(run.reward, 1);
});

test("rollout() runs each phase and reports failures by phase", async (t) => {
  const log: string[] = [];
  const env = arithEnv(log);
  const runtime = new LocalRuntime(env);
  const row = (a: number, b: number) => ({
    env: "arith",
    id: "add",
    args: { a, b },
    slug: `add-${a}-${b}`,
  });

  await t.step("a successful rollout", async () => {
    const run = await rollout(row(1, 2), functionAgent((p) => String(eval(String(p)))), {
      runtime,
    });
    assert.equal(run.reward, 1);
    assert.equal(run.trace.status, "completed");
    assert.equal(run.trace.failedPhase, null);
  });
  await t.step("an agent that throws is still graded with the answer it had", async () => {
    const run = await rollout(
      row(2, 2),
      functionAgent((_p, run) => {
        run.answer = "4";
        throw new Error("agent crashed after answering");
      }),
      { runtime },
    );
    assert.equal(run.reward, 1);
    assert.equal(run.trace.status, "error");
    assert.equal(run.trace.failedPhase, "agent");
    assert.match(run.trace.errors[0].message, /agent crashed/);
    assert.deepEqual(run.trace.steps.map((s) => s.type), [
      "setup",
      "user",
      "error",
      "agent",
      "evaluate",
    ]);
  });
  await t.step("an agent timeout grades what the agent had", async () => {
    const run = await rollout(
      row(3, 3),
      functionAgent(async (_p, run, { signal }) => {
        run.answer = "6";
        await new Promise((_r, reject) =>
          signal.addEventListener("abort", () => reject(signal.reason))
        );
      }),
      { runtime, agentTimeout: 100, rolloutTimeout: 10_000 },
    );
    assert.equal(run.reward, 1);
    assert.equal(run.trace.failedPhase, "agent");
    assert.equal(run.trace.errors[0].name, "TimeoutError");
  });
  await t.step("a start failure names the start phase", async () => {
    const run = await rollout(
      { env: "arith", id: "broken_start", args: {}, slug: "bs" },
      functionAgent(() => "x"),
      {
        runtime,
      },
    );
    assert.equal(run.reward, null);
    assert.equal(run.trace.failedPhase, "start");
    assert.match(run.trace.errors[0].message, /setup exploded/);
  });
  await t.step("a grading failure names the grading phase", async () => {
    const run = await rollout(
      { env: "arith", id: "broken_grader", args: {}, slug: "bg" },
      functionAgent(() => "x"),
      {
        runtime,
      },
    );
    assert.equal(run.reward, null);
    assert.equal(run.trace.failedPhase, "grading");
    assert.equal(run.trace.stopReason, "grading_error");
  });
  await t.step("a provisioning failure names the provisioning phase", async () => {
    const port = (() => {
      const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      const p = l.addr.port;
      l.close();
      return p;
    })();
    const run = await rollout(row(1, 1), functionAgent(() => "2"), {
      runtime: new Runtime(`127.0.0.1:${port}`),
      connect: { readyTimeout: 200, retryInterval: 50 },
    });
    assert.equal(run.trace.failedPhase, "provisioning");
    assert.equal(run.trace.stopReason, "provisioning_error");
    assert.deepEqual(run.capabilities, []);
    assert.throws(() => run.client, /failed before it connected/);
  });
  await t.step("inner limits that do not fit are refused up front", async () => {
    await assert.rejects(
      rollout(row(1, 1), functionAgent(() => "2"), {
        runtime,
        agentTimeout: 5000,
        rolloutTimeout: 1000,
      }),
      RangeError,
    );
    await assert.rejects(
      rollout({ env: "x", id: "y", args: {}, slug: "z" }, functionAgent(() => "2")),
      {
        name: "TypeError",
        message: /pass a runtime/,
      },
    );
  });
  await t.step("an abort cancels the task instead of grading it", async () => {
    const controller = new AbortController();
    let slept: Promise<unknown> = Promise.resolve();
    const run = await rollout(
      row(4, 4),
      functionAgent(async (_p, run) => {
        run.answer = "8";
        controller.abort();
        await (slept = new Promise((r) => setTimeout(r, 50)));
      }),
      { runtime, signal: controller.signal },
    );
    // The rollout returned without waiting for the agent, which ignores the
    // abort: let its sleep end inside this step (op sanitizer).
    await slept;
    assert.equal(run.reward, null);
    assert.equal(run.trace.status, "cancelled");
    assert.ok(!log.includes('graded "8"'), "never graded");
    assert.ok(run.trace.steps.some((s) => s.type === "cancel"));
  });
});

test("rollout() timeout cancels and returns fast even when teardown hangs", async () => {
  const env = arithEnv();
  let releaseTeardown!: () => void;
  const teardownGate = new Promise<void>((r) => releaseTeardown = r);
  const inner = new LocalRuntime(env);
  const hanging: RuntimeProvider = {
    async place(options) {
      const p = await inner.place(options);
      return {
        address: p.address,
        params: p.params,
        async [Symbol.asyncDispose]() {
          await teardownGate;
          await p[Symbol.asyncDispose]();
        },
      };
    },
  };
  const started = Date.now();
  const run = await rollout(
    { env: "arith", id: "add", args: { a: 1, b: 1 }, slug: "s" },
    functionAgent(() => new Promise(() => {})),
    { runtime: hanging, rolloutTimeout: 300 },
  );
  const elapsed = Date.now() - started;
  assert.equal(run.trace.status, "cancelled");
  assert.equal(run.trace.stopReason, "timeout");
  assert.equal(run.trace.failedPhase, "agent");
  assert.ok(elapsed < 2_500, `returned in ${elapsed} ms`);
  releaseTeardown();
  await new Promise((r) => setTimeout(r, 50));
});

test("CommandAgent runs an external program as the agent", async (t) => {
  const env = arithEnv();
  const runtime = new LocalRuntime(env);
  const row = { env: "arith", id: "add", args: { a: 20, b: 22 }, slug: "add-20-22" };
  await t.step("prompt on stdin and in HUD_PROMPT, answer from stdout", async () => {
    const agent = new CommandAgent(
      'read -r line; [ "$line" = "$HUD_PROMPT" ] || exit 9; echo $(( $line ))',
    );
    const run = await rollout(row, agent, { runtime });
    assert.equal(run.trace.failedPhase, null, JSON.stringify(run.trace.errors));
    assert.equal(run.answer, "42");
    assert.equal(run.reward, 1);
  });
  await t.step("task and capability variables, and nothing else leaks", async () => {
    Deno.env.set("HUD_TEST_SECRET", "leak");
    try {
      const agent = new CommandAgent([
        "bash",
        "-c",
        'echo "$HUD_TASK_ID|$HUD_TASK_SLUG|$HUD_TASK_ARGS|${HUD_TEST_SECRET:-none}|$HUD_BINDINGS|${HUD_SESSION_ID:0:5}"',
      ]);
      const run = await rollout(row, agent, { runtime });
      assert.equal(
        run.answer,
        'add|add-20-22|{"a":20,"b":22}|none|{"calc":{"hint":"sum"}}|sess-',
      );
    } finally {
      Deno.env.delete("HUD_TEST_SECRET");
    }
  });
  await t.step("a non-zero exit is an agent error and the output is still graded", async () => {
    const run = await rollout(row, new CommandAgent("echo 42; echo oops >&2; exit 3"), { runtime });
    assert.equal(run.reward, 1);
    assert.equal(run.trace.failedPhase, "agent");
    assert.match(run.trace.errors[0].message, /code 3: oops/);
  });
  await t.step("an agent timeout kills the whole process group", async () => {
    const pidFile = await Deno.makeTempFile();
    const run = await rollout(
      row,
      new CommandAgent(`sleep 300 & echo $! > ${pidFile}; echo 42; wait`, { killGrace: 200 }),
      { runtime, agentTimeout: 500, rolloutTimeout: 10_000 },
    );
    assert.equal(run.reward, 1, "graded with the partial output");
    const pid = Number((await Deno.readTextFile(pidFile)).trim());
    await Deno.remove(pidFile);
    await new Promise((r) => setTimeout(r, 300));
    const state = await Deno.readTextFile(`/proc/${pid}/status`).then(
      (s) => s.split("\n").slice(0, 3).join(" "),
      () => "gone",
    );
    assert.ok(state === "gone" || /State:\s+Z/.test(state), `grandchild gone: ${state}`);
  });
  assert.throws(() => new CommandAgent(""), TypeError);
  assert.throws(() => new CommandAgent([]), TypeError);
});

test("rollout() releases a placement that arrives after its deadline", async () => {
  const env = arithEnv();
  const inner = new LocalRuntime(env);
  let released = false;
  const slow: RuntimeProvider = {
    async place() {
      await new Promise((r) => setTimeout(r, 300));
      const p = await inner.place();
      return {
        address: p.address,
        params: p.params,
        async [Symbol.asyncDispose]() {
          released = true;
          await p[Symbol.asyncDispose]();
        },
      };
    },
  };
  const run = await rollout(
    { env: "arith", id: "add", args: { a: 1, b: 1 }, slug: "s" },
    functionAgent(() => "2"),
    { runtime: slow, rolloutTimeout: 100 },
  );
  assert.equal(run.trace.status, "cancelled");
  assert.equal(run.trace.failedPhase, "provisioning");
  await new Promise((r) => setTimeout(r, 400));
  assert.equal(released, true);
});
