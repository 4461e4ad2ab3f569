// The recording model proxy against scripted model servers that answer in
// vLLM's, sglang's, llama-server's and Anthropic's documented shapes: what
// reaches the server, what the agent gets back, what the trace records.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { serveModelProxy } from "../../proxy/mod.ts";
import { Environment, functionAgent, integer, LocalRuntime, Taskset } from "../../mod.ts";
import { type ModelCallUsage, Trace, traceTokens, traceUsage } from "../../eval/mod.ts";
import { type Received, scriptedServer } from "../agents/_scripted.ts";
import { readSse, sglangChat, sse, vllmChat, vllmChatChunks } from "./_upstream.ts";

const KEY = "sk-upstream-real-key-0123456789";

/** Parsed JSON, walked freely in assertions. */
// deno-lint-ignore no-explicit-any
type Json = any;

function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
}

const CHAT = { model: "policy", messages: [{ role: "user", content: "hi" }] };

function models(trace: Trace) {
  return trace.steps.filter((s) => s.type === "model");
}

test("ModelProxy: a vLLM chat call goes to the server with the key and the token fields; the agent gets the reply as it asked; the trace keeps the tokens", async () => {
  await using server = scriptedServer([
    () => Response.json(vllmChat([1, 2, 3], [7, 8], { content: "ok" })),
  ]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm", apiKey: KEY });
  const trace = new Trace();
  const usage: ModelCallUsage[] = [];
  await using route = proxy.open({ trace }, { onUsage: (u) => usage.push(u) });
  const reply = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, CHAT, {
    authorization: `Bearer ${route.env.OPENAI_API_KEY}`,
  });
  assert.equal(reply.status, 200);
  const json = await reply.json();
  assert.equal(json.choices[0].message.content, "ok");
  // It did not ask for logprobs nor ids: it gets none.
  assert.equal(json.prompt_token_ids, undefined);
  assert.equal(json.choices[0].token_ids, undefined);
  assert.equal(json.choices[0].logprobs, undefined);
  const got = server.received[0];
  assert.equal(got.path, "/v1/chat/completions");
  assert.equal(got.headers.get("authorization"), `Bearer ${KEY}`);
  assert.equal(got.body.return_token_ids, true);
  assert.equal(got.body.logprobs, true);
  assert.deepEqual(got.body.messages, CHAT.messages);
  const [step] = models(trace);
  assert.deepEqual(step.content, {
    request: CHAT.messages,
    params: { model: "policy" },
    reply: { role: "assistant", content: "ok" },
  });
  assert.equal(step.info?.via, "proxy");
  assert.equal(step.info?.input_tokens, 3);
  assert.equal(step.info?.finish_reason, "stop");
  assert.deepEqual(traceTokens(trace.steps), [
    { promptIds: [1, 2, 3], completionIds: [7, 8], logprobs: [-0.25, -0.5] },
  ]);
  assert.deepEqual(usage.map((u) => [u.inputTokens, u.outputTokens]), [[3, 2]]);
  assert.equal(traceUsage(trace.toJSON()).modelCalls, 1);
});

test("ModelProxy: a vLLM stream is relayed event by event, without the fields the agent did not ask for; its tokens are assembled", async () => {
  await using server = scriptedServer([
    () => sse(vllmChatChunks([5, 6], [30, 31, 32], ["a", "b", "c"])),
  ]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm" });
  const trace = new Trace();
  await using route = proxy.open({ trace });
  const reply = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, {
    ...CHAT,
    stream: true,
  }, { authorization: `Bearer ${route.key}` });
  assert.equal(reply.headers.get("content-type"), "text/event-stream");
  const events = (await readSse(reply)).map(([, d]) => d);
  assert.equal(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1) as Record<string, unknown>[];
  // No usage chunk (it did not ask), no ids, no logprobs.
  assert.equal(chunks.length, 4);
  for (const c of chunks) {
    assert.equal(c.prompt_token_ids, undefined);
    assert.equal(c.usage, undefined);
    for (const choice of c.choices as Record<string, unknown>[]) {
      assert.equal(choice.token_ids, undefined);
      assert.equal(choice.logprobs, undefined);
    }
  }
  const body = server.received[0].body;
  assert.equal(body.stream, true);
  assert.deepEqual(body.stream_options, { include_usage: true });
  const [step] = models(trace);
  assert.deepEqual((step.content as Record<string, unknown>).reply, {
    role: "assistant",
    content: "abc",
  });
  assert.equal(step.info?.output_tokens, 3);
  assert.deepEqual(traceTokens(trace.steps)[0], {
    promptIds: [5, 6],
    completionIds: [30, 31, 32],
    logprobs: [-0.5, -0.5, -0.5],
  });
});

test("ModelProxy: what the agent asked for itself it gets, as it asked", async () => {
  await using server = scriptedServer([
    () => sse(vllmChatChunks([5], [30], ["a"])),
  ]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm" });
  await using route = proxy.open({ trace: new Trace() });
  const reply = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, {
    ...CHAT,
    stream: true,
    stream_options: { include_usage: true },
    logprobs: true,
    return_token_ids: true,
  }, { authorization: `Bearer ${route.key}` });
  const chunks = (await readSse(reply)).map(([, d]) => d).slice(0, -1) as Json[];
  assert.deepEqual(chunks[0].prompt_token_ids, [5]);
  assert.deepEqual(chunks[1].choices[0].token_ids, [30]);
  assert.equal(chunks[1].choices[0].logprobs.content[0].logprob, -0.5);
  assert.deepEqual(chunks.at(-1)!.usage, { prompt_tokens: 1, completion_tokens: 1 });
  // Its logprobs keep their text: the proxy did not ask for token_id:N spellings.
  assert.equal(server.received[0].body.return_tokens_as_token_ids, undefined);
});

test("ModelProxy: sglang gives no token ids in a chat stream, so the call is made whole and the agent gets a stream of it", async () => {
  const message = {
    content: null,
    tool_calls: [{
      id: "call_1",
      type: "function",
      function: { name: "bash", arguments: '{"command":"ls"}' },
    }],
  };
  await using server = scriptedServer([
    () => Response.json(sglangChat([9, 8], [4, 5, 6], message)),
  ]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "sglang" });
  const trace = new Trace();
  await using route = proxy.open({ trace });
  const reply = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, {
    ...CHAT,
    stream: true,
    tools: [{ type: "function", function: { name: "bash", parameters: { type: "object" } } }],
  }, { authorization: `Bearer ${route.key}` });
  const body = server.received[0].body;
  assert.equal(body.stream, undefined);
  assert.equal(body.return_token_ids, true);
  assert.equal(body.return_prompt_token_ids, true);
  const events = (await readSse(reply)).map(([, d]) => d) as Json[];
  assert.equal(events.at(-1), "[DONE]");
  const [first, last] = events;
  assert.equal(first.object, "chat.completion.chunk");
  assert.deepEqual(first.choices[0].delta.tool_calls, [{ index: 0, ...message.tool_calls[0] }]);
  assert.equal(first.choices[0].prompt_token_ids, undefined);
  assert.equal(last.choices[0].finish_reason, "tool_calls");
  const [step] = models(trace);
  assert.equal(step.info?.stream, true);
  assert.equal(step.info?.upstream_stream, false);
  assert.deepEqual(traceTokens(trace.steps)[0], {
    promptIds: [9, 8],
    completionIds: [4, 5, 6],
    logprobs: [-1, -1, -1],
  });
});

test("ModelProxy: Completions in vLLM's and sglang's shapes, whole and streamed", async () => {
  const vllm = {
    id: "cmpl-1",
    object: "text_completion",
    model: "policy",
    choices: [{
      index: 0,
      text: " four",
      finish_reason: "stop",
      prompt_token_ids: [11, 12],
      token_ids: [40, 41],
      logprobs: {
        tokens: ["token_id:40", "token_id:41"],
        token_logprobs: [-0.5, -1],
        text_offset: [],
        top_logprobs: [],
      },
    }],
    usage: { prompt_tokens: 2, completion_tokens: 2 },
  };
  const sglangChunks = [
    {
      object: "text_completion",
      choices: [{
        index: 0,
        text: " fo",
        prompt_token_ids: [11, 12],
        token_ids: [40],
        logprobs: { tokens: ["fo"], token_logprobs: [-0.5] },
        finish_reason: null,
      }],
    },
    {
      object: "text_completion",
      choices: [{
        index: 0,
        text: "ur",
        token_ids: [41],
        logprobs: { tokens: ["ur"], token_logprobs: [-1] },
        finish_reason: "stop",
      }],
    },
    { object: "text_completion", choices: [], usage: { prompt_tokens: 2, completion_tokens: 2 } },
    "[DONE]",
  ];
  for (
    const [server, reply, stream] of [["vllm", () => Response.json(vllm), false], [
      "sglang",
      () => sse(sglangChunks),
      true,
    ]] as const
  ) {
    await using upstream = scriptedServer([reply]);
    await using proxy = serveModelProxy({ upstream: upstream.baseUrl, server });
    const trace = new Trace();
    await using route = proxy.open({ trace });
    const res = await post(`${route.env.OPENAI_BASE_URL}/completions`, {
      model: "policy",
      prompt: "2+2 is",
      stream,
    }, { authorization: `Bearer ${route.key}` });
    assert.equal(res.status, 200, server);
    const text = stream
      ? (await readSse(res)).map(([, d]) => (d as Json)?.choices?.[0]?.text ?? "").join("")
      : (await res.json()).choices[0].text;
    assert.equal(text, " four");
    assert.equal(upstream.received[0].body.return_token_ids, true, server);
    assert.equal(upstream.received[0].body.logprobs, 0, server);
    const [step] = models(trace);
    assert.deepEqual(step.content, {
      prompt: "2+2 is",
      params: { model: "policy" },
      reply: { text: " four" },
    });
    assert.deepEqual(traceTokens(trace.steps)[0], {
      promptIds: [11, 12],
      completionIds: [40, 41],
      logprobs: [-0.5, -1],
    }, server);
  }
});

test("ModelProxy: llama-server gives ids in its logprobs and the prompt's through /apply-template and /tokenize", async () => {
  const route = (r: Received) => {
    if (r.path === "/apply-template") return Response.json({ prompt: "<user>hi<assistant>" });
    if (r.path === "/tokenize") return Response.json({ tokens: [100, 101, 102] });
    return Response.json({
      choices: [{
        index: 0,
        finish_reason: "stop",
        message: { role: "assistant", content: "yo" },
        logprobs: {
          content: [{ id: 7, token: "y", logprob: -0.5, top_logprobs: [] }, {
            id: 8,
            token: "o",
            logprob: -1,
            top_logprobs: [],
          }],
        },
      }],
      usage: { prompt_tokens: 3, completion_tokens: 2 },
    });
  };
  await using server = scriptedServer([route, route, route]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "llama-server" });
  const trace = new Trace();
  await using r = proxy.open({ trace });
  const res = await post(`${r.env.OPENAI_BASE_URL}/chat/completions`, CHAT, {
    authorization: `Bearer ${r.key}`,
  });
  assert.equal((await res.json()).choices[0].logprobs, undefined);
  assert.deepEqual(server.received.map((x) => x.path), [
    "/v1/chat/completions",
    "/apply-template",
    "/tokenize",
  ]);
  assert.equal(server.received[0].body.logprobs, true);
  assert.equal(server.received[0].body.top_logprobs, 1);
  assert.deepEqual(server.received[1].body.messages, CHAT.messages);
  assert.deepEqual(traceTokens(trace.steps)[0], {
    promptIds: [100, 101, 102],
    completionIds: [7, 8],
    logprobs: [-0.5, -1],
  });
});

test("ModelProxy: Anthropic's Messages API passed on to a server that speaks it, whole and streamed", async () => {
  const message = {
    id: "msg_1",
    type: "message",
    role: "assistant",
    model: "claude-x",
    content: [{ type: "text", text: "Let me look." }, {
      type: "tool_use",
      id: "toolu_1",
      name: "bash",
      input: { command: "ls" },
    }],
    stop_reason: "tool_use",
    stop_sequence: null,
    usage: { input_tokens: 20, output_tokens: 9, cache_read_input_tokens: 5 },
  };
  const events: [string, unknown][] = [
    ["message_start", {
      type: "message_start",
      message: {
        ...message,
        content: [],
        stop_reason: null,
        usage: { input_tokens: 20, output_tokens: 1, cache_read_input_tokens: 5 },
      },
    }],
    ["content_block_start", {
      type: "content_block_start",
      index: 0,
      content_block: { type: "text", text: "" },
    }],
    ["content_block_delta", {
      type: "content_block_delta",
      index: 0,
      delta: { type: "text_delta", text: "Let me " },
    }],
    ["ping", { type: "ping" }],
    ["content_block_delta", {
      type: "content_block_delta",
      index: 0,
      delta: { type: "text_delta", text: "look." },
    }],
    ["content_block_stop", { type: "content_block_stop", index: 0 }],
    ["content_block_start", {
      type: "content_block_start",
      index: 1,
      content_block: { type: "tool_use", id: "toolu_1", name: "bash", input: {} },
    }],
    ["content_block_delta", {
      type: "content_block_delta",
      index: 1,
      delta: { type: "input_json_delta", partial_json: '{"command"' },
    }],
    ["content_block_delta", {
      type: "content_block_delta",
      index: 1,
      delta: { type: "input_json_delta", partial_json: ':"ls"}' },
    }],
    ["content_block_stop", { type: "content_block_stop", index: 1 }],
    ["message_delta", {
      type: "message_delta",
      delta: { stop_reason: "tool_use", stop_sequence: null },
      usage: { output_tokens: 9 },
    }],
    ["message_stop", { type: "message_stop" }],
  ];
  await using server = scriptedServer([() => Response.json(message), () => sse(events)]);
  await using proxy = serveModelProxy({
    upstream: server.origin,
    server: "anthropic",
    apiKey: KEY,
  });
  const trace = new Trace();
  await using route = proxy.open({ trace });
  const request = {
    model: "claude-x",
    max_tokens: 100,
    system: "be brief",
    messages: [{ role: "user", content: "look" }],
  };
  const headers = {
    "x-api-key": route.env.ANTHROPIC_API_KEY,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "tools-2024",
  };
  const whole = await post(`${route.env.ANTHROPIC_BASE_URL}/v1/messages`, request, headers);
  assert.deepEqual(await whole.json(), message);
  const streamed = await post(`${route.env.ANTHROPIC_BASE_URL}/v1/messages`, {
    ...request,
    stream: true,
  }, headers);
  const got = await readSse(streamed);
  assert.deepEqual(got.map(([name]) => name), events.map(([name]) => name));
  assert.deepEqual(got.map(([, d]) => d), events.map(([, d]) => d));
  for (const r of server.received) {
    assert.equal(r.path, "/v1/messages");
    assert.equal(r.headers.get("x-api-key"), KEY);
    assert.equal(r.headers.get("anthropic-beta"), "tools-2024");
  }
  const steps = models(trace);
  assert.equal(steps.length, 2);
  for (const step of steps) {
    assert.deepEqual((step.content as Record<string, unknown>).reply, {
      role: "assistant",
      content: message.content,
    });
    assert.equal(step.info?.format, "anthropic");
    assert.equal(step.info?.input_tokens, 25);
    assert.equal(step.info?.cached_tokens, 5);
    assert.equal(step.info?.output_tokens, 9);
    assert.equal(step.info?.finish_reason, "tool_use");
    assert.equal(step.info?.tokens, undefined);
  }
  // The second call repeats the first's messages: only the new part is stored.
  assert.deepEqual((steps[1].content as Record<string, unknown>).request, []);
  assert.equal(steps[1].info?.messages_shared, 1);
});

test("ModelProxy: a Messages call to vLLM is made as Chat Completions, for its token ids; the agent gets a message, or a stream of one", async () => {
  const reply = vllmChat([3, 4], [50, 51, 52], {
    content: "Running it.",
    tool_calls: [{
      id: "call_9",
      type: "function",
      function: { name: "bash", arguments: '{"command":"ls -l"}' },
    }],
  }, "tool_calls");
  await using server = scriptedServer([() => Response.json(reply), () => Response.json(reply)]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm" });
  const trace = new Trace();
  await using route = proxy.open({ trace });
  const request = {
    model: "claude-x",
    max_tokens: 64,
    system: [{ type: "text", text: "be brief" }],
    temperature: 0.5,
    stop_sequences: ["END"],
    tools: [{
      name: "bash",
      description: "run",
      input_schema: { type: "object", properties: { command: { type: "string" } } },
    }],
    tool_choice: { type: "any", disable_parallel_tool_use: true },
    messages: [
      { role: "user", content: "list the files" },
      {
        role: "assistant",
        content: [{ type: "tool_use", id: "toolu_0", name: "bash", input: { command: "pwd" } }],
      },
      {
        role: "user",
        content: [{
          type: "tool_result",
          tool_use_id: "toolu_0",
          content: [{ type: "text", text: "/work" }],
        }, { type: "text", text: "go on" }],
      },
    ],
  };
  const headers = { "x-api-key": route.key };
  const message =
    await (await post(`${route.env.ANTHROPIC_BASE_URL}/v1/messages`, request, headers)).json();
  assert.equal(message.type, "message");
  assert.equal(message.model, "claude-x");
  assert.equal(message.stop_reason, "tool_use");
  assert.deepEqual(message.content, [
    { type: "text", text: "Running it." },
    { type: "tool_use", id: "call_9", name: "bash", input: { command: "ls -l" } },
  ]);
  assert.deepEqual(message.usage, { input_tokens: 2, output_tokens: 3 });
  const chat = server.received[0].body;
  assert.equal(server.received[0].path, "/v1/chat/completions");
  assert.deepEqual(chat.messages, [
    { role: "system", content: "be brief" },
    { role: "user", content: "list the files" },
    {
      role: "assistant",
      content: "",
      tool_calls: [{
        id: "toolu_0",
        type: "function",
        function: { name: "bash", arguments: '{"command":"pwd"}' },
      }],
    },
    { role: "tool", tool_call_id: "toolu_0", content: "/work" },
    { role: "user", content: "go on" },
  ]);
  assert.deepEqual(chat.tools, [{
    type: "function",
    function: { name: "bash", description: "run", parameters: request.tools[0].input_schema },
  }]);
  assert.equal(chat.tool_choice, "required");
  assert.equal(chat.parallel_tool_calls, false);
  assert.deepEqual(chat.stop, ["END"]);
  assert.equal(chat.max_tokens, 64);
  assert.equal(chat.return_token_ids, true);
  // Streamed: the same message, as Anthropic's events say it.
  const events = await readSse(
    await post(
      `${route.env.ANTHROPIC_BASE_URL}/v1/messages`,
      { ...request, stream: true },
      headers,
    ),
  );
  assert.deepEqual(events.map(([n]) => n), [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
  ]);
  assert.deepEqual((events[5][1] as Json).delta, {
    type: "input_json_delta",
    partial_json: '{"command":"ls -l"}',
  });
  assert.equal(server.received[1].body.stream, undefined);
  const steps = models(trace);
  assert.equal(steps[0].info?.api, "anthropic.messages");
  assert.deepEqual((steps[0].content as Record<string, unknown>).reply, {
    role: "assistant",
    content: message.content,
  });
  assert.deepEqual(traceTokens(trace.steps)[0], {
    promptIds: [3, 4],
    completionIds: [50, 51, 52],
    logprobs: [-0.25, -0.5, -0.75],
  });
});

test("ModelProxy prices each call, and a job's usage and token limit count a route's calls as a model agent's", async () => {
  await using server = scriptedServer(
    Array(4).fill(() => Response.json(vllmChat([1, 2, 3], [7, 8], { content: "ok" }))),
  );
  await using proxy = serveModelProxy({
    upstream: server.baseUrl,
    server: "vllm",
    pricing: { policy: { input: 1, output: 2 } },
  });
  const env = new Environment("priced");
  const t = env.template({ id: "t", args: { n: integer() } }, async function* () {
    yield "go";
    yield 1;
  });
  // Any agent can take a route: here a function that calls the model twice.
  const agent = functionAgent(async (_prompt, run, context) => {
    await using route = proxy.open(run, context);
    for (let i = 0; i < 2; i++) {
      const res = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, CHAT, {
        authorization: `Bearer ${route.key}`,
      });
      await res.body?.cancel();
    }
    return "done";
  });
  const job = await new Taskset([t({ n: 1 }), t({ n: 2 }), t({ n: 3 })]).run(agent, {
    runtime: new LocalRuntime(env),
    maxConcurrent: 1,
    tokenLimit: 12,
  });
  // Each rollout spends 2 x (3 + 2) = 10 tokens: the second one crosses 12, the third never starts.
  assert.equal(job.stopped?.reason, "token_limit");
  assert.deepEqual(job.runs.map((r) => r.status), ["completed", "completed", "cancelled"]);
  const steps = job.runs[0].trace.steps.filter((s) => s.type === "model");
  assert.equal(steps.length, 2);
  assert.equal(steps[0].info?.cost_usd, (3 * 1 + 2 * 2) / 1e6);
  assert.equal(job.usage.inputTokens, 12);
  assert.equal(job.usage.outputTokens, 8);
  assert.equal(job.usage.modelCalls, 4);
  assert.ok(Math.abs(job.usage.costUsd - 4 * 7 / 1e6) < 1e-12);
});

test("serveModelProxy() refuses bad options before it listens, naming the option", () => {
  const up = "http://127.0.0.1:1/v1";
  const cases: [Parameters<typeof serveModelProxy>[0], string, RegExp][] = [
    [
      { upstream: "ftp://h/v1" },
      "TypeError",
      /^Cannot start model proxy: upstream must be an http\(s\) url, got "ftp:\/\/h\/v1"$/,
    ],
    [{ upstream: "" }, "TypeError", /upstream must be an http\(s\) url, got ""/],
    [
      // deno-lint-ignore no-explicit-any
      { upstream: up, server: "tgi" as any },
      "TypeError",
      /^Cannot start model proxy: server must be one of llama-server, vllm, sglang, openai, anthropic, got "tgi"$/,
    ],
    [
      { upstream: up, model: " " },
      "TypeError",
      /^Cannot start model proxy: model must name a model, got " "$/,
    ],
    [
      { upstream: up, maxRequestBytes: 0 },
      "RangeError",
      /maxRequestBytes must be a positive integer, got "0"/,
    ],
    [
      { upstream: up, callTimeout: 1.5 },
      "RangeError",
      /callTimeout must be a positive integer, got "1.5"/,
    ],
  ];
  for (const [options, name, message] of cases) {
    assert.throws(() => serveModelProxy(options), { name, message }, JSON.stringify(options));
  }
});
