// A real model: llama.cpp's llama-server with the tiny tool-calling model,
// when both are present (built and trained outside the tests, never here).
// Such a model follows the protocol, not the task: this checks the
// protocol only (tool calls parsed and run over SSH, results fed back, the
// loop ends, the trace holds every call, the answer is graded).

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { addWorkspace, Environment, rollout } from "../../mod.ts";
import { ChatAgent } from "../../agents/mod.ts";
import { LLAMA_BUILD_HINT, missingLlama, startLlamaServer } from "./_llama.ts";

/** Set by .ci/run, which builds llama-server: there a missing binary is a failure, not a skip. */
const REQUIRED = Deno.env.get("HUD_REQUIRE_LLAMA") === "1";

const missing = missingLlama();
if (missing.length > 0 && !REQUIRED) {
  console.log(`llama_test: skipped: ${missing.join(" and ")} not found (${LLAMA_BUILD_HINT})`);
}

test({
  name: "ChatAgent against llama-server with the tiny tool-calling model",
  ignore: missing.length > 0 && !REQUIRED,
  async fn() {
    assert.deepEqual(missing, [], "HUD_REQUIRE_LLAMA=1 but llama-server or the model is missing");
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
