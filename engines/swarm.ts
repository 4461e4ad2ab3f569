/**
 * A pool of environment replicas on Docker Swarm: {@linkcode SwarmRuntime}
 * runs a service of an environment image across a swarm's nodes and hands
 * its replicas out to rollouts.
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
   * The service's name.
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

interface Replica {
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
 * Places an environment image on a Docker Swarm: a service of replicas
 * (host-mode publishing of the control port, since the swarm's ingress
 * mesh needs IPVS), whose tasks' node addresses and published ports it
 * reads through the Engine API. Each placement is one replica, leased to
 * one rollout at a time (`width` at a time if set); a replica whose task
 * dies leaves the pool (a rollout holding it fails, and its release says
 * why) and the swarm starts another. Demand scales the service up to
 * `maxReplicas`; an idle pool scales back down to `minReplicas`. Closing
 * removes the service.
 *
 * All replicas share one token, passed to them as `HUD_SERVE_TOKEN`.
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
  readonly #token = generateToken();
  readonly #min: number;
  readonly #max: number;
  readonly #width: number;
  readonly #replicas = new Map<string, Replica>();
  readonly #waiters: Waiter[] = [];
  readonly #checks = new Set<Promise<void>>();
  #engine: EngineClient | null = null;
  #started: Promise<void> | null = null;
  #serviceId: string | null = null;
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

  /** The service's name. */
  get name(): string {
    return this.#name;
  }

  /** Replicas the service is set to run now. */
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
   * Creates the service (once) and waits until `n` replicas are ready.
   * `place()` starts the service by itself; call this to wait for the pool.
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

  /** Removes the service and waits (bounded) for its tasks to go; idempotent. */
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
    const created = await engine.call("POST", "/services/create", this.#spec(this.#desired), signal)
      .catch((err) => {
        this.#engine = null;
        engine.close();
        throw err;
      }) as { ID: string };
    this.#serviceId = created.ID;
    this.#schedule();
  }

  #spec(replicas: number): unknown {
    const o = this.#options;
    const env = { ...o.env, HUD_SERVE_TOKEN: this.#token };
    return {
      Name: this.#name,
      Labels: {
        ...o.labels,
        [OWNER_LABEL]: String(Deno.pid),
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
      Mode: { Replicated: { Replicas: replicas } },
      // Host-mode publishing, a port per task: the ingress mesh needs IPVS.
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
    if (engine === null || this.#serviceId === null || this.#closed) return;
    const filters = encodeURIComponent(JSON.stringify({ service: [this.#serviceId] }));
    const [tasks, nodes] = await Promise.all([
      engine.call("GET", `/tasks?filters=${filters}`) as Promise<TaskInfo[]>,
      engine.call("GET", "/nodes") as Promise<NodeInfo[]>,
    ]);
    const byId = new Map(nodes.map((n) => [n.ID, n]));
    const seen = new Set<string>();
    for (const task of tasks) {
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
        taskId: task.ID,
        node: hostname,
        nodeId: node!.ID,
        host,
        port,
        url: withToken(`tcp://${host}:${port}`, this.#token),
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
    const engine = this.#engine!;
    const leased = [...this.#replicas.values()].reduce((n, r) => n + r.leases, 0);
    const demand = leased + this.#waiters.length;
    if (demand > 0) this.#idleSince = Date.now();
    let want = this.#desired;
    const needed = Math.ceil(demand / this.#width);
    if (needed > this.#desired) want = Math.min(this.#max, needed);
    else if (
      demand === 0 && Date.now() - this.#idleSince >= (this.#options.scaleDownAfter ?? 10_000)
    ) {
      // Scaling down only when idle: the swarm picks which tasks to stop, busy or not.
      want = this.#min;
    }
    if (want === this.#desired) return;
    const svc = await engine.call("GET", `/services/${this.#serviceId}`) as {
      Version: { Index: number };
      Spec: { Mode: { Replicated: { Replicas: number } } };
    };
    svc.Spec.Mode.Replicated.Replicas = want;
    try {
      await engine.call(
        "POST",
        `/services/${this.#serviceId}/update?version=${svc.Version.Index}`,
        svc.Spec,
      );
      this.#desired = want;
    } catch (err) {
      // Another update came first ("update out of sequence"): retry at the next poll.
      if (!(err instanceof EngineError)) throw err;
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
        service: this.#name,
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
      if (engine === null || this.#serviceId === null) return;
      try {
        await engine.call("DELETE", `/services/${this.#serviceId}`);
      } catch (err) {
        if (!(err instanceof EngineError) || err.status !== 404) throw err;
      }
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
          t.ServiceID === this.#serviceId && up.has(t.NodeID ?? "") &&
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
