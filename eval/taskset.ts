/**
 * Tasksets and jobs: run many rollouts concurrently, stream results to a
 * JSONL file, resume an interrupted job, and share one environment between
 * rollouts.
 *
 * @example Three rollouts of one task, in-process
 * ```ts
 * import { Environment, functionAgent, integer, Taskset } from "../mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("arith");
 * const add = env.template({ id: "add", args: { a: integer(), b: integer() } }, async function* ({ a, b }) {
 *   const answer = yield `${a}+${b}`;
 *   yield Number(answer) === a + b ? 1 : 0;
 * });
 * const taskset = new Taskset([add({ a: 1, b: 2 }), add({ a: 2, b: 2 })]);
 * const job = await taskset.run(functionAgent((p) => String(eval(String(p)))), { group: 3 });
 * assert.equal(job.runs.length, 6);
 * assert.equal(job.meanReward, 1);
 * ```
 *
 * @module
 */

import { type TaskRow, taskSlug } from "../env.ts";
import {
  type Agent,
  defaultRuntimeFor,
  rollout,
  type RolloutOptions,
  type Run,
  type TraceJson,
  type TraceStatus,
} from "./run.ts";
import type { RuntimeProvider } from "../runtime/placement.ts";
import { isRecord } from "../_internal/util.ts";

/** A row as given, or with its slug computed as the Python SDK does when it has none. */
function checkRow(row: unknown, where: string): TaskRow {
  if (
    !isRecord(row) || typeof row.env !== "string" || typeof row.id !== "string" ||
    (row.slug !== undefined && typeof row.slug !== "string") || !isRecord(row.args)
  ) {
    throw new TypeError(
      `Cannot read task row ${where}: expected { env, id, args } and an optional slug`,
    );
  }
  if (row.slug === undefined) {
    const args = row.args as Record<string, unknown>;
    return { ...row, slug: taskSlug(row.id, args) } as unknown as TaskRow;
  }
  return row as unknown as TaskRow;
}

/** A predicate or a selection for {@linkcode Taskset.filter}. */
export type RowSelector =
  | ((row: TaskRow) => boolean)
  | { ids?: string[]; slugs?: string[]; env?: string };

function matcher(selector: RowSelector): (row: TaskRow) => boolean {
  if (typeof selector === "function") return selector;
  return (row) =>
    (selector.ids === undefined || selector.ids.includes(row.id)) &&
    (selector.slugs === undefined || selector.slugs.includes(row.slug)) &&
    (selector.env === undefined || selector.env === row.env);
}

/** Progress of a running job, for {@linkcode TasksetRunOptions.onProgress}. */
export interface JobProgress {
  /** Rollouts in the job. */
  total: number;
  /** Rollouts finished (graded or failed), including those kept from a resumed file. */
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

/** One finished rollout, as streamed to the results file. */
export interface RunRecord {
  /** The job it belongs to. */
  job_id: string;
  /** Repeats of one task share a group id. */
  group_id: string;
  /** The task row. */
  task: TaskRow;
  /** Which repeat of the task (0-based). */
  repeat: number;
  /** `completed`, `error` or `cancelled`. */
  status: Exclude<TraceStatus, "running">;
  /** The reward, or `null` when not graded. */
  reward: number | null;
  /** The phase that failed, if any. */
  failed_phase: string | null;
  /** The full trace; `{}` only for a slot a job never started. */
  trace: TraceJson | Record<string, never>;
}

/** Options for {@linkcode Taskset.run}. */
export interface TasksetRunOptions extends Omit<RolloutOptions, "signal"> {
  /**
   * Rollouts per task; repeats share a group id.
   * @default 1
   */
  group?: number;
  /**
   * Rollouts at once.
   * @default 8
   */
  maxConcurrent?: number;
  /** Called when a rollout starts or finishes. */
  onProgress?: (progress: JobProgress) => void;
  /** Stops starting rollouts and cancels the running ones. */
  signal?: AbortSignal;
  /**
   * JSONL file that receives one {@linkcode RunRecord} per finished
   * rollout. It is only ever appended to, each line synced to disk as it
   * is written; a missing directory is created. An existing non-empty file
   * is refused unless `resume` or `force` is set.
   */
  out?: string;
  /**
   * With `out`: keep every line already in the file, and run only the
   * rollouts whose latest attempt there (by task slug and repeat) was not
   * graded; new attempts are appended.
   * @default false
   */
  resume?: boolean;
  /**
   * With `out`: start over, renaming an existing non-empty file aside (to
   * `<out>.<time>.bak`); nothing is deleted.
   * @default false
   */
  force?: boolean;
  /** Job id. @default a random UUID, or the id found in a resumed file */
  jobId?: string;
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

function recordKey(slug: string, repeat: number): string {
  return `${slug}#${repeat}`;
}

function mean(records: RunRecord[]): number | null {
  const graded = records.filter((r) => r.reward !== null);
  if (graded.length === 0) return null;
  return graded.reduce((s, r) => s + r.reward!, 0) / graded.length;
}

/**
 * An ordered set of task rows keyed by slug. Rows move between this SDK and
 * the HUD SDK as JSON or JSONL.
 */
export class Taskset {
  readonly #rows: TaskRow[];
  readonly #bySlug = new Map<string, TaskRow>();

  /**
   * Makes a taskset.
   * @throws {TypeError} for a malformed row or a duplicate slug
   */
  constructor(rows: Iterable<TaskRow>) {
    this.#rows = [];
    let i = 0;
    for (const raw of rows) {
      const row = checkRow(raw, `#${i++}`);
      if (this.#bySlug.has(row.slug)) {
        throw new TypeError(`Cannot add task to taskset: duplicate slug "${row.slug}"`);
      }
      this.#bySlug.set(row.slug, row);
      this.#rows.push(row);
    }
  }

  /** The rows, in order. */
  get rows(): readonly TaskRow[] {
    return this.#rows;
  }
  /** Number of rows. */
  get size(): number {
    return this.#rows.length;
  }
  /** The row with this slug. */
  get(slug: string): TaskRow | undefined {
    return this.#bySlug.get(slug);
  }
  /** Rows matching `selector`, as a new taskset. */
  filter(selector: RowSelector): Taskset {
    return new Taskset(this.#rows.filter(matcher(selector)));
  }
  /** Rows not matching `selector`, as a new taskset. */
  exclude(selector: RowSelector): Taskset {
    const m = matcher(selector);
    return new Taskset(this.#rows.filter((r) => !m(r)));
  }

  /**
   * Parses a JSON array of rows, or JSONL (one row per line).
   * @throws {TypeError} for malformed text or rows
   */
  static parse(text: string): Taskset {
    const trimmed = text.trim();
    if (trimmed.startsWith("[")) {
      let rows: unknown;
      try {
        rows = JSON.parse(trimmed);
      } catch (err) {
        throw new TypeError(`Cannot read taskset: invalid JSON: ${(err as Error).message}`);
      }
      return new Taskset((rows as unknown[]).map((r, i) => checkRow(r, `#${i}`)));
    }
    const rows: TaskRow[] = [];
    trimmed.split("\n").forEach((line, i) => {
      if (line.trim() === "") return;
      let row: unknown;
      try {
        row = JSON.parse(line);
      } catch (err) {
        throw new TypeError(
          `Cannot read taskset: invalid JSON on line ${i + 1}: ${(err as Error).message}`,
        );
      }
      rows.push(checkRow(row, `on line ${i + 1}`));
    });
    return new Taskset(rows);
  }

  /** Reads a `.json` or `.jsonl` file. */
  static async load(path: string): Promise<Taskset> {
    return Taskset.parse(await Deno.readTextFile(path));
  }

  /** Writes JSONL when the path ends in `.jsonl`, else a JSON array. */
  async save(path: string): Promise<void> {
    const rows = this.#rows.map(({ env, id, args, slug }) => ({ env, id, args, slug }));
    const text = path.endsWith(".jsonl")
      ? rows.map((r) => JSON.stringify(r)).join("\n") + "\n"
      : JSON.stringify(rows, null, 2) + "\n";
    await Deno.writeTextFile(path, text);
  }

  /** The rows as JSON. */
  toJSON(): TaskRow[] {
    return [...this.#rows];
  }

  /**
   * Runs every row `group` times with at most `maxConcurrent` rollouts at
   * once, and returns the job. Rollout failures are recorded, not thrown.
   *
   * @throws {TypeError} up front, when no runtime is given and a row was not
   *   made from a live environment
   * @throws {RangeError} up front, for a bad group, concurrency or timeouts
   */
  async run(agent: Agent, options: TasksetRunOptions = {}): Promise<Job> {
    const group = options.group ?? 1;
    const maxConcurrent = options.maxConcurrent ?? 8;
    if (!Number.isInteger(group) || group < 1) {
      throw new RangeError(`Cannot run taskset: group must be a positive integer, got "${group}"`);
    }
    if (!Number.isInteger(maxConcurrent) || maxConcurrent < 1) {
      throw new RangeError(
        `Cannot run taskset: maxConcurrent must be a positive integer, got "${maxConcurrent}"`,
      );
    }
    if (options.resume && !options.out) {
      throw new TypeError("Cannot resume a taskset run: resume needs an out file");
    }
    // Resolve every row's runtime before anything runs.
    const runtimes = new Map<unknown, RuntimeProvider>();
    const runtimeOf = this.#rows.map((row) => options.runtime ?? defaultRuntimeFor(row, runtimes));

    const kept = new Map<string, RunRecord>();
    let jobId = options.jobId;
    let out: ResultsFile | null = null;
    if (options.out) {
      out = await openResults(options.out, {
        resume: options.resume === true,
        force: options.force === true,
      });
      // The latest attempt of each (slug, repeat) counts; graded ones are kept.
      for (const record of out.records) {
        jobId ??= record.job_id;
        const key = recordKey(record.task.slug, record.repeat);
        if (record.reward !== null) kept.set(key, record);
        else kept.delete(key);
      }
    }
    jobId ??= crypto.randomUUID();

    interface Slot {
      row: TaskRow;
      repeat: number;
      runtime: RuntimeProvider;
      groupId: string;
    }
    const slots: Slot[] = [];
    this.#rows.forEach((row, i) => {
      const groupId = `${jobId}:${row.slug}`;
      for (let repeat = 0; repeat < group; repeat++) {
        slots.push({ row, repeat, runtime: runtimeOf[i], groupId });
      }
    });
    const records: (RunRecord | null)[] = slots.map((s) =>
      kept.get(recordKey(s.row.slug, s.repeat)) ?? null
    );
    const runs: (Run | null)[] = slots.map(() => null);

    // Kept records are all graded; the mean is kept as a running sum so that
    // each progress update costs O(1), not a pass over every record.
    const keptRecords = records.filter((r): r is RunRecord => r !== null);
    let rewardSum = keptRecords.reduce((sum, r) => sum + r.reward!, 0);
    let gradedCount = keptRecords.length;
    const startedAt = Date.now();
    let finishedHere = 0;
    const progress: JobProgress = {
      total: slots.length,
      done: keptRecords.length,
      running: 0,
      failed: 0,
      meanReward: gradedCount === 0 ? null : rewardSum / gradedCount,
      elapsedMs: 0,
      etaMs: null,
    };
    // A progress callback that throws (a closed stderr) must not stop the
    // workers halfway, leaving rollouts running with nobody waiting.
    const report = (last?: RunRecord) => {
      progress.elapsedMs = Date.now() - startedAt;
      progress.etaMs = finishedHere === 0
        ? null
        : Math.round(progress.elapsedMs / finishedHere * (progress.total - progress.done));
      try {
        options.onProgress?.(last ? { ...progress, last } : { ...progress });
      } catch {
        // Ignored: reporting is best effort.
      }
    };
    report();

    const pending = slots.map((_, i) => i).filter((i) => records[i] === null);
    let next = 0;
    const worker = async () => {
      while (next < pending.length && !options.signal?.aborted) {
        const i = pending[next++];
        const slot = slots[i];
        progress.running++;
        report();
        const run = await rollout(slot.row, agent, {
          ...options,
          runtime: slot.runtime,
          signal: options.signal,
        });
        runs[i] = run;
        const record: RunRecord = {
          job_id: jobId!,
          group_id: slot.groupId,
          task: { env: slot.row.env, id: slot.row.id, args: slot.row.args, slug: slot.row.slug },
          repeat: slot.repeat,
          status: run.trace.status as RunRecord["status"],
          reward: run.reward,
          failed_phase: run.trace.failedPhase,
          trace: run.trace.toJSON(),
        };
        records[i] = record;
        if (out) await out.append(record);
        progress.running--;
        progress.done++;
        finishedHere++;
        if (record.reward === null) {
          progress.failed++;
        } else {
          rewardSum += record.reward;
          gradedCount++;
          progress.meanReward = rewardSum / gradedCount;
        }
        report(record);
      }
    };
    try {
      await Promise.all(Array.from({ length: Math.min(maxConcurrent, pending.length) }, worker));
    } finally {
      await out?.close();
    }
    // Slots never started because of an abort are recorded as cancelled.
    const final = records.map((r, i): RunRecord =>
      r ?? {
        job_id: jobId!,
        group_id: slots[i].groupId,
        task: slots[i].row,
        repeat: slots[i].repeat,
        status: "cancelled",
        reward: null,
        failed_phase: null,
        trace: {},
      }
    );
    return new Job(jobId, final, runs);
  }
}

/** Whether `value` has the shape of a {@linkcode RunRecord}. */
function isRunRecord(value: unknown): value is RunRecord {
  return isRecord(value) && isRecord(value.task) && typeof value.task.slug === "string" &&
    typeof value.repeat === "number" && (value.reward === null || typeof value.reward === "number");
}

/** Every record of a results file; other lines (cut short, foreign) are skipped. */
async function readResults(
  path: string,
  mustExist = false,
): Promise<{ records: RunRecord[]; size: number; endsWithNewline: boolean }> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound && !mustExist) {
      return { records: [], size: 0, endsWithNewline: true };
    }
    throw err;
  }
  const records: RunRecord[] = [];
  for (const line of new TextDecoder().decode(bytes).split("\n")) {
    if (line.trim() === "") continue;
    try {
      const r = JSON.parse(line);
      if (isRunRecord(r)) records.push(r);
    } catch {
      // A line cut short by a crash: kept in the file, its rollout runs again.
    }
  }
  return {
    records,
    size: bytes.length,
    endsWithNewline: bytes.length === 0 || bytes[bytes.length - 1] === 0x0a,
  };
}

function dirname(path: string): string {
  const i = path.lastIndexOf("/");
  return i < 0 ? "." : i === 0 ? "/" : path.slice(0, i);
}

/**
 * Checks a results file before a job starts, as {@linkcode Taskset.run}
 * does with `out`: creates its directory, refuses an existing non-empty
 * file unless `resume` or `force` is set, and with `force` renames it
 * aside. Returns where the old file went, or `null`.
 * @throws {Error} naming the file and the two ways on, for a non-empty file
 */
export async function prepareResults(
  path: string,
  options: { resume?: boolean; force?: boolean } = {},
): Promise<string | null> {
  try {
    await Deno.mkdir(dirname(path), { recursive: true });
  } catch (err) {
    throw new Error(
      `Cannot write results: cannot create directory "${dirname(path)}": ${(err as Error).message}`,
      { cause: err },
    );
  }
  const info = await Deno.stat(path).catch((err) => {
    if (err instanceof Deno.errors.NotFound) return null;
    throw err;
  });
  if (info === null || info.size === 0 || options.resume) return null;
  if (!options.force) {
    throw new Error(
      `Cannot write results: "${path}" already holds results; resume it with --resume, or start over with --force (the old file is renamed aside)`,
    );
  }
  const aside = `${path}.${new Date().toISOString().replace(/[:.]/g, "-")}.bak`;
  await Deno.rename(path, aside);
  return aside;
}

interface ResultsFile {
  records: RunRecord[];
  append(record: RunRecord): Promise<void>;
  close(): Promise<void>;
}

const encoder = new TextEncoder();

/** Opens a results file for appending, one synced line per record, in order. */
async function openResults(
  path: string,
  options: { resume: boolean; force: boolean },
): Promise<ResultsFile> {
  await prepareResults(path, options);
  const { records, endsWithNewline } = options.resume
    ? await readResults(path)
    : { records: [], endsWithNewline: true };
  const file = await Deno.open(path, { append: true, create: true });
  let writes: Promise<void> = Promise.resolve();
  const write = (bytes: Uint8Array) => {
    writes = writes.then(async () => {
      let off = 0;
      while (off < bytes.length) off += await file.write(bytes.subarray(off));
      // A SIGKILL or a power cut then loses at most the line being written.
      await file.syncData();
    });
    return writes;
  };
  // A line cut short by a crash stays; the next record starts on a line of its own.
  if (!endsWithNewline) await write(encoder.encode("\n"));
  let closed = false;
  return {
    records,
    append: (record) => write(encoder.encode(JSON.stringify(record) + "\n")),
    async close() {
      if (closed) return;
      closed = true;
      await writes.catch(() => {});
      file.close();
    },
  };
}
