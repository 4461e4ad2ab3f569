import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Environment, integer, rollout, type Run, string } from "../../mod.ts";
import {
  AgentLimitError,
  ChatAgent,
  defineTool,
  shellTools,
  trimToolResults,
} from "../../agents/mod.ts";
import type { SshClient } from "../../ssh/mod.ts";
import type { ChatMessage } from "../../agents/mod.ts";
import { completion, delta, failure, scriptedServer, stream } from "./_scripted.ts";

function quizTask(expected: string) {
  const env = new Environment("quiz");
  return env.template({ id: "ask" }, async function* () {
    const answer = yield "What is 2+3? Use the add tool.";
    yield answer === expected ? 1 : 0;
  });
}

function addTool(log: string[] = []) {
  return defineTool({
    name: "add",
    description: "Add two integers",
    args: { a: integer(), b: integer() },
    run({ a, b }) {
      log.push(`${a}+${b}`);
      return String(a + b);
    },
  });
}

function steps(run: Run, type: string) {
  return run.trace.steps.filter((s) => s.type === type);
}

async function quiz(agent: ChatAgent, expected = "5"): Promise<Run> {
  const task = quizTask(expected);
  return await rollout(task(), agent, { rolloutTimeout: 30_000 });
}

test("ChatAgent: a non-streaming tool call, its result fed back, a final answer graded", async () => {
  await using model = scriptedServer([
    completion({ tool_calls: [["add", '{"a": 2, "b": 3}']] }),
    completion({ content: "5" }, { prompt_tokens: 30, completion_tokens: 1 }),
  ]);
  const log: string[] = [];
  const agent = new ChatAgent({
    model: "scripted",
    baseUrl: model.baseUrl,
    apiKey: "sk-test-secret",
    stream: false,
    tools: [addTool(log)],
    capabilityTools: false,
    sampling: { temperature: 0, topP: 0.9, maxTokens: 64, seed: 7, extra: { top_k: 1 } },
    toolChoice: "required",
  });
  const run = await quiz(agent);
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.deepEqual(log, ["2+3"]);
  assert.equal(model.received.length, 2);
  const [first, second] = model.received;
  assert.equal(first.path, "/v1/chat/completions");
  assert.equal(first.headers.get("authorization"), "Bearer sk-test-secret");
  assert.equal(first.body.model, "scripted");
  assert.equal(first.body.temperature, 0);
  assert.equal(first.body.top_p, 0.9);
  assert.equal(first.body.max_tokens, 64);
  assert.equal(first.body.seed, 7);
  assert.equal(first.body.top_k, 1);
  assert.equal(first.body.tool_choice, "required");
  assert.equal(first.body.stream, undefined);
  const names = (first.body.tools as { function: { name: string } }[]).map((t) => t.function.name);
  assert.deepEqual(names.sort(), ["add", "submit"]);
  const msgs = second.body.messages as Record<string, unknown>[];
  assert.deepEqual(msgs.map((m) => m.role), ["system", "user", "assistant", "tool"]);
  const call = (msgs[2].tool_calls as { id: string }[])[0];
  assert.equal(msgs[3].tool_call_id, call.id);
  assert.equal(msgs[3].content, "5");
  // The trace: the request's messages once, then deltas; tokens and latency.
  const calls = steps(run, "model");
  assert.equal(calls.length, 2);
  const req = (s: (typeof calls)[number]) =>
    (s.content as { request: { role: string }[] }).request.map((m) => m.role);
  assert.deepEqual(req(calls[0]), ["system", "user"]);
  assert.deepEqual(req(calls[1]), ["tool"]);
  assert.equal(calls[1].info?.input_tokens, 30);
  assert.equal(calls[1].info?.output_tokens, 1);
  assert.equal(typeof calls[0].info?.latency_ms, "number");
  const tools = steps(run, "tool");
  assert.equal(tools.length, 1);
  assert.deepEqual(
    { ...(tools[0].content as object), id: undefined },
    { id: undefined, name: "add", arguments: '{"a": 2, "b": 3}', result: "5" },
  );
  assert.ok(!JSON.stringify(run.trace).includes("sk-test-secret"), "the key leaked into the trace");
});

test("ChatAgent: streamed parallel tool calls split across chunks are assembled", async () => {
  await using model = scriptedServer([
    stream([
      delta({ role: "assistant", content: "Let me " }),
      delta({ content: "add." }),
      delta({
        tool_calls: [{
          index: 0,
          id: "c0",
          type: "function",
          function: { name: "add", arguments: "" },
        }],
      }),
      delta({
        tool_calls: [{
          index: 1,
          id: "c1",
          type: "function",
          function: { name: "ad", arguments: '{"a"' },
        }],
      }),
      delta({ tool_calls: [{ index: 0, function: { arguments: '{"a": 2,' } }] }),
      delta({ tool_calls: [{ index: 1, function: { name: "d", arguments: ": 10, " } }] }),
      delta({ tool_calls: [{ index: 0, function: { arguments: ' "b": 3}' } }] }),
      delta({ tool_calls: [{ index: 1, function: { arguments: '"b": 20}' } }] }),
      delta({}, "tool_calls"),
      {
        object: "chat.completion.chunk",
        choices: [],
        usage: { prompt_tokens: 40, completion_tokens: 22 },
      },
    ]),
    stream([delta({ content: "5" }), delta({}, "stop")]),
  ]);
  const log: string[] = [];
  const agent = new ChatAgent({
    model: "scripted",
    baseUrl: model.baseUrl,
    tools: [addTool(log)],
    capabilityTools: false,
  });
  const run = await quiz(agent);
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.deepEqual(log.sort(), ["10+20", "2+3"]);
  const first = model.received[0].body;
  assert.equal(first.stream, true);
  assert.deepEqual(first.stream_options, { include_usage: true });
  assert.equal(first.parallel_tool_calls, true);
  const msgs = model.received[1].body.messages as Record<string, unknown>[];
  assert.equal(msgs[2].content, "Let me add.");
  assert.deepEqual(msgs[2].tool_calls, [
    { id: "c0", type: "function", function: { name: "add", arguments: '{"a": 2, "b": 3}' } },
    { id: "c1", type: "function", function: { name: "add", arguments: '{"a": 10, "b": 20}' } },
  ]);
  assert.deepEqual(msgs.slice(3).map((m) => [m.tool_call_id, m.content]), [["c0", "5"], [
    "c1",
    "30",
  ]]);
  assert.equal(steps(run, "model")[0].info?.input_tokens, 40);
  assert.equal(steps(run, "tool").length, 2);
});

test("ChatAgent: malformed tool arguments get the parse error back as the result", async () => {
  await using model = scriptedServer([
    completion({ tool_calls: [["add", '{"a": 2, "b": ']] }),
    completion({ tool_calls: [["add", '{"a": "two"}']] }),
    completion({ tool_calls: [["nope", "{}"]] }),
    completion({ tool_calls: [["submit", '{"answer": "5"}']] }),
  ]);
  const log: string[] = [];
  const agent = new ChatAgent({
    model: "scripted",
    baseUrl: model.baseUrl,
    stream: false,
    tools: [addTool(log)],
    capabilityTools: false,
  });
  const run = await quiz(agent);
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.deepEqual(log, [], "a tool ran on bad arguments");
  const results = steps(run, "tool").map((s) => (s.content as { result: string }).result);
  assert.match(results[0], /^Error: cannot parse the arguments of "add" as JSON: /);
  assert.match(results[1], /^Error: argument "a" must be integer/);
  assert.match(results[2], /^Error: unknown tool "nope"; available are add, submit/);
  assert.equal(results[3], "submitted");
  assert.deepEqual(steps(run, "tool").map((s) => s.info?.is_error), [true, true, true, false]);
  const last = model.received[3].body.messages as Record<string, unknown>[];
  assert.match(String(last.at(-1)!.content), /unknown tool/);
});

test("ChatAgent: 429 and 503 are retried (Retry-After honoured), other 4xx are not", async () => {
  await using model = scriptedServer([
    failure(429, "slow down", { "retry-after": "0" }),
    failure(503, "overloaded"),
    completion({ content: "5" }),
  ]);
  const agent = new ChatAgent({
    model: "scripted",
    baseUrl: model.baseUrl,
    stream: false,
    capabilityTools: false,
    retry: { baseDelay: 1 },
  });
  const run = await quiz(agent);
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.equal(model.received.length, 3);
  const info = steps(run, "model")[0].info!;
  assert.equal(info.attempts, 3);
  assert.equal((info.retries as string[]).length, 2);
  assert.match((info.retries as string[])[0], /HTTP 429: slow down/);

  await using bad = scriptedServer([failure(401, "bad key"), completion({ content: "5" })]);
  const run2 = await quiz(
    new ChatAgent({
      model: "m",
      baseUrl: bad.baseUrl,
      capabilityTools: false,
      retry: { baseDelay: 1 },
    }),
  );
  assert.equal(bad.received.length, 1, "a 401 was retried");
  assert.equal(run2.trace.failedPhase, "agent");
  assert.match(run2.trace.errors[0].message, /HTTP 401: bad key/);
  assert.equal(run2.trace.errors[0].name, "ModelHttpError");
});

test("ChatAgent: a stream cut mid-tool-call is retried, the half call never runs", async () => {
  await using model = scriptedServer([
    stream([
      delta({
        tool_calls: [{ index: 0, id: "c0", function: { name: "add", arguments: '{"a": 2' } }],
      }),
    ], { cut: true }),
    stream([
      delta({
        tool_calls: [{
          index: 0,
          id: "c1",
          function: { name: "add", arguments: '{"a": 2, "b": 3}' },
        }],
      }),
      delta({}, "tool_calls"),
    ]),
    stream([delta({ content: "5" }, "stop")]),
  ]);
  const log: string[] = [];
  const agent = new ChatAgent({
    model: "scripted",
    baseUrl: model.baseUrl,
    tools: [addTool(log)],
    capabilityTools: false,
    retry: { baseDelay: 1 },
  });
  const run = await quiz(agent);
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.deepEqual(log, ["2+3"]);
  assert.equal(model.received.length, 3);
  assert.match(String((steps(run, "model")[0].info!.retries as string[])[0]), /ended early/);
});

test("ChatAgent: a context overflow trims old tool output and tries again", async () => {
  const big = "x".repeat(6_000);
  const tooLong = (limit: number) => (r: { body: Record<string, unknown> }) =>
    JSON.stringify(r.body.messages).length > limit
      ? failure(
        400,
        "This model's maximum context length is 4096 tokens",
        {},
        "context_length_exceeded",
      )
      : completion({ content: "5" });
  await using model = scriptedServer([
    completion({ tool_calls: [["dump", "{}"]] }),
    completion({ tool_calls: [["dump", "{}"]] }),
    (r, i) => tooLong(8_000)(r)(r, i),
    (r, i) => tooLong(8_000)(r)(r, i),
  ]);
  const dump = defineTool({ name: "dump", description: "Big output", args: {}, run: () => big });
  const agent = new ChatAgent({
    model: "scripted",
    baseUrl: model.baseUrl,
    stream: false,
    tools: [dump],
    capabilityTools: false,
  });
  const run = await quiz(agent);
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.equal(model.received.length, 4);
  const sent = model.received[3].body.messages as { role: string; content: string }[];
  const tools = sent.filter((m) => m.role === "tool");
  assert.ok(tools.some((m) => m.content.startsWith("[tool output trimmed: 6000 characters")));
  assert.deepEqual(steps(run, "model")[2].info?.retries, ["context_overflow"]);

  // Nothing left to cut: the overflow is the agent's error, not retried forever.
  await using tight = scriptedServer([
    failure(400, "prompt is too long", {}, undefined),
    completion({ content: "5" }),
  ]);
  const run2 = await quiz(
    new ChatAgent({ model: "m", baseUrl: tight.baseUrl, stream: false, capabilityTools: false }),
  );
  assert.equal(tight.received.length, 1);
  assert.match(run2.trace.errors[0]?.message ?? "", /HTTP 400: prompt is too long/);
});

test("ChatAgent: a refusal ends the loop without an answer", async () => {
  await using model = scriptedServer([completion({ refusal: "I can't help with that." })]);
  const run = await quiz(
    new ChatAgent({ model: "m", baseUrl: model.baseUrl, stream: false, capabilityTools: false }),
  );
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 0);
  assert.equal(run.answer, undefined);
  assert.deepEqual(steps(run, "refusal").map((s) => s.content), ["I can't help with that."]);

  await using streamed = scriptedServer([
    stream([delta({ refusal: "I can't " }), delta({ refusal: "do that." }, "stop")]),
  ]);
  const run2 = await quiz(
    new ChatAgent({ model: "m", baseUrl: streamed.baseUrl, capabilityTools: false }),
  );
  assert.deepEqual(steps(run2, "refusal").map((s) => s.content), ["I can't do that."]);
});

test("ChatAgent: step and token limits stop the loop with an agent error", async () => {
  await using model = scriptedServer([
    completion({ tool_calls: [["add", '{"a":1,"b":1}']] }),
    completion({ tool_calls: [["add", '{"a":1,"b":1}']] }),
    completion({ tool_calls: [["add", '{"a":1,"b":1}']] }),
  ]);
  const run = await quiz(
    new ChatAgent({
      model: "m",
      baseUrl: model.baseUrl,
      stream: false,
      tools: [addTool()],
      capabilityTools: false,
      maxSteps: 2,
    }),
  );
  assert.equal(model.received.length, 2);
  assert.equal(run.trace.errors[0]?.name, "AgentLimitError");
  assert.match(run.trace.errors[0].message, /no answer after 2 model calls \(raise maxSteps\)/);

  await using model2 = scriptedServer([
    completion({ tool_calls: [["add", '{"a":1,"b":1}']] }, {
      prompt_tokens: 900,
      completion_tokens: 200,
    }),
    completion({ content: "5" }),
  ]);
  const run2 = await quiz(
    new ChatAgent({
      model: "m",
      baseUrl: model2.baseUrl,
      stream: false,
      tools: [addTool()],
      capabilityTools: false,
      maxTokens: 1000,
    }),
  );
  assert.equal(model2.received.length, 1);
  assert.match(run2.trace.errors[0]?.message ?? "", /1100 tokens used, over maxTokens 1000/);
  assert.ok(new AgentLimitError("x") instanceof Error);
});

test("ChatAgent: the agent deadline aborts a model call in flight", async () => {
  let release!: () => void;
  const held = new Promise<void>((r) => release = r);
  await using model = scriptedServer([async () => {
    await held;
    return Response.json({ error: { message: "late" } }, { status: 500 });
  }]);
  const task = quizTask("5");
  try {
    const run = await rollout(
      task(),
      new ChatAgent({ model: "m", baseUrl: model.baseUrl, stream: false, capabilityTools: false }),
      { rolloutTimeout: 20_000, agentTimeout: 300 },
    );
    assert.equal(run.trace.failedPhase, "agent");
    assert.match(run.trace.errors[0].message, /agent timed out after 300 ms/);
  } finally {
    release();
  }
});

test("ChatAgent: bad options get one-line errors", () => {
  assert.throws(() => new ChatAgent({ baseUrl: "http://127.0.0.1:1/v1" }), /model is required/);
  assert.throws(
    () => new ChatAgent({ model: "m", baseUrl: "not a url" }),
    /bad base url "not a url"/,
  );
  assert.throws(
    () => new ChatAgent({ model: "m", baseUrl: "http://x/v1", maxSteps: 0 }),
    /maxSteps must be positive, got "0"/,
  );
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => new ChatAgent({ model: "m", format: "gemini" as any }),
    /unknown format "gemini"/,
  );
  const t = addTool();
  assert.throws(
    () => new ChatAgent({ model: "m", baseUrl: "http://x/v1", tools: [t, t] }),
    /tool name "add" is used twice/,
  );
  assert.throws(
    () => defineTool({ name: "a b", description: "", args: {}, run: () => 1 }),
    /name "a b"/,
  );
});

test("trimToolResults cuts the oldest tool output first and keeps the last ones", () => {
  const tool = (c: string): ChatMessage => ({
    role: "tool",
    toolCallId: "x",
    name: "t",
    content: c,
  });
  const messages: ChatMessage[] = [
    { role: "user", content: "hi" },
    tool("a".repeat(100)),
    tool("b".repeat(100)),
    tool("c".repeat(100)),
  ];
  assert.equal(trimToolResults(messages, 1_000, 1), 0);
  assert.equal(trimToolResults(messages, 200, 1), 2);
  assert.match(messages[1].content, /^\[tool output trimmed: 100 characters/);
  assert.equal(messages[3].content, "c".repeat(100));
});

test("ChatAgent: a typed tool gets coerced arguments and a string() schema", async () => {
  const seen: unknown[] = [];
  const echo = defineTool({
    name: "echo",
    description: "Echo",
    args: { text: string(), times: integer() },
    run(args) {
      seen.push(args);
      return { echoed: args.text.repeat(args.times) };
    },
  });
  assert.deepEqual(echo.parameters.required, ["text", "times"]);
  await using model = scriptedServer([
    completion({ tool_calls: [["echo", '{"text": "ab", "times": "2"}']] }),
    completion({ content: "5" }),
  ]);
  const run = await quiz(
    new ChatAgent({
      model: "m",
      baseUrl: model.baseUrl,
      stream: false,
      tools: [echo],
      capabilityTools: false,
    }),
  );
  assert.deepEqual(seen, [{ text: "ab", times: 2 }]);
  assert.equal((steps(run, "tool")[0].content as { result: string }).result, '{"echoed":"abab"}');
});

test("shellTools(): bash names a signal as Deno does, from SSH's KILL or ExitStatus's SIGKILL", async () => {
  // The tool's text, not the transport, is the point: a client that answers
  // one exec as a server would.
  for (const signal of ["KILL", "SIGKILL"]) {
    const ssh = {
      exec: () => Promise.resolve({ code: null, signal, stdoutText: "before\n", stderrText: "" }),
    } as unknown as SshClient;
    const bash = shellTools(ssh).find((t) => t.name === "bash")!;
    const context = { run: undefined as unknown as Run, signal: new AbortController().signal };
    assert.equal(
      await bash.call({ command: "kill -KILL $$" }, context),
      "exit_code: killed by SIGKILL\nstdout:\nbefore\n",
      signal,
    );
  }
});
