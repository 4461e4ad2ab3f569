/**
 * A pool of environment replicas on Docker Swarm: {@linkcode SwarmRuntime}
 * runs an environment image across a swarm's nodes, one service and one
 * token per replica, and hands the replicas out to rollouts.
 *
 * @module
 */

import { probeReady } from "../runtime/_probe.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { NotReadyError } from "../errors.ts";
import { generateToken, withToken } from "../_internal/auth.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { EngineClient, EngineError } from "./_engine.ts";
import { CONTAINER_PORT, OWNER_LABEL } from "./container.ts";

/** The label naming the pool a replica's service belongs to. */
const POOL_LABEL = "dev.hud.pool";

/** Options for {@linkcode SwarmRuntime}. */
export interface SwarmRuntimeOptions {
  /**
   * Socket of a swarm manager's engine.
   * @default `DOCKER_HOST` (unix://), else /var/run/docker.sock
   */
  socket?: string;
  /**
   * Fewest replicas kept running.
   * @default 1
   */
  minReplicas?: number;
  /**
   * Most replicas demand may scale the service to.
   * @default max(minReplicas, replicas, 8)
   */
  maxReplicas?: number;
  /**
   * Replicas started at once.
   * @default minReplicas
   */
  replicas?: number;
  /**
   * Rollouts one replica serves at a time.
   * @default 1
   */
  width?: number;
  /**
   * Variables for the environment's process (the token is added).
   * @default {}
   */
  env?: Record<string, string>;
  /** CPU limit per replica, in CPUs (`1.5`). */
  cpus?: number;
  /** Memory limit per replica, in bytes. */
  memory?: number;
  /** Most processes per replica. */
  pids?: number;
  /**
   * Extra labels on the service (run id, job id...).
   * @default {}
   */
  labels?: Record<string, string>;
  /**
   * The pool's name: its services are `<name>-1`, `<name>-2`...
   * @default `hud-<pid>-<random>`
   */
  name?: string;
  /**
   * How long `place()` waits for a free ready replica, in ms.
   * @default 120_000
   */
  readyTimeout?: number;
  /**
   * How often the pool reads the service's tasks and the nodes, in ms.
   * @default 500
   */
  pollInterval?: number;
  /**
   * How long the pool stays idle before it scales down to `minReplicas`, in ms.
   * @default 10_000
   */
  scaleDownAfter?: number;
  /**
   * How long `close()` waits for the service's tasks to go, in ms.
   * @default 30_000
   */
  closeTimeout?: number;
}

interface TaskInfo {
  ID: string;
  ServiceID?: string;
  NodeID?: string;
  Slot?: number;
  DesiredState?: string;
  Status?: {
    State?: string;
    Message?: string;
    Err?: string;
    ContainerStatus?: { ExitCode?: number };
    PortStatus?: { Ports?: { TargetPort?: number; PublishedPort?: number }[] };
  };
}

interface NodeInfo {
  ID: string;
  Description?: { Hostname?: string };
  Status?: { State?: string; Addr?: string };
  ManagerStatus?: { Addr?: string };
}

/** One replica's service: its own token, so that one replica's leak opens no other. */
interface Slot {
  id: string;
  name: string;
  token: string;
}

interface Replica {
  slot: Slot;
  taskId: string;
  node: string;
  nodeId: string;
  host: string;
  port: number;
  url: string;
  ready: boolean;
  checking: boolean;
  /** Why it is gone, once it is. */
  dead: string | null;
  leases: number;
  lastUsed: number;
}

interface Waiter {
  resolve(replica: Replica): void;
  reject(err: unknown): void;
}

/**
 * Places an environment image on a Docker Swarm: one single-replica service
 * per replica (host-mode publishing of the control port, only on the node
 * that runs it, since the swarm's ingress mesh would publish it on every
 * node and needs IPVS), whose tasks' node addresses and published ports it
 * reads through the Engine API. Each placement is one replica, leased to
 * one rollout at a time (`width` at a time if set); a replica whose task
 * dies leaves the pool (a rollout holding it fails, and its release says
 * why) and the swarm starts another for its service. Demand adds services
 * up to `maxReplicas`; an idle pool removes idle ones down to
 * `minReplicas`. Closing removes them all.
 *
 * Each replica's service has a token of its own (256 bits, passed as
 * `HUD_SERVE_TOKEN`), and a placement's url carries only its replica's: a
 * token read out of one replica, or from one rollout's client, opens no
 * other replica.
 *
 * @example
 * ```ts ignore
 * import { probeReady } from "../runtime/_probe.ts";
 * import { SwarmRuntime } from "./mod.ts";
 *
 * await using runtime = new SwarmRuntime("registry:5000/robolab:latest", { minReplicas: 3 });
 * await using client = await connect(runtime);
 * console.log(client.manifest.env.name);
 * ```
 */
export class SwarmRuntime implements RuntimeProvider, AsyncDisposable {
  readonly #image: string;
  readonly #options: SwarmRuntimeOptions;
  readonly #name: string;
  /** The services, by id; one replica each. */
  readonly #slots = new Map<string, Slot>();
  #slotCount = 0;
  readonly #min: number;
  readonly #max: number;
  readonly #width: number;
  readonly #replicas = new Map<string, Replica>();
  readonly #waiters: Waiter[] = [];
  readonly #checks = new Set<Promise<void>>();
  #engine: EngineClient | null = null;
  #started: Promise<void> | null = null;
  #desired: number;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #polling: Promise<void> | null = null;
  #closed: Promise<void> | null = null;
  #idleSince = Date.now();
  #lastTaskError = "";
  #served = 0;

  /**
   * A runtime for `image` on the swarm whose manager is at `options.socket`.
   *
   * @param image an image every node can get (a registry's, or loaded on each node)
   * @param options replicas, width, limits, labels
   * @throws {TypeError} for an empty image name
   * @throws {RangeError} for replica counts or width out of range
   */
  constructor(image: string, options: SwarmRuntimeOptions = {}) {
    if (typeof image !== "string" || image === "") {
      throw new TypeError("Cannot create SwarmRuntime: image must be a non-empty string");
    }
    const min = options.minReplicas ?? 1;
    const initial = options.replicas ?? min;
    const max = options.maxReplicas ?? Math.max(min, initial, 8);
    const width = options.width ?? 1;
    for (const [name, value] of [["minReplicas", min], ["width", width]] as const) {
      if (!Number.isInteger(value) || value < 1) {
        throw new RangeError(
          `Cannot create SwarmRuntime: ${name} must be a positive integer, got "${value}"`,
        );
      }
    }
    if (!Number.isInteger(max) || max < min || !Number.isInteger(initial) || initial < min) {
      throw new RangeError(
        `Cannot create SwarmRuntime: need minReplicas <= replicas <= maxReplicas, got "${min}", "${initial}", "${max}"`,
      );
    }
    if (initial > max) {
      throw new RangeError(
        `Cannot create SwarmRuntime: replicas "${initial}" is above maxReplicas "${max}"`,
      );
    }
    this.#image = image;
    this.#options = options;
    this.#min = min;
    this.#max = max;
    this.#width = width;
    this.#desired = initial;
    this.#name = options.name ?? `hud-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  }

  /** The image placed. */
  get image(): string {
    return this.#image;
  }

  /** The pool's name (its services are `<name>-<n>`). */
  get name(): string {
    return this.#name;
  }

  /** Replicas (services) the pool is set to run now. */
  get desiredReplicas(): number {
    return this.#desired;
  }

  /** Ready replicas in the pool now, by node hostname. */
  get readyByNode(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const r of this.#replicas.values()) {
      if (r.ready && !r.dead) out[r.node] = (out[r.node] ?? 0) + 1;
    }
    return out;
  }

  /**
   * Creates the services (once) and waits until `n` replicas are ready.
   * `place()` starts them by itself; call this to wait for the pool.
   *
   * @param n replicas to wait for
   * @param options `timeout` in ms (default `readyTimeout`), `signal`
   * @throws {NotReadyError} when they are not ready in time, with the last task error
   */
  async ready(
    n: number = this.#desired,
    options: { signal?: AbortSignal; timeout?: number } = {},
  ): Promise<void> {
    await this.#start(options.signal);
    const timeout = options.timeout ?? this.#options.readyTimeout ?? 120_000;
    using deadline = new Deadline(timeout, options.signal, "swarm replicas ready");
    while (this.#readyCount() < n) {
      if (this.#closed) throw this.#closedError();
      if (deadline.signal.aborted) {
        if (options.signal?.aborted) throw options.signal.reason;
        throw new NotReadyError(
          `Cannot ready service "${this.#name}": ${this.#readyCount()} of ${n} replicas ready after ${timeout} ms${this.#lastErrorText()}`,
        );
      }
      await this.#poll().catch((err) => {
        this.#lastTaskError = `reading the service's tasks: ${
          err instanceof Error ? err.message : err
        }`;
      });
      await delay(this.#pollMs(), deadline.signal).catch(() => {});
    }
  }

  /**
   * Leases a ready replica, waiting for one (and scaling up) if none is free.
   * @throws {NotReadyError} when none is free within `readyTimeout`, with the last task error
   */
  async place(options: PlaceOptions = {}): Promise<Placement> {
    if (this.#closed) throw this.#closedError();
    options.signal?.throwIfAborted();
    await this.#start(options.signal);
    const replica = this.#take() ?? await this.#wait(options.signal);
    return this.#lease(replica);
  }

  /** Removes the services and waits (bounded) for their tasks to go; idempotent. */
  close(): Promise<void> {
    this.#closed ??= this.#shutdown();
    return this.#closed;
  }

  /** Same as {@linkcode SwarmRuntime.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #pollMs(): number {
    return this.#options.pollInterval ?? 500;
  }

  #closedError(): Error {
    return new Deno.errors.Interrupted(
      `Cannot place on service "${this.#name}": the SwarmRuntime is closed`,
    );
  }

  #lastErrorText(): string {
    return this.#lastTaskError === "" ? "" : `; last task error: ${this.#lastTaskError}`;
  }

  #readyCount(): number {
    let n = 0;
    for (const r of this.#replicas.values()) if (r.ready && !r.dead) n++;
    return n;
  }

  #start(signal?: AbortSignal): Promise<void> {
    this.#started ??= this.#create(signal);
    return this.#started;
  }

  async #create(signal?: AbortSignal): Promise<void> {
    const engine = await EngineClient.open(this.#options.socket, signal);
    this.#engine = engine;
    let info: { Swarm?: { LocalNodeState?: string; ControlAvailable?: boolean } };
    try {
      info = await engine.call("GET", "/info", undefined, signal) as typeof info;
    } catch (err) {
      this.#engine = null;
      engine.close();
      throw err;
    }
    if (info.Swarm?.LocalNodeState !== "active" || !info.Swarm.ControlAvailable) {
      this.#engine = null;
      engine.close();
      throw new Deno.errors.NotConnected(
        `Cannot create service "${this.#name}": the engine at ${engine.socket} is not a swarm manager; run \`docker swarm init\` there or point socket at a manager`,
      );
    }
    try {
      for (let i = 0; i < this.#desired; i++) await this.#addSlot(signal);
    } catch (err) {
      this.#desired = this.#slots.size;
      // Services made before the failure go with close(); with none, nothing is held.
      if (this.#slots.size === 0) {
        this.#engine = null;
        engine.close();
      }
      throw err;
    }
    this.#schedule();
  }

  /** Creates one replica's service, with a token of its own. */
  async #addSlot(signal?: AbortSignal): Promise<void> {
    const name = `${this.#name}-${++this.#slotCount}`;
    const token = generateToken();
    const created = await this.#engine!.call(
      "POST",
      "/services/create",
      this.#spec(name, token),
      signal,
    ) as { ID: string };
    this.#slots.set(created.ID, { id: created.ID, name, token });
  }

  /** Removes a replica's service; its replicas leave the pool. */
  async #removeSlot(slot: Slot, why: string): Promise<void> {
    this.#slots.delete(slot.id);
    for (const r of this.#replicas.values()) if (r.slot === slot && !r.dead) this.#kill(r, why);
    try {
      await this.#engine!.call("DELETE", `/services/${slot.id}`);
    } catch (err) {
      if (!(err instanceof EngineError) || err.status !== 404) throw err;
    }
  }

  #spec(name: string, token: string): unknown {
    const o = this.#options;
    const env = { ...o.env, HUD_SERVE_TOKEN: token };
    return {
      Name: name,
      Labels: {
        ...o.labels,
        [OWNER_LABEL]: String(Deno.pid),
        [POOL_LABEL]: this.#name,
        "dev.hud.created": new Date().toISOString(),
      },
      TaskTemplate: {
        ContainerSpec: {
          Image: this.#image,
          Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
          Labels: { [OWNER_LABEL]: String(Deno.pid) },
        },
        Resources: {
          Limits: {
            ...(o.cpus ? { NanoCPUs: Math.round(o.cpus * 1e9) } : {}),
            ...(o.memory ? { MemoryBytes: o.memory } : {}),
            ...(o.pids ? { Pids: o.pids } : {}),
          },
        },
        RestartPolicy: { Condition: "any", Delay: 500_000_000 },
      },
      Mode: { Replicated: { Replicas: 1 } },
      // Host-mode publishing, a port per task on its own node only: the
      // ingress mesh would open it on every node, and needs IPVS.
      EndpointSpec: {
        Mode: "dnsrr",
        Ports: [{ Protocol: "tcp", TargetPort: CONTAINER_PORT, PublishMode: "host" }],
      },
    };
  }

  #schedule(): void {
    if (this.#closed || this.#timer !== null) return;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#poll().catch((err) => {
        // Said by the next place() that times out.
        this.#lastTaskError = `reading the service's tasks: ${
          err instanceof Error ? err.message : err
        }`;
      }).finally(() => this.#schedule());
    }, this.#pollMs());
  }

  /** One look at the tasks and nodes; concurrent callers share it. */
  #poll(): Promise<void> {
    this.#polling ??= this.#refresh().finally(() => this.#polling = null);
    return this.#polling;
  }

  async #refresh(): Promise<void> {
    const engine = this.#engine;
    if (engine === null || this.#closed) return;
    if (this.#slots.size === 0) return await this.#scale();
    const filters = encodeURIComponent(JSON.stringify({ service: [...this.#slots.keys()] }));
    const [tasks, nodes] = await Promise.all([
      engine.call("GET", `/tasks?filters=${filters}`) as Promise<TaskInfo[]>,
      engine.call("GET", "/nodes") as Promise<NodeInfo[]>,
    ]);
    const byId = new Map(nodes.map((n) => [n.ID, n]));
    const seen = new Set<string>();
    for (const task of tasks) {
      const slot = this.#slots.get(task.ServiceID ?? "");
      if (slot === undefined) continue; // a service being removed
      const node = byId.get(task.NodeID ?? "");
      const hostname = node?.Description?.Hostname ?? task.NodeID ?? "?";
      const state = task.Status?.State ?? "unknown";
      if (task.Status?.Err) {
        this.#lastTaskError = `task ${task.ID.slice(0, 12)} on ${hostname}: ${task.Status.Err}`;
      }
      const known = this.#replicas.get(task.ID);
      const live = state === "running" && task.DesiredState === "running" &&
        node?.Status?.State === "ready";
      if (!live) {
        if (known && !known.dead) {
          this.#kill(
            known,
            node?.Status?.State !== "ready"
              ? `node ${hostname} is ${node?.Status?.State ?? "gone"}`
              : `task ${state}${task.Status?.Err ? `: ${task.Status.Err}` : ""}`,
          );
        }
        continue;
      }
      seen.add(task.ID);
      if (known) continue;
      const port = task.Status?.PortStatus?.Ports?.find((p) => p.TargetPort === CONTAINER_PORT)
        ?.PublishedPort;
      const host = nodeAddress(node!);
      if (!port || !host) continue;
      this.#replicas.set(task.ID, {
        slot,
        taskId: task.ID,
        node: hostname,
        nodeId: node!.ID,
        host,
        port,
        url: withToken(`tcp://${host}:${port}`, slot.token),
        ready: false,
        checking: false,
        dead: null,
        leases: 0,
        lastUsed: 0,
      });
    }
    for (const r of this.#replicas.values()) {
      if (!seen.has(r.taskId) && !r.dead) this.#kill(r, "task gone from the service");
      if (!r.ready && !r.dead && !r.checking) this.#check(r);
    }
    await this.#scale();
  }

  #kill(replica: Replica, reason: string): void {
    replica.dead = reason;
    replica.ready = false;
    if (replica.leases === 0) this.#replicas.delete(replica.taskId);
  }

  /** Readiness is the handshake: the node may accept before the server listens. */
  #check(replica: Replica): void {
    replica.checking = true;
    const check = probeReady(replica.url, { readyTimeout: 2_000, retryInterval: 200 })
      .then(() => {
        if (replica.dead === null) {
          replica.ready = true;
          this.#dispatch();
        }
      }, (err) => {
        this.#lastTaskError = `replica on ${replica.node} (${replica.host}:${replica.port}): ${
          err instanceof Error ? err.message : err
        }`;
      }).finally(() => {
        replica.checking = false;
        this.#checks.delete(check);
      });
    this.#checks.add(check);
  }

  async #scale(): Promise<void> {
    const leased = [...this.#replicas.values()].reduce((n, r) => n + r.leases, 0);
    const demand = leased + this.#waiters.length;
    if (demand > 0) this.#idleSince = Date.now();
    let want = this.#desired;
    const needed = Math.ceil(demand / this.#width);
    if (needed > this.#desired) want = Math.min(this.#max, needed);
    else if (
      demand === 0 && Date.now() - this.#idleSince >= (this.#options.scaleDownAfter ?? 10_000)
    ) {
      want = this.#min;
    }
    try {
      while (this.#slots.size < want && !this.#closed) await this.#addSlot();
      if (this.#slots.size > want) {
        // Only idle replicas' services go (the pool is idle when it shrinks).
        const busy = new Set(
          [...this.#replicas.values()].filter((r) => r.leases > 0).map((r) => r.slot),
        );
        const idle = [...this.#slots.values()].filter((s) => !busy.has(s)).reverse();
        for (const slot of idle.slice(0, this.#slots.size - want)) {
          await this.#removeSlot(slot, "scaled down");
        }
      }
    } catch (err) {
      // Retried at the next poll; said by the next place() that times out.
      if (!(err instanceof EngineError)) throw err;
      this.#lastTaskError = `scaling to ${want} replicas: ${err.message}`;
    } finally {
      this.#desired = this.#slots.size;
    }
  }

  #take(): Replica | null {
    let best: Replica | null = null;
    const perNode = new Map<string, number>();
    for (const r of this.#replicas.values()) {
      perNode.set(r.nodeId, (perNode.get(r.nodeId) ?? 0) + r.leases);
    }
    for (const r of this.#replicas.values()) {
      if (!r.ready || r.dead || r.leases >= this.#width) continue;
      if (
        best === null || r.leases < best.leases ||
        (r.leases === best.leases &&
          (perNode.get(r.nodeId)! < perNode.get(best.nodeId)! ||
            (perNode.get(r.nodeId) === perNode.get(best.nodeId) && r.lastUsed < best.lastUsed)))
      ) best = r;
    }
    if (best) {
      best.leases++;
      best.lastUsed = ++this.#served;
    }
    return best;
  }

  #wait(signal?: AbortSignal): Promise<Replica> {
    const timeout = this.#options.readyTimeout ?? 120_000;
    const deadline = new Deadline(timeout, signal, "swarm replica");
    return new Promise<Replica>((resolve, reject) => {
      const waiter: Waiter = {
        resolve: (r) => {
          deadline[Symbol.dispose]();
          resolve(r);
        },
        reject: (err) => {
          deadline[Symbol.dispose]();
          reject(err);
        },
      };
      deadline.signal.addEventListener("abort", () => {
        const i = this.#waiters.indexOf(waiter);
        if (i >= 0) this.#waiters.splice(i, 1);
        if (signal?.aborted) return waiter.reject(signal.reason);
        waiter.reject(
          new NotReadyError(
            `Cannot place on service "${this.#name}": no free ready replica after ${timeout} ms (${this.#readyCount()} ready, ${this.#desired} wanted, at most ${this.#max})${this.#lastErrorText()}`,
          ),
        );
      }, { once: true });
      this.#waiters.push(waiter);
      // Demand changed: scale now rather than at the next tick.
      this.#poll().catch(() => {});
    });
  }

  #dispatch(): void {
    while (this.#waiters.length > 0) {
      const replica = this.#take();
      if (replica === null) return;
      this.#waiters.shift()!.resolve(replica);
    }
  }

  #lease(replica: Replica): Placement {
    let released: Promise<void> | null = null;
    return {
      url: replica.url,
      params: {
        service: replica.slot.name,
        pool: this.#name,
        taskId: replica.taskId,
        node: replica.node,
        host: replica.host,
        port: replica.port,
      },
      [Symbol.asyncDispose]: () => {
        released ??= (() => {
          replica.leases--;
          if (replica.dead !== null) {
            if (replica.leases === 0) this.#replicas.delete(replica.taskId);
            return Promise.reject(
              new Error(
                `Replica of "${this.#name}" on node ${replica.node} died while placed: ${replica.dead}`,
              ),
            );
          }
          this.#dispatch();
          return Promise.resolve();
        })();
        return released;
      },
    };
  }

  async #shutdown(): Promise<void> {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    for (const w of this.#waiters.splice(0)) w.reject(this.#closedError());
    try {
      await this.#started?.catch(() => {});
      await this.#polling?.catch(() => {});
      await Promise.allSettled([...this.#checks]);
      const engine = this.#engine;
      if (engine === null) return;
      const ids = new Set(this.#slots.keys());
      for (const slot of [...this.#slots.values()]) await this.#removeSlot(slot, "closed");
      if (ids.size === 0) return;
      // Wait (bounded) for the nodes to stop the tasks; a down node never reports.
      const timeout = this.#options.closeTimeout ?? 30_000;
      using deadline = new Deadline(timeout, undefined, "service removal");
      // Filtering by a removed service fails: list all tasks and pick its own.
      while (!deadline.signal.aborted) {
        const [all, nodes] = await Promise.all([
          engine.call("GET", "/tasks") as Promise<(TaskInfo & { ServiceID?: string })[]>,
          engine.call("GET", "/nodes") as Promise<NodeInfo[]>,
        ]);
        const up = new Set(nodes.filter((n) => n.Status?.State === "ready").map((n) => n.ID));
        const left = all.filter((t) =>
          ids.has(t.ServiceID ?? "") && up.has(t.NodeID ?? "") &&
          !["shutdown", "failed", "complete", "rejected", "orphaned"]
            .includes(t.Status?.State ?? "")
        );
        if (left.length === 0) break;
        await delay(200, deadline.signal).catch(() => {});
      }
    } finally {
      this.#engine?.close();
      this.#engine = null;
    }
  }
}

function nodeAddress(node: NodeInfo): string | null {
  const addr = node.Status?.Addr;
  if (addr && addr !== "0.0.0.0") return addr;
  // A manager may report 0.0.0.0; its advertised address says where it is.
  const manager = node.ManagerStatus?.Addr;
  return manager ? manager.replace(/:\d+$/, "") : null;
}
