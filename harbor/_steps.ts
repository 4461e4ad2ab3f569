// Harbor's multi-step tasks (`[[steps]]`), run as Harbor's MultiStepTrial
// runs them: one container for the whole trial; for each step in order, its
// instruction to the agent, then its verification (the task's tests/ with
// the step's over it); a step whose rewards fall below its `min_reward`
// ends the trial there. The trial's rewards are each key's mean over the
// verified steps, a key a step lacks counting 0 (`mean`, the default), or
// the last step's (`final`).
//
// Each step is one rollout of this SDK's (eval/_rollout_stages.ts) on the
// container the first one placed: its network phases, agent time limit and
// failure classes are a single-step task's. Where Harbor would go on (a
// step whose verifier crashed is left out of its mean), this runner stops
// the trial ungraded with the step's class: a step the infrastructure or
// the verifier failed, or that the agent tampered with, makes no reward
// rather than one computed without it.

import type { Agent } from "../eval/agent.ts";
import type { Grade } from "../eval/run.ts";
import { rollout, type RolloutObserver } from "../eval/rollout.ts";
import { isGraded } from "../eval/failure.ts";
import type { RunRecord } from "../eval/results.ts";
import { runRecord } from "../eval/_ledger.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import type { HarborStep, HarborTask } from "./loader.ts";

/** A key's value in each verified step, in order: a trial's rewards are made from these. */
export type StepRewards = Record<string, number>;

/**
 * The rewards a step's verifier wrote, as Harbor keeps them: reward.json's
 * keys, or `{ reward }` for reward.txt.
 */
export function stepRewards(
  grade: { reward: number; subscores?: Record<string, number> },
): StepRewards {
  const keys = grade.subscores ?? {};
  return Object.keys(keys).length > 0 ? { ...keys } : { reward: grade.reward };
}

/**
 * The first of `min`'s keys whose value `rewards` falls below (a key it
 * lacks counts as below), as `key=value below min_reward n`, or null.
 */
export function belowMinReward(rewards: StepRewards, min: Record<string, number>): string | null {
  for (const [key, threshold] of Object.entries(min)) {
    const got = rewards[key] ?? -Infinity;
    if (got < threshold) return `${key}=${got} below min_reward ${threshold}`;
  }
  return null;
}

/**
 * The trial's rewards from its verified steps' (at least one): `final`, the
 * last step's; `mean`, each key's mean over the steps, 0 where a step lacks it.
 */
export function combineStepRewards(steps: StepRewards[], strategy: "mean" | "final"): StepRewards {
  if (strategy === "final") return { ...steps[steps.length - 1] };
  const keys = new Set(steps.flatMap((s) => Object.keys(s)));
  const out: StepRewards = {};
  for (const key of keys) out[key] = steps.reduce((a, s) => a + (s[key] ?? 0), 0) / steps.length;
  return out;
}

/** The score of a trial's rewards, as of one reward.json: `reward` when given, else the keys' mean. */
export function scoreOf(rewards: StepRewards): number {
  if (rewards.reward !== undefined) return rewards.reward;
  const values = Object.values(rewards);
  return values.reduce((a, b) => a + b, 0) / values.length;
}

/**
 * A runtime whose first placement serves every step of one trial: the
 * rollouts' releases leave it, {@linkcode close} releases it.
 */
class TrialRuntime implements RuntimeProvider, AsyncDisposable {
  readonly #inner: RuntimeProvider;
  #placement: Promise<Placement> | null = null;
  constructor(inner: RuntimeProvider) {
    this.#inner = inner;
  }
  async place(options?: PlaceOptions): Promise<Placement> {
    this.#placement ??= this.#inner.place(options);
    const placement = await this.#placement;
    return { ...placement, [Symbol.asyncDispose]: () => Promise.resolve() };
  }
  async [Symbol.asyncDispose](): Promise<void> {
    const placing = this.#placement;
    this.#placement = null;
    const placement = await placing?.catch(() => null);
    await placement?.[Symbol.asyncDispose]();
  }
}

/** What one trial of a multi-step task needs besides the task and the agent. */
export interface TrialParts {
  /** Where the trial's container is placed. */
  readonly runtime: RuntimeProvider;
  /** The observers of step `i`'s agent phase (the copy of its tests). */
  readonly observers: (step: HarborStep) => RolloutObserver[];
  /** The longest step `i`'s healthchecks may take before its prompt, in ms. */
  readonly healthBound: (index: number) => number;
  readonly jobId: string;
  readonly groupId: string;
  readonly repeat: number;
  readonly signal?: AbortSignal;
}

/** How one trial of a multi-step task ended. */
export interface Trial {
  /** Each step's record, in order, up to the one that ended it. */
  readonly records: RunRecord[];
  /** The verified steps' rewards, by step name. */
  readonly steps: { name: string; rewards: StepRewards }[];
  /** The trial's rewards, as Harbor combines the steps'; null when it was not graded. */
  readonly rewards: StepRewards | null;
  /** The step that left it ungraded, and why; or null. */
  readonly failed: { step: string; record: RunRecord } | null;
  /** The last graded step's `info` (its verifier's exit and output), or null. */
  readonly info: Record<string, unknown> | null;
}

/** The rollout deadline of a step: its agent's, its healthchecks' and its verifier's time, and placing and copying. */
function stepTimeout(step: HarborStep, health: number): number {
  return step.config.agentTimeoutSec * 1000 + health + step.config.verifierTimeoutSec * 1000 +
    120_000;
}

/** Step `index` of `task`, one rollout on the trial's container; its record and grade. */
async function runStep(
  task: HarborTask,
  index: number,
  agent: Agent,
  runtime: RuntimeProvider,
  parts: TrialParts,
): Promise<{ record: RunRecord; grade: Grade | null }> {
  const step = task.steps![index];
  const row = {
    env: `harbor-${task.name}`,
    id: "harbor",
    args: { step: index },
    slug: `${task.name}/${step.config.name}`,
  };
  const run = await rollout(row, agent, {
    runtime,
    observers: parts.observers(step),
    agentTimeout: step.config.agentTimeoutSec * 1000,
    rolloutTimeout: stepTimeout(step, parts.healthBound(index)),
    signal: parts.signal,
  });
  const { repeat, groupId } = parts;
  const slot = { index, row, repeat, runtime, groupId, key: `${row.slug}:${repeat}` };
  const record = runRecord(parts.jobId, slot, { run, attempt: 1, agent: undefined });
  return { record, grade: run.grade };
}

/**
 * One trial of `task` (which has `[[steps]]`) by `agent`: its steps in
 * order in one container, each a rollout; stops at a step that is not
 * graded, or whose rewards fall below its `min_reward`.
 */
export async function runTrial(task: HarborTask, agent: Agent, parts: TrialParts): Promise<Trial> {
  await using runtime = new TrialRuntime(parts.runtime);
  const records: RunRecord[] = [];
  const verified: { name: string; rewards: StepRewards }[] = [];
  const combined = () =>
    combineStepRewards(verified.map((s) => s.rewards), task.config.multiStepRewardStrategy);
  let info: Record<string, unknown> | null = null;
  for (const [index, step] of task.steps!.entries()) {
    const { name, minReward } = step.config;
    const { record, grade } = await runStep(task, index, agent, runtime, parts);
    records.push(record);
    if (!isGraded(record) || grade === null) {
      const failed = { step: name, record };
      return { records, steps: verified, rewards: null, failed, info };
    }
    info = grade.info;
    const rewards = stepRewards(grade);
    verified.push({ name, rewards });
    // Below its min_reward: the steps after it do not run.
    if (minReward && belowMinReward(rewards, minReward) !== null) break;
  }
  return { records, steps: verified, rewards: combined(), failed: null, info };
}
