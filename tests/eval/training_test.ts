// Token data in traces (eval/tokens.ts) and training rows (eval/training.ts),
// on records made by hand: the shapes a trainer reads.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  decodeTurnTokens,
  encodeTurnTokens,
  type RunRecord,
  toAtif,
  traceTokens,
  trainingRows,
  type TurnTokens,
} from "../../eval/mod.ts";

function modelStep(tokens: TurnTokens | null, previous: TurnTokens | null, text = "") {
  return {
    type: "model",
    timestamp: "2026-01-01T00:00:00.000Z",
    content: {
      request: [{ role: "user", content: "q" }],
      reply: { role: "assistant", content: text },
    },
    info: {
      model: "m",
      finish_reason: "stop",
      ...(tokens ? { tokens: encodeTurnTokens(tokens, previous) } : {}),
    },
  };
}

function record(repeat: number, reward: number | null, steps: unknown[]): RunRecord {
  return {
    job_id: "j",
    group_id: "j:t",
    task: { env: "e", id: "t", args: {}, slug: "t" },
    repeat,
    status: reward === null ? "error" : "completed",
    reward,
    failed_phase: reward === null ? "agent" : null,
    trace: {
      status: reward === null ? "error" : "completed",
      stop_reason: "graded",
      content: null,
      started_at: "",
      ended_at: "",
      errors: [],
      steps: steps as RunRecord["trace"]["steps"] & [],
    },
  } as RunRecord;
}

test("encodeTurnTokens() stores the prompt past its shared prefix, compactly", () => {
  const prompt = Array.from({ length: 2000 }, (_, i) => (i * 7919) % 150_000);
  const t1: TurnTokens = {
    promptIds: prompt,
    completionIds: [5, 150_001, 7],
    logprobs: [-0.125, -3.5, -0.0006986912339925766],
  };
  const t2: TurnTokens = {
    promptIds: [...prompt, 5, 150_001, 7, 42, 43],
    completionIds: [9],
    logprobs: [0],
  };
  const s1 = encodeTurnTokens(t1, null);
  const s2 = encodeTurnTokens(t2, t1);
  assert.equal(s2.prompt_shared, 2003);
  // Two new prompt ids, not 2005: base64 of 8 bytes.
  assert.equal(s2.prompt_ids, new Uint8Array([42, 0, 0, 0, 43, 0, 0, 0]).toBase64());
  // Smaller than the JSON of the arrays; the next turn, far smaller.
  assert.ok(JSON.stringify(s1).length < JSON.stringify(t1).length);
  assert.ok(JSON.stringify(s2).length < JSON.stringify(t2).length * 0.05);
  const d1 = decodeTurnTokens(s1, null)!;
  assert.deepEqual(d1.promptIds, prompt);
  assert.deepEqual(d1.completionIds, t1.completionIds);
  // float32: 7 significant digits.
  assert.deepEqual(d1.logprobs, [-0.125, -3.5, -0.0006986912]);
  assert.deepEqual(decodeTurnTokens(s2, d1)!.promptIds, t2.promptIds);
  // Without the call before, a shared prefix cannot be rebuilt: no prompt, not a wrong one.
  assert.equal(decodeTurnTokens(s2, null)!.promptIds, null);
  assert.equal(decodeTurnTokens({ n: 0, completion_ids: "not base64!" }, null), null);
});

test("traceTokens() pairs each model step with its tokens, across a step without", () => {
  const a: TurnTokens = { promptIds: [1, 2], completionIds: [3], logprobs: [-1] };
  const b: TurnTokens = { promptIds: [1, 2, 3, 4], completionIds: [5], logprobs: [-2] };
  const steps = [
    { type: "user", timestamp: "", content: "q" },
    modelStep(a, null),
    { type: "tool", timestamp: "", content: {} },
    modelStep(b, a),
    modelStep(null, b),
    modelStep(a, null),
  ];
  const got = traceTokens(steps);
  assert.equal(got.length, 4);
  assert.deepEqual(got[0], a);
  assert.deepEqual(got[1], b);
  assert.equal(got[2], null);
  assert.deepEqual(got[3], a);
});

test("trainingRows(): loss masks over the model's tokens, a new sequence where the prompt re-renders", async (t) => {
  // Turn 2's prompt extends turn 1's prompt + completion; turn 3's does not
  // (the server rendered the history differently from what was sampled).
  const t1: TurnTokens = { promptIds: [10, 11], completionIds: [20, 21], logprobs: [-0.5, -0.25] };
  const t2: TurnTokens = {
    promptIds: [10, 11, 20, 21, 30],
    completionIds: [22],
    logprobs: [-1],
  };
  const t3: TurnTokens = {
    promptIds: [10, 11, 99, 21, 30, 22, 31],
    completionIds: [23, 24],
    logprobs: [-2, -4],
  };
  const whole = record(0, 1, [modelStep(t1, null), modelStep(t2, t1), modelStep(t3, t2)]);
  const failed = record(1, null, [modelStep(t1, null)]);
  const rows = trainingRows([whole, failed]);
  await t.step("one row per record, with the group's rewards", () => {
    assert.equal(rows.length, 2);
    assert.deepEqual(rows[0].group_rewards, [1, null]);
    assert.equal(rows[0].group_complete, false);
    assert.equal(rows[0].model, "m");
    assert.equal(rows[0].turns.length, 3);
    assert.equal(rows[0].tokens_complete, true);
  });
  await t.step("the sequences", () => {
    const [s1, s2] = rows[0].sequences;
    assert.equal(rows[0].sequences.length, 2);
    assert.deepEqual(s1.tokens, [10, 11, 20, 21, 30, 22]);
    assert.deepEqual(s1.loss_mask, [0, 0, 1, 1, 0, 1]);
    assert.deepEqual(s1.logprobs, [0, 0, -0.5, -0.25, 0, -1]);
    assert.deepEqual(s1.turns, [0, 1]);
    assert.deepEqual(s2.tokens, [10, 11, 99, 21, 30, 22, 31, 23, 24]);
    assert.deepEqual(s2.loss_mask, [0, 0, 0, 0, 0, 0, 0, 1, 1]);
    assert.deepEqual(s2.turns, [2]);
    for (const s of rows[0].sequences) {
      assert.equal(s.tokens.length, s.loss_mask.length);
      assert.equal(s.tokens.length, s.logprobs!.length);
    }
  });
  await t.step("completeGroupsOnly leaves out a group that is not whole", () => {
    assert.deepEqual(trainingRows([whole, failed], { completeGroupsOnly: true }), []);
    assert.equal(trainingRows([whole], { completeGroupsOnly: true }).length, 1);
  });
  await t.step("a turn without prompt ids breaks the sequence; the row says so", () => {
    const noPrompt: TurnTokens = { promptIds: null, completionIds: [7], logprobs: [-1] };
    const [row] = trainingRows([record(0, 0, [modelStep(t1, null), modelStep(noPrompt, t1)])]);
    assert.equal(row.tokens_complete, false);
    assert.equal(row.sequences.length, 1);
    assert.deepEqual(row.turns[1].completion_token_ids, [7]);
  });
});

test("trainingRows(): each split names its turn, its reason and the first differing position", () => {
  const t1: TurnTokens = { promptIds: [10, 11], completionIds: [20, 21], logprobs: [-0.5, -0.25] };
  // Turn 2 keeps the history: it extends turn 1.
  const t2: TurnTokens = { promptIds: [10, 11, 20, 21, 30], completionIds: [22], logprobs: [-1] };
  // Turn 3 re-renders turn 1's reply: position 3 holds 99 where 21 was sampled.
  const t3: TurnTokens = {
    promptIds: [10, 11, 20, 99, 30, 22, 31],
    completionIds: [23],
    logprobs: [-2],
  };
  // Turn 4 truncates the history to its first 4 tokens.
  const t4: TurnTokens = { promptIds: [10, 11, 20, 99], completionIds: [24], logprobs: [-3] };
  const noIds: TurnTokens = { promptIds: null, completionIds: [25], logprobs: [-1] };
  const t6: TurnTokens = {
    promptIds: [10, 11, 20, 99, 24, 40],
    completionIds: [26],
    logprobs: [-1],
  };
  const steps = [t1, t2, t3, t4, noIds, t6].map((t, i, all) => modelStep(t, all[i - 1] ?? null));
  const [row] = trainingRows([record(0, 1, steps)]);
  assert.deepEqual(row.sequences.map((s) => s.turns), [[0, 1], [2], [3], [5]]);
  assert.deepEqual(row.sequences.map((s) => s.split), [
    null,
    { turn: 2, reason: "diverged", position: 3, expected: 21, got: 99 },
    { turn: 3, reason: "shortened", position: 4, expected: 30, got: null },
    { turn: 5, reason: "unknown", position: null, expected: null, got: null },
  ]);
  // A history-keeping episode is one sample.
  const [kept] = trainingRows([record(0, 1, [modelStep(t1, null), modelStep(t2, t1)])]);
  assert.equal(kept.sequences.length, 1);
  assert.equal(kept.sequences[0].split, null);
});

test("trainingRows(): a rollout that did not finish is masked, never a reward of 0", () => {
  const t1: TurnTokens = { promptIds: [1, 2], completionIds: [3, 4], logprobs: [-1, -1] };
  const errored = record(1, null, [modelStep(t1, null)]);
  // Graded, but cut off by a model server that stayed down: its reward says nothing of the agent.
  const cut: RunRecord = {
    ...record(2, 0, [modelStep(t1, null)]),
    error_class: "model_unavailable",
  };
  const whole = record(0, 1, [modelStep(t1, null)]);
  const rows = trainingRows([whole, errored, cut]);
  assert.deepEqual(rows.map((r) => r.masked), [false, true, true]);
  assert.deepEqual(rows.map((r) => r.reward), [1, null, null]);
  assert.deepEqual(rows[0].sequences[0].loss_mask, [0, 0, 1, 1]);
  for (const row of rows.slice(1)) {
    assert.deepEqual(row.sequences[0].loss_mask, [0, 0, 0, 0]);
    assert.deepEqual(row.sequences[0].tokens, [1, 2, 3, 4]);
  }
  // The group's rewards are its rows' rewards: a trainer's baseline never counts the cut one's 0.
  for (const row of rows) assert.deepEqual(row.group_rewards, [1, null, null]);
  assert.equal(rows[0].group_complete, false);
});

test("trainingRows(): the conversation of proxy-recorded calls is the last call's messages and its reply", () => {
  const step = (request: unknown[], shared: number, reply: string) => ({
    type: "model",
    timestamp: "",
    content: { request, reply: { role: "assistant", content: reply } },
    info: { messages_shared: shared, finish_reason: "stop" },
  });
  const sys = { role: "system", content: "s" };
  const user = { role: "user", content: "u" };
  const steps = [
    step([sys, user], 0, "a1"),
    // The harness kept the history and echoed the reply back.
    step([{ role: "assistant", content: "a1" }, { role: "user", content: "u2" }], 2, "a2"),
    // Then it dropped everything but the system prompt.
    step([{ role: "user", content: "summary" }], 1, "a3"),
  ];
  const [row] = trainingRows([record(0, 1, steps)]);
  assert.deepEqual(row.messages, [
    sys,
    { role: "user", content: "summary" },
    { role: "assistant", content: "a3" },
  ]);
});

test("toAtif() gives each agent step the whole prompt's ids, the sampled ids and logprobs that ChatAgent kept", () => {
  const first = { promptIds: [1, 2, 3], completionIds: [7, 8], logprobs: [-0.5, -0.25] };
  const second = { promptIds: [1, 2, 3, 7, 8, 9, 10], completionIds: [4], logprobs: [-1] };
  const model = (tokens: unknown) => ({
    type: "model",
    timestamp: "2026-01-01T00:00:00.500Z",
    content: { request: [], reply: { role: "assistant", content: "x" } },
    info: { model: "tiny", input_tokens: 3, output_tokens: 2, tokens },
  });
  const record = {
    job_id: "j",
    group_id: "j:t",
    task: { env: "e", id: "t", args: {}, slug: "t" },
    repeat: 0,
    status: "completed",
    reward: 1,
    failed_phase: null,
    trace: {
      status: "completed",
      errors: [],
      started_at: "2026-01-01T00:00:00.000Z",
      ended_at: "2026-01-01T00:00:01.000Z",
      steps: [
        { type: "user", timestamp: "2026-01-01T00:00:00.100Z", content: "go" },
        model(encodeTurnTokens(first, null)),
        { type: "tool", timestamp: "2026-01-01T00:00:00.600Z", content: { id: "a", result: "" } },
        model(encodeTurnTokens(second, first)),
      ],
    },
  } as unknown as RunRecord;
  const agentSteps = toAtif(record).steps.filter((s) => s.source === "agent");
  assert.deepEqual(agentSteps.map((s) => s.metrics?.prompt_token_ids), [
    first.promptIds,
    second.promptIds,
  ]);
  assert.deepEqual(agentSteps.map((s) => s.metrics?.completion_token_ids), [[7, 8], [4]]);
  assert.deepEqual(agentSteps.map((s) => s.metrics?.logprobs), [[-0.5, -0.25], [-1]]);
});
