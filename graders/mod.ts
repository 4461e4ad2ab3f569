/**
 * Graders for templates, as the HUD Python SDK's `hud.graders` has them:
 * {@linkcode bashGrader} scores a command run in the workspace sandbox,
 * {@linkcode llmJudgeGrader} has a model judge weighted criteria, and
 * {@linkcode combine} weighs them (and plain subscores from the text
 * helpers) into the grade a template yields. Negative weights are
 * penalties; {@linkcode combineAny} and {@linkcode combineAll} nest.
 *
 * @example A template that yields a combined grade
 * ```ts
 * import { combine, contains, numericMatch } from "./mod.ts";
 * import { Environment } from "../env.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("quiz");
 * const task = env.template({ id: "pi" }, async function* () {
 *   const answer = yield "What is pi, to two decimals? Say 'pi is ...'.";
 *   yield await combine([
 *     { name: "value", value: numericMatch(answer, 3.14, { tolerance: 0.005 }), weight: 0.8 },
 *     { name: "format", value: contains(answer, "pi is"), weight: 0.2 },
 *     { name: "rambling", value: String(answer).length > 40 ? 1 : 0, weight: -0.5 },
 *   ]);
 * });
 * const active = await env.startTask(task().id);
 * const grade = await active.grade("Pi is 3.14");
 * assert.equal(grade.score, 1);
 * assert.deepEqual(grade.subscores, { value: 1, format: 1, rambling: 0 });
 * ```
 *
 * @module
 */

export {
  type BooleanCombineOptions,
  combine,
  combineAll,
  combineAny,
  type CombineOptions,
  type GradeInfo,
  type GradeResult,
  type SubScore,
  subscore,
  type SubScoreInput,
  type SubScoreOptions,
} from "./combine.ts";
export { bashGrader, type BashGraderOptions, type ExecTarget } from "./bash.ts";
export {
  type Criterion,
  JudgeVerdictError,
  llmJudgeGrader,
  type LlmJudgeOptions,
} from "./judge.ts";
export { parseVerdict, type ParseVerdictOptions, type Verdict } from "./_verdict.ts";
export {
  contains,
  containsAll,
  containsAny,
  type ContainsOptions,
  exactMatch,
  type ExactMatchOptions,
  f1Score,
  normalize,
  numericMatch,
  type NumericMatchOptions,
} from "./text.ts";
