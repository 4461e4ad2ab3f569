// The snapshots a job's rollouts start from (`Taskset.run({ from })`). A
// snapshot given is the caller's: every rollout starts from it, and the job
// leaves it alone. A function given is called once per task, at the task's
// first rollout, for the state its group starts from; those snapshots are
// the job's: at most `maxCount` alive at once (a task waits for one to go),
// `maxBytes` of disk together, each removed once its task's last rollout is
// done, and every one left removed when the job ends, however it ends.

import type { TaskRow } from "../env.ts";
import { abortable } from "../_internal/async.ts";
import type { Snapshot } from "../runtime/placement.ts";
import { checkUsable } from "./fork.ts";
import type { Slot } from "./_ledger.ts";

/** Where a job's rollouts start: a snapshot, or a function making one per task. */
export type SnapshotSource =
  | Snapshot
  | ((task: TaskRow, signal: AbortSignal) => Promise<Snapshot>);

/** Bounds on the snapshots a job takes. */
export interface JobSnapshotBounds {
  readonly maxCount: number;
  readonly maxBytes: number;
}

/** One task's snapshot: its rollouts not yet done, and the snapshot, once asked for. */
interface TaskState {
  remaining: number;
  taking: Promise<Snapshot> | null;
}

/** The snapshots of one job. */
export class JobSnapshots {
  readonly #source: SnapshotSource;
  readonly #bounds: JobSnapshotBounds;
  /** The job's stop: a task's snapshot is taken under it, not under one rollout's deadline. */
  readonly #signal: AbortSignal;
  readonly #tasks = new Map<string, TaskState>();
  /** Snapshots taken and kept, and those being taken (each holds one of `maxCount`). */
  readonly #alive = new Set<Snapshot>();
  readonly #taking = new Set<Promise<unknown>>();
  #held = 0;
  readonly #waiting: (() => void)[] = [];
  #closed = false;

  /**
   * @param pending the slots the job will run: a task's snapshot goes when the last is done
   */
  constructor(
    source: SnapshotSource,
    bounds: JobSnapshotBounds,
    pending: readonly Slot[],
    signal: AbortSignal,
  ) {
    this.#source = source;
    this.#bounds = bounds;
    this.#signal = signal;
    for (const slot of pending) {
      const state = this.#tasks.get(slot.row.slug) ?? { remaining: 0, taking: null };
      state.remaining++;
      this.#tasks.set(slot.row.slug, state);
    }
  }

  /** The snapshots the job took and has not removed yet. */
  get alive(): number {
    return this.#alive.size;
  }

  /** What `slot`'s rollout starts from, got when it is placed (a failure is a provisioning one). */
  getter(slot: Slot): (signal: AbortSignal) => Promise<Snapshot> {
    return (signal) => this.#get(slot.row, signal);
  }

  #get(row: TaskRow, signal: AbortSignal): Promise<Snapshot> {
    const source = this.#source;
    if (typeof source !== "function") return Promise.resolve(source);
    const state = this.#tasks.get(row.slug);
    if (state === undefined) {
      return Promise.reject(new Error(`Cannot start task "${row.slug}": not a task of this job`));
    }
    if (state.taking === null) {
      const taking = this.#take(source, row);
      state.taking = taking;
      // A failed take is tried again by the task's next rollout (or its retry).
      taking.catch(() => {
        if (state.taking === taking) state.taking = null;
      });
    }
    return abortable(state.taking, signal);
  }

  async #take(
    source: (task: TaskRow, signal: AbortSignal) => Promise<Snapshot>,
    row: TaskRow,
  ): Promise<Snapshot> {
    await this.#permit(row);
    const work = (async () => {
      let snapshot: Snapshot;
      try {
        snapshot = checkUsable(
          `start task "${row.slug}" from the job's snapshot`,
          await source(row, this.#signal),
        );
      } catch (err) {
        this.#release();
        throw err;
      }
      if (this.#closed) {
        await snapshot.remove();
        this.#release();
        throw new Error(`Cannot start task "${row.slug}" from the job's snapshot: the job ended`);
      }
      let used = 0;
      for (const s of this.#alive) used += s.bytes;
      const { maxBytes } = this.#bounds;
      if (used + snapshot.bytes > maxBytes) {
        await snapshot.remove();
        this.#release();
        throw new RangeError(
          `Cannot start task "${row.slug}" from the job's snapshot: it took ${snapshot.bytes} bytes, and ${used} of the job's snapshots.maxBytes (${maxBytes}) are in use; raise it, or lower snapshots.maxCount`,
        );
      }
      this.#alive.add(snapshot);
      return snapshot;
    })();
    this.#taking.add(work);
    try {
      return await work;
    } finally {
      this.#taking.delete(work);
    }
  }

  /** Waits until fewer than `maxCount` of the job's snapshots are alive or being taken. */
  async #permit(row: TaskRow): Promise<void> {
    while (this.#held >= this.#bounds.maxCount) {
      if (this.#closed) break;
      await abortable(new Promise<void>((resolve) => this.#waiting.push(resolve)), this.#signal);
    }
    if (this.#closed) {
      throw new Error(`Cannot start task "${row.slug}" from the job's snapshot: the job ended`);
    }
    this.#held++;
  }

  #release(): void {
    this.#held--;
    // All of them: each checks again, and one may have stopped waiting.
    for (const wake of this.#waiting.splice(0)) wake();
  }

  /** Notes that `slot` is done (its last attempt): its task's snapshot goes after its last. */
  async settled(slot: Slot): Promise<void> {
    const state = this.#tasks.get(slot.row.slug);
    if (state === undefined || --state.remaining > 0 || state.taking === null) return;
    const taking = state.taking;
    state.taking = null;
    const snapshot = await taking.catch(() => null);
    if (snapshot !== null) await this.#remove(snapshot);
  }

  async #remove(snapshot: Snapshot): Promise<void> {
    if (!this.#alive.delete(snapshot)) return;
    try {
      await snapshot.remove();
    } finally {
      this.#release();
    }
  }

  /** Removes every snapshot the job took, once those being taken are; idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const wake of this.#waiting.splice(0)) wake();
    await Promise.allSettled([...this.#taking]);
    for (const snapshot of [...this.#alive]) await this.#remove(snapshot);
  }
}
