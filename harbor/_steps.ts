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
  /** Why the steps after a step did not run (`min_reward`), or null. */
  readonly stopped: string | null;
  /** The last graded step's `info` (its verifier's exit and output), or null. */
  readonly info: Record<string, unknown> | null;
}

/** The rollout deadline of a step: its agent's, its healthchecks' and its verifier's time, and placing and copying. */
function stepTimeout(step: HarborStep, health: number): number {
  return step.config.agentTimeoutSec * 1000 + health + step.config.verifierTimeoutSec * 1000 +
    120_000;
}

/**
 * One trial of `task` (which has `[[steps]]`) by `agent`: its steps in
 * order in one container, each a rollout; stops at a step that is not
 * graded, or whose rewards fall below its `min_reward`.
 */
export async function runTrial(task: HarborTask, agent: Agent, parts: TrialParts): Promise<Trial> {
  const steps = task.steps!;
  await using runtime = new TrialRuntime(parts.runtime);
  const records: RunRecord[] = [];
  const verified: { name: string; rewards: StepRewards }[] = [];
  let info: Record<string, unknown> | null = null;
  for (const [index, step] of steps.entries()) {
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
    const record = runRecord(parts.jobId, {
      index,
      row,
      repeat: parts.repeat,
      runtime,
      groupId: parts.groupId,
      key: `${row.slug}:${parts.repeat}`,
    }, { run, attempt: 1, agent: undefined });
    records.push(record);
    if (!isGraded(record) || run.grade === null) {
      return {
        records,
        steps: verified,
        rewards: null,
        failed: { step: step.config.name, record },
        stopped: null,
        info,
      };
    }
    info = run.grade.info;
    const rewards = stepRewards(run.grade);
    verified.push({ name: step.config.name, rewards });
    const below = step.config.minReward && belowMinReward(rewards, step.config.minReward);
    if (below) {
      const stopped = `step "${step.config.name}": ${below}; the steps after it did not run`;
      const combined = combineStepRewards(
        verified.map((s) => s.rewards),
        task.config.multiStepRewardStrategy,
      );
      return { records, steps: verified, rewards: combined, failed: null, stopped, info };
    }
  }
  return {
    records,
    steps: verified,
    rewards: combineStepRewards(
      verified.map((s) => s.rewards),
      task.config.multiStepRewardStrategy,
    ),
    failed: null,
    stopped: null,
    info,
  };
}
