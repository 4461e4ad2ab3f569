// ATIF v1.4 export (Harbor's trajectory format): real robolab runs by a
// model and by a command agent, exported with toAtif() and checked against
// the RFC's schema (tests/eval/_atif_schema.ts), which is itself checked to
// accept a well-formed trajectory and to catch each kind of mistake.

import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Job, toAtif, writeTrajectories } from "../../eval/mod.ts";
import { main } from "../../cli.ts";
import { atifProblems } from "./_atif_schema.ts";
import { robolabRuns } from "../viewer/_runs.ts";

/** A trajectory written from the RFC's tables: a question, two tool calls, an answer. */
function sample(): Record<string, unknown> {
  return {
    schema_version: "ATIF-v1.4",
    session_id: "sample-1",
    agent: { name: "sample-agent", version: "0.1.0", model_name: "m-1", extra: {} },
    notes: "hand-written from the RFC's field tables",
    final_metrics: { total_prompt_tokens: 300, total_completion_tokens: 30, total_steps: 4 },
    extra: {},
    steps: [
      { step_id: 1, source: "system", message: "You answer questions about files." },
      {
        step_id: 2,
        timestamp: "2026-03-01T09:00:00Z",
        source: "user",
        message: "How many lines has notes.txt?",
      },
      {
        step_id: 3,
        timestamp: "2026-03-01T09:00:01.250Z",
        source: "agent",
        model_name: "m-1",
        reasoning_effort: "low",
        message: "Counting.",
        reasoning_content: "wc -l answers this.",
        tool_calls: [
          { tool_call_id: "c1", function_name: "bash", arguments: { command: "wc -l notes.txt" } },
          { tool_call_id: "c2", function_name: "noop", arguments: {} },
        ],
        observation: { results: [{ source_call_id: "c1", content: "12 notes.txt" }] },
        metrics: { prompt_tokens: 120, completion_tokens: 20, cached_tokens: 0, cost_usd: 0.001 },
      },
      {
        step_id: 4,
        timestamp: "2026-03-01T09:00:02+00:00",
        source: "agent",
        message: "12",
        metrics: { prompt_tokens: 180, completion_tokens: 10, logprobs: [-0.1], extra: {} },
      },
    ],
  };
}

test("atifProblems() accepts a trajectory made from the RFC and finds each kind of mistake", () => {
  assert.deepEqual(atifProblems(sample()), []);
  const broken: [string, (t: Record<string, unknown>) => void, RegExp][] = [
    [
      "no agent version",
      (t) => delete (t.agent as Record<string, unknown>).version,
      /agent\.version: required/,
    ],
    ["a field ATIF lacks", (t) => t.score = 1, /\$\.score: not a field/],
    ["a step id gap", (t) => (t.steps as Record<string, unknown>[])[3].step_id = 5, /expected 4/],
    ["tool calls on a user step", (t) => {
      (t.steps as Record<string, unknown>[])[1].tool_calls = [];
    }, /only an agent step/],
    ["a result of no call of its step", (t) => {
      const s = (t.steps as Record<string, unknown>[])[2];
      (s.observation as { results: Record<string, unknown>[] }).results[0].source_call_id = "c9";
    }, /c9 is no tool call/],
    ["arguments as a string", (t) => {
      const s = (t.steps as Record<string, unknown>[])[2];
      (s.tool_calls as Record<string, unknown>[])[0].arguments = '{"command":"ls"}';
    }, /arguments: expected object/],
    [
      "a bad source",
      (t) => (t.steps as Record<string, unknown>[])[0].source = "tool",
      /not one of/,
    ],
    ["a bad timestamp", (t) => {
      (t.steps as Record<string, unknown>[])[1].timestamp = "yesterday";
    }, /not ISO 8601/],
    ["a float token count", (t) => {
      const s = (t.steps as Record<string, unknown>[])[2];
      (s.metrics as Record<string, unknown>).prompt_tokens = 1.5;
    }, /prompt_tokens: expected integer/],
    [
      "no message",
      (t) => delete (t.steps as Record<string, unknown>[])[3].message,
      /message: required/,
    ],
  ];
  for (const [what, mutate, problem] of broken) {
    const t = sample();
    mutate(t);
    const problems = atifProblems(t);
    assert.ok(problems.some((p) => problem.test(p)), `${what}: ${JSON.stringify(problems)}`);
  }
});

test(
  "toAtif() exports a model run and a command run as ATIF v1.4",
  { needs: [SANDBOX] },
  async () => {
    const dir = await Deno.makeTempDir({ prefix: "atif-test-" });
    try {
      const runs = await robolabRuns(dir);
      const model = await Job.load(runs.model);
      const command = await Job.load(runs.command);
      for (const record of [...model.runs, ...command.runs]) {
        const trajectory = toAtif(record);
        // What a file reader sees: the JSON text, parsed again.
        assert.deepEqual(
          atifProblems(JSON.parse(JSON.stringify(trajectory))),
          [],
          record.task.slug,
        );
        assert.equal((trajectory.extra?.hud as Record<string, unknown>).reward, record.reward);
      }

      // A model rollout: system, user, the setup files, four model calls, the agent's diff.
      const solved = model.runs.find((r) => r.reward === 1)!;
      const t = toAtif(solved);
      assert.deepEqual(t.steps.map((s) => s.source), [
        "system",
        "user",
        "system",
        "agent",
        "agent",
        "agent",
        "agent",
        "system",
      ]);
      assert.equal(t.agent.name, "hud-chat-agent");
      assert.equal(toAtif(solved, { sdkVersion: "9.9.9" }).agent.version, "9.9.9");
      assert.equal(t.agent.model_name, "scripted-robolab");
      const agentSteps = t.steps.filter((s) => s.source === "agent");
      const calls = agentSteps.flatMap((s) => s.tool_calls ?? []);
      assert.deepEqual(calls.map((c) => c.function_name), ["bash", "bash", "bash", "submit"]);
      assert.match(
        String(calls[1].arguments.command),
        /sed -i 's\/-lt "\$n"\/-le "\$n"\/' count\.sh/,
      );
      const tools = solved.trace.steps!.filter((s) => s.type === "tool");
      assert.deepEqual(
        agentSteps.flatMap((s) => s.observation?.results.map((r) => r.content) ?? []),
        tools.map((s) => (s.content as { result: string }).result),
      );
      const digest = model.summary();
      assert.equal(t.final_metrics?.total_prompt_tokens, digest.input_tokens! / model.runs.length);
      assert.equal(
        t.final_metrics?.total_completion_tokens,
        digest.output_tokens! / model.runs.length,
      );
      assert.match(
        t.steps[7].observation!.results[0].content!,
        /^\+while \[ "\$i" -le "\$n" \]; do$/m,
      );

      // One private file per counted rollout, named by task and repeat.
      const files = await writeTrajectories(runs.model, `${dir}/atif`);
      assert.deepEqual(
        files.map((f) => f.slice(dir.length + 6)).sort(),
        model.runs.map((r) => `${r.task.slug}.${r.repeat}.json`).sort(),
      );
      for (const f of files) {
        assert.equal((await Deno.stat(f)).mode! & 0o777, 0o600, f);
        assert.deepEqual(atifProblems(JSON.parse(await Deno.readTextFile(f))), [], f);
      }

      // The command line: report --atif DIR, one results file at a time.
      let said = "";
      const io = { stdout: () => {}, stderr: (t: string) => said += t };
      assert.equal(await main(["report", runs.command, "--atif", `${dir}/cli`], io), 0, said);
      assert.match(said, /^Wrote 2 trajectories \(ATIF v1\.4\) into /);
      for (const r of command.runs) {
        const f = `${dir}/cli/${r.task.slug}.${r.repeat}.json`;
        assert.deepEqual(atifProblems(JSON.parse(await Deno.readTextFile(f))), [], f);
      }
      said = "";
      assert.equal(await main(["report", runs.command, runs.model, "--atif", dir], io), 2);
      assert.match(said, /--atif takes one results file/);
      said = "";
      assert.equal(await main(["report", `${dir}/nope.jsonl`, "--atif", dir], io), 1);
      assert.match(said, /"[^"]*nope\.jsonl" is not a file \(run a job with --out first\)/);
      assert.equal(said.trim().split("\n").length, 1);

      // A command rollout: the prompt, the setup files, the agent's answer with its exit code.
      const done = command.runs.find((r) => r.reward === 1)!;
      const c = toAtif(done);
      const answer = c.steps.find((s) => s.source === "agent")!;
      assert.equal(answer.message, String(done.trace.content));
      assert.equal(answer.extra?.exit_code, 0);
      assert.equal(c.agent.model_name, undefined);
      assert.match(c.agent.name, /ssh_agent\.sh$/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

test("toAtif() of a rollout that never started is still a trajectory", () => {
  const t = toAtif({
    job_id: "j",
    group_id: "j:t",
    task: { env: "e", id: "t", args: {}, slug: "t" },
    repeat: 2,
    status: "cancelled",
    reward: null,
    failed_phase: null,
    trace: {},
  });
  assert.deepEqual(atifProblems(JSON.parse(JSON.stringify(t))), []);
  assert.equal(t.session_id, "j:t#2");
  assert.deepEqual(t.steps, []);
});
