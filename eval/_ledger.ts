// What a taskset run knows of its rollouts: the slots it expands into (a
// row, a repeat), what a resumed results file already holds, each slot's
// record and live run as they finish, which groups are complete, and the
// attempts that later ones replaced. runRecord() is the one place a
// RunRecord is built.

import type { TaskRow } from "../env.ts";
import type { RuntimeProvider } from "../runtime/placement.ts";
import { agentChanges, type AgentInfo, describeAgent } from "./agent.ts";
import { createJob, type Job, type JobStop } from "./job.ts";
import { recordKey, type RunRecord } from "./results.ts";
import { rolloutFinished } from "./failure.ts";
import type { Run } from "./run.ts";
import { addUsage, emptyUsage, traceUsage, type Usage } from "./usage.ts";

/** One rollout of a job: a row and a repeat of it. */
export interface Slot {
  /** Its place in the job's expansion order (row by row, repeat by repeat). */
  readonly index: number;
  readonly row: TaskRow;
  /** Which repeat of the row (0-based). */
  readonly repeat: number;
  /** Where it runs. */
  readonly runtime: RuntimeProvider;
  /** Every repeat of a row shares it: `<job id>:<slug>`. */
  readonly groupId: string;
  /** Its key in a results file ({@linkcode recordKey}). */
  readonly key: string;
}

/** Every row `group` times, in order, each on its runtime. */
export function expandSlots(
  rows: readonly TaskRow[],
  runtimes: readonly RuntimeProvider[],
  group: number,
  jobId: string,
): Slot[] {
  const slots: Slot[] = [];
  rows.forEach((row, i) => {
    const groupId = `${jobId}:${row.slug}`;
    for (let repeat = 0; repeat < group; repeat++) {
      const key = recordKey(row.slug, repeat);
      slots.push({ index: slots.length, row, repeat, runtime: runtimes[i], groupId, key });
    }
  });
  return slots;
}

/** What a results file already holds, as a resumed job reads it. */
export interface Resumed {
  /** Every record of the file, in order. */
  readonly records: readonly RunRecord[];
  /** The job id the file names first, if any. */
  readonly jobId: string | undefined;
  /** The latest attempt number of each slot key. */
  readonly tries: ReadonlyMap<string, number>;
  /** The latest attempt of each slot key, when it finished (see `rolloutFinished`): those are not run again. */
  readonly kept: ReadonlyMap<string, RunRecord>;
  /** What every attempt in the file spent: it counts toward the job's limits. */
  readonly spent: Usage;
}

/**
 * Refuses to resume a job whose kept rollouts (those of `slotKeys` that a
 * resume does not run again) another agent ran (its model, command or
 * settings: see {@linkcode agentChanges}), when this run would add
 * rollouts of its own: the mean and pass@k of one job would mix both.
 * Unless `force`; a file of only errored rollouts, or with nothing left to
 * run, mixes nothing.
 * @throws {Error} naming the file, each difference and the two ways on
 */
export function checkSameAgent(
  path: string,
  resumed: Resumed,
  slotKeys: readonly string[],
  now: AgentInfo | undefined,
  force: boolean,
): void {
  if (force || slotKeys.every((k) => resumed.kept.has(k))) return;
  for (const key of slotKeys) {
    const ran = resumed.kept.get(key)?.agent;
    if (!resumed.kept.has(key)) continue;
    const changes = agentChanges(ran, now);
    if (changes.length === 0) continue;
    throw new Error(
      `Cannot resume "${path}": its graded rollouts were run by ${
        ran ? describeAgent(ran) : "an unnamed agent"
      }, and this agent differs: ${changes.join("; ")}; resume with the same agent, ` +
        `or pass --force (force: true) to mix both into one job`,
    );
  }
}

/** Reads a results file's `records` as a resumed job does: the latest attempt of each (slug, repeat) counts. */
export function resumeFrom(records: readonly RunRecord[]): Resumed {
  let jobId: string | undefined;
  const tries = new Map<string, number>();
  const kept = new Map<string, RunRecord>();
  const spent = emptyUsage();
  for (const record of records) {
    jobId ??= record.job_id;
    const key = recordKey(record.task.slug, record.repeat);
    tries.set(key, Math.max(tries.get(key) ?? 0, record.attempt ?? 1));
    // Not graded, or graded but cut short by the infrastructure (an older
    // file's zero of a model server that was down): run again.
    if (rolloutFinished(record)) kept.set(key, record);
    else kept.delete(key);
    addUsage(spent, traceUsage(record.trace));
  }
  return { records, jobId, tries, kept, spent };
}

/** An attempt at a slot: its run, which attempt it was (from 1), and what ran. */
export interface Attempted {
  readonly run: Run;
  readonly attempt: number;
  readonly agent: AgentInfo | undefined;
}

/**
 * The record of `slot`: of an `attempted` run of it, or, with none, of a
 * slot the job never started (an abort, a limit), which is cancelled with
 * no trace and no attempt and keeps the row as given.
 */
export function runRecord(jobId: string, slot: Slot, attempted?: Attempted): RunRecord {
  const { row, repeat, groupId } = slot;
  if (attempted === undefined) {
    return {
      job_id: jobId,
      group_id: groupId,
      task: row,
      repeat,
      status: "cancelled",
      reward: null,
      failed_phase: null,
      error_class: "cancelled",
      trace: {},
    };
  }
  const { run, attempt, agent } = attempted;
  const status = run.trace.status as RunRecord["status"];
  const errors = run.trace.errors;
  // A rollout that was not graded is classed by the failure that ended it
  // (the last); a graded one by its first (the agent's own, say).
  // Tampering names the rollout whatever failed before it (an agent out of time, say).
  const deciding = errors.find((e) => e.class === "tampered") ??
    (run.reward === null ? errors[errors.length - 1] : errors[0]);
  return {
    job_id: jobId,
    group_id: groupId,
    task: { env: row.env, id: row.id, args: row.args, slug: row.slug },
    repeat,
    attempt,
    status,
    reward: run.reward,
    failed_phase: run.trace.failedPhase,
    error_class: deciding?.class ?? (status === "cancelled" ? "cancelled" : null),
    ...(run.grade?.subscores ? { subscores: run.grade.subscores } : {}),
    ...(agent ? { agent } : {}),
    trace: run.trace.toJSON(),
  };
}

/**
 * Each slot's record and live run as the job goes: the graded ones kept
 * from a resumed file at first, then what this run finishes, and the
 * earlier attempts that later ones replaced (history, never counted).
 */
export class JobLedger {
  readonly #jobId: string;
  readonly #slots: readonly Slot[];
  readonly #resumed: Resumed;
  readonly #records: (RunRecord | null)[];
  readonly #runs: (Run | null)[];
  readonly #retried: RunRecord[] = [];
  /** Whether each slot's record is final: kept from the file, or done here. */
  readonly #done: boolean[];
  /** Each group's slots, by repeat. */
  readonly #groups = new Map<string, Slot[]>();

  constructor(jobId: string, slots: readonly Slot[], resumed: Resumed) {
    this.#jobId = jobId;
    this.#slots = slots;
    this.#resumed = resumed;
    this.#records = slots.map((s) => resumed.kept.get(s.key) ?? null);
    this.#runs = slots.map(() => null);
    this.#done = this.#records.map((r) => r !== null);
    for (const s of slots) this.#groups.set(s.groupId, [...this.#groups.get(s.groupId) ?? [], s]);
  }

  /** The job id. */
  get jobId(): string {
    return this.#jobId;
  }

  /** The graded records kept from the file. */
  get kept(): RunRecord[] {
    return this.#records.filter((r): r is RunRecord => r !== null);
  }

  /** The slots to run: those without a graded record, in order. */
  pending(): Slot[] {
    return this.#slots.filter((s) => this.#records[s.index] === null);
  }

  /** The number of the next attempt at `slot`, after those in the file. */
  firstAttempt(slot: Slot): number {
    return (this.#resumed.tries.get(slot.key) ?? 0) + 1;
  }

  /** Keeps `record`, an attempt a retry replaces, as history. */
  replaced(record: RunRecord): void {
    this.#retried.push(record);
  }

  /** Sets `slot`'s last attempt. */
  settle(slot: Slot, run: Run, record: RunRecord): void {
    this.#runs[slot.index] = run;
    this.#records[slot.index] = record;
  }

  /**
   * Marks `slot`'s settled record final (not a rollout the caller's abort
   * cut short, which is left to run). Returns its group's records, by
   * repeat, when that made every slot of the group final; else `null`.
   */
  done(slot: Slot): RunRecord[] | null {
    this.#done[slot.index] = true;
    const members = this.#groups.get(slot.groupId)!;
    if (!members.every((m) => this.#done[m.index])) return null;
    return members.map((m) => this.#records[m.index]!);
  }

  /**
   * The job: every slot's record (a slot never started is cancelled), and
   * as history the file's older attempts of these slots and this run's
   * replaced ones.
   */
  toJob(extra: { stopped: JobStop | null; usage: Usage }): Job {
    const final = this.#records.map((r, i) => r ?? runRecord(this.#jobId, this.#slots[i]));
    const counted = new Set(this.#resumed.kept.values());
    const keys = new Set(this.#slots.map((s) => s.key));
    const superseded = this.#resumed.records.filter((r) =>
      !counted.has(r) && keys.has(recordKey(r.task.slug, r.repeat))
    );
    return createJob(this.#jobId, final, this.#runs, [...superseded, ...this.#retried], extra);
  }
}
