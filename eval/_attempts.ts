// One slot of a taskset run, attempt by attempt: each attempt is a rollout
// whose spending the budget meters and whose record goes to the results
// file; an attempt that failed for a class the retry policy names runs
// again after a backoff, while the job may still start rollouts.

import { delay } from "../_internal/async.ts";
import type { Agent, AgentInfo } from "./agent.ts";
import type { AdaptiveConcurrency } from "./concurrency.ts";
import { recordClass, type RolloutErrorClass } from "./failure.ts";
import type { ResultsFile, RunRecord } from "./results.ts";
import { rollout, rolloutFrom, type RolloutOptions } from "./rollout.ts";
import type { Run } from "./run.ts";
import type { Budget } from "./_budget.ts";
import { type JobLedger, runRecord, type Slot } from "./_ledger.ts";
import type { GroupReporter, Progress } from "./_progress.ts";
import type { JobSnapshots } from "./_job_snapshots.ts";

/** How failed attempts are retried, resolved (see `RolloutRetryOptions`). */
export interface RetryConfig {
  /** Tries after the first, per rollout. */
  readonly attempts: number;
  /** The failure classes that are retried. */
  readonly on: readonly RolloutErrorClass[];
  /** The first wait, in ms. */
  readonly baseDelay: number;
  /** The longest wait, in ms. */
  readonly maxDelay: number;
}

/** Which failed attempts run again, and after how long. */
export class RetryPolicy {
  readonly #config: RetryConfig;

  constructor(config: RetryConfig) {
    this.#config = config;
  }

  /** Whether retry number `n` (from 1) of an attempt that ended as `record` may run. */
  allows(n: number, record: RunRecord): boolean {
    return n <= this.#config.attempts && this.retryable(record);
  }

  /** Whether `record` failed for a retried class (a cancelled rollout never is). */
  retryable(record: RunRecord): boolean {
    const c = recordClass(record);
    return c !== null && c !== "cancelled" && this.#config.on.includes(c);
  }

  /** The wait before retry `n`: doubling from the base delay up to the longest, times 0.5 to 1.5. */
  delay(n: number): number {
    const { baseDelay, maxDelay } = this.#config;
    return Math.min(maxDelay, baseDelay * 2 ** (n - 1)) * (0.5 + Math.random());
  }
}

/** What a {@linkcode SlotRunner} works with: the job's shared parts. */
export interface SlotRunnerParts {
  readonly agent: Agent;
  /** What the agent is, read once: it does not change during a job. */
  readonly agentInfo: AgentInfo | undefined;
  /** The options every rollout gets (each slot's runtime, the signal and the context are added). */
  readonly rollout: Omit<RolloutOptions, "runtime" | "signal" | "context" | "from">;
  readonly concurrency: AdaptiveConcurrency | undefined;
  readonly budget: Budget;
  readonly ledger: JobLedger;
  readonly progress: Progress;
  /** Hears of each group once all of its slots are done. */
  readonly groups: GroupReporter;
  readonly retry: RetryPolicy;
  /** The results file, when the job writes one. */
  readonly out: ResultsFile | null;
  /** The caller's abort: a rollout it cut short is left to run, not done. */
  readonly signal: AbortSignal | undefined;
  /** What the rollouts start from, when the job has snapshots. */
  readonly snapshots: JobSnapshots | null;
}

/** Runs slots of a job: attempts, retries, records, progress. */
export class SlotRunner {
  readonly #parts: SlotRunnerParts;

  constructor(parts: SlotRunnerParts) {
    this.#parts = parts;
  }

  /**
   * Runs `slot` until its last attempt, and settles that in the ledger, the
   * group (when it completes it) and the progress.
   */
  async run(slot: Slot): Promise<void> {
    const { budget, ledger, progress, retry, signal, snapshots } = this.#parts;
    progress.started();
    let result = await this.#attempt(slot, ledger.firstAttempt(slot));
    for (let n = 1; retry.allows(n, result.record) && budget.open; n++) {
      progress.retrying(result.record);
      try {
        await delay(retry.delay(n), budget.signal);
      } catch {
        break; // Stopped while waiting: the failed attempt stands.
      }
      if (!budget.open) break;
      ledger.replaced(result.record);
      result = await this.#attempt(slot, result.record.attempt! + 1);
    }
    const { run, record } = result;
    ledger.settle(slot, run, record);
    // Its task's snapshot goes with its last rollout, before a trainer hears of the group.
    await snapshots?.settled(slot);
    // A rollout the caller's abort cut short is left to run, not done.
    const cutShort = record.status === "cancelled" && signal?.aborted === true;
    const group = cutShort ? null : ledger.done(slot);
    if (group !== null) await this.#parts.groups.report(group);
    progress.finished(record, cutShort);
  }

  /** One rollout of `slot`, metered, recorded and written. */
  async #attempt(slot: Slot, attempt: number): Promise<{ run: Run; record: RunRecord }> {
    const { agent, agentInfo, budget, concurrency, ledger, out } = this.#parts;
    const meter = budget.meter();
    const options = {
      ...this.#parts.rollout,
      runtime: slot.runtime,
      signal: budget.signal,
      context: { concurrency, onUsage: meter.onUsage },
    };
    const snapshots = this.#parts.snapshots;
    const run = snapshots === null
      ? await rollout(slot.row, agent, options)
      : await rolloutFrom(slot.row, agent, options, snapshots.getter(slot));
    meter.settle(run.trace.toJSON());
    const record = runRecord(ledger.jobId, slot, { run, attempt, agent: agentInfo });
    if (out) await out.append(record, run.trace.files);
    return { run, record };
  }
}
