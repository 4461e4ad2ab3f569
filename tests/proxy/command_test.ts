// Command agents that know nothing of the SDK (Python scripts over the
// standard library, tests/fixtures/proxy/) recorded through the proxy: the
// training rows their rollouts make, split where a harness re-renders its
// history, and the server's key kept out of their reach.

import { PYTHON3, pythonExecutable } from "../_counterparts.ts";
import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { LocalRuntime, Taskset } from "../../mod.ts";
import { CommandAgent, type ModelRouter } from "../../agents/mod.ts";
import { trainingRows } from "../../eval/mod.ts";
import { serveModelProxy } from "../../proxy/mod.ts";
import { scriptedServer } from "../agents/_scripted.ts";
import { END, toyLabServer, toyPrompt } from "./_upstream.ts";
import { env as toylab, PROMPT, tasks } from "../fixtures/proxy/toylab_env.ts";

// The interpreter itself, not pyenv's launcher (see python_interop_test.ts).
const python = await pythonExecutable();

const FIXTURES = new URL("../fixtures/proxy/", import.meta.url).pathname;
const SYSTEM = "You are an agent in a shell. Use the bash tool, then answer.";
const KEY = "sk-real-upstream-key-kept-by-the-proxy";

function harness(script: string, ...flags: string[]): string[] {
  return [python, "-I", "-S", `${FIXTURES}${script}`, ...flags];
}

const lab = () => toylab;
const TASK = tasks[0];

test({
  name:
    "CommandAgent through the proxy: a harness that keeps its history is one sample per rollout, one that re-renders it at turn 3 is two, split at turn 2 with the reason",
  needs: [PYTHON3],
  async fn(t) {
    await using server = toyLabServer(8);
    await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm", apiKey: KEY });
    const router: ModelRouter = proxy;
    const runtime = new LocalRuntime(lab());
    for (const stream of [false, true]) {
      await t.step(`keeps its history${stream ? ", streamed" : ""}`, async () => {
        const agent = new CommandAgent(
          harness("openai_agent.py", ...(stream ? ["--stream"] : [])),
          {
            modelProxy: router,
          },
        );
        const job = await new Taskset([TASK]).run(agent, { runtime, group: 2 });
        assert.deepEqual(job.runs.map((r) => r.reward), [1, 1]);
        for (const row of trainingRows(job.runs)) {
          assert.equal(row.turns.length, 3);
          assert.equal(row.sequences.length, 1, JSON.stringify(row.sequences.map((s) => s.split)));
          const [seq] = row.sequences;
          assert.equal(seq.split, null);
          // The sequence is the last prompt and its completion; the loss is on the model's tokens only.
          const last = row.turns[2];
          assert.deepEqual(seq.tokens, [...last.prompt_token_ids!, ...last.completion_token_ids!]);
          const sampled = row.turns.flatMap((turn) => turn.completion_token_ids!);
          assert.deepEqual(seq.tokens.filter((_, i) => seq.loss_mask[i] === 1), sampled);
          assert.deepEqual(row.group_rewards, [1, 1]);
          assert.equal(row.masked, false);
          assert.equal(row.messages.at(-1)?.content, "done");
        }
      });
    }
    await t.step("re-renders at turn 3", async () => {
      const agent = new CommandAgent(harness("openai_agent.py", "--rerender"), {
        modelProxy: proxy,
      });
      const job = await new Taskset([TASK]).run(agent, { runtime, group: 1 });
      const [row] = trainingRows(job.runs);
      assert.equal(row.turns.length, 3);
      assert.deepEqual(row.sequences.map((s) => s.turns), [[0, 1], [2]]);
      // The summary replaced the history right after the task's prompt.
      const head = toyPrompt([{ role: "system", content: SYSTEM }, {
        role: "user",
        content: PROMPT,
      }]);
      assert.deepEqual(row.sequences[1].split, {
        turn: 2,
        reason: "diverged",
        position: head.length - 2,
        expected: END,
        got: "\n".codePointAt(0),
      });
    });
    assert.equal(proxy.routes, 0, "every run's route was closed");
  },
});

test({
  name:
    "CommandAgent through the proxy: the server's key is in neither the agent's environment nor the results file",
  needs: [PYTHON3],
  async fn() {
    await using server = toyLabServer(1);
    await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm", apiKey: KEY });
    const dir = await Deno.makeTempDir();
    const saved = Deno.env.get("OPENAI_API_KEY");
    // The job's own environment holds the key, under its name and another.
    Deno.env.set("OPENAI_API_KEY", KEY);
    Deno.env.set("HUD_T_KEY_COPY", `Bearer ${KEY}`);
    try {
      const envDump = `${dir}/env.json`;
      const agent = new CommandAgent(harness("openai_agent.py", "--print-env", envDump), {
        modelProxy: proxy,
        passEnv: ["OPENAI_*", "HUD_T_*"],
      });
      const out = `${dir}/results.jsonl`;
      const job = await new Taskset([TASK]).run(agent, { runtime: new LocalRuntime(lab()), out });
      assert.equal(job.runs[0].reward, 1);
      const seen = JSON.parse(await Deno.readTextFile(envDump));
      assert.match(seen.OPENAI_API_KEY, /^hudr_/);
      assert.match(seen.OPENAI_BASE_URL, /^http:\/\/127\.0\.0\.1:\d+\/r\/hudr_/);
      assert.equal(seen.HUD_T_KEY_COPY, undefined);
      assert.doesNotMatch(JSON.stringify(seen), new RegExp(KEY));
      assert.doesNotMatch(await Deno.readTextFile(out), new RegExp(KEY));
      assert.equal(server.received[0].headers.get("authorization"), `Bearer ${KEY}`);
      assert.equal(job.runs[0].agent?.settings?.model_proxy, true);
    } finally {
      if (saved === undefined) Deno.env.delete("OPENAI_API_KEY");
      else Deno.env.set("OPENAI_API_KEY", saved);
      Deno.env.delete("HUD_T_KEY_COPY");
      await Deno.remove(dir, { recursive: true });
    }
  },
});

test({
  name:
    "CommandAgent through the proxy: an Anthropic-shaped harness is recorded against a server that speaks Messages, and tokenized when the server is vLLM",
  needs: [PYTHON3],
  async fn(t) {
    const runtime = new LocalRuntime(lab());
    await t.step("a Messages server: calls, usage and rewards, no token ids", async () => {
      let n = 0;
      const reply = () => {
        const done = ++n % 2 === 0;
        return Response.json({
          id: `msg_${n}`,
          type: "message",
          role: "assistant",
          model: "claude-test",
          content: done
            ? [{ type: "text", text: "done" }]
            : [{ type: "tool_use", id: `toolu_${n}`, name: "bash", input: { command: "ls" } }],
          stop_reason: done ? "end_turn" : "tool_use",
          usage: { input_tokens: 30 + n, output_tokens: 5 },
        });
      };
      await using server = scriptedServer(Array(4).fill(reply));
      await using proxy = serveModelProxy({
        upstream: server.origin,
        server: "anthropic",
        apiKey: KEY,
      });
      for (const stream of [false, true]) {
        const agent = new CommandAgent(
          harness("anthropic_agent.py", ...(stream ? ["--stream"] : [])),
          { modelProxy: proxy },
        );
        const job = await new Taskset([TASK]).run(agent, { runtime });
        assert.equal(job.runs[0].reward, 1);
        const [row] = trainingRows(job.runs);
        assert.equal(row.turns.length, 2);
        assert.deepEqual(row.sequences, []);
        assert.equal(row.tokens_complete, false);
        assert.deepEqual(row.messages.at(-1), {
          role: "assistant",
          content: [{ type: "text", text: "done" }],
        });
        assert.equal(job.usage.modelCalls, 2);
      }
      for (const r of server.received) assert.equal(r.headers.get("x-api-key"), KEY);
    });
    await t.step("vLLM, through Chat Completions: one sample of the server's tokens", async () => {
      await using server = toyLabServer(2);
      await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm" });
      const agent = new CommandAgent(harness("anthropic_agent.py"), { modelProxy: proxy });
      const job = await new Taskset([TASK]).run(agent, { runtime });
      assert.equal(job.runs[0].reward, 1);
      const [row] = trainingRows(job.runs);
      assert.equal(row.turns.length, 3);
      assert.equal(row.tokens_complete, true);
      assert.equal(row.sequences.length, 1, JSON.stringify(row.sequences.map((s) => s.split)));
      assert.equal(server.received[0].path, "/v1/chat/completions");
    });
  },
});
