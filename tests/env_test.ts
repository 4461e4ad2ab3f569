import { test } from "./_test.ts";
import assert from "node:assert/strict";
import {
  any,
  array,
  boolean,
  enumOf,
  Environment,
  environmentOf,
  integer,
  literal,
  number,
  object,
  optional,
  string,
  TaskError,
  taskSlug,
  withDefault,
} from "../mod.ts";
import type { TemplateGenerator, TypedAnswer } from "../env.ts";

test("taskSlug() matches the HUD SDK's examples", () => {
  assert.equal(taskSlug("t", { a: 1, b: 2 }), "t-1744f53e");
  assert.equal(taskSlug("t", { b: 2, a: 1 }), "t-1744f53e");
  assert.equal(taskSlug("t", { n: 1 }), "t-bae34777");
  assert.equal(taskSlug("t", { word: "strawberry" }), "t-f624d1ae");
  assert.equal(taskSlug("plain", {}), "plain");
});

test("Environment.template() mints task rows", async (t) => {
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

test("Environment.template() refuses bad registrations", () => {
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

test("Environment.listTasks() publishes JSON Schemas", async (t) => {
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
  env.template({ id: "anything", extraArgs: true }, async function* () {
    yield "p";
    yield 0;
  });
  const [all, untyped, extra, anything] = env.listTasks();
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
  await t.step("no-argument and extra-argument templates", () => {
    assert.deepEqual(untyped, {
      id: "untyped",
      description: "",
      args: { properties: {}, type: "object", additionalProperties: false },
    });
    assert.deepEqual(anything.args, {
      properties: {},
      type: "object",
      additionalProperties: true,
    });
    assert.equal("input" in untyped, false);
    assert.equal(extra.args.additionalProperties, true);
    assert.deepEqual(extra.args.required, ["a"]);
  });
});

test("Environment.startTask() with strict: false coerces laxly", async () => {
  const env = new Environment("coerce");
  let seen: unknown;
  env.template(
    {
      id: "c",
      strict: false,
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

test("Environment.checkTask() refuses as startTask() does, and runs no task code", () => {
  const env = new Environment("check");
  let ran = 0;
  env.template({ id: "t", args: { a: integer() } }, async function* () {
    ran++;
    yield "p";
    yield 1;
  });
  env.checkTask("t", { a: 1 });
  env.checkTask("t", { a: "2" }); // converts cleanly, as startTask takes it
  assert.throws(() => env.checkTask("nope"), {
    name: "RangeError",
    message: 'Cannot start task: unknown template "nope"',
  });
  assert.throws(() => env.checkTask("t", { b: 1 }), {
    name: "TypeError",
    message: /^Cannot start task "t": unknown arguments "b"; missing arguments "a"/,
  });
  assert.throws(() => env.checkTask("t", { a: "x" }), {
    name: "TypeError",
    message: /^Cannot start task "t": argument "a" /,
  });
  assert.throws(() => env.checkTask("t", [1]), {
    name: "TypeError",
    message: /args must be an object/,
  });
  assert.equal(ran, 0);
});

test("Environment.startTask() refuses before any task code runs", async (t) => {
  const env = new Environment("refuse");
  let ran = 0;
  env.template({ id: "t", args: { a: integer() } }, async function* () {
    ran++;
    yield "p";
    yield 1;
  });
  await t.step("unknown template", async () => {
    await assert.rejects(env.startTask("nope"), (e: unknown) => {
      assert.ok(e instanceof RangeError);
      assert.equal(e.message, 'Cannot start task: unknown template "nope"');
      return true;
    });
  });
  await t.step("unknown and missing args name the template and the args", async () => {
    await assert.rejects(env.startTask("t", { b: 1, c: 2 }), (e: unknown) => {
      assert.ok(e instanceof TypeError);
      assert.match(e.message, /task "t"/);
      assert.match(e.message, /unknown arguments "b", "c"/);
      assert.match(e.message, /missing arguments "a"/);
      return true;
    });
  });
  await t.step("args not an object", async () => {
    await assert.rejects(env.startTask("t", [1]), {
      name: "TypeError",
      message: 'Cannot start task "t": args must be an object',
    });
  });
  assert.equal(ran, 0);
});

test("ActiveTask.grade() normalises every grade shape", async (t) => {
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
  await t.step("no second yield is a grading error that says so", async () => {
    const env = new Environment("g");
    const log: string[] = [];
    env.template({ id: "t" }, async function* () {
      try {
        yield "p";
      } finally {
        log.push("finally");
      }
    });
    await assert.rejects((await env.startTask("t")).grade("x"), {
      name: "TaskError",
      message: /^Cannot grade task "t": the template ended without a second yield/,
    });
    assert.deepEqual(log, ["finally"]);
  });
  await t.step("a returned evaluation is a grading error that says to yield it", async () => {
    const env = new Environment("g");
    env.template({ id: "t" }, async function* () {
      yield "p";
      return 1;
    });
    await assert.rejects((await env.startTask("t")).grade("x"), {
      name: "TaskError",
      message: /the template returned 1 instead of yielding it/,
    });
  });
  for (
    const [bad, shown] of [
      [NaN, "the score is NaN"],
      [Infinity, "the score is Infinity"],
      [-Infinity, "the score is -Infinity"],
      [{ score: NaN, info: {} }, 'the "score" is NaN'],
      [{ score: -Infinity }, 'the "score" is -Infinity'],
      [{ reward: NaN }, 'the "reward" is NaN'],
      [{ reward: Infinity, content: "c" }, 'the "reward" is Infinity'],
    ] as const
  ) {
    await t.step(`refuses a grade where ${shown}`, async () => {
      const env = new Environment("g");
      env.template({ id: "t" }, async function* () {
        yield "p";
        yield bad;
      });
      await assert.rejects((await env.startTask("t")).grade("x"), (e: unknown) => {
        assert.ok(e instanceof TaskError);
        assert.equal(e.taskId, "t");
        assert.equal(
          e.message,
          `Cannot grade task "t": ${shown}; a score must be a finite number`,
        );
        return true;
      });
    });
  }
  for (const bad of ["1", null, { score: "1" }, { reward: "x" }, [1]]) {
    await t.step(`refuses ${JSON.stringify(bad)}`, async () => {
      const env = new Environment("g");
      env.template({ id: "t" }, async function* () {
        yield "p";
        yield bad;
      });
      const task = await env.startTask("t");
      await assert.rejects(task.grade("x"), {
        name: "TaskError",
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
      name: "TaskError",
      message: "grader broke",
    });
    await assert.rejects(task.grade("x"), {
      name: "Error",
      message: 'Cannot grade task "t": it was already graded or cancelled',
    });
  });
});

test("ActiveTask with a returns schema receives { content, raw }", async () => {
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

test("Environment prompt frames", async (t) => {
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
    await assert.rejects(env.startTask("boom"), { name: "TaskError", message: "setup failed" });
  });
  await t.step("a template that returns before its prompt", async () => {
    env.template({ id: "empty" }, async function* () {});
    await assert.rejects(env.startTask("empty"), { name: "TaskError", message: /before yielding/ });
  });
});

test("Environment hooks run in order, shutdown in reverse, best effort", async () => {
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

test("Environment.start() tears down when a hook fails", async () => {
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

test("Environment.template() with strict refuses arguments of the wrong type", async () => {
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
    assert.ok(e instanceof TypeError);
    assert.equal(
      e.message,
      'Cannot start task "t": argument "n" must be an integer, got "three"; argument "tags[0]" must be a string, got 1',
    );
    return true;
  });
  // deno-lint-ignore no-explicit-any
  assert.throws(() => t({ n: "x" as any }), { name: "TypeError", message: /"n"/ });
  assert.equal(ran, 1);
});

// Compile-time checks: `deno test` type-checks, so a wrong type fails the run.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
function sameType<A, B>(_proof: Same<A, B>): void {}

test("Environment.startTask() checks arguments strictly by default", async (t) => {
  const env = new Environment("strict-default");
  let ran = 0;
  const seen: unknown[] = [];
  const job = env.template(
    { id: "job", args: { n: integer(), lang: enumOf(["python", "shell"]), ok: boolean() } },
    async function* (args) {
      sameType<typeof args.n, number>(true);
      sameType<typeof args.lang, "python" | "shell">(true);
      ran++;
      seen.push(args);
      yield "p";
      yield 1;
    },
  );
  const refused = async (args: Record<string, unknown>, message: string) => {
    await assert.rejects(env.startTask("job", args), (e: unknown) => {
      assert.ok(e instanceof TypeError);
      assert.equal(e.message, `Cannot start task "job": ${message}`);
      return true;
    });
    assert.throws(() => job(args as never), {
      name: "TypeError",
      message: `Cannot create task "job": ${message}`,
    });
  };
  await t.step("integer() refuses text that is not an integer", async () => {
    await refused(
      { n: "abc", lang: "shell", ok: true },
      'argument "n" must be an integer, got "abc"',
    );
  });
  await t.step("integer() refuses a fraction", async () => {
    await refused({ n: 2.5, lang: "shell", ok: true }, 'argument "n" must be an integer, got 2.5');
    await refused(
      { n: "2.5", lang: "shell", ok: true },
      'argument "n" must be an integer, got "2.5"',
    );
  });
  await t.step("enumOf() refuses a value outside the set, listing every value", async () => {
    await refused(
      { n: 1, lang: "rust", ok: true },
      'argument "lang" must be one of "python", "shell", got "rust"',
    );
  });
  await t.step("every refused argument is named at once", async () => {
    await refused(
      { n: "x", lang: "rust", ok: "maybe" },
      'argument "n" must be an integer, got "x"; argument "lang" must be one of "python", "shell", got "rust"; argument "ok" must be a boolean, got "maybe"',
    );
  });
  await t.step("no task code ran for a refused argument", () => {
    assert.equal(ran, 0);
  });
  await t.step("what converts cleanly is converted", async () => {
    const task = await env.startTask("job", { n: " -12 ", lang: "python", ok: "TRUE" });
    await task.cancel();
    assert.deepEqual(seen.at(-1), { n: -12, lang: "python", ok: true });
    // The row keeps the arguments as given; the slug is computed from them.
    const row = job({ n: "3" as unknown as number, lang: "shell", ok: true });
    assert.deepEqual(row.args, { n: "3", lang: "shell", ok: true });
  });
});

test("Environment.template() with strict: false passes unconvertible values through", async () => {
  const env = new Environment("lax");
  const seen: unknown[] = [];
  const t = env.template(
    { id: "t", strict: false, args: { n: integer(), lang: enumOf(["python", "shell"]) } },
    async function* ({ n, lang }) {
      // The types say what lax checking guarantees: nothing.
      sameType<typeof n, unknown>(true);
      sameType<typeof lang, unknown>(true);
      seen.push({ n, lang });
      yield "p";
      yield 1;
    },
  );
  await (await env.startTask("t", { n: "3", lang: "rust" })).cancel();
  await (await env.startTask("t", { n: 2.5, lang: "shell" })).cancel();
  assert.deepEqual(seen, [{ n: 3, lang: "rust" }, { n: 2.5, lang: "shell" }]);
  assert.equal(t({ n: 1, lang: "python" }).id, "t");
  // Names are still checked.
  await assert.rejects(env.startTask("t", { n: 1 }), { message: /missing arguments "lang"/ });
});

test("optional() accepts null as left out", async () => {
  const env = new Environment("nulls");
  const seen: Record<string, unknown>[] = [];
  const t = env.template(
    { id: "t", args: { tag: optional(string()), cfg: object({ note: optional(integer()) }) } },
    async function* (args) {
      sameType<typeof args.tag, string | undefined>(true);
      seen.push(args);
      yield "p";
      yield 1;
    },
  );
  await (await env.startTask("t", { tag: null, cfg: { note: null } })).cancel();
  await (await env.startTask("t", { tag: "x", cfg: '{"note": "4"}' })).cancel();
  assert.deepEqual(seen, [{ cfg: {} }, { tag: "x", cfg: { note: 4 } }]);
  assert.equal(Object.hasOwn(seen[0], "tag"), false);
  assert.deepEqual(t({ tag: null, cfg: {} }).args, { tag: null, cfg: {} });
  await assert.rejects(env.startTask("t", { tag: 3, cfg: {} }), {
    message: /argument "tag" must be a string, got 3/,
  });
});

test("Environment.startTask() looks argument names up as own properties only", async (t) => {
  const env = new Environment("names");
  const seen: Record<string, unknown>[] = [];
  env.template(
    {
      id: "odd",
      // A computed key: `__proto__: x` in a literal would set the prototype.
      args: { constructor: integer(), toString: optional(string()), ["__proto__"]: integer() },
    },
    async function* (args) {
      seen.push(args);
      yield "p";
      yield 1;
    },
  );
  env.template({ id: "plain", args: { a: integer() } }, async function* () {
    yield "p";
    yield 1;
  });
  await t.step("inherited names do not count as given", async () => {
    await assert.rejects(env.startTask("odd", {}), {
      name: "TypeError",
      message:
        'Cannot start task "odd": missing arguments "constructor", "__proto__" (expected "constructor", "toString", "__proto__")',
    });
  });
  await t.step("they are ordinary arguments when declared", async () => {
    const given = JSON.parse('{"constructor": "1", "__proto__": "2", "toString": "x"}');
    await (await env.startTask("odd", given)).cancel();
    const args = seen[0];
    assert.equal(Object.getPrototypeOf(args), Object.prototype);
    assert.deepEqual(Object.entries(args), [["constructor", 1], ["toString", "x"], [
      "__proto__",
      2,
    ]]);
  });
  await t.step("and unknown ones when not", async () => {
    const given = JSON.parse(
      '{"a": 1, "constructor": 1, "toString": 2, "__proto__": {"polluted": true}}',
    );
    await assert.rejects(env.startTask("plain", given), {
      message: /unknown arguments "constructor", "toString", "__proto__" \(expected "a"\)/,
    });
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
  });
  await t.step("tasks.list publishes them as own properties", () => {
    const entry = env.listTasks()[0];
    assert.deepEqual(Object.keys(entry.args.properties as object), [
      "constructor",
      "toString",
      "__proto__",
    ]);
    assert.ok(
      JSON.stringify(entry.args).includes('"__proto__":{"title":"  Proto  ","type":"integer"}'),
    );
  });
});

test("Environment.template() without args takes no arguments", async (t) => {
  const env = new Environment("no-args");
  const seen: unknown[] = [];
  const none = env.template({ id: "none" }, async function* (args) {
    sameType<typeof args, Record<never, never>>(true);
    yield "p";
    yield 1;
  });
  env.template({ id: "anything", extraArgs: true }, async function* (args) {
    sameType<typeof args, Record<string, unknown>>(true);
    seen.push(args);
    yield "p";
    yield 1;
  });
  env.template(
    { id: "some", args: { n: integer() }, extraArgs: true },
    async function* (args) {
      sameType<typeof args.n, number>(true);
      sameType<typeof args.other, unknown>(true);
      seen.push(args);
      yield "p";
      yield 1;
    },
  );
  await t.step("refused with the names given", async () => {
    await assert.rejects(env.startTask("none", { x: 1 }), {
      name: "TypeError",
      message: 'Cannot start task "none": unknown arguments "x" (expected no arguments)',
    });
    // deno-lint-ignore no-explicit-any
    assert.throws(() => none({ x: 1 } as any), { name: "TypeError" });
    await (await env.startTask("none", {})).cancel();
  });
  await t.step("extraArgs: true accepts anything, unchanged", async () => {
    await (await env.startTask("anything", { x: "1", y: [null] })).cancel();
    await (await env.startTask("some", { n: "2", other: "2" })).cancel();
    assert.deepEqual(seen, [{ x: "1", y: [null] }, { n: 2, other: "2" }]);
  });
  await t.step("flags must be booleans", () => {
    assert.throws(
      () =>
        // deno-lint-ignore no-explicit-any
        env.template({ id: "bad", strict: "yes" as any }, async function* () {
          yield 1;
        }),
      { name: "TypeError", message: /"strict" must be a boolean/ },
    );
  });
});
