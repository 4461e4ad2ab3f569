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
import { errorMessage, isRecord } from "../_internal/util.ts";
import type { Agent } from "./agent.ts";
import {
  checkTimeouts,
  DEFAULT_ROLLOUT_TIMEOUT,
  defaultRuntimeFor,
  type RolloutOptions,
} from "./rollout.ts";
import type { Job, JobProgress } from "./job.ts";
import { openResults, recordKey, type ResultsFile, type RunRecord } from "./results.ts";
import { AdaptiveConcurrency } from "./concurrency.ts";
import { readErrorClass, RETRYABLE_ERROR_CLASSES, type RolloutErrorClass } from "./failure.ts";
import {
  checkNeeds,
  checkPositive,
  checkPositiveInteger,
  type OptionSpelling,
  optionSpelling,
} from "./_options.ts";
import {
  checkSameAgent,
  expandSlots,
  JobLedger,
  type Resumed,
  resumeFrom,
  type Slot,
} from "./_ledger.ts";
import { Budget } from "./_budget.ts";
import { GroupReporter, Progress } from "./_progress.ts";
import { type RetryConfig, RetryPolicy, SlotRunner } from "./_attempts.ts";

import { StartPacer } from "./_pacing.ts";
import { snapshotPolicy, type WorkspaceSnapshotOptions } from "../workspace/_snapshot.ts";
import { JobSnapshots, type SnapshotSource } from "./_job_snapshots.ts";
import { checkUsable, snapshotRefusal } from "./fork.ts";

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
   * The failure classes that are retried (older names, such as
   * `connection`, are read as today's).
   * @default {@linkcode RETRYABLE_ERROR_CLASSES}: provisioning, infrastructure_lost, model_unavailable
   */
  on?: readonly RolloutErrorClass[];
  /** The first wait, in ms; it doubles each try, with jitter (0.5 to 1.5 times). @default 1_000 */
  baseDelay?: number;
  /** The longest wait, in ms. @default 30_000 */
  maxDelay?: number;
}

/** Options for {@linkcode Taskset.run}. */
export interface TasksetRunOptions extends Omit<RolloutOptions, "signal" | "context" | "from"> {
  /**
   * The state every rollout starts from, with `runtime` one that places
   * from its kind of snapshot (a {@linkcode ForkRuntime} for workspace
   * snapshots, a `ContainerRuntime` for container snapshots), `group`
   * rollouts per task from one state:
   * - a snapshot: every rollout starts from it (it stays the caller's);
   * - a function: called once per task, with the task and the job's
   *   signal, when the task's first rollout is placed, for the snapshot
   *   its rollouts start from (the environment's setup done once, or a
   *   rollout's state saved midway). Those snapshots are the job's,
   *   bounded by `snapshots`, each removed when its task's last rollout is
   *   done, and every one left removed when the job ends, fails or is
   *   aborted. A function that fails fails that rollout (`provisioning`);
   *   the task's next rollout calls it again.
   *
   * Each rollout's trace records its snapshot and ancestry
   * (`from_snapshot`); the summary groups rollouts by it.
   * @default none
   */
  from?: SnapshotSource;
  /**
   * Bounds on the snapshots the job takes (`from` a function): at most
   * `maxCount` alive at once (a task waits for another's to go), and
   * `maxBytes` of disk together (a snapshot past it fails its rollout).
   * `method` is the workspace's business and is ignored here.
   * @default { maxCount: 32, maxBytes: 8589934592 }
   */
  snapshots?: Pick<WorkspaceSnapshotOptions, "maxCount" | "maxBytes">;
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
   * ran in this call are reported, one at a time. The job waits for it;
   * when it throws, the job stops and `run()` rejects with its error.
   */
  onGroup?: (records: RunRecord[]) => void | Promise<void>;
  /** Stops starting rollouts and cancels the running ones. */
  signal?: AbortSignal;
  /**
   * JSONL file that receives one {@linkcode RunRecord} per finished
   * rollout. It is only ever appended to, each line synced to disk as it
   * is written; a missing directory is created. An existing non-empty file
   * is refused unless `resume` or `force` (not both) is set.
   */
  out?: string;
  /**
   * With `out`: keep every line already in the file, and run only the
   * rollouts whose latest attempt there (by task slug and repeat) was not
   * graded; new attempts are appended. Refused when the agent differs from
   * the one that ran the file (its model, command or settings), unless
   * `force`.
   * @default false
   */
  resume?: boolean;
  /**
   * With `out`: start over, renaming an existing non-empty file aside (to
   * `<out>.<time>.bak`); nothing is deleted. With `resume`: resume even
   * with another agent than the file's, mixing both into one job (its
   * summary lists every agent).
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
   * A positive integer.
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

/** {@linkcode Taskset.run}'s options resolved once: every default applied, every check made. */
export interface TasksetRunConfig {
  readonly group: number;
  readonly maxConcurrent: number;
  readonly retry: RetryConfig;
  readonly tokenLimit: number | undefined;
  readonly costLimit: number | undefined;
  readonly limitAction: "finish" | "cancel";
  readonly out: string | undefined;
  readonly resume: boolean;
  readonly force: boolean;
  /** Where the rollouts start (checked), or null. */
  readonly from: SnapshotSource | null;
  /** Bounds on the snapshots the job takes. */
  readonly snapshots: { readonly maxCount: number; readonly maxBytes: number };
}

/**
 * Resolves and checks {@linkcode Taskset.run}'s options (the rollouts'
 * timeouts too) before anything runs. `s` names what it refuses: the
 * options by default, a command line's flags when it passes its own.
 * @throws {RangeError} for a bad group, concurrency, retries, limits or timeouts
 * @throws {TypeError} for `resume` or `force` without `out`, or a `from` that is
 *   neither a snapshot nor a function, or comes without a runtime that places from snapshots
 * @throws {Error} for a `from` snapshot that was removed
 */
export function tasksetRunConfig(
  options: TasksetRunOptions,
  s: OptionSpelling = optionSpelling("Cannot run taskset"),
): TasksetRunConfig {
  const group = options.group ?? 1;
  const maxConcurrent = options.maxConcurrent ?? 8;
  checkPositiveInteger(s, "group", group);
  checkPositiveInteger(s, "maxConcurrent", maxConcurrent);
  const retry = retryConfig(s, options.retries);
  if (options.tokenLimit !== undefined) checkPositiveInteger(s, "tokenLimit", options.tokenLimit);
  checkPositive(s, "costLimit", options.costLimit);
  const limitAction = options.limitAction ?? "finish";
  if (limitAction !== "finish" && limitAction !== "cancel") {
    throw new RangeError(
      `${s.prefix}${s.name("limitAction")} must be "finish" or "cancel", got "${limitAction}"`,
    );
  }
  const out = options.out || undefined;
  const resume = options.resume === true;
  const force = options.force === true;
  checkNeeds(s, "resume", resume, "out", out !== undefined);
  checkNeeds(s, "force", force, "out", out !== undefined);
  checkTimeouts(s, options.rolloutTimeout ?? DEFAULT_ROLLOUT_TIMEOUT, options.agentTimeout);
  const { tokenLimit, costLimit } = options;
  const from = snapshotSource(options);
  const policy = snapshotPolicy("run taskset", {
    maxCount: options.snapshots?.maxCount,
    maxBytes: options.snapshots?.maxBytes,
  })!;
  const snapshots = { maxCount: policy.maxCount, maxBytes: policy.maxBytes };
  return {
    group,
    maxConcurrent,
    retry,
    tokenLimit,
    costLimit,
    limitAction,
    out,
    resume,
    force,
    from,
    snapshots,
  };
}

/**
 * `options.from`, checked: a snapshot not removed, or a function, with a
 * runtime that places environments from snapshots.
 */
function snapshotSource(options: TasksetRunOptions): SnapshotSource | null {
  const from = options.from;
  if (from === undefined) return null;
  const verb = "run taskset from a snapshot";
  const snapshot = typeof from === "function" ? null : checkUsable(verb, from);
  const refused = snapshotRefusal(verb, options.runtime, snapshot);
  if (refused !== null) throw refused;
  return from;
}

function retryConfig(s: OptionSpelling, value: TasksetRunOptions["retries"]): RetryConfig {
  const o: RolloutRetryOptions = typeof value === "number" ? { attempts: value } : value ??
    { attempts: 0 };
  if (!Number.isInteger(o.attempts) || o.attempts < 0) {
    throw new RangeError(
      `${s.prefix}${s.name("retries")} must be an integer of at least 0, got "${
        s.given("retries", o.attempts)
      }"`,
    );
  }
  return {
    attempts: o.attempts,
    on: retriedClasses(s, o.on),
    baseDelay: o.baseDelay ?? 1_000,
    maxDelay: o.maxDelay ?? 30_000,
  };
}

/**
 * The classes `retries.on` names, under today's names.
 * @throws {RangeError} for a name that is not a failure class
 */
function retriedClasses(
  s: OptionSpelling,
  on: readonly string[] | undefined,
): readonly RolloutErrorClass[] {
  if (on === undefined) return RETRYABLE_ERROR_CLASSES;
  return on.map((name) => {
    const c = readErrorClass(name);
    if (c === null) {
      throw new RangeError(
        `${s.prefix}${
          s.name("retries")
        }.on names "${name}", which is not a failure class (see FAILURE_CLASSES)`,
      );
    }
    return c;
  });
}

/**
 * Runs `pending` slots, up to `maxConcurrent` at once, while the budget is
 * open: past the pacing floor, they start as fast as this process keeps up
 * ({@linkcode StartPacer}). Slots left when the budget closes (a limit, the
 * caller's abort) are not started.
 */
async function runPending(
  pending: readonly Slot[],
  runner: SlotRunner,
  budget: Budget,
  maxConcurrent: number,
): Promise<void> {
  const pacer = new StartPacer(Math.min(maxConcurrent, pending.length));
  let next = 0;
  const worker = async () => {
    while (next < pending.length && budget.open) {
      let admission: Disposable;
      try {
        admission = await pacer.admit(budget.signal);
      } catch {
        return; // Stopped while waiting.
      }
      using _ = admission;
      if (!(next < pending.length && budget.open)) return;
      await runner.run(pending[next++]);
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.min(maxConcurrent, pending.length) }, worker));
  } finally {
    pacer.close();
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
        throw new TypeError(`Cannot read taskset: invalid JSON: ${errorMessage(err)}`);
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
          `Cannot read taskset: invalid JSON on line ${i + 1}: ${errorMessage(err)}`,
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
   * Every row's runtime, resolved before anything runs: `runtime`, else the
   * live environment each row was made from (one runtime per environment).
   * @throws {TypeError} for a row with no live environment when no runtime is given
   */
  #runtimes(runtime: RuntimeProvider | undefined): RuntimeProvider[] {
    const cache = new Map<unknown, RuntimeProvider>();
    return this.#rows.map((row) => runtime ?? defaultRuntimeFor(row, cache));
  }

  /**
   * The results file of `config.out`, open for appending, and what it held:
   * read, and a resume with another agent refused, before anything is
   * written to it.
   */
  async #openResults(
    config: TasksetRunConfig,
    agent: Agent,
  ): Promise<{ out: ResultsFile | null; resumed: Resumed }> {
    let resumed = resumeFrom([]);
    if (config.out === undefined) return { out: null, resumed };
    const keys = this.#rows.flatMap((row) =>
      Array.from({ length: config.group }, (_, repeat) => recordKey(row.slug, repeat))
    );
    const out = await openResults(config.out, {
      ...config,
      check: (records) => {
        resumed = resumeFrom(records);
        checkSameAgent(config.out!, resumed, keys, agent.info, config.force);
      },
    });
    return { out, resumed };
  }

  /**
   * Runs every row `group` times with at most `maxConcurrent` rollouts at
   * once, and returns the job. Rollout failures are recorded, not thrown;
   * those of a retried class are tried again (every attempt recorded).
   * A token or cost limit stops the job cleanly: {@linkcode Job.stopped}
   * says why, and `resume` continues it.
   *
   * @throws what `onGroup` threw, once the job has stopped
   * @throws {TypeError} up front, when no runtime is given and a row was not
   *   made from a live environment, or `resume` or `force` is set without `out`
   * @throws {Error} up front, when `resume` meets a file another agent ran, without `force`
   * @throws {RangeError} up front, for a bad group, concurrency, retries, limits or timeouts
   */
  async run(agent: Agent, options: TasksetRunOptions = {}): Promise<Job> {
    const config = tasksetRunConfig(options);
    const runtimes = this.#runtimes(options.runtime);
    const concurrency = options.concurrency === false
      ? undefined
      : options.concurrency ?? new AdaptiveConcurrency({ max: config.maxConcurrent });
    const { out, resumed } = await this.#openResults(config, agent);
    const jobId = options.jobId ?? resumed.jobId ?? crypto.randomUUID();
    const ledger = new JobLedger(
      jobId,
      expandSlots(this.#rows, runtimes, config.group, jobId),
      resumed,
    );
    const groups = new GroupReporter(options.onGroup);
    const stop = options.signal ? AbortSignal.any([options.signal, groups.signal]) : groups.signal;
    const budget = new Budget(config, resumed.spent, stop);
    const pending = ledger.pending();
    const snapshots = config.from === null
      ? null
      : new JobSnapshots(config.from, config.snapshots, pending, budget.signal);
    const progress = new Progress(
      config.group * this.#rows.length,
      ledger.kept,
      { budget, concurrency },
      options.onProgress,
    );
    progress.report();
    const runner = new SlotRunner({
      agent,
      agentInfo: agent.info,
      rollout: options,
      concurrency,
      budget,
      ledger,
      progress,
      groups,
      retry: new RetryPolicy(config.retry),
      out,
      signal: options.signal,
      snapshots,
    });
    try {
      await runPending(pending, runner, budget, config.maxConcurrent);
    } finally {
      try {
        await snapshots?.close();
      } finally {
        await out?.close();
      }
    }
    groups.throwIfFailed();
    progress.report();
    return ledger.toJob({ stopped: budget.stopped, usage: budget.spent });
  }
}
