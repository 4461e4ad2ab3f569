// The proxy is reachable by the agent: every way it can be addressed gets
// the attack that would mix rollouts, forge tokens or reach the server
// around it. Each asserts that the model server was not reached (or got
// only what the proxy allows) and what the agent got back.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { serveModelProxy } from "../../proxy/mod.ts";
import { AdaptiveConcurrency, Trace } from "../../eval/mod.ts";
import { redactSecrets } from "../../_internal/redact.ts";
import { completion, failure, scriptedServer } from "../agents/_scripted.ts";
import { sse, vllmChat, vllmChatChunks } from "./_upstream.ts";

const KEY = "sk-upstream-real-key-0123456789";
const CHAT = { model: "m", messages: [{ role: "user", content: "hi" }] };

function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** The status of a reply, its body discarded. */
async function statusOf(res: Promise<Response>): Promise<number> {
  const r = await res;
  await r.body?.cancel();
  return r.status;
}

/** Sends `path` as written (fetch would resolve `..` first) and returns the status. */
async function rawStatus(port: number, path: string, headers: Record<string, string>) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    const body = JSON.stringify(CHAT);
    const head = [
      `POST ${path} HTTP/1.1`,
      `host: 127.0.0.1:${port}`,
      "content-type: application/json",
      `content-length: ${body.length}`,
      "connection: close",
      ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    ].join("\r\n");
    await conn.write(new TextEncoder().encode(`${head}\r\n\r\n${body}`));
    const chunks: Uint8Array[] = [];
    const buf = new Uint8Array(4096);
    for (;;) {
      const n = await conn.read(buf);
      if (n === null) break;
      chunks.push(buf.slice(0, n));
    }
    const text = new TextDecoder().decode(new Uint8Array(chunks.flatMap((c) => [...c])));
    return Number(text.split(" ")[1]);
  } finally {
    conn.close();
  }
}

test("ModelProxy refuses a request without its rollout's credential", async (t) => {
  await using server = scriptedServer(Array(8).fill(completion({ content: "ok" })));
  await using proxy = serveModelProxy({ upstream: server.baseUrl, apiKey: KEY });
  const a = proxy.open({ trace: new Trace() });
  const b = proxy.open({ trace: new Trace() });
  const url = `${proxy.url}/v1/chat/completions`;
  const [, aId, aSecret] = a.key.split("_");
  const [, , bSecret] = b.key.split("_");
  const refused = async (res: Response) => {
    assert.equal(res.status, 401);
    assert.match((await res.json()).error.message, /no valid credential/);
  };
  await t.step("none, or the server's own key", async () => {
    await refused(await post(url, CHAT));
    await refused(await post(url, CHAT, { authorization: `Bearer ${KEY}` }));
  });
  await t.step("a guessed secret, or another rollout's id with one's own secret", async () => {
    await refused(await post(url, CHAT, { authorization: `Bearer hudr_${aId}_${"0".repeat(64)}` }));
    await refused(await post(url, CHAT, { authorization: `Bearer hudr_${aId}_${bSecret}` }));
    await refused(await post(url, CHAT, { "x-api-key": `hudr_${aId}_${bSecret}` }));
    assert.notEqual(aSecret, bSecret);
  });
  await t.step("one's own url with another rollout's credential as the key", async () => {
    await refused(
      await post(`${a.env.OPENAI_BASE_URL}/chat/completions`, CHAT, {
        authorization: `Bearer ${b.key}`,
      }),
    );
  });
  assert.equal(server.received.length, 0, "nothing reached the model server");
  await t.step("its own, as the key or in the url (with any other key)", async () => {
    assert.equal(await statusOf(post(url, CHAT, { authorization: `Bearer ${a.key}` })), 200);
    assert.equal(await statusOf(post(url, CHAT, { "x-api-key": b.key })), 200);
    const viaUrl = post(`${a.env.OPENAI_BASE_URL}/chat/completions`, CHAT, {
      authorization: "Bearer sk-whatever-the-harness-sends",
    });
    assert.equal(await statusOf(viaUrl), 200);
  });
  await t.step("after the rollout ended", async () => {
    await a.close();
    await refused(await post(`${a.env.OPENAI_BASE_URL}/chat/completions`, CHAT));
    await refused(await post(url, CHAT, { authorization: `Bearer ${a.key}` }));
    assert.equal(await statusOf(post(url, CHAT, { authorization: `Bearer ${b.key}` })), 200);
  });
  await b.close();
  assert.equal(server.received.length, 4);
});

test("ModelProxy refuses token ids, embeddings, echoes and extra samples in a request, and asks for the tokens whatever it says", async (t) => {
  await using server = scriptedServer([() => Response.json(vllmChat([1], [2], { content: "x" }))]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "sglang" });
  const trace = new Trace();
  await using route = proxy.open({ trace });
  const chat = `${route.env.OPENAI_BASE_URL}/chat/completions`;
  const complete = `${route.env.OPENAI_BASE_URL}/completions`;
  const auth = { authorization: `Bearer ${route.key}` };
  const forged: [string, string, Record<string, unknown>][] = [
    ["chat", "input_ids", { ...CHAT, input_ids: [1, 2, 3] }],
    ["chat", "prompt_token_ids", { ...CHAT, prompt_token_ids: [1, 2, 3] }],
    ["chat", "prompt_embeds", { ...CHAT, prompt_embeds: "AAAA" }],
    ["chat", "n", { ...CHAT, n: 2 }],
    ["chat", "echo", { ...CHAT, echo: true }],
    ["completions", "echo", { model: "m", prompt: "a", echo: true, logprobs: 1 }],
    ["completions", "best_of", { model: "m", prompt: "a", best_of: 3 }],
    ["completions", "use_beam_search", { model: "m", prompt: "a", use_beam_search: true }],
    ["completions", "prompt", { model: "m", prompt: [[1, 2], [3]] }],
  ];
  for (const [api, field, body] of forged) {
    await t.step(`${api}: ${field}`, async () => {
      const res = await post(api === "chat" ? chat : complete, body, auth);
      assert.equal(res.status, 400);
      assert.match((await res.json()).error.message, new RegExp(`"${field}"`));
    });
  }
  assert.equal(server.received.length, 0);
  const refusals = trace.steps.filter((s) => s.type === "model_error");
  assert.equal(refusals.length, forged.length, "each refusal is in the trace");
  await t.step("logprobs and return_token_ids turned off by the agent are turned on", async () => {
    const res = await post(chat, {
      ...CHAT,
      logprobs: false,
      return_token_ids: false,
      return_prompt_token_ids: false,
    }, auth);
    assert.equal(res.status, 200);
    const sent = server.received[0].body;
    assert.equal(sent.logprobs, true);
    assert.equal(sent.return_token_ids, true);
    assert.equal(sent.return_prompt_token_ids, true);
    // And what it turned off it does not get.
    const json = await res.json();
    assert.equal(json.choices[0].logprobs, undefined);
    assert.equal(json.prompt_token_ids, undefined);
  });
});

test("ModelProxy refuses a body over maxRequestBytes, declared or streamed, before the server sees it", async () => {
  await using server = scriptedServer([completion({ content: "ok" })]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, maxRequestBytes: 4096 });
  await using route = proxy.open({ trace: new Trace() });
  const url = `${route.env.OPENAI_BASE_URL}/chat/completions`;
  const big = { ...CHAT, messages: [{ role: "user", content: "x".repeat(10_000) }] };
  const declared = await post(url, big, { authorization: `Bearer ${route.key}` });
  assert.equal(declared.status, 413);
  assert.match((await declared.json()).error.message, /maxRequestBytes/);
  // No content-length: the body is cut off as it arrives.
  const bytes = new TextEncoder().encode(JSON.stringify(big));
  const streamed = await fetch(url, {
    method: "POST",
    headers: { authorization: `Bearer ${route.key}` },
    body: new ReadableStream({
      start(c) {
        for (let i = 0; i < bytes.length; i += 1000) c.enqueue(bytes.slice(i, i + 1000));
        c.close();
      },
    }),
  });
  assert.equal(streamed.status, 413);
  await streamed.body?.cancel();
  assert.equal(server.received.length, 0);
  const ok = await post(url, CHAT, { authorization: `Bearer ${route.key}` });
  assert.equal(ok.status, 200);
  await ok.body?.cancel();
});

test("ModelProxy answers only its four endpoints: traversal in the url reaches nothing else of the server", async () => {
  await using server = scriptedServer(Array(2).fill(completion({ content: "ok" })));
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm" });
  await using route = proxy.open({ trace: new Trace() });
  const port = proxy.addr.port;
  const cred = route.key;
  const auth = { authorization: `Bearer ${cred}` };
  for (
    const path of [
      `/r/${cred}/../../apply-template`,
      `/r/${cred}/v1/../../slots`,
      `/r/${cred}/v1/%2e%2e/%2e%2e/props`,
      `/r/${cred}/%2e%2e/tokenize`,
      "/v1/chat/completions/../../../slots?action=erase",
      `/r/${cred}/v1/chat/completions/..`,
      `/r/${cred}/../v1/chat/completions`,
      "/v1//chat/completions",
      "/v1/chat/completions/",
      `/r/${cred}%2fv1/chat/completions`,
      "/health",
      "/slots/0?action=erase",
    ]
  ) {
    const status = await rawStatus(port, path, auth);
    assert.ok(status === 404 || status === 401, `${path}: ${status}`);
  }
  assert.equal(server.received.length, 0, "the model server saw none of them");
  // The one real endpoint, with a query, is still the endpoint.
  assert.equal(await rawStatus(port, "/v1/chat/completions?x=../../slots", auth), 200);
  assert.deepEqual(server.received.map((r) => r.path), ["/v1/chat/completions"]);
});

test("ModelProxy keeps the server's key from the agent and from the trace, even when the server echoes it", async () => {
  await using server = scriptedServer([
    failure(401, `Incorrect API key provided: ${KEY}. Check it.`),
  ]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, apiKey: KEY });
  const trace = new Trace();
  await using route = proxy.open({ trace });
  assert.doesNotMatch(JSON.stringify(route.env), new RegExp(KEY));
  const res = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, CHAT, {
    authorization: `Bearer ${route.key}`,
  });
  assert.equal(res.status, 401);
  const text = await res.text();
  assert.doesNotMatch(text, new RegExp(KEY));
  assert.match(text, /REDACTED key/);
  assert.equal(server.received[0].headers.get("authorization"), `Bearer ${KEY}`);
  const [step] = trace.steps;
  assert.equal(step.type, "model_error");
  assert.equal(step.info?.status, 401);
  assert.doesNotMatch(JSON.stringify(trace.toJSON()), new RegExp(KEY));
  // An environment given to the agent loses any variable holding the key.
  const env = route.environment({
    PATH: "/bin",
    OPENAI_API_KEY: KEY,
    OTHER: `x${KEY}x`,
    KEEP: "1",
  });
  assert.deepEqual(Object.keys(env).sort(), [
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "KEEP",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "PATH",
  ]);
  assert.equal(env.OPENAI_API_KEY, route.key);
});

test("ModelProxy: two rollouts at once never see each other's calls", async () => {
  // The server answers each call with its own message, after a delay that
  // interleaves the two rollouts' calls.
  const echo = async (r: { body: Record<string, unknown> }, i: number) => {
    await new Promise((ok) => setTimeout(ok, (i * 7) % 20));
    const said = (r.body.messages as { content: string }[]).at(-1)!.content;
    return Response.json(vllmChat([i], [i + 1000], { content: `re:${said}` }));
  };
  await using server = scriptedServer(Array(40).fill(echo));
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm" });
  const traces = [new Trace(), new Trace()];
  const routes = traces.map((trace) => proxy.open({ trace }));
  const calls = routes.flatMap((route, who) =>
    Array.from({ length: 20 }, async (_, n) => {
      const res = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, {
        model: "m",
        messages: [{ role: "user", content: `${who}-${n}` }],
      }, { authorization: `Bearer ${route.key}` });
      assert.equal((await res.json()).choices[0].message.content, `re:${who}-${n}`);
    })
  );
  await Promise.all(calls);
  for (const [who, trace] of traces.entries()) {
    const steps = trace.steps.filter((s) => s.type === "model");
    assert.equal(steps.length, 20);
    for (const s of steps) {
      const c = s.content as { request: { content: string }[]; reply: { content: string } };
      const asked = c.request.at(-1)?.content ?? "";
      assert.match(c.reply.content, new RegExp(`^re:${who}-\\d+$`));
      // Each step's request is the one its reply answers (none stored elsewhere).
      if (asked !== "") assert.equal(c.reply.content, `re:${asked}`);
    }
  }
  await Promise.all(routes.map((r) => r.close()));
  assert.equal(proxy.routes, 0);
});

test("ModelProxy: a rollout that ends mid-stream cuts the call off, records it as failed, and refuses the next", async () => {
  let release!: () => void;
  const held = new Promise<void>((ok) => release = ok);
  await using server = scriptedServer([() => {
    const chunks = vllmChatChunks([1], [2, 3], ["a", "b"]);
    const enc = new TextEncoder();
    return new Response(
      new ReadableStream({
        async start(c) {
          c.enqueue(enc.encode(`data: ${JSON.stringify(chunks[0])}\n\n`));
          await held; // the model is still generating when the rollout ends
          c.close();
        },
      }),
      { headers: { "content-type": "text/event-stream" } },
    );
  }]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "vllm" });
  const trace = new Trace();
  const route = proxy.open({ trace });
  const res = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, {
    ...CHAT,
    stream: true,
  }, { authorization: `Bearer ${route.key}` });
  const reader = res.body!.getReader();
  assert.ok((await reader.read()).value);
  await route.close();
  await assert.rejects(async () => {
    for (;;) if ((await reader.read()).done) break;
  });
  release();
  assert.deepEqual(trace.steps.map((s) => s.type), ["model_error"]);
  assert.match(String(trace.steps[0].content), /stream broke/);
  const again = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, CHAT);
  assert.equal(again.status, 401);
  await again.body?.cancel();
});

test("ModelProxy: a rollout that ends while a finished stream is read for the record records the call as failed, gives back its permit and closes", async () => {
  // llama-server's stream is complete, and the proxy is asking /apply-template
  // for the prompt's ids when the rollout ends: that read is cut off.
  let release!: () => void;
  const held = new Promise<void>((ok) => release = ok);
  const chunk = (delta: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
    choices: [{ index: 0, delta, finish_reason: null, ...extra }],
  });
  await using server = scriptedServer([
    () =>
      sse([
        chunk({ role: "assistant", content: "y" }, {
          logprobs: { content: [{ id: 7, token: "y", logprob: -0.5, top_logprobs: [] }] },
        }),
        chunk({}, { finish_reason: "stop" }),
        { choices: [], usage: { prompt_tokens: 3, completion_tokens: 1 } },
        "[DONE]",
      ]),
    async () => {
      await held;
      return Response.json({ prompt: "<user>hi<assistant>" });
    },
  ]);
  await using proxy = serveModelProxy({ upstream: server.baseUrl, server: "llama-server" });
  const trace = new Trace();
  const concurrency = new AdaptiveConcurrency({ max: 2 });
  const route = proxy.open({ trace }, { concurrency });
  try {
    const res = await post(`${route.env.OPENAI_BASE_URL}/chat/completions`, {
      ...CHAT,
      stream: true,
    }, { authorization: `Bearer ${route.key}` });
    const read = res.text();
    read.catch(() => {}); // awaited below
    for (let i = 0; i < 200 && server.received.length < 2; i++) {
      await new Promise((r) => setTimeout(r, 25));
    }
    assert.equal(server.received[1]?.path, "/apply-template");
    let timer: ReturnType<typeof setTimeout> | undefined;
    const closed = await Promise.race([
      route.close().then(() => true),
      new Promise<boolean>((r) => timer = setTimeout(() => r(false), 10_000)),
    ]);
    clearTimeout(timer);
    assert.ok(closed, "route.close() waits for the call's record, which never came");
    await assert.rejects(read);
    assert.deepEqual(trace.steps.map((s) => s.type), ["model_error"]);
    assert.match(String(trace.steps[0].content), /rollout ended/);
    assert.equal(concurrency.inFlight, 0, "the call's permit is given back");
  } finally {
    release();
  }
});

test("serveModelProxy(): the server's key given as an option is a secret of the process: redacted from whatever is written, whatever its shape", async () => {
  const key = `upstream${crypto.randomUUID().replaceAll("-", "")}`; // no known key shape
  await using _proxy = serveModelProxy({
    upstream: "http://127.0.0.1:9/v1",
    server: "vllm",
    apiKey: key,
  });
  assert.equal(redactSecrets(`a log line: ${key}.`), "a log line: [REDACTED model API key].");
});
