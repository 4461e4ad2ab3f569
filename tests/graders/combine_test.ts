// combine, combineAny, combineAll and subscore: weights, penalties,
// nesting, names; and the result as a template's grade over a real
// connection, where the client reads its subscores.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  combine,
  combineAll,
  combineAny,
  type GradeResult,
  type SubScore,
  subscore,
} from "../../graders/mod.ts";
import { bind, connect, Environment } from "../../mod.ts";
import type { GradeFrame } from "../../env.ts";
import { gradeFromFrame } from "../../eval/mod.ts";

test("combine() normalises positive weights and keeps negative ones as penalties", async () => {
  const grade = await combine([
    { name: "tests", value: 1, weight: 0.5 },
    { name: "judge", value: 0.5, weight: 0.3 },
    { name: "format", value: 0, weight: 0.3 },
    { name: "cheated", value: 1, weight: -0.2 },
  ]);
  // 0.5, 0.3, 0.3 sum to 1.1: normalised to 5/11, 3/11, 3/11.
  assert.deepEqual(
    grade.info.breakdown.map((s) => s.weight),
    [0.5 / 1.1, 0.3 / 1.1, 0.3 / 1.1, -0.2],
  );
  assert.ok(Math.abs(grade.score - (0.5 / 1.1 + 0.15 / 1.1 - 0.2)) < 1e-12);
  assert.deepEqual(grade.subscores, { tests: 1, judge: 0.5, format: 0, cheated: 1 });
});

test("combine() weighs 1 when no weight is given, and can score below 0", async () => {
  const grade = await combine([
    { name: "a", value: 0 },
    { name: "b", value: 0 },
    { name: "penalty", value: 1, weight: -0.25 },
  ]);
  assert.equal(grade.score, -0.25);
});

test("combine() awaits graders concurrently, keeping their order", async () => {
  // Each grader finishes only once the other has started: run one after
  // the other, they would never finish.
  let release!: () => void;
  const bothStarted = new Promise<void>((r) => (release = r));
  let started = 0;
  const grader = async (name: string, value: number): Promise<SubScore> => {
    if (++started === 2) release();
    await bothStarted;
    return { name, value };
  };
  const grade = await combine([
    grader("first", 1),
    { name: "plain", value: 0 },
    grader("second", 0),
  ]);
  assert.deepEqual(grade.info.breakdown.map((s) => s.name), ["first", "plain", "second"]);
  assert.equal(grade.score, 1 / 3);
});

test("combine() makes repeated names unique as the Python SDK does", async () => {
  const grade = await combine([
    { name: "check", value: 1 },
    { name: "check", value: 0 },
    { name: "check-1", value: 1 },
    { name: "other", value: 1 },
  ]);
  assert.deepEqual(grade.info.breakdown.map((s) => s.name), [
    "check-2",
    "check-3",
    "check-1",
    "other",
  ]);
  assert.deepEqual(Object.keys(grade.subscores), ["check-2", "check-3", "check-1", "other"]);
});

test("combine() nests: children appear under their parent's name", async () => {
  const inner = await combine([
    { name: "unit", value: 1, info: { passed: 12 } },
    { name: "integration", value: 0 },
  ]);
  const grade = await combine([
    subscore("tests", inner, { weight: 2 }),
    combineAll([{ name: "lint", value: 1 }, { name: "types", value: 1 }], { name: "static" }),
    combineAny([{ name: "readme", value: 0 }, { name: "docstring", value: 1 }], {
      name: "docs",
      weight: -1,
    }),
  ]);
  assert.deepEqual(grade.subscores, {
    "tests": 0.5,
    "tests/unit": 1,
    "tests/integration": 0,
    "static": 1,
    "static/lint": 1,
    "static/types": 1,
    "docs": 1,
    "docs/readme": 0,
    "docs/docstring": 1,
  });
  // tests 0.5 × 2/3 + static 1 × 1/3 − docs 1 × 1
  assert.ok(Math.abs(grade.score - (1 / 3 + 1 / 3 - 1)) < 1e-12);
  const tests = grade.info.breakdown[0];
  assert.equal(tests.children?.[0].info?.passed, 12);
  assert.equal(tests.children?.[0].weight, 0.5);
});

test("combineAny() and combineAll() take the largest and smallest value", async () => {
  const items = [{ name: "x", value: 0.25 }, { name: "x", value: 0.75 }];
  const any = await combineAny(items);
  const all = await combineAll(items, { weight: 2 });
  assert.deepEqual([any.name, any.value, any.weight], ["any", 0.75, 1]);
  assert.deepEqual([all.name, all.value, all.weight], ["all", 0.25, 2]);
  assert.deepEqual(any.children?.map((c) => c.name), ["x-1", "x-2"]);
  assert.equal(
    (await combineAny([Promise.resolve({ name: "late", value: 1 })])).value,
    1,
  );
});

test("subscore() takes numbers, booleans and grades (clamped to [0, 1])", async () => {
  assert.deepEqual(subscore("ok", true), { name: "ok", value: 1, weight: 1 });
  assert.deepEqual(subscore("ok", false, { weight: -1, info: { why: "x" } }), {
    name: "ok",
    value: 0,
    weight: -1,
    info: { why: "x" },
  });
  const negative = await combine([{ name: "a", value: 0 }, { name: "p", value: 1, weight: -1 }]);
  assert.equal(subscore("nested", negative).value, 0);
  assert.throws(() => subscore("bad", 1.5), {
    name: "RangeError",
    message: 'Cannot make a subscore: subscore "bad" has value 1.5; it must be in [0, 1]',
  });
});

test("combine() refuses what cannot be a grade", async (t) => {
  const cases: [unknown, string | RegExp, ErrorConstructor][] = [
    [[], "Cannot combine grades: no subscores given", RangeError],
    [
      [{ name: "p", value: 1, weight: -1 }],
      "Cannot combine grades: no subscore has a positive weight",
      RangeError,
    ],
    [
      [{ name: "a", value: 0, weight: 0 }],
      "Cannot combine grades: no subscore has a positive weight",
      RangeError,
    ],
    [
      [{ name: "a", value: NaN }],
      'Cannot combine grades: item 0: subscore "a" has value NaN; it must be in [0, 1]',
      RangeError,
    ],
    [[{ name: "a", value: 2 }], /value 2; it must be in \[0, 1\]/, RangeError],
    [[{ name: "a", value: 1, weight: Infinity }], /weight Infinity; it must be finite/, RangeError],
    [
      [{ value: 1 }],
      'Cannot combine grades: item 0: a subscore needs a non-empty string "name"',
      TypeError,
    ],
    [
      [0.5],
      "Cannot combine grades: item 0: expected a subscore { name, value, weight }, got 0.5",
      TypeError,
    ],
    [{ name: "a", value: 1 }, "Cannot combine grades: expected a list of subscores", TypeError],
  ];
  for (const [items, message, type] of cases) {
    await t.step(JSON.stringify(items), async () => {
      await assert.rejects(() => combine(items as SubScore[]), (err: unknown) => {
        assert.ok(err instanceof type);
        if (typeof message === "string") assert.equal((err as Error).message, message);
        else assert.match((err as Error).message, message);
        return true;
      });
    });
  }
  await t.step("a grader that fails", async () => {
    const boom = new Error("judge unreachable");
    await assert.rejects(() => combine([{ name: "a", value: 1 }, Promise.reject(boom)]), boom);
  });
});

test("combine()'s result is a template's grade: the client reads score and subscores", async () => {
  const env = new Environment("graded");
  const task = env.template({ id: "capital" }, async function* () {
    const answer = yield "What is the capital of France?";
    const grade: GradeResult = await combine([
      { name: "correct", value: String(answer).includes("Paris") ? 1 : 0, weight: 0.9 },
      { name: "brief", value: String(answer).length < 20 ? 1 : 0, weight: 0.1 },
    ], { info: { answer } });
    const frame: GradeFrame = grade; // the shape templates yield
    yield frame;
  });
  const row = task();
  await using server = bind(env);
  await using client = await connect(server);
  await client.startTask(row.id, row.args);
  const frame = await client.grade({ answer: "It is Paris, of course." });
  const grade = gradeFromFrame(frame);
  assert.equal(grade.reward, 0.9);
  assert.deepEqual(grade.subscores, { correct: 1, brief: 0 });
  assert.equal(grade.info.answer, "It is Paris, of course.");
  const breakdown = grade.info.breakdown as SubScore[];
  assert.deepEqual(breakdown.map((s) => s.name), ["correct", "brief"]);
  assert.ok(Math.abs(breakdown[0].weight! + breakdown[1].weight! - 1) < 1e-12);
});
