/**
 * Agents: an {@linkcode Agent} drives a {@linkcode Run} to an answer;
 * {@linkcode functionAgent} adapts a function into one.
 *
 * @module
 */

import type { Run } from "./run.ts";
import type { AdaptiveConcurrency } from "./concurrency.ts";

/** One model call's tokens and cost, as an agent reports it to the job. */
export interface ModelCallUsage {
  /** The model. */
  model: string;
  /** Prompt tokens, cached ones included. */
  inputTokens: number;
  /** Completion tokens. */
  outputTokens: number;
  /** The part of `inputTokens` served from a cache. */
  cachedTokens: number;
  /** What the call cost in USD, or `null` when no price is known. */
  costUsd: number | null;
}

/** What an agent gets besides the run. */
export interface AgentContext {
  /** Aborts when the agent's time is up or the rollout is cancelled. */
  signal: AbortSignal;
  /**
   * The job's limit on model calls in flight: an agent that calls a model
   * takes a permit for each call and says how it went (a rate limit
   * shrinks the limit). Absent outside a job.
   */
  concurrency?: AdaptiveConcurrency;
  /** Called by an agent after each model call, so that the job can count tokens and cost. */
  onUsage?: (usage: ModelCallUsage) => void;
}

/**
 * What an agent is, as results files record it with each rollout and the
 * viewer and `report` show it: no secrets (no keys, no full command lines).
 */
export interface AgentInfo {
  /** `model`, `command`, or another kind. */
  kind: string;
  /** The model, or the command's program name. */
  name: string;
  /** The agent's own version, when it has one. */
  version?: string;
  /** Settings worth comparing runs by: the API, sampling, limits... */
  settings?: Record<string, unknown>;
}

/**
 * An agent: drives a run to completion and sets `run.answer`. It may throw;
 * the answer it had set is still graded.
 */
export interface Agent {
  /** Works on the task until done; sets `run.answer`. */
  run(run: Run, context: AgentContext): Promise<void>;
  /** What the agent is, recorded with each rollout (`RunRecord.agent`). */
  readonly info?: AgentInfo;
}

/**
 * Adapts a function into an {@linkcode Agent}: it gets the prompt, the run
 * and the context, and its return value (when not `undefined`) becomes the
 * answer.
 */
export function functionAgent(
  fn: (prompt: unknown, run: Run, context: AgentContext) => unknown,
): Agent {
  if (typeof fn !== "function") throw new TypeError("Cannot create agent: expected a function");
  return {
    async run(run, context) {
      const answer = await fn(run.prompt, run, context);
      if (answer !== undefined) run.answer = answer;
    },
  };
}

/**
 * An agent failure after which nothing may be graded: the agent could not
 * start (a command not found or not executable), or its output went over
 * its cap. {@linkcode rollout} cancels the task and records an error.
 */
export class NotGradedError extends Error {
  /** Makes one; `cause` as for `Error`. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "NotGradedError";
  }
}

function shown(value: unknown): string {
  return value === undefined ? "none" : JSON.stringify(value);
}

/**
 * What differs between two agents' {@linkcode AgentInfo}, one phrase per
 * difference (`name "tiny" → "big"`, `settings.temperature 0 → 1`); `[]`
 * when they are the same. A missing info is an agent that says nothing of
 * itself (a function agent).
 */
export function agentChanges(
  before: AgentInfo | undefined,
  now: AgentInfo | undefined,
): string[] {
  if (before === undefined && now === undefined) return [];
  if (before === undefined || now === undefined) {
    return [
      `agent ${before === undefined ? "unnamed" : describeAgent(before)} → ${
        now === undefined ? "unnamed" : describeAgent(now)
      }`,
    ];
  }
  const out: string[] = [];
  for (const key of ["kind", "name", "version"] as const) {
    if (before[key] !== now[key]) out.push(`${key} ${shown(before[key])} → ${shown(now[key])}`);
  }
  const a = before.settings ?? {};
  const b = now.settings ?? {};
  for (const key of new Set([...Object.keys(a), ...Object.keys(b)])) {
    const [x, y] = [shown(a[key]), shown(b[key])];
    if (x !== y) out.push(`settings.${key} ${x} → ${y}`);
  }
  return out;
}

/** `model "tiny"`, `command ssh_agent.sh`. */
export function describeAgent(info: AgentInfo): string {
  return info.kind === "model" ? `model ${JSON.stringify(info.name)}` : `${info.kind} ${info.name}`;
}
