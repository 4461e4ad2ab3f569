import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { pyJson } from "../../_internal/pyjson.ts";
import { taskSlug } from "../../env.ts";

test("pyJson() writes what Python's json.dumps(sort_keys=True) writes", () => {
  assert.equal(pyJson({ b: [1, 2.5, "é"], a: null }), '{"a": null, "b": [1, 2.5, "\\u00e9"]}');
  // An integer the server kept exact, and non-finite numbers, as Python's
  // json.dumps writes them (both reach a task row's args through any()).
  const args = { x: [NaN, Infinity], n: 2n ** 60n + 1n };
  assert.equal(pyJson(args), '{"n": 1152921504606846977, "x": [NaN, Infinity]}');
  // hashlib.sha1(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]
  assert.equal(taskSlug("t", args), "t-3c700041");
});
