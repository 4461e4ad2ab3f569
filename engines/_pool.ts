// Leasing the members of a pool of environment servers (pods of a
// Kubernetes pool, tasks of a Slurm allocation) to rollouts: the least
// loaded ready member on the least loaded node goes first; a member that
// dies leaves the pool, and the release of a lease on it rejects saying why
// (a rollout records it).

import type { Placement } from "../runtime/placement.ts";
import { NotReadyError } from "../errors.ts";
import { Deadline } from "../_internal/async.ts";

/** One server of a pool. */
export interface PoolMember {
  /** Unique in the pool (pod name, job.step.task). */
  readonly id: string;
  /** The node it runs on, for errors and spreading. */
  readonly node: string;
  /** Control address, with the token. */
  readonly url: string;
  /** Data for the placement's `params`. */
  readonly params: Readonly<Record<string, unknown>>;
  ready: boolean;
  /** Why it is gone, once it is. */
  dead: string | null;
  leases: number;
  lastUsed: number;
}

interface Waiter {
  resolve(member: PoolMember): void;
  reject(err: unknown): void;
}

/** Members, their leases, and the rollouts waiting for one. */
export class LeasePool {
  readonly #members = new Map<string, PoolMember>();
  readonly #waiters: Waiter[] = [];
  readonly #width: number;
  readonly #what: string;
  #served = 0;

  /**
   * @param width rollouts a member serves at once
   * @param what the pool in errors: `pool "hud-1-ab"`
   */
  constructor(width: number, what: string) {
    this.#width = width;
    this.#what = what;
  }

  /** A member by id. */
  get(id: string): PoolMember | undefined {
    return this.#members.get(id);
  }

  /** All members, dead ones still leased included. */
  members(): PoolMember[] {
    return [...this.#members.values()];
  }

  /** Ready members. */
  get readyCount(): number {
    let n = 0;
    for (const m of this.#members.values()) if (m.ready && !m.dead) n++;
    return n;
  }

  /** Live members (ready or not). */
  get liveCount(): number {
    let n = 0;
    for (const m of this.#members.values()) if (!m.dead) n++;
    return n;
  }

  /** Ready members by node. */
  get readyByNode(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const m of this.#members.values()) {
      if (m.ready && !m.dead) out[m.node] = (out[m.node] ?? 0) + 1;
    }
    return out;
  }

  /** Leases held plus rollouts waiting. */
  get demand(): number {
    let n = this.#waiters.length;
    for (const m of this.#members.values()) n += m.leases;
    return n;
  }

  /** Adds a member (not ready yet). */
  add(member: PoolMember): void {
    this.#members.set(member.id, member);
  }

  /** Marks a member ready and hands it to whoever waits. */
  markReady(member: PoolMember): void {
    if (member.dead !== null) return;
    member.ready = true;
    this.#dispatch();
  }

  /** Takes a member out of the pool; a leased one stays until released. */
  kill(member: PoolMember, reason: string): void {
    if (member.dead === null) member.dead = reason;
    member.ready = false;
    if (member.leases === 0) this.#members.delete(member.id);
  }

  /** Leases a free ready member now, or null. */
  take(): PoolMember | null {
    let best: PoolMember | null = null;
    const perNode = new Map<string, number>();
    for (const m of this.#members.values()) {
      perNode.set(m.node, (perNode.get(m.node) ?? 0) + m.leases);
    }
    for (const m of this.#members.values()) {
      if (!m.ready || m.dead || m.leases >= this.#width) continue;
      if (
        best === null || m.leases < best.leases ||
        (m.leases === best.leases &&
          (perNode.get(m.node)! < perNode.get(best.node)! ||
            (perNode.get(m.node) === perNode.get(best.node) && m.lastUsed < best.lastUsed)))
      ) best = m;
    }
    if (best) {
      best.leases++;
      best.lastUsed = ++this.#served;
    }
    return best;
  }

  /**
   * Waits for a free ready member.
   * @param timeout ms
   * @param describe the pool's state for the timeout's message
   */
  wait(
    timeout: number,
    signal: AbortSignal | undefined,
    describe: () => string,
  ): Promise<PoolMember> {
    const deadline = new Deadline(timeout, signal, "pool member");
    return new Promise<PoolMember>((resolve, reject) => {
      const waiter: Waiter = {
        resolve: (m) => {
          deadline[Symbol.dispose]();
          resolve(m);
        },
        reject: (err) => {
          deadline[Symbol.dispose]();
          reject(err);
        },
      };
      deadline.signal.addEventListener("abort", () => {
        const i = this.#waiters.indexOf(waiter);
        if (i < 0) return;
        this.#waiters.splice(i, 1);
        if (signal?.aborted) return waiter.reject(signal.reason);
        waiter.reject(
          new NotReadyError(
            `Cannot place on ${this.#what}: no free ready member after ${timeout} ms (${describe()})`,
          ),
        );
      }, { once: true });
      this.#waiters.push(waiter);
      this.#dispatch();
    });
  }

  /** Rejects every waiter (the pool is closing, or cannot grow). */
  rejectWaiters(err: () => unknown): void {
    for (const w of this.#waiters.splice(0)) w.reject(err());
  }

  /**
   * A placement on a leased member; releasing it frees the lease once.
   * @param settle awaited before the release looks at the member: a rollout
   *   that failed because the member died often ends before the pool has
   *   read of the death, and would otherwise hand the member on
   */
  lease(member: PoolMember, onRelease?: () => void, settle?: () => Promise<void>): Placement {
    let released: Promise<void> | null = null;
    return {
      url: member.url,
      params: member.params,
      [Symbol.asyncDispose]: () => {
        released ??= (async () => {
          await settle?.();
          member.leases--;
          onRelease?.();
          if (member.dead !== null) {
            if (member.leases === 0) this.#members.delete(member.id);
            throw new Error(
              `${member.id} of ${this.#what} on node ${member.node} died while placed: ${member.dead}`,
            );
          }
          this.#dispatch();
        })();
        return released;
      },
    };
  }

  #dispatch(): void {
    while (this.#waiters.length > 0) {
      const member = this.take();
      if (member === null) return;
      this.#waiters.shift()!.resolve(member);
    }
  }
}
