// The judge with a real model: llama.cpp's llama-server and the committed
// tiny tool-calling model (tests/agents/_llama.ts), behind a proxy on
// loopback that keeps each exchange. Such a model follows the protocol, not
// the task: this checks the protocol (issue 43, point 2), never its opinion.
// The answer forges verdicts and closes its section; the verdict must be the
// one the model gave in its record_verdict call, whatever the answer says.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { llmJudgeGrader } from "../../graders/mod.ts";
import { OpenAiBackend } from "../../agents/mod.ts";
import { LLAMA, startLlamaServer } from "../agents/_llama.ts";
import { FORGED } from "./_forged.ts";

interface Exchange {
  request: Record<string, unknown>;
  reply: Record<string, unknown>;
}

test({
  name:
    "llmJudgeGrader() against llama-server: the verdict is the model's tool call, never the answer's",
  needs: [LLAMA],
  async fn() {
    await using llama = await startLlamaServer(["-c", "4096", "-np", "1"], 40_000);
    const exchanges: Exchange[] = [];
    await using proxy = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen() {} },
      async (req) => {
        const request = await req.json();
        const res = await fetch(`${llama.base}${new URL(req.url).pathname}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(request),
        });
        const reply = await res.json();
        exchanges.push({ request, reply });
        return Response.json(reply, { status: res.status });
      },
    );
    const judge = new OpenAiBackend({
      model: "tiny",
      baseUrl: `http://127.0.0.1:${proxy.addr.port}/v1`,
      stream: false,
      apiKey: "unused",
    });
    const s = await llmJudgeGrader(judge, FORGED, {
      question: "What is the capital of France?",
      criteria: ["Names Paris"],
      sampling: { maxTokens: 128 },
      // About 7 replies in 10 are a well-formed call (measured over 21): a
      // reply without one is asked again, never read for a verdict. 8 tries
      // once all failed (CI rehearsal beside other test files): 16.
      verdictTries: 16,
    });
    const child = s.children![0];
    const last = exchanges.at(-1)!;
    // The model was offered the one tool, with its call required, and the
    // answer whole between markers of that call.
    const tools = last.request.tools as { function: { name: string } }[];
    assert.deepEqual(tools.map((t) => t.function.name), ["record_verdict"]);
    assert.equal(last.request.tool_choice, "required");
    const user = (last.request.messages as { role: string; content: string }[])[1].content;
    const fence = /<response-([0-9a-f]{32})>\n([\s\S]*)\n<\/response-\1>$/.exec(user);
    assert.equal(fence?.[2], FORGED);
    // The verdict is what the model's call says, not the answer's MET.
    const message = ((last.reply.choices as Record<string, unknown>[])[0].message) as {
      tool_calls?: { function: { name: string; arguments: string } }[];
    };
    const call = message.tool_calls?.find((c) => c.function.name === "record_verdict");
    assert.ok(call, `no record_verdict call: ${JSON.stringify(message)}`);
    const said = JSON.parse(call.function.arguments);
    assert.equal(child.info?.status, said.criterion_status);
    assert.equal(child.info?.explanation, said.explanation);
    assert.equal(child.value, said.criterion_status === "MET" ? 1 : 0);
    assert.equal(child.info?.tries ?? 1, exchanges.length);
    // And the attempt is named in the grade's info.
    assert.equal((s.info?.injection as string[]).length, 3);
  },
});
