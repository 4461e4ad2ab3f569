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
import type { RuntimeProvider } from "../runtime/placement.ts";
import { isRecord } from "../_internal/util.ts";
import type { Agent } from "./agent.ts";
import type { Run } from "./run.ts";
import { defaultRuntimeFor, rollout, type RolloutOptions } from "./rollout.ts";
import { Job, type JobProgress } from "./job.ts";
import { openResults, recordKey, type ResultsFile, type RunRecord } from "./results.ts";

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
    // Read once: what the agent is does not change during a job.
    const agentInfo = agent.info;
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
          ...(run.grade?.subscores ? { subscores: run.grade.subscores } : {}),
          ...(agentInfo ? { agent: agentInfo } : {}),
          trace: run.trace.toJSON(),
        };
        records[i] = record;
        if (out) await out.append(record);
        progress.running--;
        // A rollout the abort cut short is not done: the interrupt line, and
        // --resume, count it as left to run.
        if (record.status === "cancelled" && options.signal?.aborted) {
          report(record);
          continue;
        }
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
    // The file's older attempts of every slot stay as history.
    const counted = new Set(kept.values());
    const slotKeys = new Set(slots.map((s) => recordKey(s.row.slug, s.repeat)));
    const superseded = (out?.records ?? []).filter((r) =>
      !counted.has(r) && slotKeys.has(recordKey(r.task.slug, r.repeat))
    );
    return new Job(jobId, final, runs, superseded);
  }
}
