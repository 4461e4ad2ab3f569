import assert from "node:assert/strict";
import { bind, Capability, connect, Environment, serve } from "../mod.ts";
import { demoEnv, echoServer, type Journal, RawPeer, waitFor } from "./_helpers.ts";

Deno.test("bind() answers every method of the protocol table", async (t) => {
  const journal: Journal = { events: [] };
  await using server = bind(demoEnv(journal));
  await using peer = await RawPeer.login(server);

  await t.step("hello returns session and manifest", async () => {
    const reply = await peer.call("hello", {});
    const result = reply.result as Record<string, unknown>;
    assert.match(result.session_id as string, /^sess-[0-9a-f]{32}$/);
    assert.deepEqual(result.env, { name: "demo", version: "1.2.3" });
    assert.deepEqual(result.bindings, []);
    assert.deepEqual((await peer.call("hello")).result, result, "same manifest each time");
  });
  await t.step("hello with a non-string session_id is -32602", async () => {
    const reply = await peer.call("hello", { session_id: 5 });
    assert.equal((reply.error as { code: number }).code, -32602);
  });
  await t.step("hello with an unknown session is -32600", async () => {
    const reply = await peer.call("hello", { session_id: "sess-00000000" });
    assert.deepEqual(reply.error, {
      code: -32600,
      message: "unknown session (it expired, was graded or cancelled, or never existed)",
    });
  });
  await t.step("tasks.list in registration order", async () => {
    const reply = await peer.call("tasks.list", { ignored: true });
    const tasks = (reply.result as { tasks: { id: string }[] }).tasks;
    assert.deepEqual(tasks.map((x) => x.id), ["add", "echo"]);
    assert.deepEqual(
      JSON.stringify((tasks[0] as Record<string, unknown>).args),
      '{"properties":{"a":{"title":"A","type":"integer"},"b":{"default":2,"title":"B","type":"integer"}},"required":["a"],"type":"object","additionalProperties":false}',
    );
  });
  await t.step("tasks.start with a bad id, args or unknown task", async () => {
    assert.equal(
      ((await peer.call("tasks.start", { id: 3 })).error as { code: number }).code,
      -32602,
    );
    assert.equal(
      ((await peer.call("tasks.start", { id: "add", args: [1] })).error as { code: number }).code,
      -32602,
    );
    assert.deepEqual((await peer.call("tasks.start", { id: "nope" })).error, {
      code: -32602,
      message: "unknown task: nope",
    });
    const bad = (await peer.call("tasks.start", { id: "add", args: { z: 1 } })).error as {
      code: number;
      message: string;
    };
    assert.equal(bad.code, -32000);
    assert.match(bad.message, /"add".*unknown arguments "z".*missing arguments "a"/);
  });
  await t.step("the reference transcript", async () => {
    await peer.send(
      '{"jsonrpc":"2.0","id":3,"method":"tasks.start","params":{"id":"add","args":{"a":"3"}}}',
    );
    assert.deepEqual(await peer.recv(), { jsonrpc: "2.0", id: 3, result: { prompt: "add:3:2" } });
    await peer.send('{"jsonrpc":"2.0","id":4,"method":"tasks.grade","params":{"answer":"5"}}');
    assert.deepEqual(await peer.recv(), { jsonrpc: "2.0", id: 4, result: { score: 1 } });
    await peer.send('{"jsonrpc":"2.0","id":5,"method":"tasks.grade","params":{"answer":"5"}}');
    assert.deepEqual(await peer.recv(), {
      jsonrpc: "2.0",
      id: 5,
      error: { code: -32600, message: "no task in progress" },
    });
  });
  await t.step("tasks.cancel always answers cancelled", async () => {
    assert.deepEqual((await peer.call("tasks.cancel")).result, { cancelled: true });
    await peer.call("tasks.start", { id: "add", args: { a: 1 } });
    assert.deepEqual((await peer.call("tasks.cancel")).result, { cancelled: true });
    assert.equal(((await peer.call("tasks.grade", {})).error as { code: number }).code, -32600);
  });
  await t.step("unknown method and tunnel.open inside a session are -32601", async () => {
    assert.deepEqual((await peer.call("nope")).error, {
      code: -32601,
      message: "method not found: nope",
    });
    assert.deepEqual((await peer.call("tunnel.open", { capability: "x" })).error, {
      code: -32601,
      message: "method not found: tunnel.open",
    });
    await peer.send({ jsonrpc: "2.0", id: 99 });
    assert.deepEqual((await peer.recv())!.error, { code: -32601, message: "method not found: " });
  });
  await t.step("ids are echoed exactly; notifications get no reply", async () => {
    await peer.send({ jsonrpc: "2.0", id: "abc", method: "hello" });
    assert.equal((await peer.recv())!.id, "abc");
    await peer.send({
      jsonrpc: "2.0",
      method: "tasks.start",
      params: { id: "add", args: { a: 7 } },
    });
    await peer.send({ jsonrpc: "2.0", id: 100, method: "tasks.grade", params: { answer: 9 } });
    assert.deepEqual(await peer.recv(), { jsonrpc: "2.0", id: 100, result: { score: 1 } });
  });
  await t.step("bye cancels, answers, then closes", async () => {
    await peer.call("tasks.start", { id: "add", args: { a: 11 } });
    assert.deepEqual((await peer.call("bye")).result, { goodbye: true });
    assert.equal(await peer.atEof(), true);
  });
  assert.ok(journal.events.includes("finally add 11"), "bye ran the task's finally block");
  assert.ok(journal.events.includes("finally add 3"), "grading ran the task's finally block");
  assert.ok(
    journal.events.indexOf("finally add 3") < journal.events.indexOf("start add 1"),
    "the graded task was closed before the next one started",
  );
  assert.ok(journal.events.includes("finally add 1"), "cancel ran the task's finally block");
});

Deno.test("bind() survives bad input", async (t) => {
  await using server = bind(demoEnv(), { maxFrameBytes: 1024 });
  await t.step("malformed JSON is -32700 and the session goes on", async () => {
    await using peer = await RawPeer.login(server);
    await peer.call("tasks.start", { id: "add", args: { a: 1 } });
    await peer.send("{not json");
    const reply = await peer.recv();
    assert.equal(reply!.id, null);
    assert.equal((reply!.error as { code: number }).code, -32700);
    await peer.send("");
    assert.equal(((await peer.recv())!.error as { code: number }).code, -32700);
    await peer.send(new TextDecoder().decode(new Uint8Array([0x7b, 0xff, 0x7d])));
    assert.equal(((await peer.recv())!.error as { code: number }).code, -32700);
    assert.deepEqual((await peer.call("tasks.grade", { answer: 3 })).result, { score: 1 });
  });
  await t.step("a non-object frame is -32600 and the session goes on", async () => {
    await using peer = await RawPeer.login(server);
    for (const frame of ["[1,2]", "42", '"str"', "null"]) {
      await peer.send(frame);
      assert.equal(((await peer.recv())!.error as { code: number }).code, -32600);
    }
    assert.ok((await peer.call("hello")).result);
  });
  await t.step("params of the wrong type are -32602", async () => {
    await using peer = await RawPeer.login(server);
    assert.equal(((await peer.call("tasks.start", [1])).error as { code: number }).code, -32602);
    assert.ok((await peer.call("tasks.list", null)).result, "null params mean {}");
  });
  await t.step("an oversized frame is -32600 naming the limit, then close", async () => {
    await using other = await RawPeer.login(server);
    await other.call("tasks.start", { id: "add", args: { a: 2 } });
    await using peer = await RawPeer.login(server);
    await peer.send({ jsonrpc: "2.0", id: 1, method: "hello", params: { pad: "x".repeat(5000) } });
    const reply = await peer.recv();
    assert.equal((reply!.error as { code: number }).code, -32600);
    assert.match((reply!.error as { message: string }).message, /1024 bytes/);
    assert.equal(await peer.atEof(), true);
    assert.deepEqual((await other.call("tasks.grade", { answer: 4 })).result, { score: 1 });
  });
  await t.step("an oversized frame without a newline is skipped with bounded memory", async () => {
    await using peer = await RawPeer.login(server);
    const chunk = new TextEncoder().encode("x".repeat(64 * 1024));
    // 4 MiB with no newline against a 1 KiB limit: the server answers once
    // the limit is passed, drains, and closes.
    const writing = (async () => {
      try {
        for (let i = 0; i < 64; i++) await peer.conn.write(chunk);
      } catch {
        // closed by the server
      }
    })();
    const reply = await peer.recv();
    assert.equal((reply!.error as { code: number }).code, -32600);
    await writing;
    assert.equal(await peer.atEof(), true);
    const healthy = await RawPeer.login(server);
    assert.ok((await healthy.call("hello")).result);
    healthy.close();
  });
  await t.step("a task that throws is -32000 with its message", async () => {
    const env = new Environment("throws");
    env.template({ id: "boom" }, async function* () {
      throw new Error("kaboom");
      // deno-lint-ignore no-unreachable
      yield 1;
    });
    await using s2 = bind(env);
    await using peer = await RawPeer.login(s2);
    assert.deepEqual((await peer.call("tasks.start", { id: "boom" })).error, {
      code: -32000,
      message: "kaboom",
    });
  });
});

Deno.test("bind() keeps sessions apart", async (t) => {
  const journal: Journal = { events: [] };
  await using server = bind(demoEnv(journal));
  await using a = await RawPeer.login(server);
  await using b = await RawPeer.login(server);
  await t.step("concurrent sessions each grade their own task", async () => {
    await a.call("tasks.start", { id: "add", args: { a: 1 } });
    await b.call("tasks.start", { id: "add", args: { a: 10 } });
    assert.deepEqual((await b.call("tasks.grade", { answer: 12 })).result, { score: 1 });
    assert.deepEqual((await a.call("tasks.grade", { answer: 3 })).result, { score: 1 });
  });
  await t.step("restarting a task cancels only this session's task", async () => {
    await a.call("tasks.start", { id: "add", args: { a: 100 } });
    await b.call("tasks.start", { id: "add", args: { a: 200 } });
    await a.call("tasks.start", { id: "add", args: { a: 101 } });
    assert.ok(journal.events.includes("finally add 100"));
    assert.ok(!journal.events.includes("finally add 200"));
    assert.deepEqual((await b.call("tasks.grade", { answer: 202 })).result, { score: 1 });
    assert.deepEqual((await a.call("tasks.grade", { answer: 103 })).result, { score: 1 });
  });
});

Deno.test("bind() parks, resumes and adopts tasks", async (t) => {
  const journal: Journal = { events: [] };
  await using server = bind(demoEnv(journal), { parkedTtl: 60_000 });

  await t.step("a dropped connection parks its task; hello resumes it", async () => {
    const first = await RawPeer.login(server);
    const sid = ((await first.call("hello")).result as { session_id: string }).session_id;
    await first.call("tasks.start", { id: "add", args: { a: 5 } });
    first.close();
    await waitFor(() => server.sessionCount === 1);
    await using second = await RawPeer.login(server);
    const resumed = (await second.call("hello", { session_id: sid })).result as {
      session_id: string;
    };
    assert.equal(resumed.session_id, sid);
    assert.deepEqual((await second.call("tasks.grade", { answer: 7 })).result, { score: 1 });
    assert.ok(!journal.events.includes("cancel"), "nothing was cancelled");
  });

  await t.step("resuming a session with a live connection is -32600", async () => {
    await using live = await RawPeer.login(server);
    const sid = ((await live.call("hello")).result as { session_id: string }).session_id;
    await live.call("tasks.start", { id: "add", args: { a: 1 } });
    await using other = await RawPeer.login(server);
    const err = (await other.call("hello", { session_id: sid })).error as {
      code: number;
      message: string;
    };
    assert.equal(err.code, -32600);
    assert.match(err.message, /live connection/);
    await live.call("tasks.cancel");
  });

  await t.step("a plain grade adopts the lone parked task", async () => {
    const starter = await RawPeer.login(server);
    await starter.call("tasks.start", { id: "add", args: { a: 20 } });
    starter.close();
    await waitFor(() => server.sessionCount === 1);
    await using grader = await RawPeer.login(server);
    assert.deepEqual((await grader.call("tasks.grade", { answer: 22 })).result, { score: 1 });
    assert.deepEqual((await grader.call("tasks.grade", { answer: 22 })).error, {
      code: -32600,
      message: "no task in progress",
    });
  });

  await t.step("several parked tasks make adoption ambiguous", async () => {
    const ids: string[] = [];
    for (const a of [30, 31]) {
      const p = await RawPeer.login(server);
      ids.push(((await p.call("hello")).result as { session_id: string }).session_id);
      await p.call("tasks.start", { id: "add", args: { a } });
      p.close();
    }
    await waitFor(() => server.sessionCount === 2);
    await using grader = await RawPeer.login(server);
    const err = (await grader.call("tasks.grade", { answer: 1 })).error as {
      code: number;
      message: string;
    };
    assert.equal(err.code, -32600);
    for (const id of ids) assert.ok(!err.message.includes(id), `does not show ${id}`);
    assert.doesNotMatch(err.message, /sess-/);
    assert.match(err.message, /^2 parked sessions hold a task; resume yours with hello/);
    // Resume one by id, grade it; the other is then adoptable.
    await grader.call("hello", { session_id: ids[0] });
    assert.deepEqual((await grader.call("tasks.grade", { answer: 32 })).result, { score: 1 });
    await using g2 = await RawPeer.login(server);
    assert.deepEqual((await g2.call("tasks.grade", { answer: 33 })).result, { score: 1 });
  });
});

Deno.test("bind() expires parked tasks and runs their finally blocks", async () => {
  const journal: Journal = { events: [] };
  await using server = bind(demoEnv(journal), { parkedTtl: 50 });
  const p = await RawPeer.login(server);
  await p.call("tasks.start", { id: "add", args: { a: 9 } });
  p.close();
  await waitFor(() => journal.events.includes("finally add 9"));
  assert.equal(server.sessionCount, 0);
  await using grader = await RawPeer.login(server);
  assert.equal(
    ((await grader.call("tasks.grade", { answer: 11 })).error as { code: number }).code,
    -32600,
  );
});

Deno.test("bind() shutdown cancels held tasks and closes connections", async () => {
  const journal: Journal = { events: [] };
  const server = bind(demoEnv(journal));
  const live = await RawPeer.login(server);
  await live.call("tasks.start", { id: "add", args: { a: 1 } });
  const parked = await RawPeer.login(server);
  await parked.call("tasks.start", { id: "add", args: { a: 2 } });
  parked.close();
  await server.shutdown();
  await server.shutdown();
  assert.ok(journal.events.includes("finally add 1"));
  assert.ok(journal.events.includes("finally add 2"));
  assert.equal(await live.atEof(), true);
  live.close();
  await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: server.addr.port }));
});

Deno.test("bind() tunnel.open splices to a published capability", async (t) => {
  const echo = echoServer();
  const env = new Environment("tunnels", {
    capabilities: [
      new Capability({ name: "echo", protocol: "tcp/1", url: `tcp://127.0.0.1:${echo.port}` }),
      new Capability({ name: "portless", protocol: "x/1", url: "x://nowhere" }),
    ],
  });
  const dead = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const deadPort = dead.addr.port;
  dead.close();
  env.addCapability(
    new Capability({ name: "down", protocol: "tcp/1", url: `tcp://127.0.0.1:${deadPort}` }),
  );
  await using server = bind(env);
  const port = server.addr.port;

  const open = async (capability: unknown, extra = "") => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    const frame = JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method: "tunnel.open",
      params: { capability, token: server.token },
    });
    await conn.write(new TextEncoder().encode(frame + "\n" + extra));
    return conn;
  };
  const readAll = async (conn: Deno.Conn) => {
    const chunks: Uint8Array[] = [];
    const buf = new Uint8Array(65536);
    while (true) {
      const n = await conn.read(buf);
      if (n === null) break;
      chunks.push(buf.slice(0, n));
    }
    const out = new Uint8Array(chunks.reduce((s, c) => s + c.length, 0));
    let off = 0;
    for (const c of chunks) {
      out.set(c, off);
      off += c.length;
    }
    return out;
  };
  const text = (b: Uint8Array) => new TextDecoder().decode(b);

  await t.step("a short echo, with bytes sent along with the preface", async () => {
    const conn = await open("echo", "early bytes;");
    await conn.write(new TextEncoder().encode("later bytes"));
    await conn.closeWrite();
    const out = text(await readAll(conn));
    conn.close();
    assert.equal(
      out,
      '{"jsonrpc":"2.0","id":1,"result":{"capability":"echo"}}\nearly bytes;later bytes',
    );
  });
  await t.step("1 MiB intact", async () => {
    const big = new Uint8Array(1024 * 1024);
    for (let i = 0; i < big.length; i += 65536) crypto.getRandomValues(big.subarray(i, i + 65536));
    const conn = await open("echo");
    const reading = readAll(conn);
    let off = 0;
    while (off < big.length) off += await conn.write(big.subarray(off));
    await conn.closeWrite();
    const out = await reading;
    conn.close();
    const header = out.indexOf(10) + 1;
    assert.deepEqual(out.subarray(header), big);
  });
  await t.step("8 concurrent streams do not interleave", async () => {
    await Promise.all(Array.from({ length: 8 }, async (_, i) => {
      const payload = new TextEncoder().encode(`stream-${i}:`.repeat(20_000));
      const conn = await open("echo");
      const reading = readAll(conn);
      let off = 0;
      while (off < payload.length) off += await conn.write(payload.subarray(off));
      await conn.closeWrite();
      const out = await reading;
      conn.close();
      assert.deepEqual(out.subarray(out.indexOf(10) + 1), payload);
    }));
  });
  await t.step("half-close: the reply still flows after the client stops sending", async () => {
    const conn = await open("echo");
    await conn.closeWrite();
    const out = text(await readAll(conn));
    conn.close();
    assert.equal(out, '{"jsonrpc":"2.0","id":1,"result":{"capability":"echo"}}\n');
  });
  await t.step("errors: unknown, non-string, portless, refused", async () => {
    for (
      const [cap, code, pattern] of [
        ["nope", -32000, /nope/],
        [7, -32602, /capability/],
        ["portless", -32602, /host:port/],
        ["down", -32000, /down/],
      ] as const
    ) {
      const conn = await open(cap);
      const out = text(await readAll(conn));
      conn.close();
      const reply = JSON.parse(out.trim());
      assert.equal(reply.error.code, code, out);
      assert.match(reply.error.message, pattern);
    }
  });
  await echo.close();
});

Deno.test("serve() runs hooks, announces the port and stops on abort", async () => {
  const log: string[] = [];
  const env = new Environment("served");
  env.initialize(() => void log.push("init"));
  env.shutdown(() => void log.push("shutdown"));
  const controller = new AbortController();
  const lines: string[] = [];
  const server = await serve(env, {
    signal: controller.signal,
    announce: (line) => lines.push(line),
    handleSignals: false,
  });
  assert.match(server.token!, /^[0-9a-f]{64}$/);
  assert.deepEqual(lines, [
    `HUD_SERVE_TOKEN=${server.token}`,
    `HUD_SERVE_PORT=${server.addr.port}`,
  ]);
  assert.deepEqual(log, ["init"]);
  controller.abort();
  await server.finished;
  assert.deepEqual(log, ["init", "shutdown"]);
});

Deno.test("bind() shutdown is bounded when task code never returns", async () => {
  const env = new Environment("stuck");
  let release!: () => void;
  const gate = new Promise<void>((r) => release = r);
  env.template({ id: "hang" }, async function* () {
    await gate; // a setup that never finishes (until the test releases it)
    yield "p";
    yield 1;
  });
  const errors: unknown[] = [];
  const server = bind(env, { shutdownTimeout: 200, onError: (e) => errors.push(e) });
  const peer = await RawPeer.login(server);
  await peer.send({ jsonrpc: "2.0", id: 1, method: "tasks.start", params: { id: "hang" } });
  await new Promise((r) => setTimeout(r, 50));
  const started = Date.now();
  await server.shutdown();
  assert.ok(Date.now() - started < 2_000, "shutdown did not wait for the stuck task");
  assert.match(String(errors[0]), /200 ms with 1 connections still in task code/);
  peer.close();
  release();
  await new Promise((r) => setTimeout(r, 20));
});

/** `promise`, or a rejection saying what was waited for after `ms`. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([promise, expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** Everything the server sends until it closes, as text (bounded in time). */
async function readToEnd(conn: Deno.Conn, what: string): Promise<string> {
  const chunks: string[] = [];
  const buf = new Uint8Array(64 * 1024);
  const decoder = new TextDecoder();
  await within(
    (async () => {
      while (true) {
        const n = await conn.read(buf).catch(() => null);
        if (n === null) return;
        chunks.push(decoder.decode(buf.subarray(0, n), { stream: true }));
      }
    })(),
    10_000,
    what,
  );
  return chunks.join("");
}

/** Sends raw text on a fresh connection and returns all the server said before closing. */
async function exchange(port: number, text: string): Promise<string> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    await conn.write(new TextEncoder().encode(text));
    return await readToEnd(conn, `the server to answer and close after ${text.slice(0, 60)}`);
  } finally {
    conn.close();
  }
}

Deno.test("bind() without the right token sends one error, no manifest, and closes", async (t) => {
  const echo = echoServer();
  let attached = 0;
  const env = demoEnv();
  env.addCapability(
    new Capability({ name: "echo", protocol: "tcp/1", url: `tcp://127.0.0.1:${echo.port}` }),
  );
  env.addCapability(new Capability({ name: "inproc", protocol: "x/1", url: "tcp://127.0.0.1:1" }), {
    attach: () => {
      attached++;
      return Promise.resolve();
    },
  });
  await using server = bind(env);
  const port = server.addr.port;
  const token = server.token!;
  assert.match(token, /^[0-9a-f]{64}$/, "a 256-bit token, generated");
  assert.equal(server.url, `tcp://:${token}@127.0.0.1:${port}`);
  const wrongSameLength = token.slice(0, -1) + (token.endsWith("0") ? "1" : "0");

  const refusals: [string, string][] = [
    ["hello without a token", '{"jsonrpc":"2.0","id":1,"method":"hello","params":{}}\n'],
    ["hello with no params", '{"jsonrpc":"2.0","id":1,"method":"hello"}\n'],
    [
      "hello with a wrong token of the same length",
      JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "hello",
        params: { token: wrongSameLength },
      }) +
      "\n",
    ],
    [
      "hello with a short wrong token",
      '{"jsonrpc":"2.0","id":1,"method":"hello","params":{"token":"x"}}\n',
    ],
    [
      "hello with a non-string token",
      '{"jsonrpc":"2.0","id":1,"method":"hello","params":{"token":[1]}}\n',
    ],
    ["tasks.list first", '{"jsonrpc":"2.0","id":1,"method":"tasks.list"}\n'],
    [
      "tasks.start first, even with the token",
      JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "tasks.start",
        params: { id: "add", args: { a: 1 }, token },
      }) + "\n",
    ],
    ["bad JSON first", "{nope\n"],
    ["a JSON array first", "[1]\n"],
  ];
  for (const [what, text] of refusals) {
    await t.step(what, async () => {
      const out = await exchange(port, text);
      const lines = out.split("\n").filter((l) => l !== "");
      assert.equal(lines.length, 1, `exactly one line: ${out}`);
      const reply = JSON.parse(lines[0]);
      assert.ok(reply.error, out);
      assert.equal(reply.result, undefined);
      assert.doesNotMatch(out, /session_id|bindings|demo|sess-/, "nothing of the manifest");
    });
  }
  await t.step("the error names the way out, with code -32001", async () => {
    const out = await exchange(port, '{"jsonrpc":"2.0","id":7,"method":"hello","params":{}}\n');
    const reply = JSON.parse(out);
    assert.equal(reply.id, 7);
    assert.equal(reply.error.code, -32001);
    assert.match(reply.error.message, /token.*HUD_SERVE_TOKEN/);
  });
  await t.step("tunnel.open without or with a wrong token reaches nothing", async () => {
    for (const params of [{ capability: "echo" }, { capability: "echo", token: wrongSameLength }]) {
      const out = await exchange(
        port,
        JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tunnel.open", params }) + "\nraw bytes",
      );
      assert.equal(JSON.parse(out).error.code, -32001, out);
      assert.doesNotMatch(out, /raw bytes/);
    }
    const out = await exchange(
      port,
      JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "tunnel.open",
        params: { capability: "inproc" },
      }) + "\n",
    );
    assert.equal(JSON.parse(out).error.code, -32001, out);
    assert.equal(attached, 0, "the in-process handler was never called");
  });
  await t.step("the right token opens the session; a later wrong one closes it", async () => {
    await using peer = await RawPeer.open(port);
    const hello = await peer.call("hello", { token });
    assert.match((hello.result as { session_id: string }).session_id, /^sess-[0-9a-f]{32}$/);
    assert.ok((await peer.call("tasks.list")).result, "later frames need no token");
    assert.ok((await peer.call("hello", { token })).result, "a heartbeat with the token");
    const wrong = await peer.call("hello", { token: wrongSameLength });
    assert.equal((wrong.error as { code: number }).code, -32001);
    assert.equal(await peer.atEof(), true);
  });
  await echo.close();
});

Deno.test("bind() compares tokens in constant time", async (t) => {
  const { timingSafeEqual, TokenVerifier } = await import("../_internal/auth.ts");
  await t.step("timingSafeEqual() compares every byte", () => {
    const a = new Uint8Array(32).fill(7);
    assert.equal(timingSafeEqual(a, a.slice()), true);
    for (const i of [0, 15, 31]) {
      const b = a.slice();
      b[i] ^= 1;
      assert.equal(timingSafeEqual(a, b), false, `differs at ${i}`);
    }
    assert.equal(timingSafeEqual(a, a.subarray(1)), false);
  });
  await t.step("TokenVerifier refuses every other value, of any length", () => {
    const verifier = new TokenVerifier("k".repeat(64));
    assert.equal(verifier.verify("k".repeat(64)), true);
    const wrong = [
      "",
      "k",
      "k".repeat(63),
      "k".repeat(65),
      "j" + "k".repeat(63),
      "k".repeat(63) + "j",
    ];
    for (const w of [...wrong, 5, null, undefined]) {
      assert.equal(verifier.verify(w), false, String(w));
    }
  });
  await t.step("the server checks tokens only through TokenVerifier", async () => {
    const source = await Deno.readTextFile(new URL("../_server/admission.ts", import.meta.url));
    assert.match(source, /this\.#verifier\.verify\(params\.token\)/);
    // Comparing with null or undefined (is there a token?) is fine; with a value is not.
    const compared = /token\s*[!=]==\s*(?!\s|null\b|undefined\b)|[!=]==\s*[\w.#]*token\b/i;
    assert.doesNotMatch(source, compared, "no === on a token");
  });
});

Deno.test("bind() session ids carry 128 random bits and never appear in errors", async () => {
  await using server = bind(demoEnv(), { parkedTtl: 60_000 });
  const ids = new Set<string>();
  for (let i = 0; i < 20; i++) {
    await using peer = await RawPeer.login(server);
    const id = ((await peer.call("hello", { token: server.token })).result as {
      session_id: string;
    }).session_id;
    assert.match(id, /^sess-[0-9a-f]{32}$/);
    ids.add(id);
  }
  assert.equal(ids.size, 20);
  const source = await Deno.readTextFile(new URL("../_server/sessions.ts", import.meta.url));
  assert.match(source, /crypto\.getRandomValues\(new Uint8Array\(16\)\)/);
  // A parked session's id shows up in no error, to anyone.
  const owner = await RawPeer.login(server);
  const sid = ((await owner.call("hello")).result as { session_id: string }).session_id;
  await owner.call("tasks.start", { id: "add", args: { a: 1 } });
  owner.close();
  await waitFor(() => server.sessionCount === 1);
  await using other = await RawPeer.login(server);
  await other.call("tasks.start", { id: "add", args: { a: 2 } });
  const another = await RawPeer.login(server);
  await another.call("tasks.start", { id: "add", args: { a: 3 } });
  another.close();
  await waitFor(() => server.sessionCount === 3);
  const errors: string[] = [];
  await using probe = await RawPeer.login(server);
  for (
    const [method, params] of [
      ["tasks.grade", {}],
      ["hello", { session_id: "sess-" + "0".repeat(32) }],
      ["hello", { session_id: sid.slice(0, -1) }],
      ["nope", {}],
    ] as const
  ) {
    errors.push(JSON.stringify((await probe.call(method, params)).error));
  }
  for (const e of errors) assert.doesNotMatch(e, /sess-[0-9a-f]/, e);
  assert.match(errors[0], /2 parked sessions hold a task/);
});

Deno.test("bind() with auth: false keeps the HUD wire, but adopts no parked task", async (t) => {
  await using server = bind(demoEnv(), { auth: false });
  assert.equal(server.token, null);
  assert.equal(server.url, `tcp://127.0.0.1:${server.addr.port}`);
  await t.step("any first frame, no token", async () => {
    await using peer = await RawPeer.open(server.addr.port);
    assert.deepEqual((await peer.call("tasks.start", { id: "add", args: { a: 1 } })).result, {
      prompt: "add:1:2",
    });
    assert.deepEqual((await peer.call("tasks.grade", { answer: 3 })).result, { score: 1 });
  });
  await t.step("a plain grade does not adopt; resuming by id still works", async () => {
    const owner = await RawPeer.open(server.addr.port);
    const sid = ((await owner.call("hello")).result as { session_id: string }).session_id;
    await owner.call("tasks.start", { id: "add", args: { a: 5 } });
    owner.close();
    await waitFor(() => server.sessionCount === 1);
    await using thief = await RawPeer.open(server.addr.port);
    const err = (await thief.call("tasks.grade", { answer: 0 })).error as {
      code: number;
      message: string;
    };
    assert.equal(err.code, -32600);
    assert.match(err.message, /1 parked; adopting a parked task needs an authenticated server/);
    assert.doesNotMatch(err.message, /sess-[0-9a-f]/);
    await using grader = await RawPeer.open(server.addr.port);
    await grader.call("hello", { session_id: sid });
    assert.deepEqual((await grader.call("tasks.grade", { answer: 7 })).result, { score: 1 });
  });
});

Deno.test("bind() refuses auth: false on a non-loopback address without insecureListen", () => {
  for (const hostname of ["0.0.0.0", "::", "192.0.2.1"]) {
    assert.throws(() => bind(demoEnv(), { auth: false, hostname }), {
      name: "TypeError",
      message: new RegExp(`without authentication on "${hostname}".*insecureListen: true`),
    });
  }
  assert.throws(() => bind(demoEnv(), { auth: false, token: "x".repeat(40) }), /drop one/);
  assert.throws(() => bind(demoEnv(), { token: "short" }), /at least 32 characters/);
});

Deno.test("bind() caps parked tasks", async () => {
  const journal: Journal = { events: [] };
  const errors: unknown[] = [];
  await using server = bind(demoEnv(journal), { maxParked: 2, onError: (e) => errors.push(e) });
  for (const a of [1, 2]) {
    const p = await RawPeer.login(server);
    await p.call("tasks.start", { id: "add", args: { a } });
    p.close();
  }
  await waitFor(() => server.sessionCount === 2);
  await using live = await RawPeer.login(server);
  const refused = (await live.call("tasks.start", { id: "add", args: { a: 3 } })).error as {
    code: number;
    message: string;
  };
  assert.equal(refused.code, -32002);
  assert.match(refused.message, /2 tasks are parked, the server's limit \(maxParked\)/);
  assert.ok(!journal.events.includes("start add 3"), "no task code ran");
  await live.call("tasks.grade", { answer: 3 }); // adopts nothing: two are parked
  assert.equal(server.sessionCount, 3);
});

Deno.test("bind() cancels a task whose connection drops while the parked cap is full", async () => {
  const journal: Journal = { events: [] };
  const errors: unknown[] = [];
  await using server = bind(demoEnv(journal), { maxParked: 2, onError: (e) => errors.push(e) });
  const holder = await RawPeer.login(server);
  await holder.call("tasks.start", { id: "add", args: { a: 100 } });
  for (const a of [1, 2]) {
    const p = await RawPeer.login(server);
    await p.call("tasks.start", { id: "add", args: { a } });
    p.close();
  }
  await waitFor(() => server.sessionCount === 3);
  holder.close();
  await waitFor(() => journal.events.includes("finally add 100"));
  assert.equal(server.sessionCount, 2);
  assert.match(
    String(errors[0]),
    /Cannot park a task: 2 tasks are parked, the limit \(maxParked\)/,
  );
});

Deno.test("bind() caps connections: one more gets one error line and is closed", async () => {
  const errors: unknown[] = [];
  await using server = bind(demoEnv(), { maxConnections: 8, onError: (e) => errors.push(e) });
  // Idle connections (the observation: 1,088 of them, never closed), scaled down.
  const idle = await Promise.all(
    Array.from(
      { length: 8 },
      () => Deno.connect({ hostname: "127.0.0.1", port: server.addr.port }),
    ),
  );
  try {
    const out = await exchange(server.addr.port, "");
    const lines = out.split("\n").filter((l) => l !== "");
    assert.equal(lines.length, 1, out);
    const reply = JSON.parse(lines[0]);
    assert.equal(reply.error.code, -32002);
    assert.match(reply.error.message, /too many connections: .* limit of 8/);
    assert.match(String(errors[0]), /Refusing connections: 8 are open/);
  } finally {
    for (const c of idle) c.close();
  }
  // Room again once they are gone.
  await within(
    (async () => {
      while (true) {
        const peer = await RawPeer.open(server.addr.port);
        const reply = await peer.call("hello", { token: server.token });
        peer.close();
        if (reply.result) return;
        await new Promise((r) => setTimeout(r, 20));
      }
    })(),
    10_000,
    "a connection to be accepted after the idle ones closed",
  );
});

Deno.test("bind() closes a connection that sends no first frame in time", async () => {
  await using server = bind(demoEnv(), { firstFrameTimeout: 100 });
  await using peer = await RawPeer.open(server.addr.port);
  // A partial line does not count as a frame.
  await peer.conn.write(new TextEncoder().encode('{"jsonrpc":"2.0",'));
  const reply = await within(peer.recv(), 10_000, "the first-frame deadline error");
  assert.equal((reply!.error as { code: number }).code, -32600);
  assert.match((reply!.error as { message: string }).message, /no request within 100 ms/);
  assert.equal(await within(peer.atEof(), 10_000, "the close"), true);
  // A connection that speaks in time is not affected.
  await using ok = await RawPeer.login(server);
  await new Promise((r) => setTimeout(r, 150));
  assert.ok((await ok.call("tasks.list")).result);
});

Deno.test("bind() sweeps first-frame deadlines as connections come, sparing those that spoke", async () => {
  // One timer sweeps every deadline: it must re-arm for connections that
  // come after a sweep, and never touch one that has spoken.
  await using server = bind(demoEnv(), { firstFrameTimeout: 200 });
  await using early = await RawPeer.open(server.addr.port);
  await using spoke = await RawPeer.login(server);
  const earlyError = await within(early.recv(), 10_000, "the early connection's deadline error");
  assert.match((earlyError!.error as { message: string }).message, /no request within 200 ms/);
  assert.equal(await within(early.atEof(), 10_000, "the early connection's close"), true);
  await using late = await RawPeer.open(server.addr.port);
  const lateError = await within(late.recv(), 10_000, "the late connection's deadline error");
  assert.match((lateError!.error as { message: string }).message, /no request within 200 ms/);
  assert.equal(await within(late.atEof(), 10_000, "the late connection's close"), true);
  assert.ok((await spoke.call("tasks.list")).result, "the connection that spoke was not swept");
});

Deno.test("bind() bounds the bytes buffered across connections", async () => {
  // The observation: 40 connections each holding 15 MiB of an unfinished
  // line; here 6 × 900 KiB against a 2 MiB budget.
  await using server = bind(demoEnv(), {
    maxFrameBytes: 1024 * 1024,
    maxBufferedBytes: 2 * 1024 * 1024,
  });
  const peers = await Promise.all(Array.from({ length: 6 }, () => RawPeer.login(server)));
  try {
    const refused: Record<string, unknown>[] = [];
    for (const p of peers) {
      p.recv().then((reply) => reply && refused.push(reply), () => {});
    }
    const head = new TextEncoder().encode(
      '{"jsonrpc":"2.0","id":1,"method":"hello","params":{"pad":"',
    );
    const chunk = new TextEncoder().encode("x".repeat(900 * 1024));
    await Promise.all(
      peers.map((p) =>
        writeAllTo(p.conn, head).then(() => writeAllTo(p.conn, chunk)).catch(() => {})
      ),
    );
    // 6 × 900 KiB cannot fit in 2 MiB: at least 3 lines must be refused.
    await within(
      waitFor(() => refused.length >= 3, 10_000),
      11_000,
      "at least 3 of 6 connections refused for the shared budget",
    );
    for (const reply of refused) {
      const error = reply.error as { code: number; message: string };
      assert.equal(error.code, -32002);
      assert.match(error.message, /limit of 2097152 bytes/);
    }
  } finally {
    for (const p of peers) p.close();
  }
  await using fresh = await RawPeer.login(server);
  assert.ok((await fresh.call("tasks.list")).result, "small frames still served");
});

async function writeAllTo(conn: Deno.Conn, data: Uint8Array): Promise<void> {
  let off = 0;
  while (off < data.length) off += await conn.write(data.subarray(off));
}

Deno.test("bind() refuses a deeply nested frame before parsing it", async () => {
  await using server = bind(demoEnv());
  await using deep = await RawPeer.login(server);
  await using other = await RawPeer.login(server);
  // The observation: a 15 MiB `[[[...]]]` froze the process; here 2 MiB.
  const depth = 1024 * 1024;
  const frame = "[".repeat(depth) + "]".repeat(depth);
  const sending = deep.send(frame);
  const hello = other.call("tasks.list");
  await sending;
  const reply = await within(deep.recv(), 10_000, "the reply to a deep frame");
  assert.deepEqual(reply!.error, {
    code: -32600,
    message: "frame nests arrays and objects deeper than the limit of 64",
  });
  assert.ok((await within(hello, 10_000, "another connection's reply")).result);
  // The session goes on; depth within the limit and brackets in strings are fine.
  const nested = JSON.parse("[".repeat(60) + "]".repeat(60));
  assert.ok((await deep.call("tasks.list", { nested, text: "[[[[".repeat(100) })).result);
});

Deno.test("bind() hands tunnel.open of an attached capability to its handler", async () => {
  const env = new Environment("attached");
  const heads: string[] = [];
  env.addCapability(new Capability({ name: "upper", protocol: "x/1", url: "tcp://127.0.0.1:0" }), {
    async attach(conn, head) {
      heads.push(new TextDecoder().decode(head));
      let text = new TextDecoder().decode(head);
      const buf = new Uint8Array(1024);
      for (let n = await conn.read(buf); n !== null; n = await conn.read(buf)) {
        text += new TextDecoder().decode(buf.subarray(0, n));
      }
      await conn.write(new TextEncoder().encode(text.toUpperCase()));
    },
  });
  await using server = bind(env);
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  const preface = JSON.stringify({
    jsonrpc: "2.0",
    id: 1,
    method: "tunnel.open",
    params: { capability: "upper", token: server.token },
  });
  await conn.write(new TextEncoder().encode(preface + "\nearly;"));
  await conn.write(new TextEncoder().encode("later"));
  await conn.closeWrite();
  const out = await readToEnd(conn, "the attached handler's answer");
  conn.close();
  assert.equal(out, '{"jsonrpc":"2.0","id":1,"result":{"capability":"upper"}}\nEARLY;LATER');
  assert.ok(heads.length === 1);
  // Through the client's forwarder, like any other capability.
  await using client = await connect(server, { readyTimeout: 10_000 });
  const local = new URL(client.binding("upper").url.replace("tcp:", "http:"));
  const fwd = await Deno.connect({ hostname: "127.0.0.1", port: Number(local.port) });
  await fwd.write(new TextEncoder().encode("via forwarder"));
  await fwd.closeWrite();
  assert.equal(await readToEnd(fwd, "the forwarded answer"), "VIA FORWARDER");
  fwd.close();
});

Deno.test("addWorkspace()'s file tracker has no port: only the authenticated tunnel reaches it", async () => {
  const { addWorkspace } = await import("../workspace/workspace.ts");
  const { FileTrackerClient } = await import("../filetracking/tracker.ts");
  const root = await Deno.makeTempDir({ prefix: "ws-auth-" });
  const env = new Environment("ws");
  addWorkspace(env, root, { writeKeyFile: false });
  await env.start();
  try {
    const published = env.capability("filetracking")!;
    assert.equal(published.url, "tcp://127.0.0.1:0", "a placeholder: nothing listens");
    assert.ok(env.capabilityHandler("filetracking"));
    await using server = bind(env);
    await using client = await connect(server, { readyTimeout: 10_000 });
    await using tracker = await FileTrackerClient.connect(client.binding("filetracking").url);
    await Deno.writeTextFile(`${root}/new.txt`, "hi\n");
    const diff = await tracker.diff();
    assert.deepEqual(diff.patches.map((p) => [p.path, p.status]), [["new.txt", "added"]]);
    // Without the token, tunnel.open to it is refused.
    const out = await exchange(
      server.addr.port,
      JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "tunnel.open",
        params: { capability: "filetracking" },
      }) + '\n{"jsonrpc":"2.0","id":2,"method":"snapshot"}\n',
    );
    assert.equal(JSON.parse(out.split("\n")[0]).error.code, -32001);
    assert.doesNotMatch(out, /new\.txt/);
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("bind() keeps three quarters of the descriptors in reserve by default", async () => {
  // A child with a soft limit of 128 open files: its server holds at most
  // 32 connections, so a flood leaves the rest of the process descriptors.
  const server = new URL("../server.ts", import.meta.url).href;
  const env = new URL("../env.ts", import.meta.url).href;
  const code = `
    import { bind } from "${server}";
    import { Environment } from "${env}";
    const s = bind(new Environment("fds"));
    console.log("PORT=" + s.addr.port);
    await new Response(Deno.stdin.readable).arrayBuffer();
    const files = await Promise.all(Array.from({ length: 40 }, () => Deno.open("${
    new URL(import.meta.url).pathname
  }")));
    console.log("opened " + files.length);
    for (const f of files) f.close();
    await s.shutdown();
  `;
  const child = new Deno.Command("bash", {
    args: ["-c", 'ulimit -n 128 && exec "$0" eval "$1"', Deno.execPath(), code],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const out = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const conns: Deno.Conn[] = [];
  try {
    let text = "";
    await within(
      (async () => {
        while (!/PORT=\d+\n/.test(text)) {
          const { value, done } = await out.read();
          if (done) throw new Error("the child exited before printing its port");
          text += value;
        }
      })(),
      30_000,
      "the child's port line",
    );
    const port = Number(/PORT=(\d+)/.exec(text)![1]);
    for (let i = 0; i < 32; i++) conns.push(await Deno.connect({ hostname: "127.0.0.1", port }));
    const reply = JSON.parse(await exchange(port, ""));
    assert.match(reply.error.message, /too many connections: the server holds its limit of 32/);
    // The process still has descriptors for everything else.
    await child.stdin.close();
    while (!/opened \d+/.test(text)) {
      const { value, done } = await within(out.read(), 30_000, "the child's file opening");
      if (done) break;
      text += value;
    }
    assert.match(text, /opened 40/);
  } finally {
    for (const c of conns) c.close();
    await out.cancel().catch(() => {});
    await child.stderr.cancel().catch(() => {});
    await within(child.status, 30_000, "the child to exit").catch(() => child.kill("SIGKILL"));
  }
});
