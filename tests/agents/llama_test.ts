// A real model: llama.cpp's llama-server with the tiny tool-calling model,
// when both are present (built and trained outside the tests, never here).
// Such a model follows the protocol, not the task: this checks the
// protocol only (tool calls parsed and run over SSH, results fed back, the
// loop ends, the trace holds every call, the answer is graded).

import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { addWorkspace, Environment, rollout, Taskset } from "../../mod.ts";
import { ChatAgent } from "../../agents/mod.ts";
import { RETRYABLE_ERROR_CLASSES, rolloutFinished, traceTokens } from "../../eval/mod.ts";
import { LLAMA, startLlamaServer } from "./_llama.ts";

test({
  name: "ChatAgent against llama-server with the tiny tool-calling model",
  needs: [LLAMA, SANDBOX],
  async fn() {
    await using llama = await startLlamaServer(["-c", "4096", "-np", "1"], 40_000);
    const root = await Deno.makeTempDir({ prefix: "agents-llama-" });
    try {
      const base = llama.base;
      const env = new Environment("lab");
      addWorkspace(env, root, { env: { HOME: root } });
      const task = env.template({ id: "hello" }, async function* () {
        await Deno.writeTextFile(`${root}/note.txt`, "hello\n");
        const answer = yield "Run cat note.txt with bash, then submit what it printed.";
        yield String(answer).includes("hello") ? 1 : 0;
      });
      const agent = new ChatAgent({
        model: "tiny",
        baseUrl: `${base}/v1`,
        sampling: { temperature: 0, maxTokens: 128 },
        maxSteps: 4,
      });
      const run = await rollout(task(), agent, { rolloutTimeout: 55_000, fileTracking: false });
      // The loop ended and the run was graded, whatever the model said.
      assert.notEqual(run.grade, null, JSON.stringify(run.trace.errors));
      const models = run.trace.steps.filter((s) => s.type === "model");
      const tools = run.trace.steps.filter((s) => s.type === "tool");
      assert.ok(models.length >= 1);
      const asked = models.flatMap((s) =>
        ((s.content as { reply: { tool_calls?: { id: string }[] } }).reply.tool_calls ?? [])
          .map((c) => c.id)
      );
      assert.ok(asked.length >= 1, "the model made no tool call");
      assert.deepEqual(tools.map((s) => (s.content as { id: string }).id), asked);
      for (const s of tools) {
        const c = s.content as { name: string; result: string };
        if (c.name === "bash" && s.info?.is_error === false) assert.match(c.result, /^exit_code: /);
      }
      for (const s of models) assert.equal(typeof s.info?.latency_ms, "number");
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

test({
  name:
    "ChatAgent with tokens on robolab against llama-server: every turn's ids and logprobs are the text it returned; training rows hold them",
  needs: [LLAMA, SANDBOX],
  async fn() {
    const { fixBug } = await import("../../examples/robolab.ts");
    await using llama = await startLlamaServer(["-c", "8192", "-np", "2"], 40_000);
    const agent = new ChatAgent({
      model: "tiny",
      baseUrl: `${llama.base}/v1`,
      sampling: { temperature: 1, maxTokens: 96, seed: 1 },
      maxSteps: 3,
      tokens: true,
      promptTokens: "llama-server",
    });
    const tasks = [fixBug({ difficulty: 1, seed: 1 }), fixBug({ difficulty: 2, seed: 1 })];
    const job = await new Taskset(tasks).run(agent, {
      group: 2,
      maxConcurrent: 2,
      rolloutTimeout: 100_000,
      fileTracking: false,
    });
    const post = async (path: string, body: unknown) => {
      const r = await fetch(`${llama.base}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      assert.equal(r.status, 200, path);
      return await r.json();
    };
    let turns = 0;
    for (const record of job.runs) {
      const steps = record.trace.steps ?? [];
      const models = steps.filter((s) => s.type === "model");
      assert.ok(models.length >= 1, `${record.task.slug}: no model call`);
      const tokens = traceTokens(steps);
      for (const [i, step] of models.entries()) {
        turns++;
        const t = tokens[i];
        const where = `${record.task.slug}#${record.repeat} call ${i + 1}`;
        assert.ok(t !== null, `${where}: no tokens`);
        const info = step.info!;
        assert.equal(t.completionIds?.length, info.output_tokens, where);
        assert.equal(t.logprobs?.length, info.output_tokens, where);
        assert.equal(t.promptIds?.length, info.input_tokens, where);
        assert.ok(t.logprobs!.every((lp) => Number.isFinite(lp) && lp <= 0), where);
        // The sampled ids, detokenized by the server, are the text it returned.
        const text: string = (await post("/detokenize", { tokens: t.completionIds })).content;
        const plain = text.replace(/<\|[a-z_]+\|>/g, "");
        const reply = (step.content as { reply: Record<string, unknown> }).reply;
        const content = String(reply.content ?? "").trim();
        if (content !== "") assert.ok(plain.includes(content), `${where}: ${text} vs ${content}`);
        for (const call of (reply.tool_calls ?? []) as { name: string; arguments: string }[]) {
          assert.ok(plain.includes(call.name), `${where}: ${text} lacks ${call.name}`);
          let args: unknown = null;
          try {
            args = JSON.parse(call.arguments);
          } catch {
            // Cut short at maxTokens: the name is all there is to match.
          }
          for (const v of Object.values((args ?? {}) as Record<string, unknown>)) {
            if (typeof v === "string") {
              assert.ok(
                plain.includes(JSON.stringify(v).slice(1, -1)),
                `${where}: ${text} lacks ${v}`,
              );
            }
          }
        }
        // The prompt ids are the prompt: they detokenize to the system prompt and the task.
        const prompt: string = (await post("/detokenize", { tokens: t.promptIds })).content;
        assert.ok(prompt.includes("but it has a bug. Fix it"), `${where}: ${prompt.slice(-300)}`);
      }
    }
    assert.ok(turns >= 4, `only ${turns} model calls`);
    const rows = job.exportTraining();
    assert.equal(rows.length, 4);
    for (const row of rows) {
      const siblings = job.runs.filter((r) => r.group_id === row.group_id);
      // The siblings' rewards, null for one that did not finish (masked).
      assert.deepEqual(
        row.group_rewards,
        siblings.map((r) => rolloutFinished(r) ? r.reward : null),
      );
      // Whole: every sibling graded, none cut off by the infrastructure.
      const whole = siblings.every((r) =>
        r.reward !== null && !RETRYABLE_ERROR_CLASSES.some((c) => c === r.error_class)
      );
      assert.equal(row.group_complete, whole, JSON.stringify(siblings.map((r) => r.error_class)));
      assert.equal(row.tokens_complete, true, `${row.task.slug}#${row.repeat}`);
      assert.ok(row.sequences.length >= 1);
      const covered = row.sequences.flatMap((s) => s.turns);
      assert.deepEqual(covered, row.turns.map((_, i) => i), "every turn is in a sequence");
      for (const s of row.sequences) {
        assert.equal(s.loss_mask.length, s.tokens.length);
        assert.equal(s.logprobs!.length, s.tokens.length);
        // The mask is 1 exactly on the sampled tokens, in order (0 everywhere
        // in a row that is masked: its rollout did not finish).
        const inLoss = s.tokens.filter((_, i) => s.loss_mask[i] === 1);
        const sampled = s.turns.flatMap((i) => row.turns[i].completion_token_ids!);
        assert.deepEqual(inLoss, row.masked ? [] : sampled);
        const lps = s.logprobs!.filter((_, i) => s.loss_mask[i] === 1);
        assert.deepEqual(lps, row.masked ? [] : s.turns.flatMap((i) => row.turns[i].logprobs!));
        // A sequence starts with its first turn's whole prompt.
        const first = row.turns[s.turns[0]].prompt_token_ids!;
        assert.deepEqual(s.tokens.slice(0, first.length), first);
      }
    }
  },
});
