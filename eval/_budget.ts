// A job's spending against its token and cost limits: every attempt's
// model calls counted (a resumed file's too), the limit that stopped the
// job once one is reached, and the signal that stops its rollouts.

import type { ModelCallUsage } from "./agent.ts";
import type { JobStop } from "./job.ts";
import { addUsage, emptyUsage, traceUsage, type Usage } from "./usage.ts";

/** The limits of {@linkcode Budget}, resolved. */
export interface BudgetLimits {
  /** Tokens (prompt plus completion) at which the job stops, if any. */
  readonly tokenLimit: number | undefined;
  /** USD at which the job stops, if any. */
  readonly costLimit: number | undefined;
  /** What reaching one does to running rollouts: they finish, or are cancelled. */
  readonly limitAction: "finish" | "cancel";
}

/** Counts one attempt's model calls for a {@linkcode Budget}. */
export interface AttemptMeter {
  /** For the agent's context: counts a call as the agent reports it. */
  readonly onUsage: (usage: ModelCallUsage) => void;
  /** Counts what the finished attempt's trace holds beyond what was reported. */
  settle(trace: unknown): void;
}

/**
 * What a job spent, and whether a limit stopped it. A limit reached stops
 * new rollouts; with `limitAction: "cancel"` it also aborts the running
 * ones through {@linkcode Budget.signal}.
 */
export class Budget {
  readonly #limits: BudgetLimits;
  readonly #spent: Usage;
  readonly #halt = new AbortController();
  readonly #signal: AbortSignal;
  #stopped: JobStop | null = null;

  /**
   * Starts from `spent` (a resumed file's); `signal` stops the job from
   * outside (the caller's abort, or a failed `onGroup`), if any.
   */
  constructor(limits: BudgetLimits, spent: Usage, signal: AbortSignal | undefined) {
    this.#limits = limits;
    this.#spent = spent;
    this.#signal = signal ? AbortSignal.any([signal, this.#halt.signal]) : this.#halt.signal;
    this.#check();
  }

  /** Aborts when `signal` does, or when a limit cancels the running rollouts. */
  get signal(): AbortSignal {
    return this.#signal;
  }
  /** The limit that stopped the job, once one did. */
  get stopped(): JobStop | null {
    return this.#stopped;
  }
  /** What the job spent so far (the live record, for the job's summary). */
  get spent(): Usage {
    return this.#spent;
  }
  /** Tokens spent, prompt plus completion. */
  get tokens(): number {
    return this.#spent.inputTokens + this.#spent.outputTokens;
  }
  /** Whether a new rollout may start: not aborted, no limit reached. */
  get open(): boolean {
    return !this.#signal.aborted && this.#stopped === null;
  }

  /**
   * A meter for one attempt: what the agent reports as it goes counts at
   * once; what only the trace holds, when the attempt ends.
   */
  meter(): AttemptMeter {
    const live = emptyUsage();
    return {
      onUsage: (u) => {
        const call: Usage = {
          inputTokens: u.inputTokens,
          outputTokens: u.outputTokens,
          cachedTokens: u.cachedTokens,
          costUsd: u.costUsd ?? 0,
          unpricedCalls: u.costUsd === null ? 1 : 0,
          modelCalls: 1,
        };
        addUsage(live, call);
        this.#add(call);
      },
      settle: (trace) => {
        const traced = traceUsage(trace);
        this.#add({
          inputTokens: Math.max(0, traced.inputTokens - live.inputTokens),
          outputTokens: Math.max(0, traced.outputTokens - live.outputTokens),
          cachedTokens: Math.max(0, traced.cachedTokens - live.cachedTokens),
          costUsd: Math.max(0, traced.costUsd - live.costUsd),
          unpricedCalls: Math.max(0, traced.unpricedCalls - live.unpricedCalls),
          modelCalls: Math.max(0, traced.modelCalls - live.modelCalls),
        });
      },
    };
  }

  #add(usage: Usage): void {
    addUsage(this.#spent, usage);
    this.#check();
  }

  /** The first limit reached stops the job; with "cancel" it also aborts the running rollouts. */
  #check(): void {
    if (this.#stopped !== null) return;
    this.#stopped = this.#overLimit();
    if (this.#stopped !== null && this.#limits.limitAction === "cancel") {
      const what = this.#stopped.reason.replace("_", " ");
      this.#halt.abort(new DOMException(`the job's ${what} was reached`, "AbortError"));
    }
  }

  #overLimit(): JobStop | null {
    const { tokenLimit, costLimit } = this.#limits;
    if (tokenLimit !== undefined && this.tokens >= tokenLimit) {
      return { reason: "token_limit", limit: tokenLimit, spent: this.tokens };
    }
    if (costLimit !== undefined && this.#spent.costUsd >= costLimit) {
      return { reason: "cost_limit", limit: costLimit, spent: this.#spent.costUsd };
    }
    return null;
  }
}
