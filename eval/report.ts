/**
 * Plain-text reports of jobs, for command lines and examples: a one-line
 * progress summary and a per-task results table. Returns strings; prints
 * nothing.
 *
 * @example
 * ```ts
 * import { formatProgress } from "./report.ts";
 * import assert from "node:assert/strict";
 *
 * const line = formatProgress({ total: 4, done: 2, running: 1, failed: 0, meanReward: 0.5 });
 * assert.equal(line, "done 2/4  running 1  failed 0  mean reward 0.500");
 * ```
 *
 * @module
 */

import type { Job, JobProgress } from "./taskset.ts";

/** `done 2/4  running 1  failed 0  mean reward 0.500`. */
export function formatProgress(progress: JobProgress): string {
  const mean = progress.meanReward === null ? "-" : progress.meanReward.toFixed(3);
  return `done ${progress.done}/${progress.total}  running ${progress.running}  failed ${progress.failed}  mean reward ${mean}`;
}

function table(rows: string[][]): string {
  const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)));
  return rows.map((r) => r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd()).join("\n") +
    "\n";
}

/**
 * A table with one row per task (runs, graded, errored, mean reward, the
 * phases that failed) and a closing line with the job's mean reward.
 */
export function formatJobTable(job: Job): string {
  const rows = [["task", "runs", "graded", "errored", "mean reward", "failures"]];
  for (const [slug, result] of job.results) {
    const failures = [...new Set(result.records.map((r) => r.failed_phase).filter(Boolean))];
    const graded = result.records.filter((r) => r.reward !== null).length;
    rows.push([
      slug,
      String(result.records.length),
      String(graded),
      String(result.records.length - graded),
      result.meanReward === null ? "-" : result.meanReward.toFixed(3),
      failures.join(",") || "-",
    ]);
  }
  const mean = job.meanReward === null ? "-" : job.meanReward.toFixed(3);
  const graded = job.runs.length - job.errored.length;
  return table(rows) +
    `\nmean reward ${mean} over ${graded} graded runs, ${job.errored.length} errored (job ${job.id})\n`;
}
