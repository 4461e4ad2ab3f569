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

import type { TaskRow } from "../env.ts";
import { type Agent, defaultRuntimeFor, rollout, type RolloutOptions, type Run } from "./run.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "../client.ts";
import { isRecord } from "../_internal/util.ts";

function checkRow(row: unknown, where: string): TaskRow {
  if (
    !isRecord(row) || typeof row.env !== "string" || typeof row.id !== "string" ||
    typeof row.slug !== "string" || !isRecord(row.args)
  ) {
    throw new TypeError(`Cannot read task row ${where}: expected { env, id, args, slug }`);
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
  status: string;
  /** The reward, or `null` when not graded. */
  reward: number | null;
  /** The phase that failed, if any. */
  failed_phase: string | null;
  /** The full trace. */
  trace: Record<string, unknown>;
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
  /** JSONL file that receives one {@linkcode RunRecord} per finished rollout. */
  out?: string;
  /**
   * With `out`: keep the graded rollouts already in the file and run only
   * the errored and missing ones.
   * @default false
   */
  resume?: boolean;
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
  /** Rollouts that were not graded. */
  get errored(): readonly RunRecord[] {
    return this.#records.filter((r) => r.reward === null);
  }
  /** Results grouped by task slug, in task order. */
  get results(): Map<string, TaskResult> {
    const out = new Map<string, TaskResult>();
    for (const r of this.#records) {
      let entry = out.get(r.task.slug);
      if (!entry) out.set(r.task.slug, entry = { task: r.task, records: [], meanReward: null });
      entry.records.push(r);
    }
    for (const entry of out.values()) entry.meanReward = mean(entry.records);
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

function mean(records: RunRecord[]): number | null {
  const graded = records.filter((r) => r.reward !== null);
  if (graded.length === 0) return null;
  return graded.reduce((s, r) => s + r.reward!, 0) / graded.length;
}

const encoder = new TextEncoder();

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
    if (options.resume) {
      for (const record of await readRecords(options.out!)) {
        jobId ??= record.job_id;
        if (record.reward !== null) kept.set(`${record.task.slug}#${record.repeat}`, record);
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
      kept.get(`${s.row.slug}#${s.repeat}`) ?? null
    );
    const runs: (Run | null)[] = slots.map(() => null);

    // Rewrite the file with what is kept, so errored lines do not linger.
    let out: Deno.FsFile | null = null;
    if (options.out) {
      out = await Deno.open(options.out, { write: true, create: true, truncate: true });
      for (const r of records) if (r) await out.write(encoder.encode(JSON.stringify(r) + "\n"));
    }

    // Kept records are all graded; the mean is kept as a running sum so that
    // each progress update costs O(1), not a pass over every record.
    const keptRecords = records.filter((r): r is RunRecord => r !== null);
    let rewardSum = keptRecords.reduce((sum, r) => sum + r.reward!, 0);
    let gradedCount = keptRecords.length;
    const progress: JobProgress = {
      total: slots.length,
      done: keptRecords.length,
      running: 0,
      failed: 0,
      meanReward: gradedCount === 0 ? null : rewardSum / gradedCount,
    };
    options.onProgress?.({ ...progress });

    const pending = slots.map((_, i) => i).filter((i) => records[i] === null);
    let next = 0;
    let writes = Promise.resolve();
    const worker = async () => {
      while (next < pending.length && !options.signal?.aborted) {
        const i = pending[next++];
        const slot = slots[i];
        progress.running++;
        options.onProgress?.({ ...progress });
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
          status: run.trace.status,
          reward: run.reward,
          failed_phase: run.trace.failedPhase,
          trace: run.trace.toJSON(),
        };
        records[i] = record;
        if (out) {
          const line = encoder.encode(JSON.stringify(record) + "\n");
          const file = out;
          writes = writes.then(async () => {
            let off = 0;
            while (off < line.length) off += await file.write(line.subarray(off));
          });
          await writes;
        }
        progress.running--;
        progress.done++;
        if (record.reward === null) {
          progress.failed++;
        } else {
          rewardSum += record.reward;
          gradedCount++;
          progress.meanReward = rewardSum / gradedCount;
        }
        options.onProgress?.({ ...progress, last: record });
      }
    };
    try {
      await Promise.all(Array.from({ length: Math.min(maxConcurrent, pending.length) }, worker));
    } finally {
      await writes.catch(() => {});
      out?.close();
    }
    // Slots never started because of an abort are recorded as cancelled.
    const final = records.map((r, i) =>
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

async function readRecords(path: string): Promise<RunRecord[]> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return [];
    throw err;
  }
  const out: RunRecord[] = [];
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    try {
      const r = JSON.parse(line);
      if (isRecord(r) && isRecord(r.task) && typeof r.repeat === "number") {
        out.push(r as unknown as RunRecord);
      }
    } catch {
      // A line cut short by a crash: that rollout runs again.
    }
  }
  return out;
}

/** Options for {@linkcode Shared}. */
export interface SharedOptions {
  /**
   * Rollouts one placement serves at once; more wait for a free slot.
   * @default 8
   */
  width?: number;
}

/**
 * One environment substrate for many rollouts: placed on first use, serving
 * up to `width` rollouts at once (more wait), released when the `Shared`
 * is disposed. A failed boot fails only the rollout that asked for it; the
 * next one boots again.
 */
export class Shared implements RuntimeProvider, AsyncDisposable {
  readonly #provider: RuntimeProvider;
  readonly #width: number;
  #placement: Promise<Placement> | null = null;
  #inUse = 0;
  #waiters: (() => void)[] = [];
  #disposed = false;
  #boots = 0;

  /**
   * Shares `provider`'s placement.
   * @throws {RangeError} for a width below 1
   */
  constructor(provider: RuntimeProvider, options: SharedOptions = {}) {
    const width = options.width ?? 8;
    if (!Number.isInteger(width) || width < 1) {
      throw new RangeError(
        `Cannot share runtime: width must be a positive integer, got "${width}"`,
      );
    }
    this.#provider = provider;
    this.#width = width;
  }

  /** How many times the substrate was booted. */
  get boots(): number {
    return this.#boots;
  }

  /** A lease on the shared placement; dispose it to free the slot. */
  async place(options: PlaceOptions = {}): Promise<Placement> {
    if (this.#disposed) throw new Error("Cannot place: the shared runtime was disposed");
    await this.#acquire(options.signal);
    try {
      let placement: Placement;
      while (true) {
        const mine = this.#placement === null;
        if (mine) {
          this.#boots++;
          const booting = this.#provider.place(options);
          this.#placement = booting;
          booting.catch(() => {
            if (this.#placement === booting) this.#placement = null;
          });
        }
        try {
          placement = await this.#placement!;
          break;
        } catch (err) {
          // Someone else's failed boot is not ours to report: boot again.
          if (mine) throw err;
        }
      }
      let released = false;
      return {
        url: placement.url,
        params: placement.params,
        [Symbol.asyncDispose]: () => {
          if (!released) {
            released = true;
            this.#release();
          }
          return Promise.resolve();
        },
      };
    } catch (err) {
      this.#release();
      throw err;
    }
  }

  #acquire(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    if (this.#inUse < this.#width) {
      this.#inUse++;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const grant = () => {
        signal?.removeEventListener("abort", onAbort);
        this.#inUse++;
        resolve();
      };
      const onAbort = () => {
        this.#waiters = this.#waiters.filter((w) => w !== grant);
        reject(signal!.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#waiters.push(grant);
    });
  }

  #release(): void {
    this.#inUse--;
    this.#waiters.shift()?.();
  }

  /** Releases the shared placement. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#disposed) return;
    this.#disposed = true;
    const placement = this.#placement;
    this.#placement = null;
    if (placement) {
      const p = await placement.catch(() => null);
      if (p) await p[Symbol.asyncDispose]();
    }
  }
}
