// Token and cost accounting (eval/usage.ts) and the job's limits
// (Taskset.run's tokenLimit, costLimit and limitAction).

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Environment, functionAgent, integer, Job, Taskset } from "../../mod.ts";
import { loadPricing, priceOf, traceUsage } from "../../eval/mod.ts";
import { ChatAgent } from "../../agents/mod.ts";
import { completion, scriptedServer } from "../agents/_scripted.ts";

function makeEnv() {
  const env = new Environment("budgets");
  const graded: string[] = [];
  const add = env.template(
    { id: "add", args: { a: integer(), b: integer() } },
    async function* ({ a, b }) {
      const answer = yield `${a}+${b}`;
      graded.push(`${a}+${b}`);
      yield Number(answer) === a + b ? 1 : 0;
    },
  );
  return { add, graded };
}

test("priceOf() and loadPricing(): own prices over the built-in ones, dated names, LiteLLM's file", async () => {
  assert.deepEqual(priceOf("gpt-4o-mini-2024-07-18"), priceOf("gpt-4o-mini"));
  assert.notDeepEqual(priceOf("gpt-4o-mini"), priceOf("gpt-4o"));
  assert.equal(priceOf("openai/gpt-4.1")?.input, 2);
  assert.equal(priceOf("my-local-model"), null);
  assert.deepEqual(priceOf("gpt-4o", { "gpt-4o": { input: 1, output: 2 } }), {
    input: 1,
    output: 2,
  });
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(
      `${dir}/litellm.json`,
      JSON.stringify({
        sample_spec: { input_cost_per_token: 0 },
        "my-model": {
          input_cost_per_token: 0.000002,
          output_cost_per_token: 0.000008,
          cache_read_input_token_cost: 5e-7,
        },
        "an-embedding-without-prices": { max_tokens: 8192 },
      }),
    );
    const table = await loadPricing(`${dir}/litellm.json`);
    assert.deepEqual(Object.keys(table), ["my-model"]);
    assert.ok(Math.abs(table["my-model"].input - 2) < 1e-9);
    assert.ok(Math.abs(table["my-model"].cachedInput! - 0.5) < 1e-9);
    await Deno.writeTextFile(`${dir}/bad.json`, JSON.stringify({ m: { input: -1, output: 1 } }));
    await assert.rejects(loadPricing(`${dir}/bad.json`), {
      name: "TypeError",
      message: /pricing file ".*bad\.json": model "m": input must be a number of at least 0/,
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("ChatAgent prices each call; the job counts tokens and cost per rollout and in all", async () => {
  const { add } = makeEnv();
  await using model = scriptedServer(
    Array.from(
      { length: 2 },
      () => completion({ content: "3" }, { prompt_tokens: 2_000, completion_tokens: 500 }),
    ),
  );
  const agent = new ChatAgent({
    model: "house-model-v2",
    baseUrl: model.baseUrl,
    stream: false,
    capabilityTools: false,
    pricing: { "house-model": { input: 1, output: 10 } },
  });
  const job = await new Taskset([add({ a: 1, b: 2 })]).run(agent, { group: 2 });
  for (const r of job.runs) {
    const u = traceUsage(r.trace);
    assert.deepEqual([u.inputTokens, u.outputTokens, u.modelCalls], [2_000, 500, 1]);
    assert.ok(Math.abs(u.costUsd - 0.007) < 1e-12, `${u.costUsd}`);
  }
  assert.equal(job.usage.inputTokens, 4_000);
  assert.ok(Math.abs(job.summary().cost_usd! - 0.014) < 1e-12);
});

test("Taskset.run() stops at its cost limit; resume finishes; no rollout is graded twice", async () => {
  const { add, graded } = makeEnv();
  const dir = await Deno.makeTempDir();
  const out = `${dir}/results.jsonl`;
  try {
    const rows = [1, 2, 3, 4, 5].map((a) => add({ a, b: 0 }));
    await using model = scriptedServer(
      Array.from({ length: 10 }, (_, i) => (r, n) => {
        const user = (r.body.messages as { role: string; content: string }[])[1].content;
        return completion({ content: String(eval(user)) }, {
          prompt_tokens: 1_000_000,
          completion_tokens: 0,
        })(r, n + i);
      }),
    );
    const agent = new ChatAgent({
      model: "dollar",
      baseUrl: model.baseUrl,
      stream: false,
      capabilityTools: false,
      pricing: { dollar: { input: 1, output: 0 } }, // $1 a call
    });
    const first = await new Taskset(rows).run(agent, { out, costLimit: 2, maxConcurrent: 1 });
    assert.deepEqual(first.stopped, { reason: "cost_limit", limit: 2, spent: 2 });
    assert.deepEqual(first.runs.map((r) => r.status), [
      "completed",
      "completed",
      "cancelled",
      "cancelled",
      "cancelled",
    ]);
    assert.equal(model.received.length, 2);
    const second = await new Taskset(rows).run(agent, { out, resume: true });
    assert.equal(second.stopped, null);
    assert.equal(second.meanReward, 1);
    assert.deepEqual(graded.sort(), ["1+0", "2+0", "3+0", "4+0", "5+0"]);
    const loaded = await Job.load(out);
    assert.equal(loaded.runs.length, 5);
    assert.equal(loaded.usage.costUsd, 5);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("Taskset.run() with limitAction cancel stops the running rollouts at the token limit", async () => {
  const { add, graded } = makeEnv();
  const agent = functionAgent(async (_p, _run, context) => {
    context.onUsage?.({
      model: "m",
      inputTokens: 80,
      outputTokens: 20,
      cachedTokens: 0,
      costUsd: null,
    });
    await new Promise((_, reject) => {
      context.signal.addEventListener("abort", () => reject(context.signal.reason), {
        once: true,
      });
    });
  });
  const rows = [1, 2, 3, 4].map((a) => add({ a, b: 1 }));
  const job = await new Taskset(rows).run(agent, {
    maxConcurrent: 2,
    tokenLimit: 150,
    limitAction: "cancel",
    rolloutTimeout: 20_000,
  });
  assert.equal(job.stopped?.reason, "token_limit");
  assert.equal(job.stopped?.spent, 200);
  assert.ok(job.runs.every((r) => r.status === "cancelled"), JSON.stringify(job.runs));
  assert.deepEqual(graded, [], "a cancelled rollout was graded");
  await assert.rejects(
    new Taskset(rows).run(agent, { costLimit: 0 }),
    { name: "RangeError", message: /costLimit must be a positive number, got "0"/ },
  );
});
