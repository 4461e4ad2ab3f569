// A failure is never a zero (issue 36): every rollout is graded on the
// agent's work, or errored with a class of a closed set, and every view
// counts the two apart, as issue 36's observations asked.

import { test } from "../_test.ts";
import { BWRAP, ROOT_USER, UNSHARE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { Environment } from "../../env.ts";
import { LocalRuntime } from "../../runtime/local.ts";
import { type Agent, functionAgent } from "../../eval/agent.ts";
import {
  FAILURE_CLASSES,
  isGraded,
  Job,
  readErrorClass,
  recordClass,
  RETRYABLE_ERROR_CLASSES,
  rollout,
  type RunRecord,
  Taskset,
} from "../../eval/mod.ts";
import { ModelUnavailableError } from "../../agents/model.ts";
import { THROW_LINE } from "../fixtures/failing_grade_env.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const FAST = new URL("../fixtures/fast_env.ts", import.meta.url).pathname;
const FAILING = new URL("../fixtures/failing_grade_env.ts", import.meta.url).pathname;
const DOCS = new URL("../../docs/evals.md", import.meta.url);

interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

async function cli(args: string[]): Promise<Ran> {
  const ran: Ran = { code: 0, stdout: "", stderr: "" };
  ran.code = await main(args, {
    stdout: (t) => ran.stdout += t,
    stderr: (t) => ran.stderr += t,
  });
  return ran;
}

async function withDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "failure-classes-" });
  try {
    return await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

test("FAILURE_CLASSES is the closed set docs/evals.md lists, with the same graded and retried", async () => {
  const text = await Deno.readTextFile(DOCS);
  const rows = [...text.matchAll(/^\| `([a-z_]+)` +\| (yes|no) +\| (yes|no) +\|/gm)];
  const documented = Object.fromEntries(
    rows.map((
      [, name, graded, retried],
    ) => [name, { graded: graded === "yes", retried: retried === "yes" }]),
  );
  const classes = Object.fromEntries(
    Object.entries(FAILURE_CLASSES).map((
      [name, c],
    ) => [name, { graded: c.graded, retried: c.retried }]),
  );
  assert.deepEqual(documented, classes);
  assert.deepEqual(
    [...RETRYABLE_ERROR_CLASSES].sort(),
    ["infrastructure_lost", "model_unavailable", "provisioning"],
  );
  // h10's class for Harbor, and the verifier's timeout, are in the set.
  assert.ok("tampered" in FAILURE_CLASSES && "verifier_timeout" in FAILURE_CLASSES);
  for (const c of Object.values(FAILURE_CLASSES)) assert.ok(c.meaning !== "" && c.action !== "");
});

test("older results files are read under today's class names: Job.load, the summary, --resume", async () => {
  const { tasks } = await import("../fixtures/fast_env.ts");
  await withDir(async (dir) => {
    const record = (
      i: number,
      reward: number | null,
      extra: Partial<RunRecord>,
    ): RunRecord => ({
      job_id: "old-job",
      group_id: `old-job:${tasks[i].slug}`,
      task: tasks[i],
      repeat: 0,
      status: reward === null ? "error" : "completed",
      reward,
      failed_phase: null,
      trace: {} as RunRecord["trace"],
      ...extra,
    });
    const lines = [
      record(0, 1, { error_class: null }),
      record(1, null, { failed_phase: "agent", error_class: "connection" }),
      record(2, null, { status: "cancelled", failed_phase: "agent", error_class: "timeout" }),
      record(3, 0, { failed_phase: "agent", error_class: "timeout" }),
      // An older file's silent zero: a model server that was down, graded 0.
      record(4, 0, { failed_phase: "agent", error_class: "model_unavailable" }),
      // Older still: no error_class at all.
      record(5, null, { failed_phase: "start" }),
    ];
    const out = `${dir}/old.jsonl`;
    await Deno.writeTextFile(out, lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
    assert.deepEqual(lines.map(recordClass), [
      null,
      "infrastructure_lost",
      "rollout_timeout",
      "agent_timeout",
      "model_unavailable",
      "start_error",
    ]);
    assert.deepEqual(lines.map(isGraded), [true, false, false, true, false, false]);
    assert.equal(readErrorClass("grading"), "grading_error");
    assert.equal(readErrorClass("timeout", { phase: "grading" }), "verifier_timeout");
    assert.equal(readErrorClass("no such class"), null);

    const s = (await Job.load(out)).summary();
    assert.equal(s.graded, 2);
    assert.equal(s.errored, 4);
    assert.equal(s.mean_reward, 0.5, "the old zero of a model server that was down is not in it");
    assert.deepEqual(s.errored_by_class, {
      infrastructure_lost: 1,
      rollout_timeout: 1,
      model_unavailable: 1,
      start_error: 1,
    });

    // --resume runs what did not finish (the old silent zero too), nothing graded twice.
    const ran: number[] = [];
    const agent = functionAgent((prompt) => {
      ran.push(Number(prompt));
      return String(prompt);
    });
    const job = await new Taskset(tasks.slice(0, 6)).run(agent, { out, resume: true });
    assert.deepEqual(ran.sort(), [1, 2, 4, 5]);
    assert.equal(job.summary().graded, 6);
    assert.equal(job.meanReward, (1 + 0 + 1 * 4) / 6);
  });
});

test("eval --model against an endpoint that does not answer: errored model_unavailable, naming the url and the cause, exit 1", async () => {
  const port = freePort();
  const base = `http://127.0.0.1:${port}/v1`;
  const ran = await cli(["eval", FAST, "--model", "m", "--base-url", base, "--limit", "1"]);
  // Before: every rollout "graded" 0, "0 errored", exit 0.
  assert.equal(ran.code, 1, ran.stderr);
  assert.match(
    ran.stdout,
    /^mean reward - over 0 graded runs, 1 errored \(model_unavailable 1\), not in the mean/m,
  );
  // Said once, with the url (never its credentials), the cause and the way out.
  assert.match(
    ran.stdout,
    new RegExp(
      `the rollout errored, model_unavailable .*:\\n  agent: model server http://127\\.0\\.0\\.1:${port}/v1/chat/completions unavailable after 5 attempts in [\\d.]+ s: tcp connect error: Connection refused`,
    ),
  );
  assert.match(ran.stdout, /what to do: check that the model server named in the message is up/);
});

test("ChatAgent: a call that fails past its retries names the endpoint without its credentials", async () => {
  const { ChatAgent } = await import("../../agents/chat_agent.ts");
  const env = new Environment("m");
  const t = env.template({ id: "t" }, async function* () {
    yield "hi";
    yield 1;
  });
  const port = freePort();
  const agent = new ChatAgent({
    model: "m",
    baseUrl: `http://user:secret-in-url@127.0.0.1:${port}/v1`,
    apiKey: "sk-not-shown",
    capabilityTools: false,
    retry: { maxRetries: 2, baseDelay: 1 },
  });
  const job = await new Taskset([t()]).run(agent, { runtime: new LocalRuntime(env) });
  const s = job.summary();
  assert.deepEqual([s.graded, s.errored, s.errored_by_class], [0, 1, { model_unavailable: 1 }]);
  const text = JSON.stringify(job.runs);
  assert.match(
    text,
    new RegExp(
      `model server http://127\\.0\\.0\\.1:${port}/v1/chat/completions unavailable after 3 attempts`,
    ),
  );
  assert.doesNotMatch(text, /secret-in-url|sk-not-shown/);
});

test("one summary definition: the mean and pass@k over the same graded rollouts, said in words", async () => {
  const env = new Environment("three");
  const t = env.template({ id: "t" }, async function* () {
    const answer = yield "say ok";
    yield answer === "ok" ? 1 : 0;
  });
  let n = 0;
  const agent = functionAgent(() => {
    // Two of three rollouts meet a model server that is down.
    if (n++ > 0) throw new ModelUnavailableError("model server http://x/v1 unavailable");
    return "ok";
  });
  const job = await new Taskset([t()]).run(agent, {
    runtime: new LocalRuntime(env),
    group: 3,
    maxConcurrent: 1,
  });
  const s = job.summary();
  // Before: the mean was 1 over the graded one, pass@1 0.333 over all three.
  assert.deepEqual([s.total, s.graded, s.errored], [3, 1, 2]);
  assert.equal(s.mean_reward, 1);
  assert.equal(s.pass_at["1"], 1, "pass@1 over the graded rollouts, as the mean");
  assert.equal(s.pass_at["3"], null, "no task has 3 graded rollouts");
  assert.deepEqual(s.pass_at_tasks, { "1": 1, "2": 0, "3": 0 });
  assert.equal(job.passAtK(1), s.pass_at["1"]);
  assert.deepEqual(s.errored_by_class, { model_unavailable: 2 });
  assert.deepEqual(s.class_rates, { model_unavailable: 2 / 3 });
  const [table] = [(await import("../../eval/report.ts")).formatJobTable(job)];
  assert.match(
    table,
    /^mean reward 1\.000 over 1 graded runs, 2 errored \(model_unavailable 2\), not in the mean/m,
  );
  assert.match(table, /^pass@1 1\.000 {2}pass@3 -$/m);
  assert.match(
    table,
    /^\(pass@k: over graded rollouts as the mean is, errored ones left out; pass@3 over the 0 of 1 tasks with 3\)$/m,
  );
  // Training rows: the errored ones are masked, never a reward of 0.
  const rows = job.exportTraining();
  assert.deepEqual(rows.map((r) => [r.reward, r.masked, r.error_class]), [
    [1, false, null],
    [null, true, "model_unavailable"],
    [null, true, "model_unavailable"],
  ]);
  assert.deepEqual(rows[0].group_rewards, [1, null, null]);
});

test("--resume refuses another agent, naming what changed, unless --force; forced, the summary says the agents mixed", async () => {
  await withDir(async (dir) => {
    const env = new Environment("resume");
    const t = env.template({ id: "t" }, async function* () {
      const answer = yield "say ok";
      yield answer === "ok" ? 1 : 0;
    });
    const runtime = new LocalRuntime(env);
    const agent = (model: string, temperature: number, fail = false): Agent => ({
      ...functionAgent(() => {
        if (fail) throw new ModelUnavailableError("down");
        return "ok";
      }),
      info: { kind: "model", name: model, settings: { api: "openai", temperature } },
    });
    const out = `${dir}/r.jsonl`;
    // Repeat 1 of 2 meets a model server that is down: left for --resume.
    let calls = 0;
    const first: Agent = {
      ...agent("tiny", 0),
      run: (run, context) =>
        (calls++ === 1 ? agent("tiny", 0, true) : agent("tiny", 0)).run(run, context),
    };
    await new Taskset([t()]).run(first, { runtime, out, group: 2, maxConcurrent: 1 });
    const before = await Deno.readTextFile(out);

    await assert.rejects(
      () => new Taskset([t()]).run(agent("big", 1), { runtime, out, group: 2, resume: true }),
      (err: Error) => {
        assert.match(
          err.message,
          /^Cannot resume ".*r\.jsonl": its graded rollouts were run by model "tiny"/,
        );
        assert.match(err.message, /name "tiny" → "big"; settings\.temperature 0 → 1/);
        assert.match(err.message, /pass --force/);
        return true;
      },
    );
    assert.equal(
      await Deno.readTextFile(out),
      before,
      "a refused resume leaves the file as it was",
    );

    // The same agent resumes; forced, another mixes in and the summary says so.
    const same = await new Taskset([t()]).run(agent("tiny", 0), {
      runtime,
      out,
      group: 2,
      resume: true,
    });
    assert.equal(same.summary().agents.length, 1);
    await Deno.writeTextFile(
      out,
      (await Deno.readTextFile(out)).trim().split("\n").slice(0, -1).join("\n") + "\n",
    );
    const mixed = await new Taskset([t()]).run(agent("big", 1), {
      runtime,
      out,
      group: 2,
      resume: true,
      force: true,
    });
    const s = mixed.summary();
    assert.deepEqual(s.agents.map((a) => a.name), ["tiny", "big"]);
    const { formatJobTable } = await import("../../eval/report.ts");
    assert.match(
      formatJobTable(mixed),
      /agents MIXED by a forced resume \(model "tiny" \(openai\), then model "big" \(openai\)\)/,
    );
  });
});

test("task code that throws: its file and line in the results file, the table and the serve log, secrets redacted", async (t) => {
  await t.step("the results file and eval's table", async () => {
    await withDir(async (dir) => {
      const out = `${dir}/r.jsonl`;
      const ran = await cli(["eval", FAILING, "--agent", "cat", "--out", out, "--filter", "crash"]);
      assert.equal(ran.code, 1, ran.stderr);
      const place = new RegExp(`failing_grade_env\\.ts:${THROW_LINE}:\\d+`);
      // Before: only the message, no file and line.
      assert.match(
        ran.stdout,
        new RegExp(`grading: grader lost its config .*\\(at /.*${place.source}\\)`),
      );
      const [line] = (await Deno.readTextFile(out)).trim().split("\n").map((l) => JSON.parse(l));
      assert.equal(line.error_class, "grading_error");
      assert.equal(line.reward, null);
      const [error] = line.trace.errors;
      assert.match(error.at, place);
      assert.match(error.stack, /^TypeError: grader lost its config/);
      assert.match(error.stack, place);
      assert.doesNotMatch(error.stack, /\/(env|task)\.ts:/, "only the environment's own frames");
      const file = await Deno.readTextFile(out);
      assert.doesNotMatch(file, /sk-ant-api03-b{40}/, "the key in the message is redacted");
      assert.match(error.message, /\[REDACTED Anthropic key\]/);
    });
  });

  await t.step("hud serve's log and hud grade", async () => {
    // serve in a child of its own, as people run it: its stderr is the log.
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CLI, "serve", FAILING, "--port", "0"],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const log = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
    let announced = "";
    const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    try {
      while (!/HUD_SERVE_PORT=\d+\n/.test(announced)) {
        const { value, done } = await lines.read();
        if (done) throw new Error(`serve ended before its port line: ${announced}`);
        announced += value;
      }
      const [, token, port] = /HUD_SERVE_TOKEN=(\w+)\nHUD_SERVE_PORT=(\d+)/.exec(announced)!;
      const url = `tcp://:${token}@127.0.0.1:${port}`;
      const started = await cli(["start", "crash", "--url", url]);
      assert.equal(started.code, 0, started.stderr);
      const graded = await cli(["grade", "crash", "--answer", "crash", "--url", url]);
      assert.equal(graded.code, 1);
      // Before: the message alone.
      assert.match(
        graded.stderr,
        new RegExp(
          `^error: grader lost its config \\(key \\[REDACTED Anthropic key\\]\\) \\(at /.*failing_grade_env\\.ts:${THROW_LINE}:\\d+\\)$`,
          "m",
        ),
      );
      assert.doesNotMatch(graded.stderr, /sk-ant-api03-b{40}/);
    } finally {
      child.kill("SIGTERM");
    }
    let served = "";
    for (let r = await log.read(); !r.done; r = await log.read()) served += r.value;
    await lines.cancel();
    assert.equal((await child.status).code, 0, served);
    assert.match(
      served,
      new RegExp(
        `task error: "crash": grader lost its config \\(key \\[REDACTED Anthropic key\\]\\) \\(at /.*failing_grade_env\\.ts:${THROW_LINE}:\\d+\\)\\n  TypeError: grader lost its config .*\\n  at Object\\.body \\(/.*failing_grade_env\\.ts:${THROW_LINE}:\\d+\\)`,
      ),
    );
    assert.doesNotMatch(served, /sk-ant-api03-b{40}/);
  });
});

test("a grader whose command cannot run (exit 127) errors the rollout as a grading error, not a graded 0", async () => {
  const { env } = await import("../fixtures/failing_grade_env.ts");
  const runner = { env: env.name, id: "runner", args: {}, slug: "runner" };
  const run = await rollout(runner, functionAgent(() => "runner"), {
    runtime: new LocalRuntime(env),
  });
  // Before: scored 0 and counted as graded.
  assert.equal(run.reward, null);
  assert.equal(run.trace.errors[0].class, "grading_error");
  assert.match(
    run.trace.errors[0].message,
    /Cannot run bash grader "bash": the command was not found \(exit 127\): .*hud-no-such-runner: command not found/,
  );
});

test("every rollout errored the same way: the reason once in the table, with the way out", async () => {
  const env = new Environment("nosandbox");
  const t = env.template({ id: "t" }, async function* () {
    yield "never asked";
    yield 1;
  });
  const reason =
    'Cannot start workspace: no sandbox works here (bwrap: "bwrap" is not installed; unshare: unshare failed: Operation not permitted); install bubblewrap, or set isolation: "none" to run commands unconfined';
  let tries = 0;
  const runtime = {
    place: () => Promise.reject(new Error(`${reason} (attempt ${++tries})`)),
  };
  const job = await new Taskset([t()]).run(functionAgent(() => "x"), { runtime, group: 3 });
  const s = job.summary();
  assert.equal(s.common_failure?.class, "provisioning");
  assert.equal(s.common_failure?.count, 3);
  const { formatJobTable } = await import("../../eval/report.ts");
  const table = formatJobTable(job);
  assert.equal(table.split(reason).length - 1, 1, "said once, not once per task or rollout");
  assert.match(
    table,
    /all 3 rollouts errored the same way, provisioning \(the environment could not be placed/,
  );
  assert.match(table, /what to do: read the message/);
  assert.doesNotMatch(table, /first error of each failing task/);
  // Different reasons are not one reason.
  const mixed = await new Taskset([t()]).run(functionAgent(() => "x"), {
    runtime: { place: () => Promise.reject(new Error(tries++ % 2 ? "disk full" : "no route")) },
    group: 2,
  });
  assert.equal(mixed.summary().common_failure, null);
});

/**
 * Runs `argv` in a mount namespace of its own where bwrap and unshare are
 * replaced by scripts that fail as they do where user namespaces are not
 * allowed (as under Docker's defaults). Needs root.
 */
async function withoutNamespaces(argv: string[]): Promise<Deno.CommandOutput> {
  const dir = await Deno.makeTempDir({ prefix: "hud-nons-" });
  try {
    const fake = async (name: string, says: string) => {
      await Deno.writeTextFile(`${dir}/${name}`, `#!/bin/sh\necho '${says}' >&2\nexit 1\n`);
      await Deno.chmod(`${dir}/${name}`, 0o755);
    };
    await fake("bwrap", "bwrap: No permissions to create new namespace");
    await fake("unshare", "unshare: unshare failed: Operation not permitted");
    const script = `mount --bind ${dir}/bwrap /usr/bin/bwrap && ` +
      `mount --bind ${dir}/unshare /usr/bin/unshare && exec "$@"`;
    return await new Deno.Command("unshare", {
      args: ["-m", "--propagation", "private", "sh", "-c", script, "sh", ...argv],
      stdout: "piped",
      stderr: "piped",
    }).output();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

test({
  name:
    "examples/robolab.ts where no sandbox can be made: why, once, with the way out, exit 1 (issue 44)",
  // A mount namespace to hide bwrap and unshare in takes root; the fakes are mounted over both.
  needs: [ROOT_USER, BWRAP, UNSHARE],
}, async () => {
  const robolab = new URL("../../examples/robolab.ts", import.meta.url).pathname;
  const ran = await withoutNamespaces([Deno.execPath(), "run", "-A", robolab]);
  const out = new TextDecoder().decode(ran.stdout);
  assert.equal(ran.code, 1, out + new TextDecoder().decode(ran.stderr));
  const reason =
    "Cannot start workspace: no sandbox works here: user namespaces are not allowed here (bwrap: bwrap: No permissions to create new namespace; unshare: unshare: unshare failed: Operation not permitted)";
  // Before: six rows "error (provisioning)" and the mean, nothing saying why.
  assert.equal(out.split(reason).length - 1, 1, out);
  assert.match(out, /all 6 rollouts errored the same way, provisioning/);
  assert.match(out, /what to do: /);
  // robolab's own switch, named where the reason is.
  assert.match(out, /robolab: .*ROBOLAB_ISOLATION=none/);
});
