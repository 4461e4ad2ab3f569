/**
 * Jobs: a {@linkcode Job} holds every rollout's record of a taskset run,
 * with the statistics over them (mean reward, standard error, pass@k) and
 * a {@linkcode JobSummary}; {@linkcode Job.load} reads a results file back.
 *
 * @module
 */

import type { TaskRow } from "../env.ts";
import type { TraceJson } from "./trace.ts";
import type { Run } from "./run.ts";
import { readResults, recordKey, type RunRecord } from "./results.ts";

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
  /** The rollout that just finished, when this update is for one. */
  last?: RunRecord;
}

/** Per-task results of a job. */
export interface TaskResult {
  /** The task row. */
  task: TaskRow;
  /** Its rollouts' records, by repeat. */
  records: RunRecord[];
  /** Mean reward over its graded rollouts, or `null` when none was graded. */
  meanReward: number | null;
  /** Standard error of that mean, or `null` below two graded rollouts. */
  stderr: number | null;
}

/** A job's summary, as `hud eval --json` prints it. */
export interface JobSummary {
  /** The job id. */
  id: string;
  /** Rollouts in the job. */
  total: number;
  /** Rollouts graded. */
  graded: number;
  /** Rollouts not graded. */
  errored: number;
  /** Mean reward over graded rollouts. */
  mean_reward: number | null;
  /** Its standard error. */
  stderr: number | null;
  /** pass@k for k = 1 and k = the group size (a pass is a reward of 1). */
  pass_at: Record<string, number | null>;
  /** Per task. */
  tasks: {
    slug: string;
    id: string;
    args: Record<string, unknown>;
    runs: number;
    graded: number;
    errored: number;
    mean_reward: number | null;
    stderr: number | null;
    /** The first failure, `phase: message`, if any. */
    first_error: string | null;
  }[];
}

/** A finished job: every rollout's record, in expansion order. */
export class Job {
  readonly #id: string;
  readonly #records: RunRecord[];
  readonly #runs: (Run | null)[];

  /** @internal Made by {@linkcode Taskset.run}. */
  constructor(id: string, records: RunRecord[], runs: (Run | null)[]) {
    this.#id = id;
    this.#records = records;
    this.#runs = runs;
  }

  /** The job id. */
  get id(): string {
    return this.#id;
  }
  /** Every rollout's record, in expansion order (task by task, repeat by repeat). */
  get runs(): readonly RunRecord[] {
    return this.#records;
  }
  /** The live runs of this process, in the same order; `null` for records kept from a resumed file. */
  get liveRuns(): readonly (Run | null)[] {
    return this.#runs;
  }
  /** Mean reward over graded rollouts, or `null` when none was graded. */
  get meanReward(): number | null {
    return mean(this.#records);
  }
  /** Standard error of {@linkcode Job.meanReward}, or `null` below two graded rollouts. */
  get stderr(): number | null {
    return standardError(this.#records);
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
   * task's n rollouts and averaged over tasks; an errored rollout counts as
   * a fail. `null` when a task has fewer than k rollouts.
   */
  passAtK(k: number, threshold = 1): number | null {
    const results = [...this.results.values()];
    if (results.length === 0 || !(k >= 1)) return null;
    let sum = 0;
    for (const { records } of results) {
      const n = records.length;
      if (n < k) return null;
      const c = records.filter((r) => r.reward !== null && r.reward >= threshold).length;
      // 1 - C(n-c, k) / C(n, k), as a product to stay finite.
      let fail = 1;
      if (n - c < k) fail = 0;
      else for (let i = n - c + 1; i <= n; i++) fail *= 1 - k / i;
      sum += 1 - fail;
    }
    return sum / results.length;
  }

  /** A summary without the traces: counts, means, pass@k, and each task's first error. */
  summary(): JobSummary {
    const k = this.groupSize;
    const passAt: Record<string, number | null> = { "1": this.passAtK(1) };
    if (k > 1) passAt[String(k)] = this.passAtK(k);
    return {
      id: this.#id,
      total: this.#records.length,
      graded: this.#records.length - this.errored.length,
      errored: this.errored.length,
      mean_reward: this.meanReward,
      stderr: this.stderr,
      pass_at: passAt,
      tasks: [...this.results.values()].map((r) => {
        const graded = r.records.filter((x) => x.reward !== null).length;
        return {
          slug: r.task.slug,
          id: r.task.id,
          args: r.task.args,
          runs: r.records.length,
          graded,
          errored: r.records.length - graded,
          mean_reward: r.meanReward,
          stderr: r.stderr,
          first_error: firstError(r.records),
        };
      }),
    };
  }

  /**
   * Reads a results file back: the latest attempt of each (task slug,
   * repeat), in the order the file first mentions them. Lines that are not
   * records are skipped.
   * @throws {Deno.errors.NotFound} when the file does not exist
   */
  static async load(path: string): Promise<Job> {
    const { records } = await readResults(path, true);
    const latest = new Map<string, RunRecord>();
    for (const r of records) {
      const key = recordKey(r.task.slug, r.repeat);
      latest.delete(key);
      latest.set(key, r);
    }
    // Order by first mention: re-sort by each key's first line.
    const first = new Map<string, number>();
    records.forEach((r, i) => {
      const key = recordKey(r.task.slug, r.repeat);
      if (!first.has(key)) first.set(key, i);
    });
    const ordered = [...latest.entries()].sort((a, b) => first.get(a[0])! - first.get(b[0])!)
      .map(([, r]) => r);
    return new Job(ordered[0]?.job_id ?? "", ordered, ordered.map(() => null));
  }
  /** Rollouts that were not graded. */
  get errored(): readonly RunRecord[] {
    return this.#records.filter((r) => r.reward === null);
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
      entry.meanReward = mean(entry.records);
      entry.stderr = standardError(entry.records);
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

function standardError(records: RunRecord[]): number | null {
  const xs = records.filter((r) => r.reward !== null).map((r) => r.reward!);
  if (xs.length < 2) return null;
  const m = xs.reduce((a, b) => a + b, 0) / xs.length;
  const variance = xs.reduce((a, x) => a + (x - m) ** 2, 0) / (xs.length - 1);
  return Math.sqrt(variance / xs.length);
}

/** `phase: message` of the first failure among `records`, if any. */
export function firstError(records: readonly RunRecord[]): string | null {
  for (const r of records) {
    const errors = (r.trace as Partial<TraceJson>).errors;
    if (Array.isArray(errors) && errors.length > 0) {
      return `${errors[0].phase}: ${String(errors[0].message).split("\n")[0]}`;
    }
    if (r.reward === null && r.status !== "completed") return `${r.status}`;
  }
  return null;
}

function mean(records: RunRecord[]): number | null {
  const graded = records.filter((r) => r.reward !== null);
  if (graded.length === 0) return null;
  return graded.reduce((s, r) => s + r.reward!, 0) / graded.length;
}
