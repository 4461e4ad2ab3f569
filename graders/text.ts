/**
 * Answer comparisons, each a value in [0, 1] to use as a subscore's
 * `value` or to yield as is: {@linkcode exactMatch} after
 * {@linkcode normalize}, {@linkcode contains} and its `Any`/`All` forms,
 * {@linkcode numericMatch} within a tolerance, and token-level
 * {@linkcode f1Score}, as the HUD Python SDK's `hud.graders` defines them.
 * An answer that is not a string is compared as its JSON text.
 *
 * @example
 * ```ts
 * import { exactMatch, f1Score, numericMatch } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(exactMatch("  The Answer: 42! ", "answer 42"), 1);
 * assert.equal(numericMatch("about 3.14159 radians", Math.PI, { tolerance: 1e-3 }), 1);
 * assert.equal(f1Score("The capital is Paris, France", "Paris"), 0.4);
 * ```
 *
 * @module
 */

/** An answer as text: strings as they are, anything else as JSON. */
function text(answer: unknown): string {
  if (typeof answer === "string") return answer;
  if (answer === undefined) return "";
  try {
    return JSON.stringify(answer) ?? String(answer);
  } catch {
    return String(answer);
  }
}

const ARTICLES = new Set(["a", "an", "the"]);

/**
 * Text for comparison: lower case, punctuation turned to spaces, the
 * articles "a", "an" and "the" dropped, whitespace collapsed.
 *
 * @example
 * ```ts
 * import { normalize } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(normalize("  The Answer is: 42! "), "answer is 42");
 * assert.equal(normalize("Ça, c'est l'été"), "ça c est l été");
 * ```
 */
export function normalize(answer: unknown): string {
  return text(answer)
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\p{M}_\s]/gu, " ")
    .split(/\s+/u)
    .filter((word) => word !== "" && !ARTICLES.has(word))
    .join(" ");
}

/** Options for {@linkcode exactMatch}. */
export interface ExactMatchOptions {
  /**
   * Compare the {@linkcode normalize}d texts; when false, the trimmed texts
   * are compared ignoring case only.
   * @default true
   */
  normalize?: boolean;
}

/**
 * 1 when the answer equals the expected text (after normalisation), else 0.
 *
 * @example
 * ```ts
 * import { exactMatch } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(exactMatch("France.", "france"), 1);
 * assert.equal(exactMatch("France.", "france", { normalize: false }), 0);
 * assert.equal(exactMatch(" FRANCE ", "france", { normalize: false }), 1);
 * ```
 */
export function exactMatch(
  answer: unknown,
  expected: string,
  options: ExactMatchOptions = {},
): number {
  if (options.normalize ?? true) return normalize(answer) === normalize(expected) ? 1 : 0;
  return text(answer).trim().toLowerCase() === expected.trim().toLowerCase() ? 1 : 0;
}

/** Options for {@linkcode contains}, {@linkcode containsAny} and {@linkcode containsAll}. */
export interface ContainsOptions {
  /**
   * Whether case matters.
   * @default false
   */
  caseSensitive?: boolean;
}

function fold(s: string, options: ContainsOptions): string {
  return options.caseSensitive ? s : s.toLowerCase();
}

/**
 * 1 when the answer contains `substring`, else 0.
 *
 * @example
 * ```ts
 * import { contains } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(contains("All 12 tests PASSED", "passed"), 1);
 * assert.equal(contains("All 12 tests PASSED", "passed", { caseSensitive: true }), 0);
 * ```
 */
export function contains(
  answer: unknown,
  substring: string,
  options: ContainsOptions = {},
): number {
  return fold(text(answer), options).includes(fold(substring, options)) ? 1 : 0;
}

/**
 * 1 when the answer contains at least one of `substrings`, else 0.
 *
 * @example
 * ```ts
 * import { containsAny } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(containsAny("It is blue", ["red", "blue"]), 1);
 * ```
 */
export function containsAny(
  answer: unknown,
  substrings: readonly string[],
  options: ContainsOptions = {},
): number {
  const a = fold(text(answer), options);
  return substrings.some((s) => a.includes(fold(s, options))) ? 1 : 0;
}

/**
 * 1 when the answer contains every one of `substrings`, else 0.
 *
 * @example
 * ```ts
 * import { containsAll } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(containsAll("red, green and blue", ["red", "blue"]), 1);
 * assert.equal(containsAll("red and green", ["red", "blue"]), 0);
 * ```
 */
export function containsAll(
  answer: unknown,
  substrings: readonly string[],
  options: ContainsOptions = {},
): number {
  const a = fold(text(answer), options);
  return substrings.every((s) => a.includes(fold(s, options))) ? 1 : 0;
}

/** Options for {@linkcode numericMatch}. */
export interface NumericMatchOptions {
  /**
   * The largest absolute difference that still matches.
   * @default 0
   */
  tolerance?: number;
}

const NUMBER = /[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?/;

/**
 * 1 when the first number in the answer is within `tolerance` of
 * `expected`, else 0 (also when the answer holds no number). A number
 * answer is taken as it is.
 *
 * @throws {RangeError} for a negative or non-finite tolerance
 *
 * @example
 * ```ts
 * import { numericMatch } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(numericMatch("The total is -42.0 dollars", -42), 1);
 * assert.equal(numericMatch("1.5e3 ms", 1500), 1);
 * assert.equal(numericMatch("about 99", 100, { tolerance: 0.5 }), 0);
 * assert.equal(numericMatch("no idea", 0), 0);
 * ```
 */
export function numericMatch(
  answer: unknown,
  expected: number,
  options: NumericMatchOptions = {},
): number {
  const tolerance = options.tolerance ?? 0;
  if (!(tolerance >= 0) || !Number.isFinite(tolerance)) {
    throw new RangeError(
      `Cannot match numbers: tolerance ${tolerance} must be a finite number ≥ 0`,
    );
  }
  let found: number;
  if (typeof answer === "number") found = answer;
  else {
    const m = NUMBER.exec(text(answer));
    if (m === null) return 0;
    found = Number(m[0]);
  }
  return Math.abs(found - expected) <= tolerance ? 1 : 0;
}

/**
 * Token-level F1 between the answer and a reference: both
 * {@linkcode normalize}d and split into words; the harmonic mean of
 * precision and recall over the words they share (counted with
 * multiplicity). 0 when either is empty.
 *
 * @example
 * ```ts
 * import { f1Score } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(f1Score("Paris", "Paris"), 1);
 * assert.equal(f1Score("the cat sat", "a cat sat down"), 0.8);
 * assert.equal(f1Score("", "Paris"), 0);
 * ```
 */
export function f1Score(answer: unknown, reference: string): number {
  const predicted = normalize(answer).split(" ").filter(Boolean);
  const expected = normalize(reference).split(" ").filter(Boolean);
  if (predicted.length === 0 || expected.length === 0) return 0;
  const counts = new Map<string, number>();
  for (const w of expected) counts.set(w, (counts.get(w) ?? 0) + 1);
  let common = 0;
  for (const w of predicted) {
    const n = counts.get(w) ?? 0;
    if (n > 0) {
      common++;
      counts.set(w, n - 1);
    }
  }
  if (common === 0) return 0;
  const precision = common / predicted.length;
  const recall = common / expected.length;
  return (2 * precision * recall) / (precision + recall);
}
