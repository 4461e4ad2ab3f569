// Pools of environment servers (replicas of a swarm, pods of a Kubernetes
// pool, tasks of a Slurm allocation), what the pooled runtimes share:
// leasing the members to rollouts (the least loaded ready member on the
// least loaded node goes first; a member that dies leaves the pool, and the
// release of a lease on it rejects saying why, which a rollout records),
// the size demand asks for, and the timer that looks at the pool.

import { placementOf, type PlacementWithUrl } from "../runtime/placement.ts";
import type { ControlAddress } from "../_internal/auth.ts";
import { NotReadyError } from "../errors.ts";
import { Deadline } from "../_internal/async.ts";

/** One server of a pool. */
export interface PoolMember {
  /** Unique in the pool (task id, pod name, job.step). */
  readonly id: string;
  /** The node it runs on, for errors and spreading. */
  readonly node: string;
  /** Its control address, with the token. */
  readonly address: ControlAddress;
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
  readonly #noun: string;
  #served = 0;

  /**
   * @param width rollouts a member serves at once
   * @param what the pool in errors: `pool "hud-1-ab"`
   * @param noun a member in errors: `replica`
   */
  constructor(width: number, what: string, noun = "member") {
    this.#width = width;
    this.#what = what;
    this.#noun = noun;
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
   * @param describe the pool's state for the timeout's message: `(2 ready, 4 wanted)`
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
            `Cannot place on ${this.#what}: no free ready ${this.#noun} after ${timeout} ms ${describe()}`,
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
  lease(
    member: PoolMember,
    onRelease?: () => void,
    settle?: () => Promise<void>,
  ): PlacementWithUrl {
    let released: Promise<void> | null = null;
    return placementOf(member.address, member.params, () => {
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
    });
  }

  #dispatch(): void {
    while (this.#waiters.length > 0) {
      const member = this.take();
      if (member === null) return;
      this.#waiters.shift()!.resolve(member);
    }
  }
}

/** The limits a pool's size moves within. */
export interface PoolLimits {
  /** Fewest members kept. */
  min: number;
  /** Most members demand may ask for. */
  max: number;
  /** Rollouts one member serves at once. */
  width: number;
  /** How long the pool stays idle before it shrinks to `min`, in ms. */
  scaleDownAfter: number;
}

/**
 * The size a pool should have: enough members for the demand (leases held
 * plus rollouts waiting), up to `max`; `min` once it has had no demand for
 * `scaleDownAfter` (down, or back up after failed creations); else as it is. A pure function of its
 * arguments, so that the swarm's and the Kubernetes pool's scaling is one
 * rule, tested without either.
 * @param desired the size the pool is set to now
 * @param idleFor how long the pool has had no demand, in ms (0 while it has some)
 */
export function scaleTarget(
  desired: number,
  demand: number,
  idleFor: number,
  limits: PoolLimits,
): number {
  const needed = Math.ceil(demand / limits.width);
  if (needed > desired) return Math.min(limits.max, needed);
  if (demand === 0 && idleFor >= limits.scaleDownAfter) return limits.min;
  return desired;
}

/**
 * Looks at a pool every `interval` ms until stopped: one look at a time,
 * which concurrent callers of {@linkcode Poller.poll} share. A look that
 * fails goes to `onError` and the next one comes as usual.
 */
export class Poller {
  readonly #interval: number;
  readonly #look: () => Promise<void>;
  readonly #onError: (err: unknown) => void;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #looking: Promise<void> | null = null;
  #stopped = false;

  constructor(interval: number, look: () => Promise<void>, onError: (err: unknown) => void) {
    this.#interval = interval;
    this.#look = look;
    this.#onError = onError;
  }

  /** Starts the timer (again after each look). */
  start(): void {
    if (this.#stopped || this.#timer !== null) return;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.poll().catch(this.#onError).finally(() => this.start());
    }, this.#interval);
  }

  /** One look now, or the one under way. */
  poll(): Promise<void> {
    this.#looking ??= this.#look().finally(() => this.#looking = null);
    return this.#looking;
  }

  /** Stops the timer and waits for a look under way (its failure ignored). */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#looking?.catch(() => {});
  }
}
