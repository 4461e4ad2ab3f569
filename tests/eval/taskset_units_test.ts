// The units Taskset.run() schedules with, in-process: the option checks
// (once, in tasksetRunConfig, in the options' or a command line's words),
// the ledger of slots and records, the budget, the progress and the retry
// policy. No environment, socket or file is needed but where a results
// file is the point.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import type { TaskRow } from "../../env.ts";
import type { RuntimeProvider } from "../../runtime/placement.ts";
import { functionAgent, Job, type JobProgress, Taskset } from "../../mod.ts";
import { tasksetRunConfig } from "../../eval/taskset.ts";
import type { RunRecord } from "../../eval/results.ts";
import { createRun } from "../../eval/run.ts";
import { Trace } from "../../eval/trace.ts";
import { optionSpelling } from "../../eval/_options.ts";
import { expandSlots, JobLedger, resumeFrom, runRecord } from "../../eval/_ledger.ts";
import { Budget } from "../../eval/_budget.ts";
import { GroupReporter, Progress } from "../../eval/_progress.ts";
import { RetryPolicy } from "../../eval/_attempts.ts";
import { emptyUsage } from "../../eval/usage.ts";

const NOWHERE: RuntimeProvider = {
  place: () => Promise.reject(new Error("not placed in these tests")),
};
const ROWS: TaskRow[] = [
  { env: "e", id: "t", args: { n: 1 }, slug: "t-1" },
  { env: "e", id: "t", args: { n: 2 }, slug: "t-2" },
];

function record(slug: string, repeat: number, reward: number | null, attempt = 1): RunRecord {
  return {
    job_id: "job-file",
    group_id: `job-file:${slug}`,
    task: { env: "e", id: "t", args: {}, slug },
    repeat,
    attempt,
    status: reward === null ? "error" : "completed",
    reward,
    failed_phase: reward === null ? "provisioning" : null,
    error_class: reward === null ? "provisioning" : null,
    trace: {
      status: "completed",
      stop_reason: "graded",
      content: null,
      started_at: "2025-01-01T00:00:00.000Z",
      ended_at: "2025-01-01T00:00:01.000Z",
      errors: [],
      steps: [{
        type: "model",
        timestamp: "2025-01-01T00:00:00.500Z",
        info: { input_tokens: 100, output_tokens: 10, cost_usd: 0.01 },
      }],
    },
  };
}

test("tasksetRunConfig() checks every option once, up front, in the caller's words", async (t) => {
  await t.step("defaults", () => {
    const config = tasksetRunConfig({});
    assert.equal(config.group, 1);
    assert.equal(config.maxConcurrent, 8);
    assert.equal(config.limitAction, "finish");
    assert.deepEqual(config.retry, {
      attempts: 0,
      on: ["provisioning", "infrastructure_lost", "model_unavailable"],
      baseDelay: 1_000,
      maxDelay: 30_000,
    });
  });
  await t.step("refusals name the options", () => {
    const cases: [Parameters<typeof tasksetRunConfig>[0], string, RegExp][] = [
      [
        { group: 0 },
        "RangeError",
        /^Cannot run taskset: group must be a positive integer, got "0"$/,
      ],
      [{ maxConcurrent: 1.5 }, "RangeError", /maxConcurrent must be a positive integer/],
      [{ tokenLimit: 1.5 }, "RangeError", /tokenLimit must be a positive integer, got "1.5"/],
      [{ costLimit: -1 }, "RangeError", /costLimit must be a positive number, got "-1"/],
      [{ resume: true }, "TypeError", /^Cannot run taskset: resume needs out$/],
      [{ force: true }, "TypeError", /^Cannot run taskset: force needs out$/],
      [{ rolloutTimeout: 0 }, "RangeError", /rolloutTimeout must be a positive number, got "0"/],
      [
        { rolloutTimeout: 5000, agentTimeout: 9000 },
        "RangeError",
        /^Cannot run taskset: agentTimeout \(9000 ms\) must be less than rolloutTimeout \(5000 ms\)$/,
      ],
    ];
    for (const [options, name, message] of cases) {
      assert.throws(() => tasksetRunConfig(options), { name, message }, JSON.stringify(options));
    }
  });
  await t.step("a command line's spelling: its flags, its values as typed, seconds", () => {
    const flags: Record<string, string> = {
      agentTimeout: "--agent-timeout",
      rolloutTimeout: "--timeout",
      group: "--group",
    };
    const cli = {
      prefix: "",
      name: (o: string) => flags[o] ?? o,
      given: (o: string, v: unknown) => o === "group" ? "two" : String(v),
      duration: (ms: number) => `${ms / 1000} s`,
    };
    assert.throws(() => tasksetRunConfig({ rolloutTimeout: 5000, agentTimeout: 9000 }, cli), {
      message: "--agent-timeout (9 s) must be less than --timeout (5 s)",
    });
    assert.throws(() => tasksetRunConfig({ group: NaN }, cli), {
      message: '--group must be a positive integer, got "two"',
    });
    // The library's own spelling is the default.
    assert.throws(() => tasksetRunConfig({ group: 0 }, optionSpelling("Cannot x")), {
      message: 'Cannot x: group must be a positive integer, got "0"',
    });
  });
});

test("Taskset.run() refuses timeouts that do not fit before it makes the results file", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const out = `${dir}/r.jsonl`;
    await assert.rejects(
      new Taskset(ROWS).run(functionAgent(() => "x"), {
        runtime: NOWHERE,
        out,
        rolloutTimeout: 1000,
        agentTimeout: 5000,
      }),
      { name: "RangeError", message: /agentTimeout \(5000 ms\) must be less than rolloutTimeout/ },
    );
    await assert.rejects(Deno.stat(out), Deno.errors.NotFound);
    await assert.rejects(
      new Taskset(ROWS).run(functionAgent(() => "x"), { runtime: NOWHERE, force: true }),
      { name: "TypeError", message: /force needs out/ },
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("resumeFrom() and JobLedger: the latest attempt counts, graded ones are kept, the rest runs", () => {
  const file = [
    record("t-1", 0, null, 1),
    record("t-1", 0, 1, 2),
    record("t-2", 0, 1, 1),
    record("t-2", 0, null, 2),
    record("gone", 0, 1, 1),
  ];
  const resumed = resumeFrom(file);
  assert.equal(resumed.jobId, "job-file");
  assert.deepEqual([...resumed.tries], [["t-1#0", 2], ["t-2#0", 2], ["gone#0", 1]]);
  assert.deepEqual([...resumed.kept.keys()], ["t-1#0", "gone#0"]);
  assert.equal(resumed.spent.inputTokens, 500, "every attempt in the file counts");
  const slots = expandSlots(ROWS, [NOWHERE, NOWHERE], 2, "job-file");
  assert.deepEqual(slots.map((s) => [s.index, s.key, s.groupId]), [
    [0, "t-1#0", "job-file:t-1"],
    [1, "t-1#1", "job-file:t-1"],
    [2, "t-2#0", "job-file:t-2"],
    [3, "t-2#1", "job-file:t-2"],
  ]);
  const ledger = new JobLedger("job-file", slots, resumed);
  assert.deepEqual(ledger.kept, [file[1]]);
  assert.deepEqual(ledger.pending().map((s) => s.key), ["t-1#1", "t-2#0", "t-2#1"]);
  assert.equal(ledger.firstAttempt(slots[2]), 3);
  assert.equal(ledger.firstAttempt(slots[3]), 1);
  const job = ledger.toJob({ stopped: null, usage: resumed.spent });
  assert.deepEqual(job.runs.map((r) => [r.task.slug, r.repeat, r.status]), [
    ["t-1", 0, "completed"],
    ["t-1", 1, "cancelled"],
    ["t-2", 0, "cancelled"],
    ["t-2", 1, "cancelled"],
  ]);
  // History: the file's earlier attempts of these slots, not those of other tasks.
  assert.deepEqual(job.superseded, [file[0], file[2], file[3]]);
});

test("JobLedger.done(): a group's records, by repeat, once every slot of it is final (kept ones count)", () => {
  const file = [record("t-1", 1, 1)];
  const slots = expandSlots(ROWS, [NOWHERE, NOWHERE], 2, "job-file");
  const ledger = new JobLedger("job-file", slots, resumeFrom(file));
  const trace = new Trace();
  const settle = (i: number, reward: number) => {
    const run = createRun(null, slots[i].row, trace);
    ledger.settle(slots[i], run, record(slots[i].row.slug, slots[i].repeat, reward));
    return ledger.done(slots[i]);
  };
  assert.equal(settle(2, 1), null, "t-2 has a repeat left");
  // t-1's repeat 1 is kept from the file: its repeat 0 completes the group.
  assert.deepEqual(settle(0, 0)?.map((r) => [r.task.slug, r.repeat, r.reward]), [
    ["t-1", 0, 0],
    ["t-1", 1, 1],
  ]);
  assert.deepEqual(settle(3, 1)?.map((r) => r.repeat), [0, 1]);
});

test("GroupReporter: one group at a time; the first error stops the job and is its error", async () => {
  const order: string[] = [];
  let release!: () => void;
  const first = new Promise<void>((resolve) => release = resolve);
  const reporter = new GroupReporter(async (records) => {
    const slug = records[0].task.slug;
    order.push(`start ${slug}`);
    if (slug === "t-1") await first;
    if (slug === "t-2") throw new Error("disk full");
    order.push(`end ${slug}`);
  });
  const a = reporter.report([record("t-1", 0, 1)]);
  const b = reporter.report([record("t-2", 0, 1)]);
  const c = reporter.report([record("t-3", 0, 1)]);
  await Promise.resolve();
  assert.deepEqual(order, ["start t-1"], "t-2 waits for t-1");
  release();
  await Promise.all([a, b, c]);
  assert.deepEqual(order, ["start t-1", "end t-1", "start t-2"], "nothing after the error");
  assert.equal(reporter.signal.aborted, true);
  assert.throws(() => reporter.throwIfFailed(), /disk full/);
  const none = new GroupReporter(undefined);
  await none.report([record("t-1", 0, 1)]);
  assert.equal(none.signal.aborted, false);
  none.throwIfFailed();
});

test("runRecord() builds every RunRecord: an attempt's, and a never-started slot's", () => {
  const [slot] = expandSlots(ROWS, [NOWHERE], 1, "j");
  assert.deepEqual(runRecord("j", slot), {
    job_id: "j",
    group_id: "j:t-1",
    task: ROWS[0],
    repeat: 0,
    status: "cancelled",
    reward: null,
    failed_phase: null,
    error_class: "cancelled",
    trace: {},
  });
  const trace = new Trace();
  trace.fail("provisioning", new Error("no capacity"));
  trace.finish("error", "provisioning_error");
  const run = createRun(null, ROWS[0], trace);
  const made = runRecord("j", slot, { run, attempt: 2, agent: { kind: "command", name: "x" } });
  assert.deepEqual(Object.keys(made), [
    "job_id",
    "group_id",
    "task",
    "repeat",
    "attempt",
    "status",
    "reward",
    "failed_phase",
    "error_class",
    "agent",
    "trace",
  ]);
  assert.equal(made.error_class, "provisioning");
  assert.equal(made.failed_phase, "provisioning");
  assert.deepEqual(made.trace, trace.toJSON());
});

test("Budget: every attempt counts, a limit stops new rollouts, cancel aborts running ones", () => {
  const spent = emptyUsage();
  spent.costUsd = 0.04;
  const finish = new Budget(
    { tokenLimit: undefined, costLimit: 0.05, limitAction: "finish" },
    spent,
    undefined,
  );
  assert.equal(finish.open, true);
  const meter = finish.meter();
  meter.onUsage({ model: "m", inputTokens: 10, outputTokens: 5, cachedTokens: 0, costUsd: 0.02 });
  assert.deepEqual(finish.stopped, { reason: "cost_limit", limit: 0.05, spent: 0.06 });
  assert.equal(finish.open, false);
  assert.equal(finish.signal.aborted, false, "finish: running rollouts go on");
  // What the trace holds beyond the reported calls counts when the attempt ends.
  meter.settle({
    steps: [
      { type: "model", info: { input_tokens: 10, output_tokens: 5, cost_usd: 0.02 } },
      { type: "model", info: { input_tokens: 7, output_tokens: 3 } },
    ],
  });
  assert.equal(finish.tokens, 25);
  assert.equal(finish.spent.unpricedCalls, 1);

  const cancel = new Budget(
    { tokenLimit: 20, costLimit: undefined, limitAction: "cancel" },
    emptyUsage(),
    undefined,
  );
  cancel.meter().settle({
    steps: [{ type: "model", info: { input_tokens: 30, output_tokens: 0 } }],
  });
  assert.equal(cancel.stopped?.reason, "token_limit");
  assert.equal(cancel.signal.aborted, true);
  assert.match(String(cancel.signal.reason), /the job's token limit was reached/);
});

test("Progress: counts, the running mean, an ETA from this run's pace; a throwing callback is ignored", () => {
  const seen: JobProgress[] = [];
  const budget = new Budget(
    { tokenLimit: undefined, costLimit: undefined, limitAction: "finish" },
    emptyUsage(),
    undefined,
  );
  const kept = [record("t-1", 0, 1)];
  const progress = new Progress(4, kept, { budget, concurrency: undefined }, (p) => {
    seen.push(p);
    throw new Error("stderr closed");
  });
  progress.report();
  progress.started();
  progress.retrying(record("t-2", 0, null));
  progress.finished(record("t-2", 0, 0), false);
  progress.started();
  progress.finished(record("t-2", 1, null), true);
  const pick = (p: JobProgress) => [p.done, p.running, p.failed, p.meanReward, p.retried];
  assert.deepEqual(seen.map(pick), [
    [1, 0, 0, 1, 0],
    [1, 1, 0, 1, 0],
    [1, 1, 0, 1, 1],
    [2, 0, 0, 0.5, 1],
    [2, 1, 0, 0.5, 1],
    [2, 0, 0, 0.5, 1],
  ]);
  assert.equal(seen[0].etaMs, null);
  assert.equal(typeof seen[3].etaMs, "number");
  assert.equal(seen[3].last?.task.slug, "t-2");
});

test("RetryPolicy: only the classes it names, never a cancelled rollout, backoff within bounds", () => {
  const policy = new RetryPolicy({
    attempts: 2,
    on: ["provisioning"],
    baseDelay: 100,
    maxDelay: 300,
  });
  const failed = record("t-1", 0, null);
  assert.equal(policy.allows(1, failed), true);
  assert.equal(policy.allows(3, failed), false, "past the attempts");
  assert.equal(policy.retryable({ ...failed, error_class: "agent_error" }), false);
  // Older files' names are read as today's: "agent" is agent_error, never retried.
  assert.equal(policy.retryable({ ...failed, error_class: "agent" }), false);
  assert.equal(policy.retryable({ ...failed, error_class: "cancelled" }), false);
  assert.equal(policy.retryable({ ...failed, error_class: null }), false);
  for (let i = 0; i < 50; i++) {
    const first = policy.delay(1);
    assert.ok(first >= 50 && first <= 150, `${first}`);
    const third = policy.delay(3);
    assert.ok(third >= 150 && third <= 450, `${third}: capped at 300 before the jitter`);
  }
});

test("Job has no public constructor: jobs come from Taskset.run() and Job.load()", () => {
  // @ts-expect-error: the constructor is private (this line fails type checking if it is not).
  const make = () => new Job("j", [], []);
  assert.equal(typeof make, "function");
});
