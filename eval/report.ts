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
 * const timed = formatProgress({
 *   total: 4, done: 2, running: 1, failed: 0, meanReward: 0.5, elapsedMs: 65_000, etaMs: 65_000,
 * });
 * assert.equal(timed, "done 2/4  running 1  failed 0  mean reward 0.500  elapsed 1m05s  eta 1m05s");
 * ```
 *
 * @module
 */

import { firstError, type Job, type JobProgress } from "./job.ts";

/** `12s`, `1m05s`, `2h03m`. */
export function formatDuration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
}

/** A reward as progress lines print it: 3 significant digits (`0.767`, `1`, `0.5`). */
export function formatReward(reward: number): string {
  return String(Number(reward.toPrecision(3)));
}

/**
 * `done 2/4  running 1  failed 0  mean reward 0.500`, then `elapsed` and
 * `eta` when the progress has them.
 */
export function formatProgress(progress: JobProgress): string {
  const mean = progress.meanReward === null ? "-" : progress.meanReward.toFixed(3);
  let line =
    `done ${progress.done}/${progress.total}  running ${progress.running}  failed ${progress.failed}  mean reward ${mean}`;
  if (progress.elapsedMs !== undefined) line += `  elapsed ${formatDuration(progress.elapsedMs)}`;
  if (progress.etaMs !== undefined && progress.etaMs !== null) {
    line += `  eta ${formatDuration(progress.etaMs)}`;
  }
  return line;
}

function table(rows: string[][]): string {
  const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)));
  return rows.map((r) => r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd()).join("\n") +
    "\n";
}

function meanText(mean: number | null, stderr: number | null): string {
  if (mean === null) return "-";
  return stderr === null ? mean.toFixed(3) : `${mean.toFixed(3)} ± ${stderr.toFixed(3)}`;
}

function argsText(args: Record<string, unknown>, width = 40): string {
  const text = JSON.stringify(args);
  if (text === "{}") return "-";
  return text.length > width ? text.slice(0, width - 1) + "…" : text;
}

/**
 * A table with one row per task (its args, runs, graded, errored, mean
 * reward ± standard error, the phases that failed), then the job's mean ±
 * standard error, pass@k when tasks ran more than once, and the first error
 * of each failing task.
 */
export function formatJobTable(job: Job): string {
  const rows = [["task", "args", "runs", "graded", "errored", "mean reward", "failures"]];
  const errors: string[] = [];
  for (const [slug, result] of job.results) {
    const failures = [...new Set(result.records.map((r) => r.failed_phase).filter(Boolean))];
    const graded = result.records.filter((r) => r.reward !== null).length;
    rows.push([
      slug,
      argsText(result.task.args),
      String(result.records.length),
      String(graded),
      String(result.records.length - graded),
      meanText(result.meanReward, result.stderr),
      failures.join(",") || "-",
    ]);
    const first = firstError(result.records);
    if (first !== null) errors.push(`${slug}: ${first}`);
  }
  const graded = job.runs.length - job.errored.length;
  let text = table(rows) +
    `\nmean reward ${
      meanText(job.meanReward, job.stderr)
    } over ${graded} graded runs, ${job.errored.length} errored (job ${job.id})\n`;
  const k = job.groupSize;
  if (k > 1) {
    const at = (n: number) => job.passAtK(n)?.toFixed(3) ?? "-";
    text += `pass@1 ${at(1)}  pass@${k} ${at(k)}\n`;
  }
  if (errors.length > 0) text += `\nfirst error of each failing task:\n${errors.join("\n")}\n`;
  return text;
}
