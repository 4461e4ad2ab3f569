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
 * const model = formatProgress({
 *   total: 4, done: 2, running: 2, failed: 0, meanReward: 0.5,
 *   tokens: 12_345, costUsd: 0.0421, concurrency: { limit: 6, max: 8 }, retried: 1,
 * });
 * assert.equal(
 *   model,
 *   "done 2/4  running 2  failed 0  mean reward 0.500  tokens 12.3k  $0.0421  model calls ≤6/8  retried 1",
 * );
 * ```
 *
 * @module
 */

import type { Job, JobProgress, JobSummary } from "./job.ts";
import type { CommonFailure } from "./_summary.ts";
import type { AgentInfo } from "./agent.ts";

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

function tokenCount(n: number): string {
  if (n < 1_000) return String(n);
  if (n < 1_000_000) return `${(n / 1_000).toFixed(1)}k`;
  return `${(n / 1_000_000).toFixed(2)}M`;
}

/**
 * `done 2/4  running 1  failed 0  mean reward 0.500`, then `elapsed` and
 * `eta` when the progress has them; once model calls ran, the tokens and
 * cost so far and the adaptive limit on model calls in flight (also once
 * a rate limit lowered it); the attempts retried; the limit that stopped
 * the job.
 */
export function formatProgress(progress: JobProgress): string {
  const mean = progress.meanReward === null ? "-" : progress.meanReward.toFixed(3);
  let line =
    `done ${progress.done}/${progress.total}  running ${progress.running}  failed ${progress.failed}  mean reward ${mean}`;
  if (progress.elapsedMs !== undefined) line += `  elapsed ${formatDuration(progress.elapsedMs)}`;
  if (progress.etaMs !== undefined && progress.etaMs !== null) {
    line += `  eta ${formatDuration(progress.etaMs)}`;
  }
  const tokens = progress.tokens ?? 0;
  if (tokens > 0) {
    line += `  tokens ${tokenCount(tokens)}`;
    if ((progress.costUsd ?? 0) > 0) line += `  $${progress.costUsd!.toFixed(4)}`;
  }
  const c = progress.concurrency;
  if (c && (tokens > 0 || c.limit < c.max)) line += `  model calls ≤${c.limit}/${c.max}`;
  if ((progress.retried ?? 0) > 0) line += `  retried ${progress.retried}`;
  if (progress.stopped) line += `  stopped: ${progress.stopped.replace("_", " ")}`;
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
 * A count for people: exact below 10,000, else 3 significant digits with
 * k or M (`12.3k`, `4.56M`).
 */
export function formatCount(n: number): string {
  if (Math.abs(n) < 10_000) return String(Math.round(n));
  const [d, unit] = Math.abs(n) < 1e6 ? [1e3, "k"] : [1e6, "M"];
  return `${Number((n / d).toPrecision(3))}${unit}`;
}

/** What ran and what it used, on one line; `""` when nothing is known. */
function agentLine(s: JobSummary): string {
  const parts: string[] = [];
  const what = (a: AgentInfo) =>
    a.kind === "model"
      ? `model "${a.name}"${a.settings?.api ? ` (${a.settings.api})` : ""}`
      : `${a.kind} ${a.name}`;
  if (s.agents.length > 1) {
    parts.push(`agents MIXED by a forced resume (${s.agents.map(what).join(", then ")})`);
  } else if (s.agent) {
    parts.push(`agent ${what(s.agent)}`);
  }
  if (s.env) parts.push(`env ${s.env.name}${s.env.version ? ` ${s.env.version}` : ""}`);
  if (s.model_calls > 0) parts.push(`${s.model_calls} model calls, ${s.tool_calls} tool calls`);
  if (s.input_tokens !== null || s.output_tokens !== null) {
    parts.push(
      `tokens ${formatCount(s.input_tokens ?? 0)} in, ${formatCount(s.output_tokens ?? 0)} out`,
    );
  }
  if (s.cost_usd !== null) parts.push(`cost $${Number(s.cost_usd.toPrecision(3))}`);
  return parts.join("; ");
}

/** Subscore columns: at most this many, the first names met. */
const SUBSCORE_COLUMNS = 6;

/**
 * A table with one row per task (its args, runs, graded, errored, mean
 * reward ± standard error, the mean of each subscore, the phases that
 * failed), then the job's mean ± standard error, pass@k when tasks ran more
 * than once, the earlier attempts that later ones replaced (never
 * counted), what ran, and the first error of each failing task. The
 * figures are {@linkcode Job.summary}'s, as every other view shows them.
 */
export function formatJobTable(job: Job): string {
  const s = job.summary();
  const names = Object.keys(s.subscores).slice(0, SUBSCORE_COLUMNS);
  const rows = [["task", "args", "runs", "graded", "errored", "mean reward", ...names, "failures"]];
  const errors: string[] = [];
  for (const t of s.tasks) {
    rows.push([
      t.slug,
      argsText(t.args),
      String(t.runs),
      String(t.graded),
      String(t.errored),
      meanText(t.mean_reward, t.stderr),
      ...names.map((n) => Object.hasOwn(t.subscores, n) ? t.subscores[n].toFixed(3) : "-"),
      t.failed_phases.join(",") || "-",
    ]);
    if (t.first_error !== null) errors.push(`${t.slug}: ${t.first_error}`);
  }
  let text = table(rows) + `\n${meanLine(s)} (job ${s.id})\n`;
  const k = s.group_size;
  if (k > 1) {
    const at = (n: number) => s.pass_at[String(n)]?.toFixed(3) ?? "-";
    text += `pass@1 ${at(1)}  pass@${k} ${at(k)}\n${passWords(s, k)}\n`;
  }
  if (s.superseded > 0) {
    text += `${s.superseded} earlier attempt${
      s.superseded === 1 ? "" : "s"
    } replaced by a later one, not counted\n`;
  }
  const line = agentLine(s);
  if (line !== "") text += `${line}\n`;
  text += snapshotLines(s);
  const usage = job.usage;
  if (usage.unpricedCalls > 0) {
    text += usage.costUsd > 0
      ? `${usage.unpricedCalls} model calls unpriced (pass --pricing)\n`
      : `no price for the model (pass --pricing)\n`;
  }
  const incomplete = job.incompleteGroups;
  if (incomplete.length > 0 && k > 1) {
    text += `${incomplete.length} group(s) incomplete (a rollout could not finish): ${
      incomplete.map((g) => g.slice(g.indexOf(":") + 1)).join(", ")
    }\n`;
  }
  if (s.common_failure !== null) text += `\n${commonFailureText(s.common_failure)}`;
  else if (errors.length > 0) text += `\nfirst error of each failing task:\n${errors.join("\n")}\n`;
  return text;
}

/**
 * The snapshots rollouts started from, one line each with its ancestry:
 * `from snap-1a2b (parents snap-0c0d): 4 rollouts, 4 graded, mean 0.500, best 1`
 * (parents nearest first).
 */
function snapshotLines(s: JobSummary): string {
  return s.snapshots.map((b) => {
    const after = b.parents.length === 0 ? "" : ` (parents ${b.parents.join(", ")})`;
    const mean = b.mean_reward === null ? "-" : b.mean_reward.toFixed(3);
    const best = b.best_reward === null ? "-" : String(b.best_reward);
    return `from ${b.id}${after}: ${b.rollouts} rollouts, ${b.graded} graded, mean ${mean}, best ${best}\n`;
  }).join("");
}

/** `a 2, b 1`: counts by name, largest first. */
function countsText(counts: Record<string, number>): string {
  return Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ${n}`)
    .join(", ");
}

/**
 * The summary's first line: the mean over graded rollouts, and beside it
 * the errored ones by class, which it leaves out (`mean reward 0.500 ±
 * 0.100 over 6 graded runs, 2 errored (model_unavailable 2), not in the
 * mean`).
 */
export function meanLine(s: JobSummary): string {
  let line = `mean reward ${
    meanText(s.mean_reward, s.stderr)
  } over ${s.graded} graded runs, ${s.errored} errored`;
  if (s.errored > 0) line += ` (${countsText(s.errored_by_class)}), not in the mean`;
  return line;
}

/** What pass@k is over, in words: the graded rollouts, and how many tasks have k of them. */
function passWords(s: JobSummary, k: number): string {
  const tasks = s.tasks.length;
  const over = (n: number) => s.pass_at_tasks[String(n)] ?? 0;
  const left = over(k) < tasks ? `; pass@${k} over the ${over(k)} of ${tasks} tasks with ${k}` : "";
  return `(pass@k: over graded rollouts as the mean is, errored ones left out${left})`;
}

/**
 * The one reason every rollout errored, said once with the way out
 * (several lines, each ending in a newline).
 */
export function commonFailureText(f: CommonFailure): string {
  const all = f.count === 1
    ? "the rollout errored"
    : `all ${f.count} rollouts errored the same way`;
  return `${all}, ${f.class} (${f.meaning}):\n  ${f.message}\n  what to do: ${f.action}\n`;
}
