/**
 * Subscores and how they add up: a {@linkcode SubScore} is one weighted
 * measurement (its `children` say what it was made from), and
 * {@linkcode combine} turns several into the {@linkcode GradeResult} a
 * template yields, running the graders among them concurrently. Positive
 * weights are normalised to sum to 1; negative weights are penalties,
 * kept as given. {@linkcode combineAny} and {@linkcode combineAll} pass when
 * any or all of their inputs do. The semantics are those of the HUD Python
 * SDK's `hud.graders`.
 *
 * @example
 * ```ts
 * import { combine, combineAny, exactMatch } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const answer = "Paris";
 * const grade = await combine([
 *   { name: "answer", value: exactMatch(answer, "paris"), weight: 0.8 },
 *   combineAny([
 *     { name: "short", value: answer.length < 10 ? 1 : 0 },
 *     { name: "polite", value: 0 },
 *   ], { name: "style", weight: 0.2 }),
 *   { name: "rambling", value: 0, weight: -0.5 },
 * ]);
 * assert.equal(grade.score, 1);
 * assert.deepEqual(grade.subscores, {
 *   "answer": 1,
 *   "style": 1,
 *   "style/short": 1,
 *   "style/polite": 0,
 *   "rambling": 0,
 * });
 * ```
 *
 * @module
 */

import { setOwn } from "../schema.ts";

/** One node of a grade's breakdown. */
export interface SubScore {
  /** What it measures; names are made unique among siblings (`tests`, `tests-1`...). */
  name: string;
  /** The measurement, in [0, 1]. */
  value: number;
  /**
   * Its weight among its siblings; a negative weight is a penalty, taken
   * off when the value is 1.
   * @default 1
   */
  weight?: number;
  /** What the grader that made it saw: exit code, output, the judge's explanation... */
  info?: Record<string, unknown>;
  /** The subscores it was derived from. */
  children?: SubScore[];
}

/** The `info` of a {@linkcode GradeResult}. */
export interface GradeInfo {
  /** The subscores with their weights as used (positive ones normalised), children included. */
  breakdown: SubScore[];
  /** Whatever else the caller added through {@linkcode CombineOptions.info}. */
  [key: string]: unknown;
}

/**
 * An evaluation, shaped as a template yields it (`yield await combine(...)`):
 * a `score`, the flat `subscores` the viewer and job table show, and the
 * weighted tree in `info.breakdown`.
 */
export interface GradeResult {
  /** Σ value × weight over the subscores. Below 0 when penalties outweigh the rest. */
  score: number;
  /**
   * Every subscore's value by name; a child's name follows its parent's
   * after a `/` (`judge/Cites a source`).
   */
  subscores: Record<string, number>;
  /** The breakdown, and any extra keys given. */
  info: GradeInfo;
  /** Further keys pass through to the grade frame. */
  [key: string]: unknown;
}

/** Options for {@linkcode combine}. */
export interface CombineOptions {
  /**
   * Extra keys for the result's `info` (`breakdown` is always the combiner's).
   * @default {}
   */
  info?: Record<string, unknown>;
}

/** Options for {@linkcode combineAny} and {@linkcode combineAll}. */
export interface BooleanCombineOptions {
  /**
   * The combined subscore's name.
   * @default "any" for combineAny, "all" for combineAll
   */
  name?: string;
  /**
   * Its weight.
   * @default 1
   */
  weight?: number;
}

/** A subscore, or a grader still running. */
export type SubScoreInput = SubScore | PromiseLike<SubScore>;

function checked(item: unknown, where: string): SubScore {
  if (typeof item !== "object" || item === null) {
    throw new TypeError(
      `${where}: expected a subscore { name, value, weight }, got ${String(item)}`,
    );
  }
  const s = item as SubScore;
  if (typeof s.name !== "string" || s.name === "") {
    throw new TypeError(`${where}: a subscore needs a non-empty string "name"`);
  }
  if (typeof s.value !== "number" || !(s.value >= 0 && s.value <= 1)) {
    throw new RangeError(
      `${where}: subscore "${s.name}" has value ${s.value}; it must be in [0, 1]`,
    );
  }
  const weight = s.weight ?? 1;
  if (typeof weight !== "number" || !Number.isFinite(weight)) {
    throw new RangeError(`${where}: subscore "${s.name}" has weight ${weight}; it must be finite`);
  }
  return s;
}

/**
 * Unique names for siblings, as the Python SDK makes them: a name used once
 * stays; repeated ones become `name-1`, `name-2`..., skipping names taken.
 */
function uniqueNames(items: readonly SubScore[]): string[] {
  const counts = new Map<string, number>();
  for (const s of items) counts.set(s.name, (counts.get(s.name) ?? 0) + 1);
  const reserved = new Set(items.map((s) => s.name));
  const used = new Set<string>();
  const suffix = new Map<string, number>();
  return items.map((s) => {
    let name = s.name;
    if (counts.get(s.name)! > 1 || used.has(name)) {
      let n = suffix.get(s.name) ?? 0;
      do name = `${s.name}-${++n}`; while (used.has(name) || reserved.has(name));
      suffix.set(s.name, n);
    }
    used.add(name);
    return name;
  });
}

async function resolve(items: Iterable<SubScoreInput>, where: string): Promise<SubScore[]> {
  if (items === null || typeof items !== "object" || !(Symbol.iterator in items)) {
    throw new TypeError(`${where}: expected a list of subscores`);
  }
  const resolved = await Promise.all(items);
  if (resolved.length === 0) throw new RangeError(`${where}: no subscores given`);
  return resolved.map((s, i) => checked(s, `${where}: item ${i}`));
}

function flatten(into: Record<string, number>, prefix: string, items: readonly SubScore[]): void {
  for (const s of items) {
    const name = prefix + s.name;
    setOwn(into, name, s.value);
    if (s.children) flatten(into, `${name}/`, s.children);
  }
}

/** A copy of `s` named `name`, its children's names made unique too. */
function renamed(s: SubScore, name: string, weight: number): SubScore {
  const out: SubScore = { ...s, name, weight };
  if (s.children) {
    const names = uniqueNames(s.children);
    out.children = s.children.map((c, i) => renamed(c, names[i], c.weight ?? 1));
  }
  return out;
}

/**
 * Combines subscores into a grade: awaits the graders among `items`
 * concurrently, normalises the positive weights to sum to 1, keeps the
 * negative ones as penalties, and scores Σ value × weight.
 *
 * @param items subscores, or promises of them (`bashGrader(...)`, `llmJudgeGrader(...)`)
 * @returns the grade, with every subscore by name and the weighted tree in `info.breakdown`
 * @throws {RangeError} when there are no subscores, none has a positive
 *   weight, or a value is outside [0, 1]
 * @throws {TypeError} for an item that is not a subscore
 * @throws the first error of a grader that failed
 *
 * @example Weights are normalised; a penalty is subtracted
 * ```ts
 * import { combine } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const grade = await combine([
 *   { name: "tests", value: 1, weight: 3 },
 *   { name: "lint", value: 0, weight: 1 },
 *   { name: "deleted_tests", value: 1, weight: -0.25 },
 * ]);
 * assert.equal(grade.score, 0.5); // 1 × 0.75 + 0 × 0.25 − 0.25
 * assert.deepEqual(grade.info.breakdown.map((s) => s.weight), [0.75, 0.25, -0.25]);
 * ```
 */
export async function combine(
  items: Iterable<SubScoreInput>,
  options: CombineOptions = {},
): Promise<GradeResult> {
  const subscores = await resolve(items, "Cannot combine grades");
  const positive = subscores.reduce((sum, s) => sum + Math.max(0, s.weight ?? 1), 0);
  if (!(positive > 0)) {
    throw new RangeError("Cannot combine grades: no subscore has a positive weight");
  }
  const names = uniqueNames(subscores);
  const breakdown = subscores.map((s, i) => {
    const weight = s.weight ?? 1;
    return renamed(s, names[i], weight > 0 ? weight / positive : weight);
  });
  const score = breakdown.reduce((sum, s) => sum + s.value * s.weight!, 0);
  const flat: Record<string, number> = {};
  flatten(flat, "", breakdown);
  return { score, subscores: flat, info: { ...options.info, breakdown } };
}

async function boolean(
  kind: "any" | "all",
  items: Iterable<SubScoreInput>,
  options: BooleanCombineOptions,
): Promise<SubScore> {
  const what = `Cannot combine subscores with ${kind === "any" ? "combineAny" : "combineAll"}`;
  const children = await resolve(items, what);
  const values = children.map((s) => s.value);
  const names = uniqueNames(children);
  return {
    name: options.name ?? kind,
    value: kind === "any" ? Math.max(...values) : Math.min(...values),
    weight: options.weight ?? 1,
    children: children.map((c, i) => renamed(c, names[i], c.weight ?? 1)),
  };
}

/**
 * A subscore that passes when any input does: the largest value, the inputs
 * kept as children.
 *
 * @param items subscores, or promises of them
 * @throws {RangeError} when there are none, or a value is outside [0, 1]
 *
 * @example
 * ```ts
 * import { combineAny } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const either = await combineAny([{ name: "a", value: 0 }, { name: "b", value: 1 }]);
 * assert.equal(either.value, 1);
 * assert.equal(either.name, "any");
 * ```
 */
export function combineAny(
  items: Iterable<SubScoreInput>,
  options: BooleanCombineOptions = {},
): Promise<SubScore> {
  return boolean("any", items, options);
}

/**
 * A subscore that passes only when all inputs do: the smallest value, the
 * inputs kept as children.
 *
 * @param items subscores, or promises of them
 * @throws {RangeError} when there are none, or a value is outside [0, 1]
 *
 * @example
 * ```ts
 * import { combineAll } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const both = await combineAll([{ name: "a", value: 1 }, { name: "b", value: 0.5 }], {
 *   name: "checks",
 * });
 * assert.equal(both.value, 0.5);
 * ```
 */
export function combineAll(
  items: Iterable<SubScoreInput>,
  options: BooleanCombineOptions = {},
): Promise<SubScore> {
  return boolean("all", items, options);
}

/** Options for {@linkcode subscore}. */
export interface SubScoreOptions {
  /**
   * Its weight; negative for a penalty.
   * @default 1
   */
  weight?: number;
  /** Extra details. */
  info?: Record<string, unknown>;
}

/**
 * A subscore from a number, a boolean (1 or 0), or a whole
 * {@linkcode GradeResult}, whose breakdown becomes its children: the way
 * to nest one combined grade inside another (its score clamped to [0, 1],
 * the range of a subscore, should penalties take it below 0).
 *
 * @throws {RangeError} for a value outside [0, 1]
 *
 * @example A grade nested in a grade
 * ```ts
 * import { combine, subscore } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const style = await combine([{ name: "lint", value: 1 }, { name: "format", value: 0 }]);
 * const grade = await combine([
 *   subscore("correct", true, { weight: 3 }),
 *   subscore("style", style),
 * ]);
 * assert.equal(grade.score, 0.875);
 * assert.equal(grade.subscores["style/format"], 0);
 * ```
 */
export function subscore(
  name: string,
  value: number | boolean | GradeResult,
  options: SubScoreOptions = {},
): SubScore {
  const out: SubScore = {
    name,
    value: typeof value === "boolean"
      ? (value ? 1 : 0)
      : typeof value === "number"
      ? value
      : Math.min(1, Math.max(0, value.score)),
    weight: options.weight ?? 1,
  };
  if (typeof value === "object" && value !== null) out.children = value.info.breakdown;
  if (options.info !== undefined) out.info = options.info;
  return checked(out, "Cannot make a subscore");
}
