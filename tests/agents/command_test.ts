import { test } from "../_test.ts";
import { DIFFUTILS } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { bind, Environment, integer, Job, LocalRuntime, rollout, Taskset } from "../../mod.ts";
import type { RuntimeProvider } from "../../runtime/mod.ts";
import { CommandAgent } from "../../agents/mod.ts";
import type { Run } from "../../eval/mod.ts";

function echoEnv(): Environment {
  const env = new Environment("echoes");
  // The prompt is `size` bytes of "x" then the number; the answer must be the number.
  env.template(
    { id: "echo", args: { n: integer(), size: integer() } },
    async function* ({ n, size }) {
      const answer = yield "x".repeat(size) + String(n);
      yield String(answer).trim() === String(n) ? 1 : 0;
    },
  );
  env.template({ id: "nan" }, async function* () {
    yield "anything";
    yield Number.NaN;
  });
  return env;
}

const row = (n: number, size = 0) => ({
  env: "echoes",
  id: "echo",
  args: { n, size },
  slug: `echo-${n}-${size}`,
});

test("CommandAgent passes only what it is told to", async (t) => {
  const runtime = new LocalRuntime(echoEnv());
  const dir = await Deno.makeTempDir();
  Deno.env.set("HUD_T_OPENAI_KEY", "sk-one");
  Deno.env.set("HUD_T_OTHER", "two");
  Deno.env.set("HUD_T_HIDDEN", "three");
  try {
    const show = 'echo "${HUD_T_OPENAI_KEY:-}|${HUD_T_OTHER:-}|${HUD_T_HIDDEN:-}|${FROM_FILE:-}"';
    await t.step("by default: PATH, HOME and HUD_* only", async () => {
      const run = await rollout(row(1), new CommandAgent(show), { runtime });
      assert.equal(run.answer, "|||");
    });
    await t.step("passEnv takes names and globs", async () => {
      const agent = new CommandAgent(show, { passEnv: ["HUD_T_OPENAI_*", "HUD_T_OTHER"] });
      const run = await rollout(row(1), agent, { runtime });
      assert.equal(run.answer, "sk-one|two||");
    });
    await t.step("envFile: NAME=value lines, comments, export, quotes", async () => {
      const file = `${dir}/agent.env`;
      await Deno.writeTextFile(file, '# keys\nexport FROM_FILE="four"\n\nHUD_T_OTHER=five\n');
      const run = await rollout(row(1), new CommandAgent(show, { envFile: file }), { runtime });
      assert.equal(run.answer, "|five||four");
    });
    await t.step("a bad env file is an error naming the line, not the value", async () => {
      const file = `${dir}/bad.env`;
      await Deno.writeTextFile(file, "OK=1\nsk-secret-value\n");
      const run = await rollout(row(1), new CommandAgent(show, { envFile: file }), { runtime });
      assert.equal(run.reward, null);
      assert.match(run.trace.errors[0].message, /bad\.env.*line 2 is not NAME=value/);
      assert.doesNotMatch(JSON.stringify(run.trace.toJSON()), /sk-secret-value/);
    });
  } finally {
    for (const n of ["HUD_T_OPENAI_KEY", "HUD_T_OTHER", "HUD_T_HIDDEN"]) Deno.env.delete(n);
    await Deno.remove(dir, { recursive: true });
  }
});

test("CommandAgent: the prompt is on stdin and in HUD_PROMPT_FILE, in HUD_PROMPT when small", {
  needs: [DIFFUTILS],
}, async (t) => {
  const runtime = new LocalRuntime(echoEnv());
  await t.step("a small prompt: all three agree; the file is private and removed", async () => {
    const agent = new CommandAgent(
      'p=$(cat); [ "$p" = "$HUD_PROMPT" ] && [ "$p" = "$(cat "$HUD_PROMPT_FILE")" ] || exit 9; ' +
        'echo "$HUD_PROMPT_FILE $(stat -c %a "$HUD_PROMPT_FILE") ${p#x}"',
    );
    const run = await rollout(row(7, 1), agent, { runtime });
    assert.equal(run.trace.failedPhase, null, JSON.stringify(run.trace.errors));
    const [file, mode, n] = String(run.answer).split(" ");
    assert.equal(mode, "600");
    assert.equal(n, "7");
    assert.equal(await Deno.stat(file).then(() => "there", () => "gone"), "gone");
  });
  await t.step("a 256 KiB prompt starts the agent; HUD_PROMPT is left out", async () => {
    const agent = new CommandAgent(
      '[ -z "${HUD_PROMPT+set}" ] || exit 9; cmp -s - "$HUD_PROMPT_FILE" || exit 8; ' +
        'tail -c 2 "$HUD_PROMPT_FILE"',
    );
    const run = await rollout(row(42, 256 * 1024), agent, { runtime });
    assert.equal(run.trace.failedPhase, null, JSON.stringify(run.trace.errors));
    assert.equal(run.reward, 1);
  });
});

test("CommandAgent: an agent that cannot start is an error, never graded", async (t) => {
  const runtime = new LocalRuntime(echoEnv());
  const notExecutable = await Deno.makeTempFile({ suffix: ".sh" });
  await Deno.writeTextFile(notExecutable, "echo 1\n", { mode: 0o644 });
  await Deno.chmod(notExecutable, 0o644);
  for (
    const [name, agent, pattern] of [
      ["a missing program", new CommandAgent(["/nonexistent/agent"]), /could not start/],
      ["exit 127 (a typo)", new CommandAgent("./agnet.sh"), /could not start \(exit code 127\)/],
      ["exit 126 (not executable)", new CommandAgent(notExecutable), /exit code 126/],
    ] as const
  ) {
    await t.step(name, async () => {
      const run = await rollout(row(1), agent, { runtime });
      assert.equal(run.reward, null);
      assert.equal(run.trace.status, "error");
      assert.equal(run.trace.failedPhase, "agent");
      assert.match(run.trace.errors[0].message, pattern);
      assert.ok(!run.trace.steps.some((s) => s.type === "evaluate"), "not graded");
    });
  }
  await t.step("resume retries it", async () => {
    const dir = await Deno.makeTempDir();
    try {
      const out = `${dir}/r.jsonl`;
      const set = new Taskset([row(1), row(2)]);
      const first = await set.run(new CommandAgent("./agnet.sh"), { runtime, out });
      assert.equal(first.errored.length, 2);
      const second = await set.run(new CommandAgent("cat"), { runtime, out, resume: true });
      assert.equal(second.errored.length, 0);
      const loaded = await Job.load(out);
      assert.equal(loaded.runs.length, 2, "the latest attempt of each counts");
      assert.deepEqual(loaded.runs.map((r) => r.reward), [1, 1]);
      assert.equal(loaded.id, first.id);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
  await Deno.remove(notExecutable);
});

test("CommandAgent: an exit is recorded as ExitStatus, a signal as code null with its name", async (t) => {
  const runtime = new LocalRuntime(echoEnv());
  const command = (run: Run) => run.trace.steps.find((s) => s.type === "command")!.info!;
  await t.step("exit 3: code 3, no signal, an agent error; the answer is graded", async () => {
    const run = await rollout(row(1), new CommandAgent("echo 1; exit 3"), { runtime });
    assert.equal(run.reward, 1);
    assert.deepEqual({ ...command(run), stderr: "" }, { code: 3, signal: null, stderr: "" });
    assert.equal(run.trace.errors[0].message, "Agent command exited with code 3");
  });
  await t.step(
    "killed by SIGTERM: code null, the signal named, an agent error; graded",
    async () => {
      const agent = new CommandAgent(["sh", "-c", "echo 1; kill -TERM $$"]);
      const run = await rollout(row(1), agent, { runtime });
      assert.equal(run.reward, 1);
      assert.deepEqual({ ...command(run), stderr: "" }, {
        code: null,
        signal: "SIGTERM",
        stderr: "",
      });
      assert.equal(run.trace.errors[0].message, "Agent command exited with signal SIGTERM");
      assert.equal(run.trace.errors[0].class, "agent_error");
    },
  );
  await t.step(
    "killed by SIGKILL: code null (not 137), the signal named; from outside, not graded",
    async () => {
      // A SIGKILL the agent was not sent by its deadline (the OOM killer, an
      // operator, a preempted machine) is not the agent's doing: a 0 here
      // would be the infrastructure's.
      const agent = new CommandAgent(["sh", "-c", "echo 1; kill -KILL $$"]);
      const run = await rollout(row(1), agent, { runtime });
      assert.equal(run.reward, null);
      assert.deepEqual({ ...command(run), stderr: "" }, {
        code: null,
        signal: "SIGKILL",
        stderr: "",
      });
      assert.match(
        run.trace.errors[0].message,
        /^Agent command was killed \(SIGKILL\) from outside/,
      );
      assert.equal(run.trace.errors[0].class, "infrastructure_lost");
    },
  );
});

test("CommandAgent caps the answer: over it the agent stops and the run errors", async () => {
  const runtime = new LocalRuntime(echoEnv());
  const agent = new CommandAgent("yes 1 | head -c 100000; sleep 30", {
    maxOutputBytes: 1000,
  });
  const run = await rollout(row(1), agent, { runtime, rolloutTimeout: 20_000 });
  assert.equal(run.reward, null);
  assert.equal(run.trace.failedPhase, "agent");
  assert.equal(run.trace.errors[0].message, "answer exceeds 1000 bytes");
  assert.throws(() => new CommandAgent("x", { maxOutputBytes: 0 }), RangeError);
});

test("rollout(): a non-finite score is a grading error, never a null reward that looks graded", async () => {
  const env = echoEnv();
  const run = await rollout(
    { env: "echoes", id: "nan", args: {}, slug: "nan" },
    new CommandAgent("cat"),
    { runtime: new LocalRuntime(env) },
  );
  assert.equal(run.reward, null);
  assert.equal(run.trace.status, "error");
  assert.equal(run.trace.failedPhase, "grading");
  assert.match(
    run.trace.errors[0].message,
    /score (must be a (finite )?number|is not a finite number)/,
  );
});

test("rollout(): an answer over the server's frame limit reports the limit", async () => {
  const env = echoEnv();
  await using server = bind(env, { maxFrameBytes: 4096 });
  const runtime: RuntimeProvider = {
    place: () =>
      Promise.resolve({
        address: server.address,
        params: {},
        [Symbol.asyncDispose]: async () => {},
      }),
  };
  const run = await rollout(row(1), new CommandAgent("head -c 10000 /dev/zero | tr '\\0' x"), {
    runtime,
  });
  assert.equal(run.reward, null);
  assert.equal(run.trace.failedPhase, "grading");
  assert.match(run.trace.errors[0].message, /frame exceeds the limit of 4096 bytes/);
  assert.doesNotMatch(run.trace.errors[0].message, /id mismatch/);
});
