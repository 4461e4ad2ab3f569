// The proxy against a real model server: llama.cpp's llama-server with the
// committed tiny tool-calling model (built outside the tests). Python
// harnesses that know nothing of the SDK run robolab from the command line
// through the proxy; the training rows that export-training writes hold
// token ids that the server detokenizes to the text it returned.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { LLAMA, startLlamaServer } from "../agents/_llama.ts";
import { PYTHON3, pythonExecutable, SANDBOX } from "../_counterparts.ts";
import { rolloutFinished } from "../../eval/mod.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const ROBOLAB = new URL("../../examples/robolab.ts", import.meta.url).pathname;
const FIXTURES = new URL("../fixtures/proxy/", import.meta.url).pathname;

const python = await pythonExecutable();

async function cli(args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { NO_COLOR: "1" },
    stdin: "null",
    signal: AbortSignal.timeout(150_000),
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

async function jsonl(path: string): Promise<Record<string, unknown>[]> {
  return (await Deno.readTextFile(path)).trim().split("\n").map((l) => JSON.parse(l));
}

interface Row {
  group_id: string;
  repeat: number;
  reward: number | null;
  masked: boolean;
  group_rewards: (number | null)[];
  turns: { prompt_token_ids: number[] | null; completion_token_ids: number[] | null }[];
  sequences: { tokens: number[]; loss_mask: number[]; turns: number[] }[];
}

for (
  const [harness, flags] of [
    ["openai_agent.py", ["--stream"]],
    ["anthropic_agent.py", []],
  ] as const
) {
  test({
    name:
      `proxy: ${harness} runs robolab against llama-server from the command line; export-training's token ids are the server's text, with masks and group rewards`,
    needs: [LLAMA, PYTHON3, SANDBOX],
    async fn() {
      await using llama = await startLlamaServer(["-c", "8192", "-np", "2"], 40_000);
      const dir = await Deno.makeTempDir({ prefix: "proxy-llama-" });
      try {
        const agent = [python, "-I", "-S", `${FIXTURES}${harness}`, "--turns", "3", ...flags]
          .join(" ");
        const ran = await cli([
          "eval",
          ROBOLAB,
          "--agent",
          agent,
          "--model-proxy",
          `${llama.base}/v1`,
          "--model-server",
          "llama-server",
          "--limit",
          "2",
          "--group",
          "2",
          "--max-concurrent",
          "2",
          "--timeout",
          "120",
          "--out",
          `${dir}/results.jsonl`,
        ]);
        assert.ok(ran.code === 0 || ran.code === 1, ran.stderr);
        const exported = await cli([
          "export-training",
          `${dir}/results.jsonl`,
          "--out",
          `${dir}/rows.jsonl`,
        ]);
        assert.equal(exported.code, 0, exported.stderr);
        const records = await jsonl(`${dir}/results.jsonl`);
        const rows = await jsonl(`${dir}/rows.jsonl`) as unknown as Row[];
        assert.equal(rows.length, 4);
        const detokenize = async (tokens: number[]) => {
          const r = await fetch(`${llama.base}/detokenize`, {
            method: "POST",
            body: JSON.stringify({ tokens }),
          });
          return String((await r.json()).content);
        };
        let turns = 0;
        for (const row of rows) {
          const record = records.find((r) =>
            r.group_id === row.group_id && r.repeat === row.repeat
          )!;
          const steps = (record.trace as { steps: Record<string, unknown>[] }).steps
            .filter((s) => s.type === "model");
          assert.equal(steps.length, row.turns.length);
          assert.ok(row.turns.length >= 1, "no model call");
          for (const [i, turn] of row.turns.entries()) {
            turns++;
            const where = `${row.group_id}#${row.repeat} call ${i + 1}`;
            assert.ok(turn.completion_token_ids && turn.prompt_token_ids, `${where}: no tokens`);
            // The sampled ids are the text the server returned.
            const text = (await detokenize(turn.completion_token_ids!)).replace(
              /<\|[a-z_]+\|>/g,
              "",
            );
            const reply = (steps[i].content as { reply: Record<string, unknown> }).reply;
            const said = harness === "openai_agent.py"
              ? [
                String(reply.content ?? ""),
                ...((reply.tool_calls ?? []) as { function: { name: string } }[]).map((c) =>
                  c.function.name
                ),
              ]
              : (reply.content as Record<string, unknown>[]).map((b) =>
                b.type === "text" ? String(b.text) : String(b.name)
              );
            for (const piece of said.map((p) => p.trim()).filter((p) => p !== "")) {
              assert.ok(text.includes(piece), `${where}: ${JSON.stringify(text)} lacks ${piece}`);
            }
            // The prompt ids are the prompt: the task is in them.
            const prompt = await detokenize(turn.prompt_token_ids!);
            assert.ok(
              prompt.includes("but it has a bug. Fix it"),
              `${where}: ${prompt.slice(-200)}`,
            );
          }
          // Masks: 1 exactly on the sampled tokens of the turns a sequence holds.
          for (const s of row.sequences) {
            const inLoss = s.tokens.filter((_, k) => s.loss_mask[k] === 1);
            const sampled = s.turns.flatMap((k) => row.turns[k].completion_token_ids!);
            assert.deepEqual(inLoss, row.masked ? [] : sampled);
          }
          assert.deepEqual(row.sequences.flatMap((s) => s.turns), row.turns.map((_, k) => k));
          const siblings = records.filter((r) => r.group_id === row.group_id)
            .sort((a, b) => Number(a.repeat) - Number(b.repeat));
          // The siblings' rewards, null for one that did not finish (masked).
          const rewards = siblings.map((r) =>
            rolloutFinished(r as { reward: number | null; error_class?: string }) ? r.reward : null
          );
          assert.deepEqual(row.group_rewards, rewards);
        }
        assert.ok(turns >= 4, `only ${turns} model calls`);
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    },
  });
}
