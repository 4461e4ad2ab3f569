// The method table and the session registry, in-process: requests in,
// replies out, no socket. A channel's close() is a dropped connection.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Capability, Environment, HudProtocolError, TaskError } from "../../mod.ts";
import {
  type ControlChannel,
  ControlDispatcher,
  type ControlDispatcherOptions,
  type Reply,
  toWireError,
  type WireError,
} from "../../_server/dispatcher.ts";
import { demoEnv, type Journal, waitFor } from "../_helpers.ts";

/** A dispatcher whose tasks are all cancelled (and timers cleared) on dispose. */
function dispatcherFor(
  env: Environment,
  options: Partial<ControlDispatcherOptions> = {},
): ControlDispatcher & AsyncDisposable {
  const d = new ControlDispatcher(env, {
    parkedTtl: 60_000,
    maxParked: 10_000,
    onError: () => {},
    ...options,
  });
  return Object.assign(d, {
    async [Symbol.asyncDispose]() {
      await Promise.allSettled(d.sessions.close());
    },
  });
}

let nextId = 0;

/** Sends a request with a fresh id; its reply. */
async function call(channel: ControlChannel, method: string, params?: unknown): Promise<Reply> {
  const request: Record<string, unknown> = { jsonrpc: "2.0", id: ++nextId, method };
  if (params !== undefined) request.params = params;
  const reply = await channel.handle(request);
  assert.ok(reply !== null, `a reply to ${method}`);
  assert.equal(reply.id, request.id, "the request's id echoed");
  return reply;
}

function resultOf(reply: Reply | null): Record<string, unknown> {
  if (reply === null || !("result" in reply)) {
    return assert.fail(`expected a result, got ${JSON.stringify(reply)}`);
  }
  return reply.result;
}

function errorOf(reply: Reply | null): WireError {
  if (reply === null || !("error" in reply)) {
    return assert.fail(`expected an error, got ${JSON.stringify(reply)}`);
  }
  return reply.error;
}

test("ControlChannel answers every method of the protocol table", async (t) => {
  const journal: Journal = { events: [] };
  await using d = dispatcherFor(demoEnv(journal));
  const ch = d.open();

  await t.step("hello returns the session and the manifest, the same each time", async () => {
    const result = resultOf(await call(ch, "hello", {}));
    assert.equal(result.session_id, ch.sessionId);
    assert.match(ch.sessionId, /^sess-[0-9a-f]{32}$/);
    assert.deepEqual(result.env, { name: "demo", version: "1.2.3" });
    assert.deepEqual(result.bindings, []);
    assert.deepEqual(resultOf(await call(ch, "hello")), result);
    assert.deepEqual(resultOf(await call(ch, "hello", { session_id: null })), result);
    assert.deepEqual(resultOf(await call(ch, "hello", { session_id: ch.sessionId })), result);
  });
  await t.step("hello with a non-string session_id is -32602", async () => {
    assert.deepEqual(errorOf(await call(ch, "hello", { session_id: 5 })), {
      code: -32602,
      message: "session_id must be a string",
    });
  });
  await t.step("hello with an unknown session is -32600", async () => {
    assert.deepEqual(errorOf(await call(ch, "hello", { session_id: "sess-00000000" })), {
      code: -32600,
      message: "unknown session (it expired, was graded or cancelled, or never existed)",
    });
  });
  await t.step("tasks.list in registration order, params ignored", async () => {
    const result = resultOf(await call(ch, "tasks.list", { ignored: true }));
    assert.deepEqual(
      JSON.stringify(result),
      '{"tasks":[{"id":"add","description":"","args":{"properties":{"a":{"title":"A","type":"integer"},"b":{"default":2,"title":"B","type":"integer"}},"required":["a"],"type":"object","additionalProperties":false}},{"id":"echo","description":"","args":{"properties":{},"type":"object","additionalProperties":false}}]}',
    );
  });
  await t.step("tasks.start with a bad id, args, unknown task or refused arguments", async () => {
    assert.deepEqual(errorOf(await call(ch, "tasks.start", { id: 3 })), {
      code: -32602,
      message: "id must be a string",
    });
    assert.deepEqual(errorOf(await call(ch, "tasks.start", { id: "add", args: [1] })), {
      code: -32602,
      message: "args must be an object",
    });
    assert.deepEqual(errorOf(await call(ch, "tasks.start", { id: "nope" })), {
      code: -32602,
      message: "unknown task: nope",
    });
    assert.deepEqual(errorOf(await call(ch, "tasks.start", { id: "add", args: { z: 1 } })), {
      code: -32000,
      message:
        'Cannot start task "add": unknown arguments "z"; missing arguments "a" (expected "a", "b")',
    });
    assert.ok(!journal.events.some((e) => e.startsWith("start")), "no task code ran");
  });
  await t.step(
    "tasks.start cancels the held task first, then looks the id up (as HUD)",
    async () => {
      await call(ch, "tasks.start", { id: "add", args: { a: 60 } });
      assert.deepEqual(errorOf(await call(ch, "tasks.start", { id: "nope" })), {
        code: -32602,
        message: "unknown task: nope",
      });
      assert.ok(journal.events.includes("finally add 60"), "the held task was cancelled");
      assert.deepEqual(errorOf(await call(ch, "tasks.grade", { answer: 62 })), {
        code: -32600,
        message: "no task in progress",
      });
    },
  );
  await t.step("start, grade, and a second grade", async () => {
    assert.deepEqual(
      await ch.handle({ id: 3, method: "tasks.start", params: { id: "add", args: { a: "3" } } }),
      {
        jsonrpc: "2.0",
        id: 3,
        result: { prompt: "add:3:2" },
      },
    );
    assert.deepEqual(await ch.handle({ id: 4, method: "tasks.grade", params: { answer: "5" } }), {
      jsonrpc: "2.0",
      id: 4,
      result: { score: 1 },
    });
    assert.deepEqual(await ch.handle({ id: 5, method: "tasks.grade", params: { answer: "5" } }), {
      jsonrpc: "2.0",
      id: 5,
      error: { code: -32600, message: "no task in progress" },
    });
  });
  await t.step("the prompt frame passes extra keys through", async () => {
    assert.deepEqual(resultOf(await call(ch, "tasks.start", { id: "echo" })), {
      prompt: "echo",
      bindings: { shell: { seed: 7 } },
      args: {},
    });
    assert.deepEqual(resultOf(await call(ch, "tasks.grade", { answer: [1, 2] })), {
      score: 0.5,
      content: [1, 2],
    });
  });
  await t.step("tasks.cancel always answers cancelled", async () => {
    assert.deepEqual(resultOf(await call(ch, "tasks.cancel")), { cancelled: true });
    await call(ch, "tasks.start", { id: "add", args: { a: 1 } });
    assert.deepEqual(resultOf(await call(ch, "tasks.cancel", { ignored: 1 })), { cancelled: true });
    assert.equal(errorOf(await call(ch, "tasks.grade", {})).code, -32600);
  });
  await t.step("an unknown method, tunnel.open inside a session, no method: -32601", async () => {
    assert.deepEqual(errorOf(await call(ch, "nope")), {
      code: -32601,
      message: "method not found: nope",
    });
    assert.deepEqual(errorOf(await call(ch, "tunnel.open", { capability: "x" })), {
      code: -32601,
      message: "method not found: tunnel.open",
    });
    assert.deepEqual(await ch.handle({ jsonrpc: "2.0", id: 99 }), {
      jsonrpc: "2.0",
      id: 99,
      error: { code: -32601, message: "method not found: " },
    });
  });
  await t.step("params or args that Python reads as false mean {}, as HUD's server", async () => {
    for (const falsy of [null, false, 0, "", [], {}]) {
      assert.ok(resultOf(await call(ch, "tasks.list", falsy)), JSON.stringify(falsy));
      assert.deepEqual(
        resultOf(await call(ch, "tasks.start", { id: "echo", args: falsy })).args,
        {},
        JSON.stringify(falsy),
      );
    }
    await call(ch, "tasks.cancel");
  });
  await t.step("other params that are not an object are -32602 where they are read", async () => {
    for (const params of [[1], 7, "x", true]) {
      for (const method of ["hello", "tasks.start"]) {
        assert.deepEqual(errorOf(await call(ch, method, params)), {
          code: -32602,
          message: "params must be an object",
        }, `${method} ${JSON.stringify(params)}`);
      }
    }
    assert.deepEqual(errorOf(await call(ch, "tasks.start", { id: "echo", args: [1] })), {
      code: -32602,
      message: "args must be an object",
    });
  });
  await t.step("a method that is not a string is -32601, as HUD's server", async () => {
    assert.deepEqual(await ch.handle({ id: 7, method: 7 }), {
      jsonrpc: "2.0",
      id: 7,
      error: { code: -32601, message: "method not found: 7" },
    });
    assert.deepEqual(errorOf(await call(ch, "x", undefined)), {
      code: -32601,
      message: "method not found: x",
    });
    assert.equal(errorOf(await ch.handle({ id: 8, method: ["hello"] })).code, -32601);
  });
  await t.step(
    "ids are echoed as given; id null or absent is a notification, run all the same",
    async () => {
      assert.equal((await ch.handle({ id: "abc", method: "hello" }))?.id, "abc");
      assert.equal((await ch.handle({ id: 0, method: "hello" }))?.id, 0);
      assert.equal(await ch.handle({ id: null, method: "hello" }), null);
      assert.equal(await ch.handle({ id: null, method: "nope" }), null, "errors too");
      assert.equal(
        await ch.handle({ method: "tasks.start", params: { id: "add", args: { a: 7 } } }),
        null,
      );
      assert.deepEqual(resultOf(await call(ch, "tasks.grade", { answer: 9 })), { score: 1 });
    },
  );
  await t.step("bye cancels the task, answers, and ends the channel", async () => {
    await call(ch, "tasks.start", { id: "add", args: { a: 11 } });
    assert.equal(ch.ended, false);
    assert.deepEqual(resultOf(await call(ch, "bye")), { goodbye: true });
    assert.equal(ch.ended, true);
    ch.close();
    assert.equal(d.sessions.size, 0, "the session is forgotten");
  });
  assert.ok(journal.events.includes("finally add 11"), "bye ran the task's finally block");
  assert.ok(journal.events.includes("finally add 3"), "grading ran the task's finally block");
  assert.ok(
    journal.events.indexOf("finally add 3") < journal.events.indexOf("start add 1"),
    "the graded task was closed before the next one started",
  );
  assert.ok(journal.events.includes("finally add 1"), "cancel ran the task's finally block");
});

test("ControlChannel reads params, and answers, where HUD's server does (issue 42, points 2 to 4)", async (t) => {
  const journal: Journal = { events: [] };
  await using d = dispatcherFor(demoEnv(journal));
  const ch = d.open();
  await t.step("tasks.list, tasks.cancel and bye never read their params", async () => {
    for (const params of [[1], 7, "x", true]) {
      const shown = JSON.stringify(params);
      assert.ok(Array.isArray(resultOf(await call(ch, "tasks.list", params)).tasks), shown);
      await call(ch, "tasks.start", { id: "add", args: { a: 20 } });
      assert.deepEqual(resultOf(await call(ch, "tasks.cancel", params)), { cancelled: true });
      assert.equal(journal.events.at(-1), "finally add 20", `tasks.cancel ${shown} cancelled`);
      assert.equal(
        errorOf(await call(ch, "tasks.grade", { answer: 22 })).message,
        "no task in progress",
      );
    }
    const other = d.open();
    await call(other, "tasks.start", { id: "add", args: { a: 30 } });
    assert.deepEqual(resultOf(await call(other, "bye", 7)), { goodbye: true });
    assert.equal(other.ended, true, "the connection is to be closed");
    assert.equal(journal.events.at(-1), "finally add 30", "bye 7 cancelled the task");
    other.close();
  });
  await t.step("a grade whose params are not an object consumes the task", async () => {
    await call(ch, "tasks.start", { id: "add", args: { a: 40 } });
    assert.deepEqual(errorOf(await call(ch, "tasks.grade", [42])), {
      code: -32602,
      message: "params must be an object",
    });
    assert.equal(journal.events.at(-1), "finally add 40", "the task was cancelled");
    assert.equal(
      errorOf(await call(ch, "tasks.grade", { answer: 42 })).message,
      "no task in progress",
    );
    // An adopted task too: the grade took it.
    const starter = d.open();
    await call(starter, "tasks.start", { id: "add", args: { a: 50 } });
    starter.close();
    assert.equal(errorOf(await call(ch, "tasks.grade", "x")).code, -32602);
    assert.equal(d.sessions.parkedCount, 0);
    assert.equal(journal.events.at(-1), "finally add 50");
    // No task: the same answer as any grade without one.
    assert.equal(errorOf(await call(ch, "tasks.grade", [1])).message, "no task in progress");
  });
  await t.step("a grade without an answer sends null in, and the reply keeps it", async () => {
    for (const params of [undefined, {}, { answer: null }, []]) {
      await call(ch, "tasks.start", { id: "echo" });
      assert.deepEqual(
        JSON.stringify(await call(ch, "tasks.grade", params)),
        `{"jsonrpc":"2.0","id":${nextId},"result":{"score":0.5,"content":null}}`,
      );
    }
  });
});

test("ControlChannel maps errors to codes in one place", async (t) => {
  const env = new Environment("errors");
  env.template({ id: "boom" }, async function* () {
    throw new Error("kaboom");
    // deno-lint-ignore no-unreachable
    yield 1;
  });
  env.template({ id: "wire" }, async function* () {
    // Task code that fails on a wire error of its own (say, from a client
    // it uses) still fails as task code.
    throw new HudProtocolError(-32602, "unknown task: inner");
    // deno-lint-ignore no-unreachable
    yield 1;
  });
  env.template({ id: "nograde" }, async function* () {
    yield "p";
  });
  await using d = dispatcherFor(env);
  const ch = d.open();
  await t.step("task code that throws is -32000 with its message, and where it threw", async () => {
    const boom = errorOf(await call(ch, "tasks.start", { id: "boom" }));
    const { data, ...wire } = boom as { data?: { at?: string; stack?: string } };
    assert.deepEqual(wire, { code: -32000, message: "kaboom" });
    // The environment's own frame (this file), never the SDK's.
    assert.match(data?.at ?? "", /tests\/_server\/dispatcher_test\.ts:\d+:\d+$/);
    assert.match(data?.stack ?? "", /^Error: kaboom\n {4}at .*dispatcher_test\.ts:\d+:\d+/);
    assert.doesNotMatch(data?.stack ?? "", /\/(env|task|_server\/dispatcher)\.ts:/);
    const wired = errorOf(await call(ch, "tasks.start", { id: "wire" }));
    assert.equal(wired.code, -32000);
    assert.equal(wired.message, "unknown task: inner");
  });
  await t.step("a broken grading contract is -32000", async () => {
    await call(ch, "tasks.start", { id: "nograde" });
    assert.deepEqual(errorOf(await call(ch, "tasks.grade", { answer: 1 })), {
      code: -32000,
      message:
        'Cannot grade task "nograde": the template ended without a second yield; yield the evaluation (a number, or an object with a numeric "score")',
    });
  });
  await t.step("toWireError: protocol errors keep their code, the rest is -32000", () => {
    assert.deepEqual(toWireError(new HudProtocolError(-32600, "x")), {
      code: -32600,
      message: "x",
    });
    assert.deepEqual(toWireError(new TaskError("t", "y")), { code: -32000, message: "y" });
    assert.deepEqual(toWireError(new TypeError("z")), { code: -32000, message: "z" });
    assert.deepEqual(toWireError("plain"), { code: -32000, message: "plain" });
  });
});

test("ControlChannel keeps sessions apart", async () => {
  const journal: Journal = { events: [] };
  await using d = dispatcherFor(demoEnv(journal));
  const a = d.open();
  const b = d.open();
  assert.notEqual(a.sessionId, b.sessionId);
  await call(a, "tasks.start", { id: "add", args: { a: 1 } });
  await call(b, "tasks.start", { id: "add", args: { a: 10 } });
  assert.deepEqual(resultOf(await call(b, "tasks.grade", { answer: 12 })), { score: 1 });
  assert.deepEqual(resultOf(await call(a, "tasks.grade", { answer: 3 })), { score: 1 });
  await call(a, "tasks.start", { id: "add", args: { a: 100 } });
  await call(b, "tasks.start", { id: "add", args: { a: 200 } });
  await call(a, "tasks.start", { id: "add", args: { a: 101 } });
  assert.ok(journal.events.includes("finally add 100"), "a restart cancels the session's task");
  assert.ok(!journal.events.includes("finally add 200"), "and no other");
  assert.deepEqual(resultOf(await call(b, "tasks.grade", { answer: 202 })), { score: 1 });
  assert.deepEqual(resultOf(await call(a, "tasks.grade", { answer: 103 })), { score: 1 });
});

test("SessionRegistry parks, resumes and adopts tasks", async (t) => {
  const journal: Journal = { events: [] };
  await using d = dispatcherFor(demoEnv(journal));

  await t.step("a dropped connection parks its task; hello resumes it", async () => {
    const first = d.open();
    const sid = first.sessionId;
    await call(first, "tasks.start", { id: "add", args: { a: 5 } });
    first.close();
    assert.equal(d.sessions.parkedCount, 1);
    const second = d.open();
    assert.equal(resultOf(await call(second, "hello", { session_id: sid })).session_id, sid);
    assert.equal(second.sessionId, sid);
    assert.equal(d.sessions.size, 1, "the session the connection had before is forgotten");
    assert.deepEqual(resultOf(await call(second, "tasks.grade", { answer: 7 })), { score: 1 });
    assert.ok(!journal.events.includes("finally add 5") || journal.events.includes("start add 5"));
    second.close();
    assert.equal(d.sessions.size, 0);
  });
  await t.step("a session without a task is forgotten when its connection drops", () => {
    const idle = d.open();
    assert.equal(d.sessions.size, 1);
    idle.close();
    idle.close();
    assert.equal(d.sessions.size, 0);
  });
  await t.step("resuming a session with a live connection is -32600", async () => {
    const live = d.open();
    await call(live, "tasks.start", { id: "add", args: { a: 1 } });
    const other = d.open();
    assert.deepEqual(errorOf(await call(other, "hello", { session_id: live.sessionId })), {
      code: -32600,
      message: "session has a live connection",
    });
    await call(live, "tasks.cancel");
    live.close();
    other.close();
  });
  await t.step("resuming releases the session this connection held, parking its task", async () => {
    const owner = d.open();
    await call(owner, "tasks.start", { id: "add", args: { a: 40 } });
    owner.close();
    const mover = d.open();
    const before = mover.sessionId;
    await call(mover, "tasks.start", { id: "add", args: { a: 41 } });
    await call(mover, "hello", { session_id: owner.sessionId });
    assert.equal(d.sessions.parkedCount, 1, "41 parked in its place");
    assert.deepEqual(resultOf(await call(mover, "tasks.grade", { answer: 42 })), { score: 1 });
    await call(mover, "hello", { session_id: before });
    assert.deepEqual(resultOf(await call(mover, "tasks.grade", { answer: 43 })), { score: 1 });
    mover.close();
  });
  await t.step("a plain grade adopts the lone parked task, once", async () => {
    const starter = d.open();
    await call(starter, "tasks.start", { id: "add", args: { a: 20 } });
    starter.close();
    const grader = d.open();
    assert.deepEqual(resultOf(await call(grader, "tasks.grade", { answer: 22 })), { score: 1 });
    assert.deepEqual(errorOf(await call(grader, "tasks.grade", { answer: 22 })), {
      code: -32600,
      message: "no task in progress",
    });
    assert.deepEqual(errorOf(await call(grader, "hello", { session_id: starter.sessionId })), {
      code: -32600,
      message: "unknown session (it expired, was graded or cancelled, or never existed)",
    });
    grader.close();
  });
  await t.step("several parked tasks make adoption ambiguous; no id is shown", async () => {
    const ids: string[] = [];
    for (const a of [30, 31]) {
      const p = d.open();
      ids.push(p.sessionId);
      await call(p, "tasks.start", { id: "add", args: { a } });
      p.close();
    }
    const grader = d.open();
    const err = errorOf(await call(grader, "tasks.grade", { answer: 1 }));
    assert.deepEqual(err, {
      code: -32600,
      message:
        '2 parked sessions hold a task; resume yours with hello {"session_id": ...} before grading',
    });
    await call(grader, "hello", { session_id: ids[0] });
    assert.deepEqual(resultOf(await call(grader, "tasks.grade", { answer: 32 })), { score: 1 });
    const g2 = d.open();
    assert.deepEqual(resultOf(await call(g2, "tasks.grade", { answer: 33 })), { score: 1 });
    grader.close();
    g2.close();
  });
});

test("SessionRegistry expires parked tasks and runs their finally blocks", async () => {
  const journal: Journal = { events: [] };
  await using d = dispatcherFor(demoEnv(journal), { parkedTtl: 50 });
  const p = d.open();
  await call(p, "tasks.start", { id: "add", args: { a: 9 } });
  p.close();
  await waitFor(() => journal.events.includes("finally add 9"));
  assert.equal(d.sessions.size, 0);
  const grader = d.open();
  assert.deepEqual(errorOf(await call(grader, "tasks.grade", { answer: 11 })), {
    code: -32600,
    message: "no task in progress",
  });
  grader.close();
});

test("SessionRegistry caps parked tasks", async (t) => {
  await t.step("tasks.start is refused while the cap is full, before any task code", async () => {
    const journal: Journal = { events: [] };
    await using d = dispatcherFor(demoEnv(journal), { maxParked: 2 });
    for (const a of [1, 2]) {
      const p = d.open();
      await call(p, "tasks.start", { id: "add", args: { a } });
      p.close();
    }
    const live = d.open();
    assert.deepEqual(errorOf(await call(live, "tasks.start", { id: "add", args: { a: 3 } })), {
      code: -32002,
      message:
        'Cannot start task "add": 2 tasks are parked, the server\'s limit (maxParked); grade or resume them, or wait for them to expire',
    });
    assert.ok(!journal.events.includes("start add 3"), "no task code ran");
    live.close();
  });
  await t.step("a task whose connection drops while the cap is full is cancelled", async () => {
    const journal: Journal = { events: [] };
    const errors: unknown[] = [];
    await using d = dispatcherFor(demoEnv(journal), {
      maxParked: 2,
      onError: (e) => errors.push(e),
    });
    const holder = d.open();
    await call(holder, "tasks.start", { id: "add", args: { a: 100 } });
    for (const a of [1, 2]) {
      const p = d.open();
      await call(p, "tasks.start", { id: "add", args: { a } });
      p.close();
    }
    holder.close();
    await waitFor(() => journal.events.includes("finally add 100"));
    assert.equal(d.sessions.size, 2);
    assert.match(
      String(errors[0]),
      /Cannot park a task: 2 tasks are parked, the limit \(maxParked\); cancelled it/,
    );
  });
});

test("SessionRegistry.close() cancels every task and refuses a start that finishes after it", async () => {
  const journal: Journal = { events: [] };
  const env = demoEnv(journal);
  let release!: () => void;
  const gate = new Promise<void>((r) => release = r);
  env.template({ id: "slow" }, async function* () {
    await gate;
    try {
      yield "p";
      yield 1;
    } finally {
      journal.events.push("finally slow");
    }
  });
  await using d = dispatcherFor(env);
  const live = d.open();
  await call(live, "tasks.start", { id: "add", args: { a: 1 } });
  const parked = d.open();
  await call(parked, "tasks.start", { id: "add", args: { a: 2 } });
  parked.close();
  const slow = d.open();
  const starting = call(slow, "tasks.start", { id: "slow" });
  d.sessions.beginClose();
  live.close();
  assert.equal(d.sessions.parkedCount, 1, "nothing parks once closing");
  await Promise.all(d.sessions.close());
  assert.ok(journal.events.includes("finally add 1"));
  assert.ok(journal.events.includes("finally add 2"));
  release();
  assert.deepEqual(errorOf(await starting), { code: -32000, message: "server is shutting down" });
  assert.ok(journal.events.includes("finally slow"), "the late task was cancelled");
});

test("ControlDispatcher mints 128-bit session ids and never shows one in an error", async () => {
  await using d = dispatcherFor(demoEnv());
  const ids = new Set<string>();
  for (let i = 0; i < 50; i++) {
    const ch = d.open();
    assert.match(ch.sessionId, /^sess-[0-9a-f]{32}$/);
    ids.add(ch.sessionId);
    ch.close();
  }
  assert.equal(ids.size, 50);
  const owner = d.open();
  await call(owner, "tasks.start", { id: "add", args: { a: 1 } });
  owner.close();
  const other = d.open();
  await call(other, "tasks.start", { id: "add", args: { a: 2 } });
  const another = d.open();
  await call(another, "tasks.start", { id: "add", args: { a: 3 } });
  another.close();
  const probe = d.open();
  const errors: WireError[] = [];
  const probes: [string, Record<string, unknown>][] = [
    ["tasks.grade", {}],
    ["hello", { session_id: "sess-" + "0".repeat(32) }],
    ["hello", { session_id: owner.sessionId.slice(0, -1) }],
    ["hello", { session_id: other.sessionId }],
    ["nope", {}],
  ];
  for (const [method, params] of probes) {
    errors.push(errorOf(await call(probe, method, params)));
  }
  for (const e of errors) assert.doesNotMatch(e.message, /sess-[0-9a-f]/, e.message);
  assert.match(errors[0].message, /^2 parked sessions hold a task/);
});

test("ControlChannel's hello lists published capabilities in the manifest", async () => {
  const env = new Environment("caps", {
    capabilities: [
      new Capability({ name: "echo", protocol: "tcp/1", url: "tcp://127.0.0.1:9" }),
    ],
  });
  await using d = dispatcherFor(env);
  const ch = d.open();
  assert.deepEqual(resultOf(await call(ch, "hello")).bindings, [
    { name: "echo", protocol: "tcp/1", url: "tcp://127.0.0.1:9", params: {} },
  ]);
  ch.close();
});
