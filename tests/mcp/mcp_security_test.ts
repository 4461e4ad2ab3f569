// What stands between the MCP server and a stranger (issue 23, point 3): the
// binding's bearer token, the Host and Origin checks against DNS rebinding,
// and bounded bodies both ways; and ChatAgent cutting MCP results as it cuts
// shell output.

import { test } from "../_test.ts";
import { CURL, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment, rollout } from "../../mod.ts";
import { addMcpServer, McpClient, McpError, mcpTool, resultText } from "../../mcp/mod.ts";
import { ChatAgent } from "../../agents/mod.ts";
import { string } from "../../schema.ts";
import { completion, scriptedServer } from "../agents/_scripted.ts";
import { ChildProcess } from "../_helpers.ts";
import { curlAs } from "../_uid.ts";

const INITIALIZE = JSON.stringify({
  jsonrpc: "2.0",
  id: 1,
  method: "initialize",
  params: {
    protocolVersion: "2025-11-25",
    capabilities: {},
    clientInfo: { name: "curl", version: "1" },
  },
});

function echoTool(calls: string[] = []) {
  return mcpTool({
    name: "echo",
    args: { text: string() },
    run: ({ text }) => {
      calls.push(text);
      return text;
    },
  });
}

/** curl's arguments for a POST of `body` (with the bearer `token`, and `headers`). */
function post(body: string, token: string | null, headers: string[] = []): string[] {
  return [
    "-X",
    "POST",
    "-H",
    "content-type: application/json",
    "-H",
    "accept: application/json, text/event-stream",
    ...(token === null ? [] : ["-H", `authorization: Bearer ${token}`]),
    ...headers.flatMap((h) => ["-H", h]),
    "--data-binary",
    body,
  ];
}

async function withMcpServer(
  fn: (url: string, token: string | null, calls: string[]) => Promise<void>,
): Promise<void> {
  const calls: string[] = [];
  const env = new Environment("mcp-guarded");
  addMcpServer(env, { tools: [echoTool(calls)] });
  await env.start();
  try {
    const cap = env.capability("tools")!;
    const token = cap.params.auth_token;
    await fn(cap.url, typeof token === "string" ? token : null, calls);
  } finally {
    await env.stop();
  }
}

test({
  name: "addMcpServer() serves only bearers of the binding's token: another uid gets 401",
  needs: [ROOT_USER, CURL],
  async fn() {
    await withMcpServer(async (url, token, calls) => {
      // uid 65534, without the token, and with a wrong one.
      const bare = await curlAs(true, url, post(INITIALIZE, null));
      assert.equal(bare.status, 401, `uid 65534 got ${bare.status}: ${bare.body}`);
      const wrong = await curlAs(true, url, post(INITIALIZE, "0".repeat(64)));
      assert.equal(wrong.status, 401);
      // A tool call with a made-up session is refused before the session is looked up.
      const call = JSON.stringify({
        jsonrpc: "2.0",
        id: 2,
        method: "tools/call",
        params: { name: "echo", arguments: { text: "pwned" } },
      });
      const sneaky = await curlAs(true, url, post(call, null, ["mcp-session-id: x"]));
      assert.equal(sneaky.status, 401);
      assert.deepEqual(calls, []);
      assert.match(token ?? "", /^[0-9a-f]{64}$/, "the binding carries no auth_token");
      // With the token the same request is served (so the refusals are the token's doing).
      const ok = await curlAs(true, url, post(INITIALIZE, token));
      assert.equal(ok.status, 200, ok.body);
      // McpClient.fromBinding presents it; a client without it is refused.
      await assert.rejects(
        McpClient.connect(url),
        (e: unknown) => e instanceof McpError && e.code === 401,
      );
      await using mcp = await McpClient.connect(url, { authToken: token! });
      assert.equal(resultText(await mcp.callTool("echo", { text: "hi" })), "hi");
      assert.deepEqual(calls, ["hi"]);
    });
  },
});

test(
  "addMcpServer() refuses a Host or Origin it does not serve (DNS rebinding)",
  { needs: [CURL] },
  async () => {
    await withMcpServer(async (url, token) => {
      const port = new URL(url).port;
      const status = async (headers: string[]) =>
        (await curlAs(false, url, post(INITIALIZE, token, headers))).status;
      assert.equal(await status([]), 200);
      // A page at http://rebind.attacker.example:PORT whose name now resolves to 127.0.0.1.
      assert.equal(await status([`host: rebind.attacker.example:${port}`]), 403);
      assert.equal(await status([`origin: http://rebind.attacker.example:${port}`]), 403);
      assert.equal(await status(["origin: null"]), 403);
      assert.equal(await status([`origin: http://127.0.0.1:${port}`]), 200);
      assert.equal(await status([`host: localhost:${port}`]), 200);
    });
  },
);

/** `VmRSS` or `VmHWM` of `pid`, in bytes. */
async function memoryOf(pid: number, field: "VmRSS" | "VmHWM"): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`);
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status);
  assert.ok(m, `no ${field} in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}

/**
 * POSTs `total` bytes of `{"x...` by hand (fetch would not stop at an early
 * reply): `chunked` or with a Content-Length, writing until the server
 * answers or closes. The status line, and how much was written.
 */
async function bigPost(
  url: string,
  token: string,
  total: number,
  chunked: boolean,
): Promise<{ statusLine: string; written: number }> {
  const { hostname, port } = new URL(url);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  const encoder = new TextEncoder();
  let answered = false;
  const reply = (async () => {
    const buf = new Uint8Array(4096);
    let text = "";
    try {
      for (;;) {
        const n = await conn.read(buf);
        if (n === null) break;
        text += new TextDecoder().decode(buf.subarray(0, n));
        if (text.includes("\r\n")) break;
      }
    } catch {
      // Reset after the reply: what came is the answer.
    }
    answered = true;
    return text.split("\r\n")[0];
  })();
  let written = 0;
  try {
    await conn.write(encoder.encode(
      `POST /mcp HTTP/1.1\r\nHost: ${hostname}:${port}\r\nAuthorization: Bearer ${token}\r\n` +
        `Content-Type: application/json\r\n` +
        (chunked ? "Transfer-Encoding: chunked\r\n" : `Content-Length: ${total}\r\n`) + "\r\n",
    ));
    const chunk = new Uint8Array(1 << 20).fill(0x78);
    chunk[0] = 0x7b;
    chunk[1] = 0x22;
    for (let i = 0; i < total / chunk.length && !answered; i++) {
      const framed = chunked
        ? [encoder.encode(`${chunk.length.toString(16)}\r\n`), chunk, encoder.encode("\r\n")]
        : [chunk];
      for (const part of framed) {
        let off = 0;
        while (off < part.length) off += await conn.write(part.subarray(off));
      }
      written += chunk.length;
      if (i === 0) chunk[0] = chunk[1] = 0x78;
    }
    if (chunked && !answered) await conn.write(encoder.encode("0\r\n\r\n"));
  } catch {
    // The server closed the connection on us: its reply says why.
  }
  const statusLine = await reply;
  conn.close();
  return { statusLine, written };
}

test("addMcpServer() refuses a 256 MiB POST with 413 without growing", async () => {
  const fixture = new URL("../fixtures/mcp_env.ts", import.meta.url).pathname;
  await using child = new ChildProcess(Deno.execPath(), { args: ["run", "-A", fixture] });
  const line = await child.waitForLine(/^\{.*\}$/m, "the server's url");
  const { url, token } = JSON.parse(line[0]) as { url: string; token: string | null };
  // Warm up: one whole session, so that what grows later is the request's doing.
  {
    await using mcp = await McpClient.connect(url, { authToken: token ?? undefined });
    assert.equal(resultText(await mcp.callTool("echo", { text: "warm" })), "warm");
  }
  const before = await memoryOf(child.pid, "VmRSS");
  const total = 256 << 20;
  const replies = [];
  for (const chunked of [false, true]) {
    replies.push(await bigPost(url, token ?? "", total, chunked));
  }
  const peak = await memoryOf(child.pid, "VmHWM");
  const grown = peak - before;
  console.log(
    `mcp server RSS before ${(before / 2 ** 20).toFixed(0)} MiB, peak after two 256 MiB POSTs ${
      (peak / 2 ** 20).toFixed(0)
    } MiB`,
  );
  assert.ok(grown < 64 << 20, `the server grew by ${(grown / 2 ** 20).toFixed(0)} MiB`);
  // With a Content-Length, then chunked: both refused as they come.
  for (const { statusLine, written } of replies) {
    assert.match(statusLine, /^HTTP\/1\.1 413/, `after ${written} bytes`);
    assert.ok(written < total, "the whole body was taken");
  }
  // And it still serves.
  await using mcp = await McpClient.connect(url, { authToken: token ?? undefined });
  assert.equal(resultText(await mcp.callTool("echo", { text: "after" })), "after");
});

/**
 * A scripted MCP server whose `tools/call` reply is `size` bytes, as JSON
 * or as one SSE event, made as it is pulled; `sent()` says how much was.
 */
function hugeReplyServer(size: number, sse: boolean) {
  let sent = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    if (req.method === "DELETE") return new Response(null, { status: 200 });
    const msg = await req.json();
    if (msg.id === undefined) return new Response(null, { status: 202 });
    if (msg.method === "initialize") {
      return Response.json({
        jsonrpc: "2.0",
        id: msg.id,
        result: { protocolVersion: "2025-11-25", capabilities: {}, serverInfo: { name: "huge" } },
      }, { headers: { "mcp-session-id": "s" } });
    }
    const encoder = new TextEncoder();
    const head = encoder.encode(
      (sse ? "event: message\ndata: " : "") +
        `{"jsonrpc":"2.0","id":${msg.id},"result":{"content":[{"type":"text","text":"`,
    );
    const tail = encoder.encode(`"}]}}${sse ? "\n\n" : ""}`);
    const chunk = new Uint8Array(64 << 10).fill(0x61);
    let left = size;
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(head);
      },
      pull(controller) {
        if (left <= 0) {
          controller.enqueue(tail);
          controller.close();
          return;
        }
        const n = Math.min(left, chunk.length);
        left -= n;
        sent += n;
        controller.enqueue(chunk.slice(0, n));
      },
    });
    return new Response(body, {
      headers: { "content-type": sse ? "text/event-stream" : "application/json" },
    });
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}/mcp`,
    sent: () => sent,
    [Symbol.asyncDispose]: () => server.shutdown(),
  };
}

test("McpClient cuts off a reply over maxResponseBytes (JSON and SSE)", async (t) => {
  await t.step("a 64 MiB JSON reply against the default 16 MiB", async () => {
    await using server = hugeReplyServer(64 << 20, false);
    await using mcp = await McpClient.connect(server.url);
    await assert.rejects(
      mcp.callTool("dump", {}),
      (e: unknown) =>
        e instanceof McpError && /the reply to "tools\/call" is over 16 MiB/.test(e.message),
    );
    assert.ok(server.sent() < 32 << 20, `the server sent ${server.sent()} bytes`);
  });
  await t.step("a 64 MiB event against maxResponseBytes 1 MiB", async () => {
    await using server = hugeReplyServer(64 << 20, true);
    await using mcp = await McpClient.connect(server.url, { maxResponseBytes: 1 << 20 });
    await assert.rejects(
      mcp.callTool("dump", {}),
      (e: unknown) => e instanceof McpError && /is over 1 MiB \(maxResponseBytes\)/.test(e.message),
    );
    assert.ok(server.sent() < 16 << 20, `the server sent ${server.sent()} bytes`);
  });
  await t.step("a reply within the limit is read", async () => {
    await using server = hugeReplyServer(100_000, true);
    await using mcp = await McpClient.connect(server.url, { maxResponseBytes: 1 << 20 });
    assert.equal(resultText(await mcp.callTool("dump", {})).length, 100_000);
  });
});

test("ChatAgent cuts an MCP tool's result to outputLimit, as it cuts shell output", async () => {
  const env = new Environment("mcp-flood");
  const flood = "A".repeat(50_000) + "THE-END";
  addMcpServer(env, {
    tools: [mcpTool({ name: "dump", args: {}, run: () => flood })],
  });
  const task = env.template({ id: "t" }, async function* () {
    yield "Dump it.";
    yield 1;
  });
  await using model = scriptedServer([
    completion({ tool_calls: [["dump", "{}"]] }),
    completion({ content: "done" }),
  ]);
  const run = await rollout(
    task(),
    new ChatAgent({ model: "m", baseUrl: model.baseUrl, stream: false }),
    { rolloutTimeout: 30_000 },
  );
  assert.deepEqual(run.trace.errors, []);
  const messages = model.received[1].body.messages as { role: string; content: string }[];
  const seen = messages.find((m) => m.role === "tool")!.content;
  assert.ok(seen.length <= 16_100, `the model got ${seen.length} characters`);
  assert.match(seen, /characters cut: output over 16000/);
  assert.ok(seen.endsWith("THE-END"), "the tail is kept");
  const step = run.trace.steps.find((s) => s.type === "tool")!;
  assert.equal((step.content as { result: string }).result, seen);
});
