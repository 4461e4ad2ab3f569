// A taskset run's progress, as TasksetRunOptions.onProgress receives it:
// counts kept up to date as rollouts start, retry and finish, with the
// elapsed time, an ETA from this run's pace, and the budget's figures; and
// its finished groups, as TasksetRunOptions.onGroup receives them.

import type { AdaptiveConcurrency } from "./concurrency.ts";
import type { JobProgress } from "./job.ts";
import type { RunRecord } from "./results.ts";
import type { Budget } from "./_budget.ts";
import { isGraded } from "./failure.ts";

/** Keeps a job's {@linkcode JobProgress} and reports each change to a callback. */
export class Progress {
  readonly #progress: JobProgress;
  readonly #onProgress: ((progress: JobProgress) => void) | undefined;
  readonly #budget: Budget;
  readonly #concurrency: AdaptiveConcurrency | undefined;
  readonly #startedAt = Date.now();
  // The mean is kept as a running sum, so that each update costs O(1), not
  // a pass over every record.
  #rewardSum: number;
  #graded: number;
  /** Rollouts this run finished: the ETA's pace. */
  #finishedHere = 0;

  /** Starts at `total` rollouts, of which `kept` (graded, from a resumed file) are done. */
  constructor(
    total: number,
    kept: readonly RunRecord[],
    sources: { budget: Budget; concurrency: AdaptiveConcurrency | undefined },
    onProgress: ((progress: JobProgress) => void) | undefined,
  ) {
    this.#rewardSum = kept.reduce((sum, r) => sum + r.reward!, 0);
    this.#graded = kept.length;
    this.#progress = {
      total,
      done: kept.length,
      running: 0,
      failed: 0,
      meanReward: this.#graded === 0 ? null : this.#rewardSum / this.#graded,
      elapsedMs: 0,
      etaMs: null,
      retried: 0,
    };
    this.#budget = sources.budget;
    this.#concurrency = sources.concurrency;
    this.#onProgress = onProgress;
  }

  /** A rollout started. */
  started(): void {
    this.#progress.running++;
    this.report();
  }

  /** `failed`, an attempt, is about to be retried. */
  retrying(failed: RunRecord): void {
    this.#progress.retried!++;
    this.report(failed);
  }

  /**
   * A rollout ended with `record`. One the caller's abort cut short is not
   * done: the interrupt line, and `resume`, count it as left to run.
   */
  finished(record: RunRecord, cutShort: boolean): void {
    const p = this.#progress;
    p.running--;
    if (!cutShort) {
      p.done++;
      this.#finishedHere++;
      if (!isGraded(record)) {
        p.failed++;
      } else {
        this.#rewardSum += record.reward!;
        this.#graded++;
        p.meanReward = this.#rewardSum / this.#graded;
      }
    }
    this.report(record);
  }

  /**
   * Reports the progress now, with `last`, the rollout this update is for.
   * A callback that throws (a closed stderr) is ignored: it must not stop
   * the workers halfway, leaving rollouts running with nobody waiting.
   */
  report(last?: RunRecord): void {
    const p = this.#progress;
    p.elapsedMs = Date.now() - this.#startedAt;
    p.etaMs = this.#finishedHere === 0
      ? null
      : Math.round(p.elapsedMs / this.#finishedHere * (p.total - p.done));
    if (this.#concurrency) {
      p.concurrency = { limit: this.#concurrency.limit, max: this.#concurrency.max };
    }
    p.tokens = this.#budget.tokens;
    p.costUsd = this.#budget.spent.costUsd;
    p.stopped = this.#budget.stopped?.reason ?? null;
    try {
      this.#onProgress?.(last ? { ...p, last } : { ...p });
    } catch {
      // Ignored: reporting is best effort.
    }
  }
}

/**
 * Hands each finished group's records to `onGroup`, one group at a time
 * (a trainer's writer need not guard against itself). Unlike a progress
 * callback, its failure matters (a trainer would miss rows): the first
 * error stops the job, through {@linkcode GroupReporter.signal}, and is the
 * job's error; no group is reported after it.
 */
export class GroupReporter {
  readonly #onGroup: ((records: RunRecord[]) => void | Promise<void>) | undefined;
  readonly #failed = new AbortController();
  #turn: Promise<void> = Promise.resolve();
  #error: { error: unknown } | null = null;

  constructor(onGroup: ((records: RunRecord[]) => void | Promise<void>) | undefined) {
    this.#onGroup = onGroup;
  }

  /** Aborts once `onGroup` threw: the job starts no rollout more and cancels its running ones. */
  get signal(): AbortSignal {
    return this.#failed.signal;
  }

  /** Reports `records`, a finished group, after the groups before it; resolves once reported. */
  report(records: RunRecord[]): Promise<void> {
    const onGroup = this.#onGroup;
    if (onGroup === undefined) return Promise.resolve();
    this.#turn = this.#turn.then(async () => {
      if (this.#error !== null) return;
      try {
        await onGroup(records);
      } catch (error) {
        this.#error = { error };
        this.#failed.abort(error);
      }
    });
    return this.#turn;
  }

  /** Throws what `onGroup` threw, if it did. */
  throwIfFailed(): void {
    if (this.#error !== null) throw this.#error.error;
  }
}
