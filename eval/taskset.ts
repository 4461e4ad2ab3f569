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
import { Job, type JobProgress, type JobStop } from "./job.ts";
import { openResults, recordKey, type ResultsFile, type RunRecord } from "./results.ts";
import { AdaptiveConcurrency } from "./concurrency.ts";
import { RETRYABLE_ERROR_CLASSES, type RolloutErrorClass } from "./failure.ts";
import { addUsage, emptyUsage, traceUsage, type Usage } from "./usage.ts";
import type { ModelCallUsage } from "./agent.ts";
import { delay } from "../_internal/async.ts";

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

/** How {@linkcode Taskset.run} retries rollouts that failed for the infrastructure's reasons. */
export interface RolloutRetryOptions {
  /** Tries after the first, per rollout. */
  attempts: number;
  /**
   * The failure classes that are retried.
   * @default {@linkcode RETRYABLE_ERROR_CLASSES}: provisioning, connection, model_unavailable
   */
  on?: readonly RolloutErrorClass[];
  /** The first wait, in ms; it doubles each try, with jitter (0.5 to 1.5 times). @default 1_000 */
  baseDelay?: number;
  /** The longest wait, in ms. @default 30_000 */
  maxDelay?: number;
}

/** Options for {@linkcode Taskset.run}. */
export interface TasksetRunOptions extends Omit<RolloutOptions, "signal" | "context"> {
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
  /**
   * Called with a group's records (by repeat) once every repeat of it has
   * its final record, retries done: a trainer consumes groups as they
   * finish (`trainingRows(records)` makes their rows). Only groups that
   * ran in this call are reported. The job waits for it; when it throws,
   * the job stops and `run()` rejects with its error.
   */
  onGroup?: (records: RunRecord[]) => void | Promise<void>;
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
  /**
   * Retries of a rollout that failed for the infrastructure's reasons
   * (see {@linkcode RolloutRetryOptions}); a number is the attempts. Every
   * attempt's record goes to `out`; the latest counts.
   * @default 0
   */
  retries?: number | RolloutRetryOptions;
  /**
   * The limit on model calls in flight that agents share (see
   * {@linkcode AdaptiveConcurrency}); `false` for none.
   * @default an adaptive limit bounded by `maxConcurrent`
   */
  concurrency?: AdaptiveConcurrency | false;
  /**
   * Stop the job once its model calls used this many tokens (prompt plus
   * completion), counting every attempt in `out` of a resumed job: no new
   * rollouts start; running ones finish (or are cancelled, by `limitAction`).
   * @default no limit
   */
  tokenLimit?: number;
  /** As `tokenLimit`, for the cost in USD (priced by the agent). @default no limit */
  costLimit?: number;
  /**
   * What happens to running rollouts when a limit is reached: they
   * `finish`, or are `cancel`led (their records say so; `resume` runs them again).
   * @default "finish"
   */
  limitAction?: "finish" | "cancel";
}

function retryOptions(value: TasksetRunOptions["retries"]): Required<RolloutRetryOptions> {
  const o: RolloutRetryOptions = typeof value === "number" ? { attempts: value } : value ??
    { attempts: 0 };
  if (!Number.isInteger(o.attempts) || o.attempts < 0) {
    throw new RangeError(
      `Cannot run taskset: retries must be an integer of at least 0, got "${o.attempts}"`,
    );
  }
  return {
    attempts: o.attempts,
    on: o.on ?? RETRYABLE_ERROR_CLASSES,
    baseDelay: o.baseDelay ?? 1_000,
    maxDelay: o.maxDelay ?? 30_000,
  };
}

function checkLimit(name: string, value: number | undefined): void {
  if (value !== undefined && !(value > 0)) {
    throw new RangeError(`Cannot run taskset: ${name} must be positive, got "${value}"`);
  }
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
   * once, and returns the job. Rollout failures are recorded, not thrown;
   * those of a retried class are tried again (every attempt recorded).
   * A token or cost limit stops the job cleanly: {@linkcode Job.stopped}
   * says why, and `resume` continues it.
   *
   * @throws {TypeError} up front, when no runtime is given and a row was not
   *   made from a live environment
   * @throws {RangeError} up front, for a bad group, concurrency, retries, limits or timeouts
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
    const retry = retryOptions(options.retries);
    checkLimit("tokenLimit", options.tokenLimit);
    checkLimit("costLimit", options.costLimit);
    const limitAction = options.limitAction ?? "finish";
    if (limitAction !== "finish" && limitAction !== "cancel") {
      throw new RangeError(
        `Cannot run taskset: limitAction must be "finish" or "cancel", got "${limitAction}"`,
      );
    }
    if (options.resume && !options.out) {
      throw new TypeError("Cannot resume a taskset run: resume needs an out file");
    }
    // Resolve every row's runtime before anything runs.
    const runtimes = new Map<unknown, RuntimeProvider>();
    const runtimeOf = this.#rows.map((row) => options.runtime ?? defaultRuntimeFor(row, runtimes));
    const concurrency = options.concurrency === false
      ? undefined
      : options.concurrency ?? new AdaptiveConcurrency({ max: maxConcurrent });

    const kept = new Map<string, RunRecord>();
    const tries = new Map<string, number>();
    const spent = emptyUsage();
    // Read once: what the agent is does not change during a job.
    const agentInfo = agent.info;
    let jobId = options.jobId;
    let out: ResultsFile | null = null;
    if (options.out) {
      out = await openResults(options.out, {
        resume: options.resume === true,
        force: options.force === true,
      });
      // The latest attempt of each (slug, repeat) counts; graded ones are
      // kept. Every attempt's spending counts toward the limits.
      for (const record of out.records) {
        jobId ??= record.job_id;
        const key = recordKey(record.task.slug, record.repeat);
        tries.set(key, Math.max(tries.get(key) ?? 0, record.attempt ?? 1));
        if (record.reward !== null) kept.set(key, record);
        else kept.delete(key);
        addUsage(spent, traceUsage(record.trace));
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

    // A limit reached stops new rollouts; with "cancel" it also aborts the running ones.
    let stopped: JobStop | null = null;
    const halt = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, halt.signal]) : halt.signal;
    const overLimit = (): JobStop | null => {
      const tokens = spent.inputTokens + spent.outputTokens;
      if (options.tokenLimit !== undefined && tokens >= options.tokenLimit) {
        return { reason: "token_limit", limit: options.tokenLimit, spent: tokens };
      }
      if (options.costLimit !== undefined && spent.costUsd >= options.costLimit) {
        return { reason: "cost_limit", limit: options.costLimit, spent: spent.costUsd };
      }
      return null;
    };
    const checkLimits = () => {
      if (stopped !== null) return;
      stopped = overLimit();
      if (stopped !== null && limitAction === "cancel") {
        halt.abort(
          new DOMException(
            `the job's ${stopped.reason.replace("_", " ")} was reached`,
            "AbortError",
          ),
        );
      }
    };
    checkLimits();

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
      retried: 0,
    };
    // A progress callback that throws (a closed stderr) must not stop the
    // workers halfway, leaving rollouts running with nobody waiting.
    const report = (last?: RunRecord) => {
      progress.elapsedMs = Date.now() - startedAt;
      progress.etaMs = finishedHere === 0
        ? null
        : Math.round(progress.elapsedMs / finishedHere * (progress.total - progress.done));
      if (concurrency) {
        progress.concurrency = { limit: concurrency.limit, max: concurrency.max };
      }
      progress.tokens = spent.inputTokens + spent.outputTokens;
      progress.costUsd = spent.costUsd;
      progress.stopped = stopped?.reason ?? null;
      try {
        options.onProgress?.(last ? { ...progress, last } : { ...progress });
      } catch {
        // Ignored: reporting is best effort.
      }
    };
    report();

    const attemptOnce = async (slot: Slot, attempt: number) => {
      // What the agent reports as it goes counts at once; what only the
      // trace holds, at the end.
      const live = emptyUsage();
      const onUsage = (u: ModelCallUsage) => {
        const call: Usage = {
          inputTokens: u.inputTokens,
          outputTokens: u.outputTokens,
          cachedTokens: u.cachedTokens,
          costUsd: u.costUsd ?? 0,
          unpricedCalls: u.costUsd === null ? 1 : 0,
          modelCalls: 1,
        };
        addUsage(live, call);
        addUsage(spent, call);
        checkLimits();
      };
      const run = await rollout(slot.row, agent, {
        ...options,
        runtime: slot.runtime,
        signal,
        context: { concurrency, onUsage },
      });
      const traced = traceUsage(run.trace.toJSON());
      addUsage(spent, {
        inputTokens: Math.max(0, traced.inputTokens - live.inputTokens),
        outputTokens: Math.max(0, traced.outputTokens - live.outputTokens),
        cachedTokens: Math.max(0, traced.cachedTokens - live.cachedTokens),
        costUsd: Math.max(0, traced.costUsd - live.costUsd),
        unpricedCalls: Math.max(0, traced.unpricedCalls - live.unpricedCalls),
        modelCalls: Math.max(0, traced.modelCalls - live.modelCalls),
      });
      checkLimits();
      const status = run.trace.status as RunRecord["status"];
      const record: RunRecord = {
        job_id: jobId!,
        group_id: slot.groupId,
        task: { env: slot.row.env, id: slot.row.id, args: slot.row.args, slug: slot.row.slug },
        repeat: slot.repeat,
        attempt,
        status,
        reward: run.reward,
        failed_phase: run.trace.failedPhase,
        error_class: run.trace.errors[0]?.class ?? (status === "cancelled" ? "cancelled" : null),
        ...(run.grade?.subscores ? { subscores: run.grade.subscores } : {}),
        ...(agentInfo ? { agent: agentInfo } : {}),
        trace: run.trace.toJSON(),
      };
      if (out) await out.append(record);
      return { run, record };
    };

    const retryable = (record: RunRecord) =>
      record.error_class !== undefined && record.error_class !== null &&
      record.error_class !== "cancelled" &&
      (retry.on as readonly string[]).includes(record.error_class);

    const pending = slots.map((_, i) => i).filter((i) => records[i] === null);
    // A group is reported once each of its slots holds its final record.
    const groupSlots = new Map<string, number[]>();
    slots.forEach((s, i) => groupSlots.set(s.groupId, [...(groupSlots.get(s.groupId) ?? []), i]));
    const settled = new Set(slots.map((_, i) => i).filter((i) => records[i] !== null));
    let groupError: { error: unknown } | null = null;
    const finishSlot = async (i: number) => {
      settled.add(i);
      const members = groupSlots.get(slots[i].groupId)!;
      if (!options.onGroup || !members.every((m) => settled.has(m))) return;
      try {
        await options.onGroup(members.map((m) => records[m]!));
      } catch (error) {
        groupError ??= { error };
        halt.abort(error);
      }
    };
    let next = 0;
    // This run's failed attempts that a retry replaced: history, not counted.
    const retriedHere: RunRecord[] = [];
    const starting = () => !signal.aborted && stopped === null;
    const worker = async () => {
      while (next < pending.length && starting()) {
        const i = pending[next++];
        const slot = slots[i];
        const key = recordKey(slot.row.slug, slot.repeat);
        progress.running++;
        report();
        let result = await attemptOnce(slot, (tries.get(key) ?? 0) + 1);
        for (let n = 1; n <= retry.attempts && retryable(result.record) && starting(); n++) {
          progress.retried!++;
          report(result.record);
          const wait = Math.min(retry.maxDelay, retry.baseDelay * 2 ** (n - 1)) *
            (0.5 + Math.random());
          try {
            await delay(wait, signal);
          } catch {
            break; // Stopped while waiting: the failed attempt stands.
          }
          if (!starting()) break;
          retriedHere.push(result.record);
          result = await attemptOnce(slot, result.record.attempt! + 1);
        }
        const { run, record } = result;
        runs[i] = run;
        records[i] = record;
        progress.running--;
        // A rollout the abort cut short is not done: the interrupt line, and
        // --resume, count it as left to run.
        if (record.status === "cancelled" && options.signal?.aborted) {
          report(record);
          continue;
        }
        await finishSlot(i);
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
    if (groupError !== null) throw (groupError as { error: unknown }).error;
    // Slots never started (an abort, a limit) are recorded as cancelled.
    const final = records.map((r, i): RunRecord =>
      r ?? {
        job_id: jobId!,
        group_id: slots[i].groupId,
        task: slots[i].row,
        repeat: slots[i].repeat,
        status: "cancelled",
        reward: null,
        failed_phase: null,
        error_class: "cancelled",
        trace: {},
      }
    );
    // The file's older attempts of every slot stay as history.
    const counted = new Set(kept.values());
    const slotKeys = new Set(slots.map((s) => recordKey(s.row.slug, s.repeat)));
    const superseded = (out?.records ?? []).filter((r) =>
      !counted.has(r) && slotKeys.has(recordKey(r.task.slug, r.repeat))
    );
    report();
    return new Job(jobId, final, runs, [...superseded, ...retriedHere], { stopped, usage: spent });
  }
}
