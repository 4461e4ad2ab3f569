import assert from "node:assert/strict";
import { bind, Capability, Environment, serve } from "../mod.ts";
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
