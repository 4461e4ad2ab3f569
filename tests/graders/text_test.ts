// The text helpers, on the cases the Python SDK's hud/graders/text.py
// documents and on the edges of each rule.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  contains,
  containsAll,
  containsAny,
  exactMatch,
  f1Score,
  normalize,
  numericMatch,
} from "../../graders/mod.ts";

test("normalize() lowers case, drops punctuation and articles, collapses space", () => {
  assert.equal(normalize("  The Answer is: 42! "), "answer is 42");
  assert.equal(normalize("A cat, an owl and THE dog."), "cat owl and dog");
  assert.equal(normalize("theme another"), "theme another"); // articles are whole words only
  assert.equal(normalize("snake_case\tand\nlines"), "snake_case and lines");
  assert.equal(normalize("Ünïcode—dash…"), "ünïcode dash");
  assert.equal(normalize(""), "");
  assert.equal(normalize({ key: 1 }), "key 1"); // as its JSON text
  assert.equal(normalize(42), "42");
});

test("exactMatch() compares normalised texts, or trimmed ones ignoring case", () => {
  assert.equal(exactMatch("The answer is: 42.", "answer is 42"), 1);
  assert.equal(exactMatch("42", "43"), 0);
  assert.equal(exactMatch("Paris!", "paris", { normalize: false }), 0);
  assert.equal(exactMatch("  PARIS ", "paris", { normalize: false }), 1);
  assert.equal(exactMatch(42, "42"), 1);
});

test("contains(), containsAny() and containsAll() ignore case unless asked", () => {
  assert.equal(contains("Hello World", "world"), 1);
  assert.equal(contains("Hello World", "world", { caseSensitive: true }), 0);
  assert.equal(contains("Hello World", ""), 1);
  assert.equal(containsAny("red", ["green", "RED"]), 1);
  assert.equal(containsAny("red", []), 0);
  assert.equal(containsAny("red", ["RED"], { caseSensitive: true }), 0);
  assert.equal(containsAll("red green", ["GREEN", "red"]), 1);
  assert.equal(containsAll("red", ["red", "blue"]), 0);
  assert.equal(containsAll("anything", []), 1);
  assert.equal(contains({ status: "passed" }, '"status":"passed"'), 1);
});

test("numericMatch() takes the first number in the answer, within the tolerance", () => {
  assert.equal(numericMatch("The answer is 42", 42), 1);
  assert.equal(numericMatch("x = -3.5, y = 2", -3.5), 1);
  assert.equal(numericMatch("2 apples, 3 pears", 3), 0); // the first number counts
  assert.equal(numericMatch("about 3.14159", Math.PI, { tolerance: 0.001 }), 1);
  assert.equal(numericMatch("about 3.14159", Math.PI, { tolerance: 1e-7 }), 0);
  assert.equal(numericMatch("6.02e23 atoms", 6.02e23), 1);
  assert.equal(numericMatch("costs .5 dollars", 0.5), 1);
  assert.equal(numericMatch(7, 7), 1);
  assert.equal(numericMatch("none", 0), 0);
  assert.throws(() => numericMatch("1", 1, { tolerance: -1 }), RangeError);
  assert.throws(() => numericMatch("1", 1, { tolerance: NaN }), RangeError);
});

test("f1Score() is token F1 over normalised words, counted with multiplicity", () => {
  assert.equal(f1Score("The capital is Paris, France", "Paris"), 0.4);
  assert.equal(f1Score("Paris", "Paris"), 1);
  assert.equal(f1Score("london", "paris"), 0);
  assert.equal(f1Score("the the", "the"), 0); // articles only: nothing to compare
  // "x x y" vs "x y y": shared x, y; precision 2/3, recall 2/3.
  assert.ok(Math.abs(f1Score("x x y", "x y y") - 2 / 3) < 1e-12);
  assert.equal(f1Score("", ""), 0);
});
