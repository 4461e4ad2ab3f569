// A started task: the template's generator waiting at its prompt, and the
// frames it answers with. Part of the protocol core beside env.ts, which
// re-exports what is public here.

import { TaskError } from "./errors.ts";
import { type AnySchema, type ArgsShape, setOwn, showValue } from "./schema.ts";
import { errorMessage, isRecord } from "./_internal/util.ts";
import { redactValues, redactValuesDeep } from "./_internal/redact.ts";
import { stringifyJson } from "./_internal/framing.ts";

/** The prompt frame `tasks.start` returns: `prompt` plus any extra keys. */
export interface PromptFrame {
  /** The prompt: a string or any JSON value. */
  prompt: unknown;
  /** Per-episode data keyed by capability name. */
  bindings?: Record<string, unknown>;
  /** Extra keys pass through unchanged. */
  [key: string]: unknown;
}

/** The grade frame `tasks.grade` returns: a numeric `score` plus any extra keys. */
export interface GradeFrame {
  /** The score, usually in [0, 1]. */
  score: number;
  /** Extra keys (`info`, `content`, `done`, `isError`, `subscores`...) pass through. */
  [key: string]: unknown;
}

/** The body of a template: an async generator yielding prompt, then evaluation. */
export type TemplateBody<A, Answer> = (args: A) => AsyncGenerator<unknown, unknown, Answer>;

/** @internal What Environment.template keeps of a template. */
export interface TemplateRecord {
  id: string;
  description: string;
  shape: ArgsShape;
  extraArgs: boolean;
  strict: boolean;
  input: AnySchema | undefined;
  returns: AnySchema | undefined;
  body: TemplateBody<Record<string, unknown>, unknown>;
}

/**
 * A task that has been started: its generator waits at the prompt for the
 * answer. Grade it or cancel it exactly once; either closes the generator so
 * that its `finally` blocks run.
 */
export class ActiveTask {
  readonly #template: TemplateRecord;
  readonly #gen: AsyncGenerator<unknown, unknown, unknown>;
  readonly #prompt: PromptFrame;
  #done = false;

  /** @internal Created by {@linkcode Environment.startTask}. */
  constructor(
    template: TemplateRecord,
    gen: AsyncGenerator<unknown, unknown, unknown>,
    prompt: PromptFrame,
  ) {
    this.#template = template;
    this.#gen = gen;
    this.#prompt = prompt;
  }

  /** The template id. */
  get id(): string {
    return this.#template.id;
  }

  /** The prompt frame. */
  get prompt(): PromptFrame {
    return this.#prompt;
  }

  /** Whether the task was graded or cancelled. */
  get done(): boolean {
    return this.#done;
  }

  /**
   * Sends the answer in and returns the normalised evaluation. An absent
   * answer (`undefined`) is sent in as `null`, as HUD's server does
   * (`payload.get("answer")`): JSON has no `undefined`.
   * @throws {Error} when already graded or cancelled
   * The grade (and a failing task's message) loses every secret value this
   * process holds (see `markSecret`): what it sends goes into results.
   * @throws {TaskError} when the task throws, ends without a second
   *   `yield`, or yields something that is not a grade (a non-finite score
   *   included)
   */
  async grade(answer: unknown): Promise<GradeFrame> {
    const id = this.#template.id;
    if (this.#done) {
      throw new Error(`Cannot grade task "${id}": it was already graded or cancelled`);
    }
    this.#done = true;
    let step: IteratorResult<unknown, unknown>;
    try {
      step = await this.#gen.next(this.#answerFor(answer === undefined ? null : answer));
    } catch (err) {
      throw new TaskError(id, redactValues(errorMessage(err)), { cause: err });
    } finally {
      await this.#close();
    }
    if (step.done) {
      // The HUD SDK scores this 0, which hides a grader that forgot to grade.
      throw new TaskError(
        id,
        step.value === undefined
          ? `Cannot grade task "${id}": the template ended without a second yield; yield the evaluation (a number, or an object with a numeric "score")`
          : `Cannot grade task "${id}": the template returned ${
            showValue(step.value)
          } instead of yielding it; use yield for the evaluation`,
      );
    }
    // A grade goes to results: without the secrets this process holds (its
    // token, its keys), whatever the template put in its info.
    return redactValuesDeep(normaliseGrade(id, step.value)) as GradeFrame;
  }

  /** Closes the generator without grading. Idempotent; never throws for task code. */
  async cancel(): Promise<void> {
    if (this.#done) return;
    this.#done = true;
    await this.#close();
  }

  async #close(): Promise<void> {
    try {
      await this.#gen.return(undefined);
    } catch {
      // A finally block that throws while being cancelled has nobody to tell.
    }
  }

  #answerFor(answer: unknown): unknown {
    const returns = this.#template.returns;
    if (returns === undefined) return answer;
    const raw = typeof answer === "string" ? answer : stringifyJson(answer);
    let content: unknown = answer;
    if (!returns.accepts(answer)) {
      const coerced = returns.coerce(answer);
      if (returns.accepts(coerced)) content = coerced;
    }
    return { content, raw };
  }
}

function normaliseGrade(id: string, evaluation: unknown): GradeFrame {
  // JSON has no NaN or Infinity: such a score would go out as null.
  const finite = (score: number, where: string): number => {
    if (Number.isFinite(score)) return score;
    throw new TaskError(
      id,
      `Cannot grade task "${id}": the ${where} is ${score}; a score must be a finite number`,
    );
  };
  if (typeof evaluation === "number") return { score: finite(evaluation, "score") };
  if (typeof evaluation === "boolean") return { score: evaluation ? 1 : 0 };
  if (isRecord(evaluation)) {
    if (typeof evaluation.score === "number") {
      finite(evaluation.score, `"score"`);
      return evaluation as GradeFrame;
    }
    if (
      (!Object.hasOwn(evaluation, "score") || evaluation.score === undefined) &&
      typeof evaluation.reward === "number"
    ) {
      finite(evaluation.reward, `"reward"`);
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(evaluation)) setOwn(out, k === "reward" ? "score" : k, v);
      return out as GradeFrame;
    }
  }
  throw new TaskError(
    id,
    `Cannot grade task "${id}": the evaluation must be a number, or an object with a numeric "score" or "reward", got ${
      showValue(evaluation)
    }`,
  );
}
