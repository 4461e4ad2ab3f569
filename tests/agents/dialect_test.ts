// agents/_dialect.ts's StreamAssembler: the one assembler of streamed
// Chat Completions and Completions chunks, which OpenAiBackend and the
// recording proxy both read their streams with.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { StreamAssembler } from "../../agents/_dialect.ts";

test("StreamAssembler puts a chat stream together: text, reasoning, refusal, tool calls by index, usage, tokens", () => {
  const chunks = new StreamAssembler("chat");
  const choice = (delta: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
    model: "m-1",
    choices: [{ index: 0, delta, ...extra }],
  });
  chunks.add({ ...choice({ role: "assistant", content: "" }), prompt_token_ids: [1, 2] });
  chunks.add(choice({ reasoning_content: "thinking" }, { token_ids: [7] }));
  chunks.add(choice({ content: "Hel" }, { token_ids: [8] }));
  chunks.add(choice({ content: "lo" }, { token_ids: [9] }));
  chunks.add(choice({ refusal: "no" }));
  // The second call's pieces come first; the first call has no id.
  chunks.add(
    choice({ tool_calls: [{ index: 1, id: "b", function: { name: "ls", arguments: "" } }] }),
  );
  chunks.add(choice({ tool_calls: [{ index: 0, function: { name: "ca", arguments: '{"x"' } }] }));
  chunks.add(choice({ tool_calls: [{ index: 0, function: { name: "t", arguments: ":1}" } }] }));
  assert.equal(
    chunks.finishReason,
    null,
    "no finish reason yet: a stream ending here was cut short",
  );
  chunks.add({ ...choice({}, { finish_reason: "tool_calls" }), model: "m-2" });
  chunks.add({ choices: [], usage: { prompt_tokens: 2, completion_tokens: 3 } });
  assert.equal(chunks.text, "Hello");
  assert.equal(chunks.reasoning, "thinking");
  assert.equal(chunks.refusal, "no");
  assert.equal(chunks.finishReason, "tool_calls");
  assert.equal(chunks.model, "m-1", "the first chunk's model");
  assert.deepEqual(chunks.usage, { inputTokens: 2, outputTokens: 3 });
  assert.deepEqual(chunks.toolCalls(), [
    { id: "call_0", name: "cat", arguments: '{"x":1}' },
    { id: "b", name: "ls", arguments: "" },
  ]);
  assert.deepEqual(chunks.tokens(), {
    promptIds: [1, 2],
    completionIds: [7, 8, 9],
    logprobs: null,
  });
});

test("StreamAssembler puts a completions stream together: the choices' text and their logprobs' ids", () => {
  const chunks = new StreamAssembler("completions");
  const lp = (token: string, logprob: number) => ({ tokens: [token], token_logprobs: [logprob] });
  chunks.add({ choices: [{ text: "4", logprobs: lp("token_id:19", -0.5) }] });
  // A chat delta in a completions stream is not text.
  chunks.add({
    choices: [{ text: "2", delta: { content: "x" }, logprobs: lp("token_id:20", -1) }],
  });
  chunks.add({ choices: [{ text: "", finish_reason: "stop" }] });
  assert.equal(chunks.text, "42");
  assert.equal(chunks.finishReason, "stop");
  assert.deepEqual(chunks.toolCalls(), []);
  assert.deepEqual(chunks.tokens(), {
    promptIds: null,
    completionIds: [19, 20],
    logprobs: [-0.5, -1],
  });
});
