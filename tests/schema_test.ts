// The conversion table of strict checking, factory by factory: what is
// taken as is, what converts, and what is refused with which message.
import { test } from "./_test.ts";
import assert from "node:assert/strict";
import {
  any,
  array,
  boolean,
  enumOf,
  integer,
  literal,
  number,
  object,
  optional,
  type Schema,
  string,
  withDefault,
} from "../mod.ts";

function takes(schema: Schema<unknown>, cases: [unknown, unknown][]): void {
  for (const [given, value] of cases) {
    assert.deepEqual(schema.parse(given), { ok: true, value }, String(given));
  }
}

function refuses(schema: Schema<unknown>, cases: [unknown, string][]): void {
  for (const [given, message] of cases) {
    const r = schema.parse(given);
    assert.equal(r.ok, false, `${String(given)} should be refused`);
    if (!r.ok) assert.deepEqual(r.issues, [{ path: "", message }]);
  }
}

test("integer().parse() takes integers and integer text only", () => {
  takes(integer(), [[3, 3], [-7, -7], ["3", 3], [" -12 ", -12], ["+4", 4], [3.0, 3]]);
  refuses(integer(), [
    ["abc", 'must be an integer, got "abc"'],
    [2.5, "must be an integer, got 2.5"],
    ["2.5", 'must be an integer, got "2.5"'],
    ["1e3", 'must be an integer, got "1e3"'],
    ["", 'must be an integer, got ""'],
    [true, "must be an integer, got true"],
    [null, "must be an integer, got null"],
    [NaN, "must be an integer, got NaN"],
  ]);
});

test("integer().parse() never takes a rounded integer, and names any() (issue 24 point 2, issue 42 point 6)", () => {
  const range = "must be an integer from -9007199254740991 to 9007199254740991";
  // The documented way to pass such an integer (PROTOCOL.md, "Argument checking").
  const way = " (a JavaScript number would round it; an any() argument takes it exactly)";
  takes(integer(), [
    [9007199254740991, 9007199254740991],
    [-9007199254740991, -9007199254740991],
    [12n, 12],
    [9007199254740991n, 9007199254740991],
  ]);
  refuses(integer(), [
    // 2^60 + 1 as JSON.parse reads it, already rounded to 2^60.
    [2 ** 60, `${range}, got 1152921504606846976${way}`],
    [1152921504606846977n, `${range}, got 1152921504606846977${way}`],
    [-9007199254740993n, `${range}, got -9007199254740993${way}`],
    ["99999999999999999999", `${range}, got "99999999999999999999"${way}`],
    // Not a rounding: no hint.
    [2.5, "must be an integer, got 2.5"],
  ]);
  assert.equal(integer().accepts(2 ** 60), false);
  takes(number(), [[12n, 12], [2n ** 60n, 2 ** 60]]);
  refuses(number(), [
    [1152921504606846977n, `must be a number, got 1152921504606846977${way}`],
    // Beyond the doubles, a refusal too (it threw a RangeError from BigInt(Infinity)).
    [10n ** 400n, `must be a number, got ${String(10n ** 400n).slice(0, 77)}...${way}`],
  ]);
});

test("number().parse() takes finite numbers and decimal text", () => {
  takes(number(), [[2.5, 2.5], ["2.5", 2.5], [" -1e3 ", -1000], [".5", 0.5], ["7", 7]]);
  refuses(number(), [
    ["0x10", 'must be a number, got "0x10"'],
    ["Infinity", 'must be a number, got "Infinity"'],
    [Infinity, "must be a number, got Infinity"],
    [NaN, "must be a number, got NaN"],
    ["", 'must be a number, got ""'],
    [false, "must be a number, got false"],
  ]);
});

test("string().parse() takes strings only", () => {
  takes(string(), [["7", "7"], ["", ""]]);
  refuses(string(), [[7, "must be a string, got 7"], [null, "must be a string, got null"]]);
});

test("boolean().parse() takes booleans, 0/1, and true/false/1/0 text", () => {
  takes(boolean(), [
    [true, true],
    [false, false],
    [1, true],
    [0, false],
    ["TRUE", true],
    [" false ", false],
    ["1", true],
    ["0", false],
  ]);
  refuses(boolean(), [
    ["yes", 'must be a boolean, got "yes"'],
    [2, "must be a boolean, got 2"],
  ]);
});

test("enumOf().parse() names every allowed value", () => {
  const lang = enumOf(["python", "shell"]);
  takes(lang, [["python", "python"]]);
  refuses(lang, [["rust", 'must be one of "python", "shell", got "rust"']]);
  takes(enumOf([1, 2, 3]), [[2, 2], ["2", 2]]);
  refuses(enumOf([1, 2, 3]), [["4", 'must be one of 1, 2, 3, got "4"']]);
  // A member string is taken as is, never re-read as JSON.
  takes(enumOf(["1", 1]), [["1", "1"], [1, 1]]);
  takes(literal(3), [[3, 3], ["3", 3]]);
  refuses(literal(null), [[0, "must be exactly null, got 0"]]);
});

test("array().parse() checks each item and names its index", () => {
  const xs = array(integer());
  takes(xs, [[[1, "2"], [1, 2]], ['["1", 2]', [1, 2]], [[], []]]);
  refuses(xs, [["nope", 'must be an array, got "nope"']]);
  assert.deepEqual(xs.parse([1, "x", 2.5]), {
    ok: false,
    issues: [
      { path: "[1]", message: 'must be an integer, got "x"' },
      { path: "[2]", message: "must be an integer, got 2.5" },
    ],
  });
});

test("object().parse() checks properties as arguments are checked", () => {
  const cfg = object({ depth: integer(), note: optional(string()), k: withDefault(integer(), 1) });
  takes(cfg, [
    [{ depth: "2" }, { depth: 2, k: 1 }],
    ['{"depth": 2, "note": null, "k": 5}', { depth: 2, k: 5 }],
  ]);
  assert.deepEqual(cfg.parse({ note: 1, zzz: 0 }), {
    ok: false,
    issues: [
      { path: ".note", message: "must be a string, got 1" },
      { path: ".depth", message: "is required" },
      { path: ".zzz", message: 'is not a known property (known: "depth", "note", "k")' },
    ],
  });
  takes(object(), [[{ any: [1] }, { any: [1] }], ['{"a":1}', { a: 1 }]]);
  refuses(object(), [[[1], "must be an object, got [1]"]]);
});

test("optional() takes null and undefined as left out; any() takes anything", () => {
  takes(optional(integer()), [[null, undefined], [undefined, undefined], ["4", 4]]);
  refuses(optional(integer()), [["x", 'must be an integer, got "x"']]);
  refuses(withDefault(integer(), 2), [[null, "must be an integer, got null"]]);
  takes(any(), [[null, null], [{ a: 1 }, { a: 1 }]]);
});

test("Schema.coerce() converts what parse() converts and passes the rest through", () => {
  assert.equal(integer().coerce("3"), 3);
  assert.equal(integer().coerce("abc"), "abc");
  assert.deepEqual(array(integer()).coerce('["1", "x"]'), [1, "x"]);
  assert.equal(optional(string()).coerce(null), undefined);
  assert.deepEqual(object({ a: integer() }).coerce({ a: "1", b: 2 }), { a: 1, b: 2 });
});
