/**
 * Jobs: a {@linkcode Job} holds every rollout's record of a taskset run,
 * with the statistics over them (mean reward, standard error, pass@k) and
 * a {@linkcode JobSummary}; {@linkcode Job.load} reads a results file back.
 *
 * @module
 */

import type { TaskRow } from "../env.ts";
import type { Run } from "./run.ts";
import { readResults, type RunRecord } from "./results.ts";
import {
  digestRecord,
  type JobStop,
  type JobSummary,
  latestAttempts,
  meanAndError,
  passAtK,
  summarizeDigests,
} from "./_summary.ts";

export type {
  CommonFailure,
  JobStop,
  JobSummary,
  SnapshotSummary,
  TaskSummary,
} from "./_summary.ts";
import { addUsage, emptyUsage, traceUsage, type Usage } from "./usage.ts";
import { type TrainingRow, trainingRows, type TrainingRowsOptions } from "./training.ts";
import { isGraded, rolloutFinished } from "./failure.ts";

/** Progress of a running job, for {@linkcode TasksetRunOptions.onProgress}. */
export interface JobProgress {
  /** Rollouts in the job. */
  total: number;
  /**
   * Rollouts finished (graded or failed), including those kept from a
   * resumed file; not those the job's abort cut short (left to run).
   */
  done: number;
  /** Rollouts running now. */
  running: number;
  /** Finished rollouts that failed. */
  failed: number;
  /** Mean reward over graded rollouts so far, or `null` before the first. */
  meanReward: number | null;
  /** Milliseconds since the job started. */
  elapsedMs?: number;
  /**
   * Estimated milliseconds until the job is done, from this run's pace;
   * `null` until a rollout of this run has finished.
   */
  etaMs?: number | null;
  /** The rollout that just finished, when this update is for one (or an attempt about to be retried). */
  last?: RunRecord;
  /** Attempts retried so far. */
  retried?: number;
  /** The model-call concurrency: the adaptive limit now, and its bound. */
  concurrency?: { limit: number; max: number };
  /** Tokens the job's model calls used (prompt plus completion), every attempt counted. */
  tokens?: number;
  /** What they cost in USD, over the calls with a known price. */
  costUsd?: number;
  /** The limit that stopped new rollouts, once one did. */
  stopped?: JobStop["reason"] | null;
}

/** Per-task results of a job. */
export interface TaskResult {
  /** The task row. */
  task: TaskRow;
  /** Its rollouts' records, by repeat. */
  records: RunRecord[];
  /** Mean reward over its graded rollouts ({@linkcode isGraded}), or `null` when none was. */
  meanReward: number | null;
  /** Standard error of that mean, or `null` below two graded rollouts. */
  stderr: number | null;
}

/** What a finished taskset run adds to its records: why it stopped early, and what it spent. */
export interface JobExtra {
  stopped?: JobStop | null;
  usage?: Usage;
}

// The constructor Taskset.run()'s ledger needs and Job's public API must
// not show; assigned in Job's static block.
let construct: (
  id: string,
  records: RunRecord[],
  runs: (Run | null)[],
  superseded: RunRecord[],
  extra: JobExtra,
) => Job;

/**
 * A finished job: the record of every rollout that counts (the latest
 * attempt of each task and repeat), in expansion order, and the earlier
 * attempts they replaced.
 */
export class Job {
  readonly #id: string;
  readonly #records: RunRecord[];
  readonly #runs: (Run | null)[];
  readonly #superseded: RunRecord[];
  readonly #stopped: JobStop | null;
  readonly #spent: Usage | null;

  // TypeScript's `private` is the only way to keep a constructor out of the
  // public API (a #private name cannot apply to one). Jobs are made by
  // Taskset.run() (through createJob()) and Job.load(). Records that repeat
  // a (task, repeat) are kept as history: the last of them counts.
  private constructor(
    id: string,
    records: RunRecord[],
    runs: (Run | null)[],
    superseded: RunRecord[] = [],
    extra: JobExtra = {},
  ) {
    const { counted, superseded: older } = latestAttempts(
      records.map((r) => ({ slug: r.task.slug, repeat: r.repeat })),
    );
    this.#id = id;
    if (older.length === 0) {
      this.#records = records;
      this.#runs = runs;
      this.#superseded = superseded;
    } else {
      this.#records = counted.map((i) => records[i]);
      this.#runs = counted.map((i) => runs[i] ?? null);
      this.#superseded = [...superseded, ...older.map((i) => records[i])];
    }
    this.#stopped = extra.stopped ?? null;
    this.#spent = extra.usage ?? null;
  }

  static {
    construct = (id, records, runs, superseded, extra) =>
      new Job(id, records, runs, superseded, extra);
  }

  /** The token or cost limit that stopped the job before it ran everything, or `null`. */
  get stopped(): JobStop | null {
    return this.#stopped;
  }

  /**
   * Tokens and cost: what the job spent, every attempt counted (a resumed
   * file's too) for a job just run; over the counted records for a loaded one.
   */
  get usage(): Usage {
    if (this.#spent !== null) return { ...this.#spent };
    const total = emptyUsage();
    for (const r of this.#records) addUsage(total, traceUsage(r.trace));
    return total;
  }

  /**
   * Groups (a task's repeats) with a rollout that could not finish, after
   * any retries: not graded, or failed for an infrastructure reason (see
   * {@linkcode rolloutFinished}). A trainer should not learn from such a
   * group as if it were whole.
   */
  get incompleteGroups(): string[] {
    const out = new Set<string>();
    for (const r of this.#records) if (!rolloutFinished(r)) out.add(r.group_id);
    return [...out];
  }

  /**
   * The job as training data: one {@linkcode TrainingRow} per counted
   * rollout, with its turns' tokens and log-probabilities, a loss mask
   * over the model's tokens, the reward and its group's rewards.
   */
  exportTraining(options: TrainingRowsOptions = {}): TrainingRow[] {
    return trainingRows(this.#records, options);
  }

  /** The job id. */
  get id(): string {
    return this.#id;
  }
  /** Every counted rollout's record, in expansion order (task by task, repeat by repeat). */
  get runs(): readonly RunRecord[] {
    return this.#records;
  }
  /**
   * Earlier attempts that a later attempt of the same task and repeat
   * replaced (a resumed job's cancelled or failed lines), oldest first:
   * history, never counted.
   */
  get superseded(): readonly RunRecord[] {
    return this.#superseded;
  }
  /** The live runs of this process, in the same order; `null` for records kept from a resumed file. */
  get liveRuns(): readonly (Run | null)[] {
    return this.#runs;
  }
  /**
   * Mean reward over graded rollouts ({@linkcode isGraded}: errored ones
   * are left out, never counted as 0), or `null` when none was graded.
   */
  get meanReward(): number | null {
    return meanAndError(rewardsOf(this.#records)).mean;
  }
  /** Standard error of {@linkcode Job.meanReward}, or `null` below two graded rollouts. */
  get stderr(): number | null {
    return meanAndError(rewardsOf(this.#records)).stderr;
  }
  /** Rollouts per task (the largest repeat count of any task). */
  get groupSize(): number {
    let n = 0;
    for (const r of this.results.values()) n = Math.max(n, r.records.length);
    return n;
  }

  /**
   * pass@k: the chance that at least one of k rollouts of a task passes
   * (reward of at least `threshold`), estimated without bias from each
   * task's n graded rollouts and averaged over the tasks with at least k
   * graded, as the mean is over graded rollouts: an errored rollout is left
   * out, not counted as a fail. `null` when no task has k graded rollouts.
   */
  passAtK(k: number, threshold = 1): number | null {
    return passAtK(
      [...this.results.values()].map(({ records }) => {
        const graded = records.filter(isGraded);
        return { n: graded.length, c: graded.filter((r) => r.reward! >= threshold).length };
      }),
      k,
    );
  }

  /**
   * The summary without the traces, exact numbers: counts, means, pass@k
   * for every k up to the group size, subscores, tokens, what ran, and
   * each task's figures. `eval --json`, `report`, `view` and the table all
   * show this one.
   */
  summary(): JobSummary {
    return summarizeDigests(this.#records.map(digestRecord), {
      id: this.#id,
      superseded: this.#superseded.map(digestRecord),
    });
  }

  /**
   * Reads a results file back: the latest attempt of each (task slug,
   * repeat), in the order the file first mentions them; earlier attempts
   * are {@linkcode Job.superseded}. Lines that are not records are skipped.
   * @throws {Deno.errors.NotFound} when the file does not exist
   */
  static async load(path: string): Promise<Job> {
    const { records } = await readResults(path, true);
    const { counted, superseded } = latestAttempts(
      records.map((r) => ({ slug: r.task.slug, repeat: r.repeat })),
    );
    const latest = counted.map((i) => records[i]);
    return new Job(
      latest[0]?.job_id ?? "",
      latest,
      latest.map(() => null),
      superseded.map((i) => records[i]),
    );
  }
  /** Rollouts that were not graded (see {@linkcode isGraded}), whatever their class. */
  get errored(): readonly RunRecord[] {
    return this.#records.filter((r) => !isGraded(r));
  }
  /** Results grouped by task slug, in task order. */
  get results(): Map<string, TaskResult> {
    const out = new Map<string, TaskResult>();
    for (const r of this.#records) {
      let entry = out.get(r.task.slug);
      if (!entry) {
        out.set(r.task.slug, entry = { task: r.task, records: [], meanReward: null, stderr: null });
      }
      entry.records.push(r);
    }
    for (const entry of out.values()) {
      const stats = meanAndError(rewardsOf(entry.records));
      entry.meanReward = stats.mean;
      entry.stderr = stats.stderr;
    }
    return out;
  }

  /** A plain summary. */
  toJSON(): Record<string, unknown> {
    return {
      id: this.#id,
      mean_reward: this.meanReward,
      total: this.#records.length,
      errored: this.errored.length,
      runs: this.#records,
    };
  }
}

function rewardsOf(records: readonly RunRecord[]): number[] {
  return records.filter(isGraded).map((r) => r.reward!);
}

/** `phase: message` of the first failure among `records`, if any. */
export function firstError(records: readonly RunRecord[]): string | null {
  for (const r of records) {
    const { error } = digestRecord(r);
    if (error !== "") return error;
  }
  return null;
}

/**
 * The job of a taskset run: its counted `records` and live `runs` in
 * expansion order, the attempts they `superseded`, and `extra`. For
 * Taskset.run() (eval/_ledger.ts); no face exports it.
 */
export function createJob(
  id: string,
  records: RunRecord[],
  runs: (Run | null)[],
  superseded: RunRecord[],
  extra: JobExtra,
): Job {
  return construct(id, records, runs, superseded, extra);
}
