import { test } from "./_test.ts";
import { LINUX, ROOT_USER } from "./_counterparts.ts";
import { dialOwn } from "../_internal/peer_uid.ts";
import assert from "node:assert/strict";
import {
  any,
  bind,
  Capability,
  connect,
  ConnectionClosedError,
  Environment,
  HudProtocolError,
  NotReadyError,
  ProtocolViolationError,
} from "../mod.ts";
import { formatControlUrl, parseControlUrl } from "../client.ts";
import { LineReader, parseLine } from "../_internal/framing.ts";
import { demoEnv, echoServer, tcpServer, waitFor } from "./_helpers.ts";
import { FileTrackerClient, startFileTracker } from "../filetracking/mod.ts";
import { generateSshKeyPair, SshClient } from "../ssh/mod.ts";
import { functionAgent, rollout } from "../eval/mod.ts";
import { LocalRuntime, type Placement, Runtime } from "../runtime/mod.ts";

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}

/** A scripted server: answers each request frame with `reply(request)`. */
function scriptedServer(
  reply: (req: Record<string, unknown>, n: number) => unknown | Promise<unknown>,
): { port: number; close(): Promise<void> } {
  return tcpServer(async (conn) => {
    const reader = new LineReader(conn, 1 << 20);
    for (let n = 0;; n++) {
      const frame = await reader.read();
      if (frame === null || frame.kind !== "line") return;
      const out = await reply(parseLine(frame.line) as Record<string, unknown>, n);
      if (out === "close") return;
      if (out === "hang") continue;
      await conn.write(new TextEncoder().encode(JSON.stringify(out) + "\n"));
    }
  });
}

const HELLO = (id: unknown) => ({
  jsonrpc: "2.0",
  id,
  result: { session_id: "sess-0000abcd", env: { name: "s", version: "1" }, bindings: [] },
});

test("parseControlUrl() accepts tcp:// and host:port only", () => {
  assert.deepEqual(parseControlUrl("tcp://127.0.0.1:8765"), { hostname: "127.0.0.1", port: 8765 });
  assert.deepEqual(parseControlUrl("localhost:1"), { hostname: "localhost", port: 1 });
  assert.deepEqual(parseControlUrl("tcp://[::1]:9"), { hostname: "::1", port: 9 });
  assert.throws(() => parseControlUrl("http://127.0.0.1:80"), {
    name: "TypeError",
    message: /"http"/,
  });
  assert.throws(() => parseControlUrl("ws://x"), { name: "TypeError", message: /"ws"/ });
  assert.throws(() => parseControlUrl("127.0.0.1"), TypeError);
});

test("parseControlUrl() takes the token from the url's password, and never shows it", () => {
  assert.deepEqual(parseControlUrl("tcp://:s3cr%2Ft@127.0.0.1:8765"), {
    hostname: "127.0.0.1",
    port: 8765,
    token: "s3cr/t",
  });
  assert.deepEqual(parseControlUrl("tcp://me:abc@[::1]:9").token, "abc");
  assert.throws(() => parseControlUrl("tcp://abc@127.0.0.1:1"), {
    name: "TypeError",
    message: /after a colon in "tcp:\/\/127.0.0.1:1"/,
  });
  assert.throws(() => parseControlUrl("http://:hidden@127.0.0.1:80"), (e: unknown) => {
    assert.ok(e instanceof TypeError);
    assert.doesNotMatch(e.message, /hidden/);
    return true;
  });
});

test("connect() retries until a late server answers", async () => {
  const port = freePort();
  const env = demoEnv();
  let server: ReturnType<typeof bind> | null = null;
  const token = "t".repeat(40);
  const timer = setTimeout(() => server = bind(env, { port, token }), 300);
  try {
    await using client = await connect(`tcp://:${token}@127.0.0.1:${port}`, {
      retryInterval: 50,
      readyTimeout: 10_000,
    });
    assert.equal(client.manifest.env.name, "demo");
  } finally {
    clearTimeout(timer);
    await (server as ReturnType<typeof bind> | null)?.shutdown();
  }
});

test("connect() treats accept-then-close as not ready, then succeeds", async () => {
  let attempts = 0;
  const server = scriptedServer((req) => {
    attempts++;
    return attempts < 3 ? "close" : HELLO(req.id);
  });
  await using client = await connect(`127.0.0.1:${server.port}`, {
    retryInterval: 20,
    readyTimeout: 10_000,
  });
  assert.equal(client.sessionId, "sess-0000abcd");
  assert.equal(attempts, 3);
  await client.close();
  await server.close();
});

test("connect() fails at once on an error reply", async () => {
  const server = scriptedServer((req) => ({
    jsonrpc: "2.0",
    id: req.id,
    error: { code: -32600, message: "unknown session: sess-1" },
  }));
  const started = Date.now();
  await assert.rejects(
    connect(`tcp://127.0.0.1:${server.port}`, { sessionId: "sess-1", readyTimeout: 30_000 }),
    (e: unknown) => e instanceof HudProtocolError && e.code === -32600,
  );
  assert.ok(Date.now() - started < 10_000);
  await server.close();
});

test("connect() gives up at the ready timeout and honours abort", async () => {
  const port = freePort();
  await assert.rejects(
    connect(`tcp://127.0.0.1:${port}`, { readyTimeout: 200, retryInterval: 50 }),
    NotReadyError,
  );
  const server = scriptedServer(() => "hang");
  await assert.rejects(
    connect(`tcp://127.0.0.1:${server.port}`, { readyTimeout: 200 }),
    NotReadyError,
    "a server that never answers is not ready",
  );
  const controller = new AbortController();
  setTimeout(() => controller.abort(new Error("stop")), 100);
  await assert.rejects(
    connect(`tcp://127.0.0.1:${port}`, { signal: controller.signal, retryInterval: 20 }),
    { message: "stop" },
  );
  await server.close();
});

test("HudClient heartbeat surfaces a dead server as an error", async () => {
  const server = scriptedServer((req, n) => (n === 0 ? HELLO(req.id) : "hang"));
  await using client = await connect(`tcp://127.0.0.1:${server.port}`, {
    heartbeatInterval: 50,
    heartbeatTimeout: 100,
    readyTimeout: 10_000,
  });
  await new Promise((r) => setTimeout(r, 400));
  assert.equal(client.closed, true);
  await assert.rejects(client.listTasks(), ConnectionClosedError);
  await server.close();
});

test("HudClient heartbeat keeps a healthy session", async () => {
  await using server = bind(demoEnv());
  await using client = await connect(server, {
    heartbeatInterval: 20,
    heartbeatTimeout: 1000,
    readyTimeout: 10_000,
  });
  await new Promise((r) => setTimeout(r, 150));
  assert.equal(client.closed, false);
  await client.startTask("add", { a: 1 });
  assert.equal((await client.grade({ answer: 3 })).score, 1);
});

test("HudClient refuses protocol violations", async (t) => {
  await t.step("a grade whose score is not a number is a ProtocolViolationError", async () => {
    for (const score of ["1", null, [1]]) {
      const server = scriptedServer((req, n) =>
        n === 0 ? HELLO(req.id) : { jsonrpc: "2.0", id: req.id, result: { score } }
      );
      await using client = await connect(`tcp://127.0.0.1:${server.port}`, {
        readyTimeout: 10_000,
      });
      await assert.rejects(
        client.grade({ answer: 1 }),
        (e: unknown) =>
          e instanceof ProtocolViolationError && /score must be a number/.test(e.message),
      );
      await client.close();
      await server.close();
    }
  });
  await t.step("a reply id mismatch aborts the connection", async () => {
    const server = scriptedServer((req, n) =>
      n === 0 ? HELLO(req.id) : { jsonrpc: "2.0", id: 999, result: { tasks: [] } }
    );
    await using client = await connect(`tcp://127.0.0.1:${server.port}`, { readyTimeout: 10_000 });
    await assert.rejects(client.listTasks(), {
      name: "ProtocolViolationError",
      message: /mismatch/,
    });
    assert.equal(client.closed, true);
    await assert.rejects(client.listTasks(), ConnectionClosedError);
    await client.close();
    await server.close();
  });
  await t.step("error frames become HudProtocolError with code and message", async () => {
    await using server = bind(demoEnv());
    await using client = await connect(server, { readyTimeout: 10_000 });
    await assert.rejects(client.startTask("nope"), (e: unknown) => {
      assert.ok(e instanceof HudProtocolError);
      assert.equal(e.code, -32602);
      assert.equal(e.message, "unknown task: nope");
      return true;
    });
    assert.equal(client.closed, false, "an error reply keeps the connection");
    assert.deepEqual((await client.listTasks()).map((x) => x.id), ["add", "echo"]);
  });
});

test("HudClient calls are serialised on one connection", async () => {
  await using server = bind(demoEnv());
  await using client = await connect(server, { readyTimeout: 10_000 });
  const results = await Promise.all([
    client.startTask("add", { a: 1 }),
    client.grade({ answer: 3 }),
    client.startTask("add", { a: 2 }),
    client.grade({ answer: 0 }),
  ]);
  assert.deepEqual(results, [{ prompt: "add:1:2" }, { score: 1 }, { prompt: "add:2:2" }, {
    score: 0,
  }]);
});

test("HudClient resumes a parked session and grades it", async () => {
  await using server = bind(demoEnv());
  const url = server.url;
  const first = await connect(url, { readyTimeout: 10_000 });
  await first.startTask("add", { a: 4 });
  const sid = first.sessionId;
  await first.close();
  await using second = await connect(url, { sessionId: sid, readyTimeout: 10_000 });
  assert.equal(second.sessionId, sid);
  assert.equal((await second.grade({ answer: 6 })).score, 1);
});

test("HudClient.bye() cancels the task and ends the session", async () => {
  await using server = bind(demoEnv());
  const client = await connect(server, { readyTimeout: 10_000 });
  await client.startTask("add", { a: 4 });
  await client.bye();
  assert.equal(client.closed, true);
  await using other = await connect(server, { readyTimeout: 10_000 });
  await assert.rejects(other.grade({ answer: 6 }), { code: -32600 });
});

test("HudClient.binding() resolves refs and forwards through the control port", async (t) => {
  const echo = echoServer();
  const env = new Environment("fwd", {
    capabilities: [
      new Capability({
        name: "echo",
        protocol: "echo/1",
        url: `tcp://127.0.0.1:${echo.port}/p?q=1#f`,
      }),
      Capability.ssh({
        url: `ssh://agent@127.0.0.1:${echo.port}`,
        hostPublicKey: "ssh-ed25519 AAAA",
      }),
      Capability.mcp({ name: "tools-a", url: `ws://127.0.0.1:${echo.port}/mcp` }),
      Capability.mcp({ name: "tools-b", url: `ws://127.0.0.1:${echo.port}/mcp2` }),
    ],
  });
  await using server = bind(env);
  const client = await connect(server, { readyTimeout: 10_000 });
  let forwardedPort = 0;

  await t.step("by name, full protocol and family, with the url rewritten", () => {
    const byName = client.binding("echo");
    const m = /^tcp:\/\/127\.0\.0\.1:(\d+)\/p\?q=1#f$/.exec(byName.url);
    assert.ok(m, byName.url);
    forwardedPort = Number(m[1]);
    assert.notEqual(forwardedPort, echo.port);
    assert.equal(client.binding("ssh/2").name, "shell");
    assert.match(client.binding("ssh").url, /^ssh:\/\/agent@127\.0\.0\.1:\d+$/);
    assert.equal(client.binding("ssh").params.host_pubkey, "ssh-ed25519 AAAA");
    assert.equal(client.manifest.bindings[0].url, `tcp://127.0.0.1:${echo.port}/p?q=1#f`);
  });
  await t.step("unknown and ambiguous refs list what is available", () => {
    assert.throws(() => client.binding("browser"), {
      name: "RangeError",
      message: /"browser".*"echo" \(echo\/1\).*"shell" \(ssh\/2\)/,
    });
    assert.throws(() => client.binding("mcp"), {
      name: "RangeError",
      message: /"tools-a", "tools-b"/,
    });
  });
  await t.step("bytes reach the capability through the forwarder", async () => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: forwardedPort });
    await conn.write(new TextEncoder().encode("ping through the tunnel"));
    await conn.closeWrite();
    const buf = new Uint8Array(1024);
    let out = "";
    while (true) {
      const n = await conn.read(buf);
      if (n === null) break;
      out += new TextDecoder().decode(buf.subarray(0, n));
    }
    conn.close();
    assert.equal(out, "ping through the tunnel");
  });
  await t.step("8 concurrent forwarded streams, 256 KiB each", async () => {
    await Promise.all(Array.from({ length: 8 }, async (_, i) => {
      const payload = new TextEncoder().encode(`s${i};`.repeat(65536));
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: forwardedPort });
      const chunks: Uint8Array[] = [];
      const reading = (async () => {
        const buf = new Uint8Array(65536);
        while (true) {
          const n = await conn.read(buf);
          if (n === null) break;
          chunks.push(buf.slice(0, n));
        }
      })();
      let off = 0;
      while (off < payload.length) off += await conn.write(payload.subarray(off));
      await conn.closeWrite();
      await reading;
      conn.close();
      const got = new Uint8Array(chunks.reduce((s, c) => s + c.length, 0));
      let o = 0;
      for (const c of chunks) {
        got.set(c, o);
        o += c.length;
      }
      assert.deepEqual(got, payload);
    }));
  });
  await t.step("a live tunnel is closed with the client, and ports are refused after", async () => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: forwardedPort });
    await conn.write(new TextEncoder().encode("x"));
    const buf = new Uint8Array(8);
    assert.equal(await conn.read(buf), 1);
    await client.close();
    assert.equal(await conn.read(buf).catch(() => null), null);
    conn.close();
    await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: forwardedPort }));
  });
  await echo.close();
});

test("HudClient forwarder closes the local side when the tunnel is refused", async () => {
  const port = freePort();
  const env = new Environment("refused", {
    capabilities: [
      new Capability({ name: "down", protocol: "x/1", url: `tcp://127.0.0.1:${port}` }),
    ],
  });
  await using server = bind(env);
  const errors: unknown[] = [];
  await using client = await connect(server, {
    onError: (e) => errors.push(e),
    readyTimeout: 10_000,
  });
  const local = new URL(client.binding("down").url.replace("tcp://", "http://"));
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(local.port) });
  assert.equal(await conn.read(new Uint8Array(8)).catch(() => null), null);
  conn.close();
  assert.equal(errors.length, 1);
  assert.match(String(errors[0]), /down/);
});

test("HudClient call aborted by its signal rejects and closes the connection", async () => {
  const server = scriptedServer((req, n) => (n === 0 ? HELLO(req.id) : "hang"));
  await using client = await connect(`tcp://127.0.0.1:${server.port}`, {
    heartbeatInterval: 0,
    readyTimeout: 10_000,
  });
  const controller = new AbortController();
  setTimeout(() => controller.abort(new Error("gave up")), 50);
  await assert.rejects(client.startTask("add", {}, { signal: controller.signal }), {
    message: "gave up",
  });
  assert.equal(client.closed, true, "a reply that can no longer be matched ends the connection");
  await assert.rejects(client.listTasks(), ConnectionClosedError);
  await client.close();
  await server.close();
});

test("connect() takes the token from the option, the url, or HUD_SERVE_TOKEN", async (t) => {
  const token = "a".repeat(64);
  await using server = bind(demoEnv(), { token });
  const plain = `tcp://127.0.0.1:${server.addr.port}`;
  await t.step("without one: the server's error at once, naming the way out", async () => {
    await assert.rejects(connect(plain, { readyTimeout: 10_000 }), (e: unknown) => {
      assert.ok(e instanceof HudProtocolError);
      assert.equal(e.code, -32001);
      assert.match(e.message, /HUD_SERVE_TOKEN/);
      return true;
    });
  });
  await t.step("from the option", async () => {
    await using client = await connect(plain, { token, readyTimeout: 10_000 });
    assert.equal(client.manifest.env.name, "demo");
  });
  await t.step("from the url; client.url does not show it", async () => {
    await using client = await connect(server, { readyTimeout: 10_000 });
    assert.equal(client.url, plain);
  });
  await t.step("from HUD_SERVE_TOKEN", async () => {
    // In a process of its own, whose environment holds the token: this
    // process's other test files (deno test --parallel) must not see it.
    const script = `import { connect } from ${
      JSON.stringify(new URL("../client.ts", import.meta.url).href)
    };\nawait using client = await connect(${
      JSON.stringify(plain)
    }, { readyTimeout: 10_000 });\nconsole.log(client.manifest.env.name);`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", "--no-lock", script],
      env: { HUD_SERVE_TOKEN: token, NO_COLOR: "1" },
      stdin: "null",
      signal: AbortSignal.timeout(30_000),
    }).output();
    const text = new TextDecoder();
    assert.equal(text.decode(out.stdout), "demo\n", text.decode(out.stderr));
  });
  await t.step("a wrong one in the url is refused; messages never show it", async () => {
    const secret = "b".repeat(64);
    await assert.rejects(
      connect(`tcp://:${secret}@127.0.0.1:${server.addr.port}`, { readyTimeout: 10_000 }),
      (e: unknown) => {
        assert.ok(e instanceof HudProtocolError && e.code === -32001);
        assert.doesNotMatch(e.message, /bbbb/);
        return true;
      },
    );
    const port = freePort();
    await assert.rejects(
      connect(`tcp://:${secret}@127.0.0.1:${port}`, { readyTimeout: 100, retryInterval: 20 }),
      (e: unknown) => {
        assert.ok(e instanceof NotReadyError);
        assert.doesNotMatch(e.message, /bbbb/);
        assert.match(e.message, new RegExp(`tcp://127.0.0.1:${port}`));
        return true;
      },
    );
  });
});

test("HudClient sends the token in every hello, heartbeats included", async () => {
  const seen: unknown[] = [];
  const server = scriptedServer((req) => {
    if (req.method === "hello") seen.push((req.params as Record<string, unknown>).token);
    return HELLO(req.id);
  });
  const token = "c".repeat(64);
  const client = await connect(`tcp://:${token}@127.0.0.1:${server.port}`, {
    heartbeatInterval: 20,
    heartbeatTimeout: 1000,
  });
  try {
    await waitFor(() => seen.length >= 3);
    await client.hello();
    assert.ok(seen.every((t) => t === token), JSON.stringify(seen));
  } finally {
    await client.close();
    await server.close();
  }
});

test("HudClient.open() returns the client for the binding's family, through the forwarder", async (t) => {
  const root = await Deno.makeTempDir();
  await using tracker = await startFileTracker(root);
  const keys = await generateSshKeyPair();
  const echo = echoServer();
  const env = new Environment("open", {
    capabilities: [
      tracker.capability(),
      Capability.ssh({
        url: `127.0.0.1:${echo.port}`,
        hostPublicKey: keys.publicKey,
        clientKey: keys.privateKey,
      }),
      Capability.rfb({ url: `127.0.0.1:${echo.port}` }),
      Capability.openpi({ url: `127.0.0.1:${echo.port}` }),
    ],
  });
  await using server = bind(env);
  await using client = await connect(server, { readyTimeout: 10_000 });
  try {
    await t.step("filetracking: a connected FileTrackerClient", async () => {
      await Deno.writeTextFile(`${root}/a.txt`, "a\n");
      await using files = await client.open("filetracking");
      assert.ok(files instanceof FileTrackerClient);
      assert.deepEqual((await files.snapshot()).files.map((f) => f.path), ["a.txt"]);
    });
    await t.step("ssh, by name: an SshClient for the forwarder's port", async () => {
      const shell = await client.open("shell");
      assert.ok(shell instanceof SshClient);
      assert.equal(shell.connected, false, "it connects on first use");
    });
    await t.step("rfb: an RfbClient, which finds no VNC server behind an echo", async () => {
      await assert.rejects(client.open("screen", { connectTimeout: 300 }), {
        name: "RfbError",
        message: /no RFB handshake within 300 ms/,
      });
    });
    await t.step("a protocol without a client names binding() as the way out", async () => {
      await assert.rejects(client.open("robot"), {
        name: "TypeError",
        message: /"robot".*"openpi\/0".*binding\("robot"\)/,
      });
    });
    await t.step("an unknown ref is refused as by binding()", async () => {
      await assert.rejects(client.open("nothing"), { name: "RangeError", message: /"nothing"/ });
    });
  } finally {
    await echo.close();
    await Deno.remove(root, { recursive: true });
  }
});

test("a client HudClient.open() made stops retrying once the HudClient closes", async () => {
  // An SSH server that hangs up at once: each try fails as a lost
  // connection does, and the SSH client tries again after 100 and 400 ms.
  let tries = 0;
  const hangup = tcpServer((conn) => {
    tries++;
    conn.close();
    return Promise.resolve();
  });
  const keys = await generateSshKeyPair();
  const env = new Environment("left-behind", {
    capabilities: [
      Capability.ssh({
        url: `127.0.0.1:${hangup.port}`,
        hostPublicKey: keys.publicKey,
        clientKey: keys.privateKey,
      }),
    ],
  });
  await using server = bind(env);
  const client = await connect(server, { readyTimeout: 10_000 });
  try {
    // As an agent a rollout stopped waiting for: its shell is never closed.
    const shell = await client.open("shell");
    const running = shell.exec("true");
    await waitFor(() => tries >= 1, 10_000, "the first try");
    const refused = assert.rejects(running, {
      name: "ConnectionClosedError",
      message: /HUD client is closed/,
    });
    await client.close();
    // Before, it went on to its third try and its last timer outlived the
    // test ("failed three times").
    await refused;
    const after = tries;
    await new Promise((r) => setTimeout(r, 600));
    assert.equal(tries, after, "no try after the close");
  } finally {
    await client.close();
    await hangup.close();
  }
});

test("HudClient reads the replies HUD's client reads", async (t) => {
  await t.step(
    'a dict score of true or false, as HUD\'s server sends {"score": True}',
    async () => {
      for (const [score, read] of [[true, 1], [false, 0]] as const) {
        const server = scriptedServer((req, n) =>
          n === 0 ? HELLO(req.id) : { jsonrpc: "2.0", id: req.id, result: { score, info: {} } }
        );
        try {
          await using client = await connect(`tcp://127.0.0.1:${server.port}`, {
            readyTimeout: 10_000,
          });
          assert.deepEqual(await client.grade({ answer: 1 }), { score: read, info: {} });
        } finally {
          await server.close();
        }
      }
    },
  );
  await t.step("a reply nested deeper than 64 (the limit is for requests)", async () => {
    let deep: unknown = "bottom";
    for (let i = 0; i < 200; i++) deep = [deep];
    const server = scriptedServer((req, n) =>
      n === 0 ? HELLO(req.id) : { jsonrpc: "2.0", id: req.id, result: { prompt: deep } }
    );
    try {
      await using client = await connect(`tcp://127.0.0.1:${server.port}`, {
        readyTimeout: 10_000,
      });
      assert.deepEqual(await client.startTask("deep"), { prompt: deep });
      assert.equal(client.closed, false);
    } finally {
      await server.close();
    }
  });
});

test("HudClient.binding() keeps the user name of a url, never its password", async () => {
  const echo = echoServer();
  const env = new Environment("userinfo", {
    capabilities: [
      new Capability({
        name: "db",
        protocol: "x/1",
        url: `x://me:s3cret@127.0.0.1:${echo.port}/d`,
      }),
      new Capability({ name: "anon", protocol: "y/1", url: `y://:s3cret@127.0.0.1:${echo.port}` }),
    ],
  });
  await using server = bind(env);
  await using client = await connect(server, { readyTimeout: 10_000 });
  assert.match(client.binding("db").url, /^x:\/\/me@127\.0\.0\.1:\d+\/d$/);
  assert.match(client.binding("anon").url, /^y:\/\/127\.0\.0\.1:\d+$/);
  for (const cap of client.bindings) assert.doesNotMatch(cap.url, /s3cret/);
  await echo.close();
});

test("HudClient.manifest gives an attached capability's placeholder url its forwarder's", async () => {
  const root = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${root}/a.txt`, "a\n");
    const tracker = await startFileTracker(root, { listen: false });
    const env = new Environment("attached");
    env.addCapability(tracker.capability(), {
      attach: (conn, head) => tracker.attach(conn, head),
    });
    await using server = bind(env);
    await using client = await connect(server, { readyTimeout: 10_000 });
    const raw = client.manifest.bindings.find((b) => b.protocol === "filetracking/1")!;
    assert.doesNotMatch(raw.url, /:0$/, "the placeholder cannot be dialled");
    assert.equal(raw.url, client.binding("filetracking").url);
    await using files = await FileTrackerClient.connect(raw.url);
    assert.equal((await files.snapshot()).files_scanned, 1);
    await tracker.shutdown();
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("connect() and rollout() fail soon, saying so, where nothing listens", async (t) => {
  await t.step(
    "an address refused for 10 s (the default) is a one-line NotReadyError",
    async () => {
      const port = freePort();
      const url = `tcp://127.0.0.1:${port}`;
      const row = { env: "none", id: "t", args: {}, slug: "t" };
      const [connecting, run] = await Promise.all([
        connect(url).then(() => null, (e: unknown) => e),
        rollout(row, functionAgent(() => "never"), { runtime: new Runtime(url) }),
      ]);
      assert.ok(connecting instanceof NotReadyError, String(connecting));
      assert.match(
        connecting.message,
        new RegExp(
          `^Cannot connect to ${url}: connection refused for 10000 ms .*nothing listens there`,
        ),
      );
      assert.doesNotMatch(connecting.message, /\n/);
      assert.equal(run.trace.failedPhase, "provisioning");
      assert.match(run.trace.errors[0].message, /nothing listens there/);
    },
  );
  await t.step(
    "refusedTimeout counts refusals only; an accepting server gets readyTimeout",
    async () => {
      const server = scriptedServer(() => "close");
      try {
        await assert.rejects(
          connect(`tcp://127.0.0.1:${server.port}`, {
            refusedTimeout: 50,
            readyTimeout: 600,
            retryInterval: 20,
          }),
          (e: unknown) => {
            assert.ok(e instanceof NotReadyError);
            assert.match(e.message, /not ready after 600 ms/);
            return true;
          },
        );
      } finally {
        await server.close();
      }
    },
  );
});

/** Sends "ping" over `conn` and reads back up to 4 bytes (fewer when it closes first). */
async function pingOver(conn: Deno.Conn): Promise<string> {
  await conn.write(new TextEncoder().encode("ping"));
  const buf = new Uint8Array(4);
  let n = 0;
  while (n < 4) {
    const got = await conn.read(buf.subarray(n));
    if (got === null) break;
    n += got;
  }
  return new TextDecoder().decode(buf.subarray(0, n));
}

/** Runs `bash -c script` (as uid 65534 with `asNobody`); its stdout. */
async function bashOutput(script: string, asNobody: boolean): Promise<string> {
  const argv = ["timeout", "10", "bash", "-c", script];
  const command = asNobody
    ? new Deno.Command("setpriv", {
      args: ["--reuid=65534", "--regid=65534", "--clear-groups", ...argv],
      stdout: "piped",
      stderr: "piped",
    })
    : new Deno.Command(argv[0], { args: argv.slice(1), stdout: "piped", stderr: "piped" });
  const out = await command.output();
  return new TextDecoder().decode(out.stdout);
}

test({
  name: "HudClient forwarders serve only the user who opened them: another uid is refused",
  // Needs root to act as another user, and Linux's socket tables.
  needs: [LINUX, ROOT_USER],
  async fn(t) {
    const echo = echoServer();
    const env = new Environment("users", {
      capabilities: [
        new Capability({
          name: "echo",
          protocol: "echo/1",
          url: `tcp://127.0.0.1:${echo.port}`,
        }),
      ],
    });
    await using server = bind(env);
    // The same 4 bytes out and back through the forwarder at `port`.
    const ping = (port: number) =>
      `exec 3<>/dev/tcp/127.0.0.1/${port}; printf ping >&3; head -c 4 <&3`;
    try {
      await t.step("by default: our own uid gets through, uid 65534 is closed", async () => {
        const errors: unknown[] = [];
        await using client = await connect(server, {
          readyTimeout: 10_000,
          onError: (e) => errors.push(e),
        });
        const port = Number(new URL(client.binding("echo").url.replace("tcp:", "http:")).port);
        assert.equal(await bashOutput(ping(port), false), "ping");
        assert.deepEqual(errors, []);
        assert.equal(await bashOutput(ping(port), true), "", "uid 65534 got an answer");
        assert.equal(errors.length, 1);
        assert.match(
          String(errors[0]),
          /"echo" refused a connection from uid 65534: it serves uid 0/,
        );
        assert.equal(await bashOutput(ping(port), false), "ping", "and we still do");
        // From an IPv6 socket (the peer shows in /proc/net/tcp6, IPv4-mapped).
        const conn = await Deno.connect({ hostname: "::ffff:127.0.0.1", port });
        try {
          assert.equal(await pingOver(conn), "ping");
        } finally {
          conn.close();
        }
        assert.equal(errors.length, 1);
      });
      await t.step(
        "our own dials get in, and another uid's beside them does not",
        async () => {
          const errors: unknown[] = [];
          await using client = await connect(server, {
            readyTimeout: 10_000,
            onError: (e) => errors.push(e),
          });
          const port = Number(new URL(client.binding("echo").url.replace("tcp:", "http:")).port);
          // Twenty of ours in flight (noted as this process's own), and uid
          // 65534's at the same moment: the forwarder may not take it for one.
          const ours = Array.from(
            { length: 20 },
            () => dialOwn(port, () => Deno.connect({ hostname: "127.0.0.1", port })),
          );
          const theirs = bashOutput(ping(port), true);
          const conns = await Promise.all(ours);
          try {
            for (const conn of conns) assert.equal(await pingOver(conn), "ping");
          } finally {
            for (const conn of conns) conn.close();
          }
          assert.equal(await theirs, "", "uid 65534 got an answer");
          assert.equal(errors.length, 1, String(errors));
          assert.match(String(errors[0]), /refused a connection from uid 65534/);
          // A closed one of ours is forgotten: nobody else is let in by its port.
          assert.equal(await bashOutput(ping(port), true), "");
          assert.equal(errors.length, 2);
        },
      );
      await t.step("forwardUsers lets the listed uids in", async () => {
        await using client = await connect(server, {
          readyTimeout: 10_000,
          forwardUsers: [0, 65534],
        });
        const port = Number(new URL(client.binding("echo").url.replace("tcp:", "http:")).port);
        assert.equal(await bashOutput(ping(port), true), "ping");
      });
      await t.step('forwardUsers: "any" serves everyone, and a bad list is refused', async () => {
        await using client = await connect(server, { readyTimeout: 10_000, forwardUsers: "any" });
        const port = Number(new URL(client.binding("echo").url.replace("tcp:", "http:")).port);
        assert.equal(await bashOutput(ping(port), true), "ping");
        await assert.rejects(
          connect(server, { readyTimeout: 10_000, forwardUsers: [-1] }),
          { name: "TypeError", message: /forwardUsers/ },
        );
      });
    } finally {
      await echo.close();
    }
  },
});

test("HudClient keeps integers beyond 2^53 exact both ways, against our server", async () => {
  // HUD's Python client does (json keeps ints exact); a double would round
  // 2^60 + 1 to ...976 (issue 24, points 2 and 5).
  const BIG = 2n ** 60n + 1n;
  const env = new Environment("exact");
  env.template({ id: "exact", args: { n: any() } }, async function* ({ n }) {
    // What arrived, as digits: the send half apart from the read half.
    const answer = yield { prompt: n, sent: String(n) };
    yield { score: 1, content: answer, received: String(answer) };
  });
  await using server = bind(env);
  await using client = await connect(server.url, { readyTimeout: 10_000 });
  const prompt = await client.startTask("exact", { n: BIG });
  assert.equal(prompt.sent, "1152921504606846977", "the bigint argument went out exactly");
  assert.equal(prompt.prompt, BIG, "the prompt came back exactly, as a bigint");
  const grade = await client.grade({ answer: BIG + 1n });
  assert.equal(grade.received, "1152921504606846978");
  assert.equal(grade.content, BIG + 1n);
  assert.equal((await client.listTasks()).length, 1, "the connection stays usable");
});

test("connect() takes a control address as a record: a placement's, a server's, or one written out", async (t) => {
  const token = "r".repeat(64);
  await using server = bind(demoEnv(), { token });
  await t.step("a placement that carries only an address", async () => {
    const placement: Placement = {
      address: { hostname: "127.0.0.1", port: server.addr.port, token },
      params: {},
      [Symbol.asyncDispose]: () => Promise.resolve(),
    };
    await using client = await connect(placement, { readyTimeout: 10_000, forward: false });
    assert.equal(client.manifest.env.name, "demo");
    assert.equal(client.url, `tcp://127.0.0.1:${server.addr.port}`, "no token in client.url");
  });
  await t.step("a runtime whose placements carry only an address", async () => {
    const runtime = {
      place: () =>
        Promise.resolve({
          address: server.address,
          params: {},
          [Symbol.asyncDispose]: () => Promise.resolve(),
        }),
    };
    await using client = await connect(runtime, { readyTimeout: 10_000, forward: false });
    assert.equal(client.manifest.env.name, "demo");
  });
  await t.step("the server handle's address", async () => {
    assert.deepEqual(server.address, { hostname: "127.0.0.1", port: server.addr.port, token });
    await using client = await connect(server, { readyTimeout: 10_000, forward: false });
    assert.equal(client.manifest.env.name, "demo");
  });
  await t.step("an address written out, and refused soon where nothing listens", async () => {
    const address = { hostname: "127.0.0.1", port: server.addr.port, token };
    await using client = await connect(address, { readyTimeout: 10_000, forward: false });
    assert.equal(client.manifest.env.name, "demo");
    await assert.rejects(
      connect({ hostname: "127.0.0.1", port: freePort() }, { refusedTimeout: 200 }),
      (e: unknown) => e instanceof NotReadyError && /nothing listens there/.test(e.message),
    );
    // No time allowed for refusals: the first one is the answer, said as such.
    const port = freePort();
    await assert.rejects(
      connect({ hostname: "127.0.0.1", port }, { refusedTimeout: 0 }),
      (e: unknown) =>
        e instanceof NotReadyError &&
        e.message.startsWith(
          `Cannot connect to tcp://127.0.0.1:${port}: connection refused, nothing listens there; `,
        ),
    );
    await assert.rejects(connect({ hostname: "", port: 1 }), TypeError);
    await assert.rejects(connect({ hostname: "x", port: 0 }), RangeError);
  });
  await t.step("still, anything with a url", async () => {
    const legacy = { url: formatControlUrl(server.address) };
    await using client = await connect(legacy, { readyTimeout: 10_000, forward: false });
    assert.equal(client.manifest.env.name, "demo");
  });
});

test("a runtime's placement carries a typed address, and printing it shows no token", async () => {
  await using placed = await new LocalRuntime(demoEnv()).place();
  const { hostname, port, token } = placed.address;
  assert.equal(hostname, "127.0.0.1");
  assert.equal(port, placed.params.port);
  assert.match(token ?? "", /^[0-9a-f]{64}$/, "a fresh token per server");
  assert.equal(placed.url, `tcp://:${token}@127.0.0.1:${port}`, "the url, for compatibility");
  for (const shown of [Deno.inspect(placed, { depth: 5, getters: true }), JSON.stringify(placed)]) {
    assert.ok(!shown.includes(token!), `the token is printed: ${shown}`);
  }
  await using client = await connect(placed, { readyTimeout: 10_000, forward: false });
  assert.equal(client.manifest.env.name, "demo");
});
