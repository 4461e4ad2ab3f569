// Argument checking and grading errors as a peer sees them on the wire.
import { test } from "./_test.ts";
import assert from "node:assert/strict";
import { bind, connect, enumOf, Environment, HudProtocolError, integer } from "../mod.ts";
import { RawPeer } from "./_helpers.ts";

function argsEnv(ran: string[]): Environment {
  const env = new Environment("args");
  env.template(
    { id: "job", args: { n: integer(), lang: enumOf(["python", "shell"]) } },
    async function* ({ n, lang }) {
      ran.push(`job ${n} ${lang}`);
      const answer = yield `${lang}:${n}`;
      yield answer === String(n) ? 1 : 0;
    },
  );
  env.template({ id: "none" }, async function* () {
    ran.push("none");
    yield "p";
    yield 1;
  });
  env.template({ id: "forgot" }, async function* () {
    yield "p";
  });
  env.template({ id: "nan" }, async function* () {
    const answer = yield "p";
    yield answer === "obj" ? { score: NaN, info: { why: "0/0" } } : Number(answer) / 0;
  });
  return env;
}

function errorOf(reply: Record<string, unknown>): { code: number; message: string } {
  assert.ok(reply.error, `expected an error reply, got ${JSON.stringify(reply)}`);
  return reply.error as { code: number; message: string };
}

test("tasks.start refuses mistyped arguments with -32000, naming them", async (t) => {
  const ran: string[] = [];
  await using server = bind(argsEnv(ran));
  await using peer = await RawPeer.login(server);
  await t.step("integer() refuses text and fractions", async () => {
    assert.deepEqual(
      errorOf(await peer.call("tasks.start", { id: "job", args: { n: "abc", lang: "shell" } })),
      {
        code: -32000,
        message: 'Cannot start task "job": argument "n" must be an integer, got "abc"',
      },
    );
    assert.deepEqual(
      errorOf(await peer.call("tasks.start", { id: "job", args: { n: 2.5, lang: "shell" } })),
      {
        code: -32000,
        message: 'Cannot start task "job": argument "n" must be an integer, got 2.5',
      },
    );
  });
  await t.step("enumOf() refuses a value outside the set, listing the set", async () => {
    assert.deepEqual(
      errorOf(await peer.call("tasks.start", { id: "job", args: { n: 1, lang: "rust" } })),
      {
        code: -32000,
        message:
          'Cannot start task "job": argument "lang" must be one of "python", "shell", got "rust"',
      },
    );
  });
  await t.step("__proto__ and constructor are unknown names, not a way in", async () => {
    await peer.send(
      '{"jsonrpc":"2.0","id":"p","method":"tasks.start","params":{"id":"job","args":{"n":1,"lang":"shell","__proto__":{"n":2},"constructor":1}}}',
    );
    assert.deepEqual(await peer.recv(), {
      jsonrpc: "2.0",
      id: "p",
      error: {
        code: -32000,
        message:
          'Cannot start task "job": unknown arguments "__proto__", "constructor" (expected "n", "lang")',
      },
    });
  });
  await t.step("a template without args takes none", async () => {
    assert.deepEqual(
      errorOf(await peer.call("tasks.start", { id: "none", args: { x: 1 } })),
      {
        code: -32000,
        message: 'Cannot start task "none": unknown arguments "x" (expected no arguments)',
      },
    );
    const list = (await peer.call("tasks.list")).result as { tasks: { args: unknown }[] };
    assert.deepEqual(list.tasks[1].args, {
      properties: {},
      type: "object",
      additionalProperties: false,
    });
  });
  await t.step("no task code ran; clean conversions still start", async () => {
    assert.deepEqual(ran, []);
    const reply = await peer.call("tasks.start", { id: "job", args: { n: "7", lang: "python" } });
    assert.deepEqual(reply.result, { prompt: "python:7" });
    assert.deepEqual((await peer.call("tasks.grade", { answer: "7" })).result, { score: 1 });
    assert.deepEqual(ran, ["job 7 python"]);
  });
});

test("tasks.grade reports a template that ends without grading", async () => {
  await using server = bind(argsEnv([]));
  await using peer = await RawPeer.login(server);
  await peer.call("tasks.start", { id: "forgot" });
  assert.deepEqual(errorOf(await peer.call("tasks.grade", { answer: "x" })), {
    code: -32000,
    message:
      'Cannot grade task "forgot": the template ended without a second yield; yield the evaluation (a number, or an object with a numeric "score")',
  });
  // The task is consumed, as after any grading error.
  assert.deepEqual(errorOf(await peer.call("tasks.grade", { answer: "x" })), {
    code: -32600,
    message: "no task in progress",
  });
});

test("tasks.grade refuses a non-finite score instead of sending null", async (t) => {
  await using server = bind(argsEnv([]));
  await using client = await connect(server, { readyTimeout: 10_000 });
  for (
    const [answer, message] of [
      ["1", 'Cannot grade task "nan": the score is Infinity; a score must be a finite number'],
      ["-1", 'Cannot grade task "nan": the score is -Infinity; a score must be a finite number'],
      ["0", 'Cannot grade task "nan": the score is NaN; a score must be a finite number'],
      ["obj", 'Cannot grade task "nan": the "score" is NaN; a score must be a finite number'],
    ]
  ) {
    await t.step(`answer ${answer}`, async () => {
      await client.startTask("nan");
      await assert.rejects(client.grade({ answer }), (e: unknown) => {
        assert.ok(e instanceof HudProtocolError);
        assert.equal(e.code, -32000);
        assert.equal(e.message, message);
        return true;
      });
    });
  }
});
