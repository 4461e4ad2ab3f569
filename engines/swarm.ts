/**
 * A pool of environment replicas on Docker Swarm: {@linkcode SwarmRuntime}
 * runs an environment image across a swarm's nodes, one service and one
 * token per replica, and hands the replicas out to rollouts.
 *
 * @module
 */

import { probeReady } from "../runtime/_probe.ts";
import type { PlacementWithUrl, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { NotReadyError } from "../errors.ts";
import { controlAddress, generateToken, SERVE_TOKEN_VAR } from "../_internal/auth.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { errorMessage } from "../_internal/util.ts";
import { EngineClient, EngineError } from "./_engine.ts";
import { CONTAINER_PORT, CREATED_LABEL, OWNER_LABEL, POOL_LABEL } from "./_constants.ts";
import { LeasePool, Poller, type PoolLimits, type PoolMember, scaleTarget } from "./_pool.ts";
import { checkPublicNetwork, type PublicNetwork } from "./_network_support.ts";

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
  /**
   * The network its placements have: only `"public"` (the service's tasks are on the swarm's networks). Anything
   * else (`"none"`, an allowlist, a network by phase) is refused, never
   * silently run public: ContainerRuntime enforces those.
   * @default "public"
   */
  network?: PublicNetwork;
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

/** A replica: one running task of a slot's service, a member of the pool. */
interface Replica extends PoolMember {
  slot: Slot;
  nodeId: string;
  host: string;
  port: number;
  checking: boolean;
}

/** {@linkcode SwarmRuntimeOptions}, checked, with every default resolved. */
interface SwarmConfig extends PoolLimits {
  image: string;
  name: string;
  socket: string | undefined;
  replicas: number;
  env: Record<string, string>;
  cpus: number | undefined;
  memory: number | undefined;
  pids: number | undefined;
  labels: Record<string, string>;
  readyTimeout: number;
  pollInterval: number;
  closeTimeout: number;
}

function resolveSwarmOptions(image: string, options: SwarmRuntimeOptions): SwarmConfig {
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
  return {
    image,
    name: options.name ?? `hud-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`,
    socket: options.socket,
    min,
    max,
    width,
    replicas: initial,
    scaleDownAfter: options.scaleDownAfter ?? 10_000,
    env: { ...options.env },
    cpus: options.cpus,
    memory: options.memory,
    pids: options.pids,
    labels: { ...options.labels },
    readyTimeout: options.readyTimeout ?? 120_000,
    pollInterval: options.pollInterval ?? 500,
    closeTimeout: options.closeTimeout ?? 30_000,
  };
}

/** The body of `POST /services/create` for one replica's service. */
function serviceSpec(config: SwarmConfig, name: string, token: string): unknown {
  const env = { ...config.env, [SERVE_TOKEN_VAR]: token };
  return {
    Name: name,
    Labels: {
      ...config.labels,
      [OWNER_LABEL]: String(Deno.pid),
      [POOL_LABEL]: config.name,
      [CREATED_LABEL]: new Date().toISOString(),
    },
    TaskTemplate: {
      ContainerSpec: {
        Image: config.image,
        Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
        Labels: { [OWNER_LABEL]: String(Deno.pid) },
      },
      Resources: {
        Limits: {
          ...(config.cpus ? { NanoCPUs: Math.round(config.cpus * 1e9) } : {}),
          ...(config.memory ? { MemoryBytes: config.memory } : {}),
          ...(config.pids ? { Pids: config.pids } : {}),
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

/** Why a task that is not live is not: its node's state, or its own. */
function taskProblem(task: TaskInfo, node: NodeInfo | undefined, hostname: string): string {
  if (node?.Status?.State !== "ready") {
    return `node ${hostname} is ${node?.Status?.State ?? "gone"}`;
  }
  return `task ${task.Status?.State ?? "unknown"}${task.Status?.Err ? `: ${task.Status.Err}` : ""}`;
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
  readonly #config: SwarmConfig;
  /** The services, by id; one replica each. */
  readonly #slots = new Map<string, Slot>();
  #slotCount = 0;
  /** The replicas, by task id. */
  readonly #pool: LeasePool;
  readonly #poller: Poller;
  readonly #checks = new Set<Promise<void>>();
  #engine: EngineClient | null = null;
  #started: Promise<void> | null = null;
  #desired: number;
  #closed: Promise<void> | null = null;
  #idleSince = Date.now();
  #lastTaskError = "";

  /**
   * A runtime for `image` on the swarm whose manager is at `options.socket`.
   *
   * @param image an image every node can get (a registry's, or loaded on each node)
   * @param options replicas, width, limits, labels
   * @throws {TypeError} for an empty image name
   * @throws {RangeError} for replica counts or width out of range
   */
  constructor(image: string, options: SwarmRuntimeOptions = {}) {
    checkPublicNetwork("SwarmRuntime", options.network, "its tasks are on the swarm's networks");
    const config = this.#config = resolveSwarmOptions(image, options);
    this.#desired = config.replicas;
    this.#pool = new LeasePool(config.width, `service "${config.name}"`, "replica");
    this.#poller = new Poller(config.pollInterval, () => this.#refresh(), (err) => {
      // Said by the next place() that times out.
      this.#lastTaskError = `reading the service's tasks: ${errorMessage(err)}`;
    });
  }

  /** The image placed. */
  get image(): string {
    return this.#config.image;
  }

  /** The pool's name (its services are `<name>-<n>`). */
  get name(): string {
    return this.#config.name;
  }

  /** Replicas (services) the pool is set to run now. */
  get desiredReplicas(): number {
    return this.#desired;
  }

  /** Ready replicas in the pool now, by node hostname. */
  get readyByNode(): Record<string, number> {
    return this.#pool.readyByNode;
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
    const timeout = options.timeout ?? this.#config.readyTimeout;
    using deadline = new Deadline(timeout, options.signal, "swarm replicas ready");
    while (this.#pool.readyCount < n) {
      if (this.#closed) throw this.#closedError();
      if (deadline.signal.aborted) {
        if (options.signal?.aborted) throw options.signal.reason;
        throw new NotReadyError(
          `Cannot ready service "${this.name}": ${this.#pool.readyCount} of ${n} replicas ready after ${timeout} ms${this.#lastErrorText()}`,
        );
      }
      await this.#poller.poll().catch((err) => {
        this.#lastTaskError = `reading the service's tasks: ${errorMessage(err)}`;
      });
      await delay(this.#config.pollInterval, deadline.signal).catch(() => {});
    }
  }

  /**
   * Leases a ready replica, waiting for one (and scaling up) if none is free.
   * @throws {NotReadyError} when none is free within `readyTimeout`, with the last task error
   */
  async place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    if (this.#closed) throw this.#closedError();
    options.signal?.throwIfAborted();
    await this.#start(options.signal);
    const pool = this.#pool;
    const replica = pool.take() ?? await (() => {
      const waiting = pool.wait(
        this.#config.readyTimeout,
        options.signal,
        () =>
          `(${pool.readyCount} ready, ${this.#desired} wanted, at most ${this.#config.max})${this.#lastErrorText()}`,
      );
      // Demand changed: scale now rather than at the next tick.
      this.#poller.poll().catch(() => {});
      return waiting;
    })();
    return pool.lease(replica);
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

  #closedError(): Error {
    return new Deno.errors.Interrupted(
      `Cannot place on service "${this.name}": the SwarmRuntime is closed`,
    );
  }

  #lastErrorText(): string {
    return this.#lastTaskError === "" ? "" : `; last task error: ${this.#lastTaskError}`;
  }

  #start(signal?: AbortSignal): Promise<void> {
    this.#started ??= this.#create(signal);
    return this.#started;
  }

  async #create(signal?: AbortSignal): Promise<void> {
    const engine = await managerEngine(this.#config, signal);
    this.#engine = engine;
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
    this.#poller.start();
  }

  /** Creates one replica's service, with a token of its own. */
  async #addSlot(signal?: AbortSignal): Promise<void> {
    const name = `${this.name}-${++this.#slotCount}`;
    const token = generateToken();
    const spec = serviceSpec(this.#config, name, token);
    const created = await this.#engine!.call("POST", "/services/create", spec, signal) as {
      ID: string;
    };
    this.#slots.set(created.ID, { id: created.ID, name, token });
  }

  /** Removes a replica's service; its replicas leave the pool. */
  async #removeSlot(slot: Slot, why: string): Promise<void> {
    this.#slots.delete(slot.id);
    for (const r of this.#replicas()) if (r.slot === slot && !r.dead) this.#pool.kill(r, why);
    try {
      await this.#engine!.call("DELETE", `/services/${slot.id}`);
    } catch (err) {
      if (!(err instanceof EngineError) || err.status !== 404) throw err;
    }
  }

  #replicas(): Replica[] {
    return this.#pool.members() as Replica[];
  }

  /** One look at the tasks and nodes: replicas in and out of the pool, and the pool's size. */
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
    const live = new Set<string>();
    for (const task of tasks) {
      if (this.#observe(task, byId.get(task.NodeID ?? ""))) live.add(task.ID);
    }
    for (const r of this.#replicas()) {
      if (!live.has(r.id) && !r.dead) this.#pool.kill(r, "task gone from the service");
      if (!r.ready && !r.dead && !r.checking) this.#check(r);
    }
    await this.#scale();
  }

  /** Folds one task into the pool; says whether it runs. */
  #observe(task: TaskInfo, node: NodeInfo | undefined): boolean {
    const slot = this.#slots.get(task.ServiceID ?? "");
    if (slot === undefined) return false; // a service being removed
    const hostname = node?.Description?.Hostname ?? task.NodeID ?? "?";
    if (task.Status?.Err) {
      this.#lastTaskError = `task ${task.ID.slice(0, 12)} on ${hostname}: ${task.Status.Err}`;
    }
    const known = this.#pool.get(task.ID);
    const live = task.Status?.State === "running" && task.DesiredState === "running" &&
      node?.Status?.State === "ready";
    if (!live) {
      if (known && !known.dead) this.#pool.kill(known, taskProblem(task, node, hostname));
      return false;
    }
    if (known) return true;
    const port = task.Status?.PortStatus?.Ports?.find((p) => p.TargetPort === CONTAINER_PORT)
      ?.PublishedPort;
    const host = nodeAddress(node!);
    if (!port || !host) return true;
    const replica: Replica = {
      id: task.ID,
      node: hostname,
      address: controlAddress(host, port, slot.token),
      params: { service: slot.name, pool: this.name, taskId: task.ID, node: hostname, host, port },
      ready: false,
      dead: null,
      leases: 0,
      lastUsed: 0,
      slot,
      nodeId: node!.ID,
      host,
      port,
      checking: false,
    };
    this.#pool.add(replica);
    return true;
  }

  /** Readiness is the handshake: the node may accept before the server listens. */
  #check(replica: Replica): void {
    replica.checking = true;
    const check = probeReady(replica.address, { readyTimeout: 2_000, retryInterval: 200 })
      .then(() => this.#pool.markReady(replica), (err) => {
        this.#lastTaskError = `replica on ${replica.node} (${replica.host}:${replica.port}): ${
          errorMessage(err)
        }`;
      }).finally(() => {
        replica.checking = false;
        this.#checks.delete(check);
      });
    this.#checks.add(check);
  }

  /** Services up to the size demand asks for; only idle replicas' go when it shrinks. */
  async #scale(): Promise<void> {
    const demand = this.#pool.demand;
    if (demand > 0) this.#idleSince = Date.now();
    const want = scaleTarget(this.#desired, demand, Date.now() - this.#idleSince, this.#config);
    try {
      while (this.#slots.size < want && !this.#closed) await this.#addSlot();
      if (this.#slots.size > want) {
        // The pool is idle when it shrinks: only idle replicas' services go.
        const busy = new Set(this.#replicas().filter((r) => r.leases > 0).map((r) => r.slot));
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

  async #shutdown(): Promise<void> {
    this.#pool.rejectWaiters(() => this.#closedError());
    try {
      await this.#started?.catch(() => {});
      await this.#poller.stop();
      await Promise.allSettled([...this.#checks]);
      const engine = this.#engine;
      if (engine === null) return;
      const ids = new Set(this.#slots.keys());
      for (const slot of [...this.#slots.values()]) await this.#removeSlot(slot, "closed");
      if (ids.size > 0) await tasksGone(engine, ids, this.#config.closeTimeout);
    } finally {
      this.#engine?.close();
      this.#engine = null;
    }
  }
}

/** A client of the engine at the socket, once it says it is a swarm manager. */
async function managerEngine(config: SwarmConfig, signal?: AbortSignal): Promise<EngineClient> {
  const engine = await EngineClient.open(config.socket, signal);
  try {
    const info = await engine.call("GET", "/info", undefined, signal) as {
      Swarm?: { LocalNodeState?: string; ControlAvailable?: boolean };
    };
    if (info.Swarm?.LocalNodeState !== "active" || !info.Swarm.ControlAvailable) {
      throw new Deno.errors.NotConnected(
        `Cannot create service "${config.name}": the engine at ${engine.socket} is not a swarm manager; run \`docker swarm init\` there or point socket at a manager`,
      );
    }
    return engine;
  } catch (err) {
    engine.close();
    throw err;
  }
}

/**
 * Waits (bounded) for the nodes to stop the tasks of removed services; a
 * down node never reports. Filtering by a removed service fails: it lists
 * all tasks and picks theirs.
 */
async function tasksGone(engine: EngineClient, ids: Set<string>, timeout: number): Promise<void> {
  using deadline = new Deadline(timeout, undefined, "service removal");
  while (!deadline.signal.aborted) {
    const [all, nodes] = await Promise.all([
      engine.call("GET", "/tasks") as Promise<TaskInfo[]>,
      engine.call("GET", "/nodes") as Promise<NodeInfo[]>,
    ]);
    const up = new Set(nodes.filter((n) => n.Status?.State === "ready").map((n) => n.ID));
    const left = all.filter((t) =>
      ids.has(t.ServiceID ?? "") && up.has(t.NodeID ?? "") &&
      !["shutdown", "failed", "complete", "rejected", "orphaned"].includes(t.Status?.State ?? "")
    );
    if (left.length === 0) return;
    await delay(200, deadline.signal).catch(() => {});
  }
}

function nodeAddress(node: NodeInfo): string | null {
  const addr = node.Status?.Addr;
  if (addr && addr !== "0.0.0.0") return addr;
  // A manager may report 0.0.0.0; its advertised address says where it is.
  const manager = node.ManagerStatus?.Addr;
  return manager ? manager.replace(/:\d+$/, "") : null;
}
