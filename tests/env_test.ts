import assert from "node:assert/strict";
import {
  any,
  array,
  boolean,
  enumOf,
  Environment,
  environmentOf,
  ErrorCode,
  HudProtocolError,
  integer,
  literal,
  number,
  object,
  optional,
  string,
  taskSlug,
  type TemplateGenerator,
  type TypedAnswer,
  withDefault,
} from "../mod.ts";

Deno.test("taskSlug() matches the HUD SDK's examples", () => {
  assert.equal(taskSlug("t", { a: 1, b: 2 }), "t-1744f53e");
  assert.equal(taskSlug("t", { b: 2, a: 1 }), "t-1744f53e");
  assert.equal(taskSlug("t", { n: 1 }), "t-bae34777");
  assert.equal(taskSlug("t", { word: "strawberry" }), "t-f624d1ae");
  assert.equal(taskSlug("plain", {}), "plain");
});

Deno.test("Environment.template() mints task rows", async (t) => {
  const env = new Environment("robolab");
  const fix = env.template(
    { id: "fix_bug", args: { difficulty: integer(), tag: optional(string()) } },
    async function* ({ difficulty }) {
      yield `fix ${difficulty}`;
      yield 1;
    },
  );
  await t.step("with the computed slug", () => {
    const row = fix({ difficulty: 3 });
    assert.deepEqual(row, {
      env: "robolab",
      id: "fix_bug",
      args: { difficulty: 3 },
      slug: taskSlug("fix_bug", { difficulty: 3 }),
    });
    assert.equal(environmentOf(row), env);
    assert.equal(environmentOf({ ...row }), undefined);
  });
  await t.step("with a slug override", () => {
    assert.equal(fix({ difficulty: 1 }, { slug: "easy" }).slug, "easy");
  });
  await t.step("refusing unknown and missing arguments", () => {
    assert.throws(
      // deno-lint-ignore no-explicit-any
      () => fix({ difficulty: 1, nope: 2 } as any),
      { name: "TypeError", message: /unknown arguments "nope"/ },
    );
    // deno-lint-ignore no-explicit-any
    assert.throws(() => fix({} as any), {
      name: "TypeError",
      message: /missing arguments "difficulty"/,
    });
  });
  await t.step("exposing id and env", () => {
    assert.equal(fix.id, "fix_bug");
    assert.equal(fix.env, env);
  });
});

Deno.test("Environment.template() refuses bad registrations", () => {
  const env = new Environment("e");
  // deno-lint-ignore no-explicit-any
  const plain: any = async () => {};
  assert.throws(() => env.template({ id: "x" }, plain), {
    name: "TypeError",
    message: /async generator function/,
  });
  // deno-lint-ignore no-explicit-any
  const syncGen: any = function* () {};
  assert.throws(() => env.template({ id: "x" }, syncGen), { name: "TypeError" });
  env.template({ id: "x" }, async function* () {
    yield 1;
  });
  assert.throws(
    () =>
      env.template({ id: "x" }, async function* () {
        yield 1;
      }),
    { name: "TypeError", message: /"x".*environment "e" already has/ },
  );
  assert.throws(() =>
    env.template({ id: "" }, async function* () {
      yield 1;
    })
  );
});

Deno.test("Environment.listTasks() publishes JSON Schemas", async (t) => {
  const env = new Environment("schemas");
  env.template(
    {
      id: "all",
      description: "every kind",
      args: {
        a: integer(),
        b: withDefault(integer(), 2),
        max_steps: number({ description: "budget" }),
        name: string(),
        flag: boolean(),
        level: enumOf(["easy", "hard"]),
        exact: literal(3),
        items: array(integer()),
        cfg: object({ depth: integer(), note: optional(string()) }),
        blob: object(),
        anything: any(),
        maybe: optional(string()),
      },
      input: string(),
      returns: object({ answer: integer() }),
    },
    async function* () {
      yield "p";
      yield 0;
    },
  );
  env.template({ id: "untyped" }, async function* () {
    yield "p";
    yield 0;
  });
  env.template({ id: "extra", args: { a: integer() }, extraArgs: true }, async function* () {
    yield "p";
    yield 0;
  });
  const [all, untyped, extra] = env.listTasks();
  await t.step("the documented example shape", () => {
    const p = all.args.properties as Record<string, unknown>;
    assert.deepEqual(p.a, { title: "A", type: "integer" });
    assert.deepEqual(p.b, { default: 2, title: "B", type: "integer" });
    assert.deepEqual(JSON.stringify(p.b), '{"default":2,"title":"B","type":"integer"}');
  });
  await t.step("each schema kind", () => {
    const p = all.args.properties as Record<string, Record<string, unknown>>;
    assert.deepEqual(p.max_steps, { title: "Max Steps", description: "budget", type: "number" });
    assert.deepEqual(p.name, { title: "Name", type: "string" });
    assert.deepEqual(p.flag, { title: "Flag", type: "boolean" });
    assert.deepEqual(p.level, { title: "Level", enum: ["easy", "hard"], type: "string" });
    assert.deepEqual(p.exact, { title: "Exact", const: 3, type: "integer" });
    assert.deepEqual(p.items, { title: "Items", items: { type: "integer" }, type: "array" });
    assert.deepEqual(p.cfg, {
      title: "Cfg",
      properties: {
        depth: { title: "Depth", type: "integer" },
        note: { title: "Note", type: "string" },
      },
      required: ["depth"],
      type: "object",
      additionalProperties: false,
    });
    assert.deepEqual(p.blob, { title: "Blob", additionalProperties: true, type: "object" });
    assert.deepEqual(p.anything, { title: "Anything" });
    assert.deepEqual(all.args.required, [
      "a",
      "max_steps",
      "name",
      "flag",
      "level",
      "exact",
      "items",
      "cfg",
      "blob",
      "anything",
    ]);
    assert.equal(all.args.additionalProperties, false);
    assert.equal(all.description, "every kind");
    assert.deepEqual(all.input, { type: "string" });
    assert.equal((all.returns as Record<string, unknown>).type, "object");
  });
  await t.step("untyped and extra-argument templates", () => {
    assert.deepEqual(untyped, {
      id: "untyped",
      description: "",
      args: { properties: {}, type: "object", additionalProperties: true },
    });
    assert.equal("input" in untyped, false);
    assert.equal(extra.args.additionalProperties, true);
    assert.deepEqual(extra.args.required, ["a"]);
  });
});

Deno.test("Environment.startTask() coerces arguments laxly", async () => {
  const env = new Environment("coerce");
  let seen: unknown;
  env.template(
    {
      id: "c",
      args: {
        i: integer(),
        n: number(),
        b: boolean(),
        o: object(),
        a: array(integer()),
        e: enumOf([1, 2, 3]),
        s: string(),
        d: withDefault(object(), { k: [1] }),
        bad: integer(),
      },
    },
    async function* (args) {
      seen = args;
      yield "p";
      yield 1;
    },
  );
  const task = await env.startTask("c", {
    i: "3",
    n: "2.5",
    b: "true",
    o: '{"x":1}',
    a: '["1", 2]',
    e: "2",
    s: "7",
    bad: "three",
  });
  assert.deepEqual(seen, {
    i: 3,
    n: 2.5,
    b: true,
    o: { x: 1 },
    a: [1, 2],
    e: 2,
    s: "7",
    bad: "three",
    d: { k: [1] },
  });
  await task.cancel();
});

Deno.test("Environment.startTask() refuses before any task code runs", async (t) => {
  const env = new Environment("refuse");
  let ran = 0;
  env.template({ id: "t", args: { a: integer() } }, async function* () {
    ran++;
    yield "p";
    yield 1;
  });
  await t.step("unknown template", async () => {
    await assert.rejects(env.startTask("nope"), (e: unknown) => {
      assert.ok(e instanceof HudProtocolError);
      assert.equal(e.code, ErrorCode.INVALID_PARAMS);
      assert.equal(e.message, "unknown task: nope");
      return true;
    });
  });
  await t.step("unknown and missing args name the template and the args", async () => {
    await assert.rejects(env.startTask("t", { b: 1, c: 2 }), (e: unknown) => {
      assert.ok(e instanceof HudProtocolError);
      assert.equal(e.code, ErrorCode.SERVER_ERROR);
      assert.match(e.message, /task "t"/);
      assert.match(e.message, /unknown arguments "b", "c"/);
      assert.match(e.message, /missing arguments "a"/);
      return true;
    });
  });
  await t.step("args not an object", async () => {
    await assert.rejects(env.startTask("t", [1]), { code: ErrorCode.INVALID_PARAMS });
  });
  assert.equal(ran, 0);
});

Deno.test("ActiveTask.grade() normalises every grade shape", async (t) => {
  const cases: [string, unknown, unknown][] = [
    ["a number", 0.25, { score: 0.25 }],
    ["a boolean", true, { score: 1 }],
    ["an object with score", { score: 1, info: { x: 1 }, done: true }, {
      score: 1,
      info: { x: 1 },
      done: true,
    }],
    ["an evaluation result with reward", { reward: 0.5, content: "c", isError: false }, {
      score: 0.5,
      content: "c",
      isError: false,
    }],
  ];
  for (const [name, evaluation, expected] of cases) {
    await t.step(name, async () => {
      const env = new Environment("g");
      env.template({ id: "t" }, async function* () {
        yield "p";
        yield evaluation;
      });
      const task = await env.startTask("t");
      assert.deepEqual(await task.grade("x"), expected);
    });
  }
  await t.step("no second yield scores 0", async () => {
    const env = new Environment("g");
    env.template({ id: "t" }, async function* () {
      yield "p";
    });
    assert.deepEqual(await (await env.startTask("t")).grade("x"), { score: 0 });
  });
  for (const bad of ["1", null, { score: "1" }, { reward: "x" }, [1]]) {
    await t.step(`refuses ${JSON.stringify(bad)}`, async () => {
      const env = new Environment("g");
      env.template({ id: "t" }, async function* () {
        yield "p";
        yield bad;
      });
      const task = await env.startTask("t");
      await assert.rejects(task.grade("x"), {
        code: ErrorCode.SERVER_ERROR,
        message: /evaluation must be a number/,
      });
    });
  }
  await t.step("a task that throws while grading", async () => {
    const env = new Environment("g");
    env.template({ id: "t" }, async function* () {
      yield "p";
      throw new Error("grader broke");
    });
    const task = await env.startTask("t");
    await assert.rejects(task.grade("x"), {
      code: ErrorCode.SERVER_ERROR,
      message: "grader broke",
    });
    await assert.rejects(task.grade("x"), { code: ErrorCode.INVALID_REQUEST });
  });
});

Deno.test("ActiveTask with a returns schema receives { content, raw }", async () => {
  const env = new Environment("typed");
  const seen: unknown[] = [];
  env.template(
    { id: "t", returns: object({ n: integer() }) },
    async function* (): TemplateGenerator<TypedAnswer<{ n: number }>> {
      const answer = yield "p";
      seen.push(answer);
      yield answer.content.n === 2 ? 1 : 0;
    },
  );
  assert.deepEqual(await (await env.startTask("t")).grade('{"n": 2}'), { score: 1 });
  assert.deepEqual(await (await env.startTask("t")).grade({ n: 2 }), { score: 1 });
  await (await env.startTask("t")).grade("not json").catch(() => {});
  assert.deepEqual(seen, [
    { content: { n: 2 }, raw: '{"n": 2}' },
    { content: { n: 2 }, raw: '{"n":2}' },
    { content: "not json", raw: "not json" },
  ]);
});

Deno.test("Environment prompt frames", async (t) => {
  const env = new Environment("p");
  for (
    const [id, value, frame] of [
      ["str", "hi", { prompt: "hi" }],
      ["json", { a: [1] }, { prompt: { a: [1] } }],
      ["frame", { prompt: "x", bindings: { shell: { cwd: "/" } }, extra: 1 }, {
        prompt: "x",
        bindings: { shell: { cwd: "/" } },
        extra: 1,
      }],
      ["null", null, { prompt: null }],
    ] as const
  ) {
    env.template({ id }, async function* () {
      yield value;
      yield 1;
    });
    await t.step(id, async () => {
      const task = await env.startTask(id);
      assert.deepEqual(task.prompt, frame);
      await task.cancel();
    });
  }
  await t.step("a template that throws before its prompt", async () => {
    env.template({ id: "boom" }, async function* () {
      throw new Error("setup failed");
      // deno-lint-ignore no-unreachable
      yield 1;
    });
    await assert.rejects(env.startTask("boom"), { code: -32000, message: "setup failed" });
  });
  await t.step("a template that returns before its prompt", async () => {
    env.template({ id: "empty" }, async function* () {});
    await assert.rejects(env.startTask("empty"), { code: -32000, message: /before yielding/ });
  });
});

Deno.test("Environment hooks run in order, shutdown in reverse, best effort", async () => {
  const log: string[] = [];
  const env = new Environment("hooks");
  env.initialize(() => void log.push("init 1"));
  env.initialize(async () => {
    await Promise.resolve();
    log.push("init 2");
  });
  env.shutdown(() => void log.push("down 1"));
  env.shutdown(() => {
    log.push("down 2");
    throw new Error("down 2 failed");
  });
  await env.start();
  await env.start();
  assert.equal(env.started, true);
  await assert.rejects(env.stop(), AggregateError);
  await env.stop();
  assert.deepEqual(log, ["init 1", "init 2", "down 2", "down 1"]);
});

Deno.test("Environment.start() tears down when a hook fails", async () => {
  const log: string[] = [];
  const env = new Environment("fails");
  env.initialize(() => {
    throw new Error("no disk");
  });
  env.shutdown(() => void log.push("down"));
  await assert.rejects(env.start(), { message: "no disk" });
  assert.deepEqual(log, ["down"]);
  assert.equal(env.started, false);
});

Deno.test("Environment.template() with strict refuses arguments of the wrong type", async () => {
  const env = new Environment("strict");
  let ran = 0;
  const t = env.template(
    { id: "t", strict: true, args: { n: integer(), tags: optional(array(string())) } },
    async function* () {
      ran++;
      yield "p";
      yield 1;
    },
  );
  const ok = await env.startTask("t", { n: "3", tags: '["a"]' });
  await ok.cancel();
  await assert.rejects(env.startTask("t", { n: "three", tags: [1] }), (e: unknown) => {
    assert.ok(e instanceof HudProtocolError);
    assert.equal(e.code, -32000);
    assert.match(e.message, /wrong type: "n" \(expected integer, got "three"\), "tags"/);
    return true;
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => t({ n: "x" as any }), { name: "TypeError", message: /"n"/ });
  assert.equal(ran, 1);
});
