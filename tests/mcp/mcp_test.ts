import { test } from "../_test.ts";
import { counterpart } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { bind, connect, Environment, integer, rollout, string } from "../../mod.ts";
import { addMcpServer, McpClient, McpError, mcpTool, resultText } from "../../mcp/mod.ts";
import { ChatAgent } from "../../agents/mod.ts";
import { completion, scriptedServer } from "../agents/_scripted.ts";

function tools(calls: string[] = []) {
  return [
    mcpTool({
      name: "add",
      description: "Add two integers",
      args: { a: integer(), b: integer() },
      run: ({ a, b }) => {
        calls.push(`add ${a} ${b}`);
        return String(a + b);
      },
    }),
    mcpTool({
      name: "lookup",
      description: "Look a word up",
      args: { word: string() },
      run: ({ word }) => {
        calls.push(`lookup ${word}`);
        if (word === "") throw new Error("empty word");
        return { word, meaning: `the meaning of ${word}` };
      },
    }),
  ];
}

for (const replies of ["json", "sse"] as const) {
  test(`McpClient against addMcpServer (${replies} replies): tools, errors, sessions`, async () => {
    const env = new Environment("mcp");
    addMcpServer(env, { tools: tools(), replies });
    await env.start();
    try {
      const cap = env.capability("tools")!;
      assert.equal(cap.protocol, "mcp/2025-11-25");
      assert.match(cap.url, /^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
      assert.equal(cap.params.transport, "streamable-http");
      const token = cap.params.auth_token as string;
      const auth = { authorization: `Bearer ${token}` };
      {
        await using mcp = await McpClient.fromBinding(cap);
        assert.equal(mcp.protocolVersion, "2025-11-25");
        assert.match(mcp.sessionId ?? "", /^[0-9a-f-]{36}$/);
        const listed = await mcp.listTools();
        assert.deepEqual(listed.map((t) => t.name), ["add", "lookup"]);
        assert.deepEqual(listed[0].inputSchema.required, ["a", "b"]);
        assert.equal(resultText(await mcp.callTool("add", { a: 2, b: "3" })), "5");
        const looked = await mcp.callTool("lookup", { word: "hud" });
        assert.deepEqual(looked.structuredContent, { word: "hud", meaning: "the meaning of hud" });
        const bad = await mcp.callTool("add", { a: "x", b: 1 });
        assert.equal(bad.isError, true);
        assert.match(resultText(bad), /argument "a" must be integer/);
        assert.equal((await mcp.callTool("lookup", { word: "" })).isError, true);
        await assert.rejects(
          mcp.callTool("nope", {}),
          (e: unknown) =>
            e instanceof McpError && e.code === -32602 && /Unknown tool: "nope"/.test(e.message),
        );
        // A request without the session is refused.
        const raw = await fetch(cap.url, {
          method: "POST",
          headers: { "content-type": "application/json", accept: "application/json", ...auth },
          body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
        });
        assert.equal(raw.status, 400);
        assert.match((await raw.json()).error.message, /missing Mcp-Session-Id/);
      }
      // The older version is negotiated when offered.
      await using old = await McpClient.connect(cap.url, {
        protocolVersion: "2025-06-18",
        authToken: token,
      });
      assert.equal(old.protocolVersion, "2025-06-18");
      // A closed session is gone.
      const id = old.sessionId;
      await old.close();
      const after = await fetch(cap.url, {
        method: "POST",
        headers: { "content-type": "application/json", "mcp-session-id": id!, ...auth },
        body: JSON.stringify({ jsonrpc: "2.0", id: 2, method: "tools/list" }),
      });
      assert.equal(after.status, 404);
      await after.body?.cancel();
    } finally {
      await env.stop();
    }
    assert.equal(env.capability("tools"), undefined);
  });
}

test("ChatAgent takes an mcp capability's tools and calls them through the forwarder", async () => {
  const calls: string[] = [];
  const env = new Environment("mcp-lab");
  addMcpServer(env, { tools: tools(calls), replies: "sse" });
  const task = env.template({ id: "define" }, async function* () {
    const answer = yield "What does hud mean? Use lookup.";
    yield String(answer).includes("the meaning of hud") ? 1 : 0;
  });
  await using model = scriptedServer([
    completion({ tool_calls: [["lookup", '{"word": "hud"}'], ["add", '{"a": 1, "b": 2}']] }),
    completion({ content: "hud: the meaning of hud" }),
  ]);
  const run = await rollout(
    task(),
    new ChatAgent({ model: "m", baseUrl: model.baseUrl, stream: false }),
    { rolloutTimeout: 30_000 },
  );
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.deepEqual(calls, ["lookup hud", "add 1 2"]);
  const offered = (model.received[0].body.tools as { function: { name: string } }[])
    .map((t) => t.function.name).sort();
  assert.deepEqual(offered, ["add", "lookup", "submit"]);
  const results = run.trace.steps.filter((s) => s.type === "tool")
    .map((s) => (s.content as { result: string }).result);
  assert.deepEqual(results, ['{"word":"hud","meaning":"the meaning of hud"}', "3"]);
});

test('HudClient.open("mcp") and open(name) reach the server through the forwarder', async () => {
  const calls: string[] = [];
  const env = new Environment("mcp-open");
  addMcpServer(env, { tools: tools(calls) });
  await env.start();
  await using _stopped = { [Symbol.asyncDispose]: () => env.stop() };
  await using server = bind(env);
  await using client = await connect(server, { readyTimeout: 10_000 });
  const binding = client.binding("tools");
  // The binding is the client's forwarder, not the server's own port.
  assert.notEqual(binding.url, env.capability("tools")!.url);
  {
    await using mcp = await client.open("mcp");
    assert.equal(mcp.protocolVersion, "2025-11-25");
    assert.equal(resultText(await mcp.callTool("add", { a: 40, b: 2 })), "42");
  }
  {
    await using mcp = await client.open("tools", { protocolVersion: "2025-06-18" });
    assert.equal(mcp.protocolVersion, "2025-06-18");
    assert.deepEqual((await mcp.listTools()).map((t) => t.name), ["add", "lookup"]);
  }
  assert.deepEqual(calls, ["add 40 2"]);
});

// ---- against the official TypeScript SDK, installed from npm for this test only

const SDK_SERVER = `
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";
import http from "node:http";
import { randomUUID } from "node:crypto";
const transports = {};
const srv = http.createServer(async (req, res) => {
  let body = "";
  for await (const c of req) body += c;
  const sid = req.headers["mcp-session-id"];
  let transport = sid ? transports[sid] : undefined;
  if (!transport) {
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => { transports[id] = transport; },
    });
    const server = new McpServer({ name: "sdk-example", version: "1.0.0" });
    server.registerTool("multiply", {
      description: "Multiply two numbers",
      inputSchema: { a: z.number(), b: z.number() },
    }, async ({ a, b }) => ({ content: [{ type: "text", text: String(a * b) }] }));
    await server.connect(transport);
  }
  await transport.handleRequest(req, res, body ? JSON.parse(body) : undefined);
});
srv.listen(0, "127.0.0.1", () => console.log(JSON.stringify({ port: srv.address().port })));
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
`;

const SDK_CLIENT = `
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
const transport = new StreamableHTTPClientTransport(new URL(process.argv[2]), {
  requestInit: { headers: { authorization: "Bearer " + process.env.MCP_TOKEN } },
});
const client = new Client({ name: "sdk-client", version: "1.0.0" });
await client.connect(transport);
const tools = await client.listTools();
const sum = await client.callTool({ name: "add", arguments: { a: 20, b: 22 } });
const bad = await client.callTool({ name: "lookup", arguments: { word: "" } });
console.log(JSON.stringify({
  version: transport.protocolVersion,
  tools: tools.tools.map((t) => t.name),
  sum, bad,
}));
await transport.terminateSession();
await client.close();
`;

async function npmAvailable(): Promise<boolean> {
  try {
    const out = await new Deno.Command("npm", {
      args: ["--version"],
      stdout: "null",
      stderr: "null",
    })
      .output();
    return out.success;
  } catch {
    return false;
  }
}

/** npm, which installs the official SDK from the registry. */
const NPM = counterpart(
  "npm",
  "apt-get install npm (and the npm registry reachable)",
  () => npmOk ? null : "npm --version failed",
);
const npmOk = await npmAvailable();

test({
  name: "MCP interop with the official TypeScript SDK (npm): its server, its client",
  needs: [NPM],
  async fn(t) {
    const dir = await Deno.makeTempDir({ prefix: "mcp-sdk-" });
    try {
      await Deno.writeTextFile(`${dir}/package.json`, '{"type":"module","private":true}');
      const install = await new Deno.Command("npm", {
        args: [
          "install",
          "--no-audit",
          "--no-fund",
          "--prefer-offline",
          "@modelcontextprotocol/sdk@1",
          "zod@4",
        ],
        cwd: dir,
        stdout: "piped",
        stderr: "piped",
        signal: AbortSignal.timeout(150_000),
      }).output();
      assert.ok(
        install.success,
        `npm install @modelcontextprotocol/sdk failed: ${new TextDecoder().decode(install.stderr)}`,
      );
      await Deno.writeTextFile(`${dir}/server.mjs`, SDK_SERVER);
      await Deno.writeTextFile(`${dir}/client.mjs`, SDK_CLIENT);

      await t.step("our McpClient against the SDK's server", async () => {
        const child = new Deno.Command("node", {
          args: ["server.mjs"],
          cwd: dir,
          stdin: "piped",
          stdout: "piped",
          stderr: "null",
        }).spawn();
        try {
          const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
          const ready = setTimeout(() => child.kill(), 20_000);
          const first = await reader.read();
          clearTimeout(ready);
          assert.ok(!first.done, "the SDK server exited before printing its port");
          const { port } = JSON.parse(first.value!);
          await using mcp = await McpClient.connect(`http://127.0.0.1:${port}/mcp`);
          assert.equal(mcp.protocolVersion, "2025-11-25");
          assert.equal(mcp.serverInfo.name, "sdk-example");
          const listed = await mcp.listTools();
          assert.deepEqual(listed.map((x) => x.name), ["multiply"]);
          assert.deepEqual((listed[0].inputSchema as { required: string[] }).required, ["a", "b"]);
          assert.equal(resultText(await mcp.callTool("multiply", { a: 6, b: 7 })), "42");
          const bad = await mcp.callTool("multiply", { a: "six" });
          assert.equal(bad.isError, true);
          await using old = await McpClient.connect(`http://127.0.0.1:${port}/mcp`, {
            protocolVersion: "2025-06-18",
          });
          assert.equal(old.protocolVersion, "2025-06-18");
          reader.releaseLock();
        } finally {
          await child.stdin.close();
          await child.stdout.cancel().catch(() => {});
          await child.status;
        }
      });

      await t.step("the SDK's client against our addMcpServer", async () => {
        const env = new Environment("mcp");
        addMcpServer(env, { tools: tools(), replies: "sse" });
        await env.start();
        try {
          const out = await new Deno.Command("node", {
            args: ["client.mjs", env.capability("tools")!.url],
            env: { MCP_TOKEN: String(env.capability("tools")!.params.auth_token) },
            cwd: dir,
            stdout: "piped",
            stderr: "piped",
            signal: AbortSignal.timeout(30_000),
          }).output();
          const text = new TextDecoder();
          assert.ok(out.success, `the SDK client failed: ${text.decode(out.stderr)}`);
          const got = JSON.parse(text.decode(out.stdout));
          assert.equal(got.version, "2025-11-25");
          assert.deepEqual(got.tools, ["add", "lookup"]);
          assert.deepEqual(got.sum.content, [{ type: "text", text: "42" }]);
          assert.equal(got.bad.isError, true);
          assert.match(got.bad.content[0].text, /empty word/);
        } finally {
          await env.stop();
        }
      });
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
