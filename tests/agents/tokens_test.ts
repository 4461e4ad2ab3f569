// Token capture over scripted OpenAI-compatible servers that answer as
// vLLM and llama-server do (the real llama-server is in llama_test.ts).

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Environment, rollout } from "../../mod.ts";
import { ChatAgent, OpenAiBackend } from "../../agents/mod.ts";
import { traceTokens, trainingRows } from "../../eval/mod.ts";
import { delta, type Received, scriptedServer, stream } from "./_scripted.ts";

const REQUEST = {
  messages: [{ role: "user" as const, content: "hi" }],
  tools: [],
  tokens: true,
};

/** A vLLM-shaped reply: prompt ids at the top, the completion's in the choice, `token_id:N` logprobs. */
function vllmReply(prompt: number[], ids: number[], text: string, usePromptCount = prompt.length) {
  return () =>
    Response.json({
      id: "cmpl-1",
      object: "chat.completion",
      prompt_token_ids: prompt,
      choices: [{
        index: 0,
        finish_reason: "stop",
        message: { role: "assistant", content: text },
        token_ids: ids,
        logprobs: {
          content: ids.map((id, i) => ({ token: `token_id:${id}`, logprob: -0.5 * (i + 1) })),
        },
      }],
      usage: { prompt_tokens: usePromptCount, completion_tokens: ids.length },
    });
}

test("OpenAiBackend reads vLLM's token ids, prompt ids and token_id:N logprobs", async () => {
  await using server = scriptedServer([vllmReply([1, 2, 3], [40, 41], "ok")]);
  const backend = new OpenAiBackend({ model: "m", baseUrl: server.baseUrl, stream: false });
  const reply = await backend.complete(REQUEST, AbortSignal.timeout(10_000));
  assert.deepEqual(reply.tokens, {
    promptIds: [1, 2, 3],
    completionIds: [40, 41],
    logprobs: [-0.5, -1],
  });
  const body = server.received[0].body;
  assert.equal(body.logprobs, true);
  assert.equal(body.return_token_ids, true);
  assert.equal(body.return_tokens_as_token_ids, true);
});

test("OpenAiBackend asks for nothing of the kind when a request does not want tokens", async () => {
  await using server = scriptedServer([vllmReply([1], [2], "ok"), vllmReply([1], [2], "ok")]);
  const plain = new OpenAiBackend({ model: "m", baseUrl: server.baseUrl, stream: false });
  await plain.complete({ ...REQUEST, tokens: false }, AbortSignal.timeout(10_000));
  const own = new OpenAiBackend({
    model: "m",
    baseUrl: server.baseUrl,
    stream: false,
    tokenFields: {},
  });
  await own.complete(REQUEST, AbortSignal.timeout(10_000));
  const [a, b] = server.received.map((r) => r.body);
  for (const k of ["logprobs", "return_token_ids", "return_tokens_as_token_ids"]) {
    assert.equal(a[k], undefined, k);
  }
  assert.equal(b.logprobs, true);
  assert.equal(b.return_token_ids, undefined);
});

test("OpenAiBackend assembles token ids and logprobs from a stream's chunks", async () => {
  const chunk = (d: Record<string, unknown>, ids: number[], finish: string | null = null) => ({
    ...(delta(d, finish) as Record<string, unknown>),
    choices: [{
      index: 0,
      delta: d,
      finish_reason: finish,
      token_ids: ids,
      logprobs: { content: ids.map((id) => ({ token: `token_id:${id}`, logprob: -id / 100 })) },
    }],
  });
  await using server = scriptedServer([
    stream([
      { ...chunk({ role: "assistant", content: "He" }, [7]), prompt_token_ids: [1, 2] },
      chunk({ content: "llo" }, [8, 9]),
      chunk({}, [10], "stop"),
      { choices: [], usage: { prompt_tokens: 2, completion_tokens: 4 } },
    ]),
  ]);
  const backend = new OpenAiBackend({ model: "m", baseUrl: server.baseUrl });
  const reply = await backend.complete(REQUEST, AbortSignal.timeout(10_000));
  assert.equal(reply.content, "Hello");
  assert.deepEqual(reply.tokens, {
    promptIds: [1, 2],
    completionIds: [7, 8, 9, 10],
    logprobs: [-0.07, -0.08, -0.09, -0.1],
  });
  assert.equal(server.received[0].body.stream, true);
});

test("OpenAiBackend: a server that refuses logprobs in a stream is asked without streaming, from then on", async () => {
  // llama-server: "logprobs is not supported with tools + stream".
  const refuse = () =>
    Response.json({
      error: {
        code: 400,
        message: "logprobs is not supported with tools + stream",
        type: "invalid_request_error",
      },
    }, { status: 400 });
  const llamaReply = (ids: number[]) => () =>
    Response.json({
      choices: [{
        index: 0,
        finish_reason: "stop",
        message: { role: "assistant", content: "x" },
        logprobs: {
          content: ids.map((id) => ({
            id,
            token: "x",
            bytes: [120],
            logprob: -1,
            top_logprobs: [],
          })),
        },
      }],
      usage: { prompt_tokens: 5, completion_tokens: ids.length },
    });
  await using server = scriptedServer([refuse, llamaReply([3, 4]), llamaReply([5])]);
  const backend = new OpenAiBackend({ model: "m", baseUrl: server.baseUrl });
  const first = await backend.complete(REQUEST, AbortSignal.timeout(10_000));
  const second = await backend.complete(REQUEST, AbortSignal.timeout(10_000));
  assert.deepEqual(first.tokens?.completionIds, [3, 4]);
  assert.deepEqual(second.tokens?.completionIds, [5]);
  assert.deepEqual(server.received.map((r) => r.body.stream ?? false), [true, false, false]);
  // The prompt's ids are not in llama-server's reply: none, rather than a guess.
  assert.equal(first.tokens?.promptIds, null);
});

test("OpenAiBackend with promptTokens llama-server: prompt ids from /apply-template and /tokenize, kept only when they count the prompt", async () => {
  const paths: string[] = [];
  const route = (r: Received) => {
    paths.push(r.path);
    if (r.path === "/apply-template") return Response.json({ prompt: "<|im_start|>user\nhi" });
    if (r.path === "/tokenize") {
      assert.deepEqual(r.body, {
        content: "<|im_start|>user\nhi",
        add_special: true,
        parse_special: true,
      });
      return Response.json({ tokens: [100, 200, 300] });
    }
    return Response.json({
      choices: [{
        index: 0,
        finish_reason: "stop",
        message: { role: "assistant", content: "x" },
        logprobs: { content: [{ id: 9, token: "x", logprob: -0.25 }] },
      }],
      // The first call's prompt is 3 tokens; the second's usage says 4.
      usage: {
        prompt_tokens: paths.filter((p) => p.endsWith("completions")).length + 2,
        completion_tokens: 1,
      },
    });
  };
  await using server = scriptedServer(Array(6).fill(route));
  const backend = new OpenAiBackend({
    model: "m",
    baseUrl: server.baseUrl,
    stream: false,
    promptTokens: "llama-server",
  });
  const first = await backend.complete(REQUEST, AbortSignal.timeout(10_000));
  assert.deepEqual(first.tokens, {
    promptIds: [100, 200, 300],
    completionIds: [9],
    logprobs: [-0.25],
  });
  const second = await backend.complete(REQUEST, AbortSignal.timeout(10_000));
  assert.equal(second.tokens?.promptIds, null, "a count that disagrees must not be kept");
  assert.deepEqual(paths, [
    "/v1/chat/completions",
    "/apply-template",
    "/tokenize",
    "/v1/chat/completions",
    "/apply-template",
    "/tokenize",
  ]);
  // /apply-template gets the chat request itself, so that it renders the same prompt.
  assert.deepEqual(server.received[1].body.messages, server.received[0].body.messages);
});

test("ChatAgent with tokens keeps each call's tokens in its model step, and training rows use them", async () => {
  const env = new Environment("tok");
  const task = env.template({ id: "say" }, async function* () {
    const answer = yield "Say ok, then submit it.";
    yield answer === "ok" ? 1 : 0;
  });
  const call = (id: string, name: string, args: string) => ({
    id,
    type: "function",
    function: { name, arguments: args },
  });
  const toolReply = (prompt: number[], ids: number[]) => () =>
    Response.json({
      prompt_token_ids: prompt,
      choices: [{
        index: 0,
        finish_reason: "tool_calls",
        message: {
          role: "assistant",
          content: null,
          tool_calls: [call("c1", "submit", '{"answer":"ok"}')],
        },
        token_ids: ids,
        logprobs: { content: ids.map((id) => ({ token: `token_id:${id}`, logprob: -1 })) },
      }],
      usage: { prompt_tokens: prompt.length, completion_tokens: ids.length },
    });
  await using server = scriptedServer([toolReply([1, 2, 3, 4], [50, 51, 52])]);
  const agent = new ChatAgent({
    model: "m",
    baseUrl: server.baseUrl,
    stream: false,
    capabilityTools: false,
    tokens: true,
  });
  const run = await rollout(task(), agent, { rolloutTimeout: 30_000 });
  assert.equal(run.reward, 1, JSON.stringify(run.trace.errors));
  const json = run.trace.toJSON();
  const model = json.steps.find((s) => s.type === "model")!;
  // Compact in the trace: base64, not arrays of numbers.
  const stored = model.info!.tokens as Record<string, unknown>;
  assert.equal(typeof stored.completion_ids, "string");
  assert.equal(stored.n, 3);
  assert.deepEqual(traceTokens(json.steps), [{
    promptIds: [1, 2, 3, 4],
    completionIds: [50, 51, 52],
    logprobs: [-1, -1, -1],
  }]);
  const [row] = trainingRows([{
    job_id: "j",
    group_id: "j:say",
    task: run.task,
    repeat: 0,
    status: "completed",
    reward: run.reward,
    failed_phase: null,
    trace: json,
  }]);
  assert.deepEqual(row.sequences[0].tokens, [1, 2, 3, 4, 50, 51, 52]);
  assert.deepEqual(row.sequences[0].loss_mask, [0, 0, 0, 0, 1, 1, 1]);
  assert.deepEqual(row.messages.map((m) => m.role), ["system", "user", "assistant"]);
});
