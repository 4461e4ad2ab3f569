/**
 * Environments on Slurm: {@linkcode SlurmRuntime} serves a TypeScript
 * environment module on a cluster's nodes (Deno runs there; no image) and
 * leases the servers to rollouts, and {@linkcode cancelStaleJobs} cleans up
 * after a runner that was killed.
 *
 * @module
 */

import type { PlacementWithUrl, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { probeReady } from "../runtime/_probe.ts";
import { NotReadyError } from "../errors.ts";
import {
  controlAddress,
  generateToken,
  SERVE_PORT_VAR,
  SERVE_TOKEN_VAR,
  timingSafeEqual,
} from "../_internal/auth.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { closeQuietly } from "../_internal/io.ts";
import { acceptLoop } from "../_internal/accept.ts";
import { errorMessage } from "../_internal/util.ts";
import {
  CommandConnection,
  ENDED,
  type JobSpec,
  RestConnection,
  type SlurmConnection,
  SlurmError,
} from "./_slurm.ts";
import { LeasePool, Poller, type PoolMember } from "./_pool.ts";
import { processAlive } from "../_internal/process.ts";
import { checkPublicNetwork, type PublicNetwork } from "./_network_support.ts";

export { SlurmError };

/** The comment of every job: `hud:owner=HOST:PID`. */
export const OWNER_COMMENT = "hud:owner=";

/** Options for {@linkcode SlurmRuntime}. */
export interface SlurmRuntimeOptions {
  /**
   * The network its placements have: only `"public"` (the environment runs on the nodes' own network). Anything
   * else (`"none"`, an allowlist, a network by phase) is refused, never
   * silently run public: ContainerRuntime enforces those.
   * @default "public"
   */
  network?: PublicNetwork;
  /** The environment module the tasks serve (a path the nodes can read, or a URL). */
  module: string;
  /** Which environment of the module (an export or environment name). */
  envName?: string;
  /**
   * slurmrestd: `unix:/path/slurmrestd.sock` or `http://host:6820`.
   * @default `SLURMRESTD` from the environment, else sbatch/scontrol/scancel
   */
  rest?: string;
  /**
   * slurmrestd's JWT (from `scontrol token`).
   * @default `SLURM_JWT` from the environment, else none (local authentication)
   */
  token?: string;
  /**
   * The user the JWT is for.
   * @default `USER` (or `LOGNAME`), else "root" when running as root
   */
  user?: string;
  /** SLURM_CONF for the commands. */
  slurmConf?: string;
  /**
   * Servers (tasks) in the allocation.
   * @default nodes * tasksPerNode when both are given, else 1
   */
  tasks?: number;
  /** Nodes of the allocation (`--nodes`). */
  nodes?: number;
  /** Tasks on each node (`--ntasks-per-node`). */
  tasksPerNode?: number;
  /** CPUs of each task (`--cpus-per-task`). */
  cpusPerTask?: number;
  /** `--partition`. */
  partition?: string;
  /** `--account`. */
  account?: string;
  /** `--qos`. */
  qos?: string;
  /**
   * One job per placement, cancelled when released, instead of one
   * allocation whose tasks are leased.
   * @default false
   */
  jobPerPlacement?: boolean;
  /**
   * Rollouts one server serves at a time.
   * @default 1
   */
  width?: number;
  /**
   * The job's time limit, in ms (`--time`, whole minutes): the dead-man's
   * switch. The job's shell gets SIGTERM `signalGrace` seconds before it.
   * @default 3_600_000
   */
  time?: number;
  /**
   * Seconds between the graceful signal and the time limit (`--signal=B:TERM@N`).
   * @default 60
   */
  signalGrace?: number;
  /**
   * The address the tasks announce themselves to: this machine's, as the nodes reach it.
   * @default the first non-loopback IPv4 address of this machine
   */
  announceHost?: string;
  /**
   * Deno on the nodes.
   * @default this process's Deno (`Deno.execPath()`)
   */
  deno?: string;
  /**
   * Variables for the environment's process (the token is added).
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * The job's working directory.
   * @default "/tmp"
   */
  cwd?: string;
  /**
   * Where the job's output goes.
   * @default "/dev/null"
   */
  output?: string;
  /** More sbatch options (without slurmrestd). */
  sbatchArgs?: string[];
  /**
   * How long `place()` waits for a free ready server, in ms.
   * @default 120_000
   */
  readyTimeout?: number;
  /**
   * How often the runtime looks at its jobs, in ms.
   * @default 2_000
   */
  pollInterval?: number;
  /**
   * How long `close()` waits for the jobs to end, in ms.
   * @default 30_000
   */
  closeTimeout?: number;
}

/** Each task: serve on a port of its own and say so to the runner, and stop when the runner goes. */
const TASK = `exec 3<>"/dev/tcp/$HUD_ANNOUNCE_HOST/$HUD_ANNOUNCE_PORT" || exit 75
"$HUD_DENO" run -A "$HUD_CLI" serve "$HUD_MODULE" \${HUD_ENV_NAME:+--env "$HUD_ENV_NAME"} \\
  --host 0.0.0.0 --port 0 --stop-on-eof <&3 | while IFS= read -r line; do
  case "$line" in
  ${SERVE_PORT_VAR}=*) printf 'HUD_TASK %s %s %s %s %s\\n' "$HUD_ANNOUNCE_TOKEN" "$SLURM_JOB_ID" \\
    "$SLURM_STEP_ID" "$SLURMD_NODENAME" "\${line#${SERVE_PORT_VAR}=}" >&3 ;;
  esac
done`;

/** The batch script: a job step per task, so that a lost node ends only its own. */
function batchScript(): string {
  return `#!/bin/bash
# HUD environment servers for SlurmRuntime
trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' TERM
for i in $(seq 1 "\${SLURM_NTASKS:-1}"); do
  srun --ntasks=1 --nodes=1 --exact --kill-on-bad-exit=0 bash -c '${
    TASK.replaceAll("'", `'"'"'`)
  }' &
done
wait
`;
}

interface Task extends PoolMember {
  job: string;
  conn: Deno.TcpConn;
  checking: boolean;
}

function firstAddress(): string {
  for (const i of Deno.networkInterfaces()) {
    if (i.family === "IPv4" && !i.address.startsWith("127.")) return i.address;
  }
  return "127.0.0.1";
}

function checkPositive(what: string, value: number | undefined): void {
  if (value !== undefined && !(Number.isInteger(value) && value > 0)) {
    throw new RangeError(
      `Cannot create SlurmRuntime: ${what} must be a positive integer, got "${value}"`,
    );
  }
}

/** {@linkcode SlurmRuntimeOptions}, checked, with every default resolved. */
interface SlurmConfig {
  module: string;
  envName: string | undefined;
  connection: CancelStaleJobsOptions;
  /** The address the tasks announce themselves to; looked up when the listener opens. */
  announceHost: string | undefined;
  tasks: number;
  nodes: number | undefined;
  tasksPerNode: number | undefined;
  cpusPerTask: number | undefined;
  partition: string | undefined;
  account: string | undefined;
  qos: string | undefined;
  jobPerPlacement: boolean;
  width: number;
  /** The time limit in whole minutes. */
  timeLimit: number;
  signalGrace: number;
  deno: string;
  env: Record<string, string>;
  cwd: string;
  output: string;
  sbatchArgs: string[];
  readyTimeout: number;
  pollInterval: number;
  closeTimeout: number;
}

function resolveSlurmOptions(options: SlurmRuntimeOptions): SlurmConfig {
  if (typeof options?.module !== "string" || options.module === "") {
    throw new TypeError("Cannot create SlurmRuntime: module must be a non-empty string");
  }
  for (const k of ["tasks", "nodes", "tasksPerNode", "cpusPerTask", "width"] as const) {
    checkPositive(k, options[k]);
  }
  for (const k of ["time", "readyTimeout", "pollInterval", "closeTimeout"] as const) {
    const v = options[k];
    if (v !== undefined && !(v > 0)) {
      throw new RangeError(`Cannot create SlurmRuntime: ${k} must be positive, got "${v}"`);
    }
  }
  const grace = options.signalGrace;
  if (grace !== undefined && !(Number.isInteger(grace) && grace >= 0)) {
    throw new RangeError(
      `Cannot create SlurmRuntime: signalGrace must be a whole number of seconds, got "${grace}"`,
    );
  }
  const o = options;
  return {
    module: o.module,
    envName: o.envName,
    connection: { rest: o.rest, token: o.token, user: o.user, slurmConf: o.slurmConf },
    announceHost: o.announceHost,
    tasks: o.tasks ?? (o.nodes && o.tasksPerNode ? o.nodes * o.tasksPerNode : 1),
    nodes: o.nodes,
    tasksPerNode: o.tasksPerNode,
    cpusPerTask: o.cpusPerTask,
    partition: o.partition,
    account: o.account,
    qos: o.qos,
    jobPerPlacement: o.jobPerPlacement === true,
    width: o.width ?? 1,
    timeLimit: Math.max(1, Math.ceil((o.time ?? 3_600_000) / 60_000)),
    signalGrace: grace ?? 60,
    deno: o.deno ?? Deno.execPath(),
    env: { ...o.env },
    cwd: o.cwd ?? "/tmp",
    output: o.output ?? "/dev/null",
    sbatchArgs: [...(o.sbatchArgs ?? [])],
    readyTimeout: o.readyTimeout ?? 120_000,
    pollInterval: o.pollInterval ?? 2_000,
    closeTimeout: o.closeTimeout ?? 30_000,
  };
}

/**
 * The connection to Slurm: slurmrestd where one is named (`rest`, else
 * `SLURMRESTD`), as `user` (else `USER`, `LOGNAME`, or root) with `token`
 * (else `SLURM_JWT`); else the commands.
 */
function slurmConnection(options: CancelStaleJobsOptions): SlurmConnection {
  const rest = options.rest ?? Deno.env.get("SLURMRESTD");
  if (!rest) return new CommandConnection(options.slurmConf);
  const user = options.user ?? Deno.env.get("USER") ?? Deno.env.get("LOGNAME") ??
    (Deno.uid() === 0 ? "root" : undefined);
  return new RestConnection(rest, user, options.token ?? Deno.env.get("SLURM_JWT"));
}

/**
 * Serves an environment module on Slurm nodes. By default one allocation is
 * the pool: a job whose tasks (one job step each) run `serve --port 0`,
 * announce their node and port to this process over a connection they hold
 * (and stop when it closes, so that a runner that dies takes its servers
 * with it), and are leased to rollouts after a handshake, with no load
 * balancer in between. With `jobPerPlacement`, each placement is a job of
 * its own, cancelled on release.
 *
 * Through slurmrestd where there is one, else sbatch/scontrol/scancel. The
 * job's `--time` is the dead-man's switch, with SIGTERM to its shell
 * `signalGrace` seconds before; `close()` cancels the jobs; the job's
 * comment names this host and process for {@linkcode cancelStaleJobs}
 * (`hud gc`). A task whose node is lost leaves the pool, and a rollout on
 * it fails naming the node. The token is in the job's environment, never on
 * a command line.
 *
 * @example
 * ```ts ignore
 * import { connect } from "../client.ts";
 * import { SlurmRuntime } from "./slurm.ts";
 *
 * await using runtime = new SlurmRuntime({ module: "/shared/envs/robolab.ts", nodes: 4, tasksPerNode: 8 });
 * await using client = await connect(runtime);
 * console.log(client.manifest.env.name);
 * ```
 */
export class SlurmRuntime implements RuntimeProvider, AsyncDisposable {
  readonly #config: SlurmConfig;
  readonly #name: string;
  readonly #token = generateToken();
  readonly #pool: LeasePool;
  readonly #poller: Poller;
  readonly #jobs = new Map<string, { state: string; reason: string; ended: boolean }>();
  /** Per-placement jobs waiting for their task. */
  readonly #jobWaiters = new Map<string, (task: Task) => void>();
  readonly #checks = new Set<Promise<void>>();
  /**
   * Every task connection accepted and not yet closed: a task that died or
   * left the pool still holds one until it is closed here.
   */
  readonly #conns = new Set<Deno.TcpConn>();
  #slurm: SlurmConnection | null = null;
  #listener: Deno.TcpListener | null = null;
  #accepting: Promise<void> | null = null;
  #started: Promise<void> | null = null;
  #closed: Promise<void> | null = null;
  #lastError = "";

  /**
   * A runtime for `options.module` on a Slurm cluster.
   *
   * @param options the module, the allocation, slurmrestd or the commands
   * @throws {TypeError} for a missing module
   * @throws {RangeError} for counts or times out of range
   */
  constructor(options: SlurmRuntimeOptions) {
    checkPublicNetwork("SlurmRuntime", options?.network, "its jobs run on the nodes' own network");
    this.#config = resolveSlurmOptions(options);
    this.#name = `hud-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
    this.#pool = new LeasePool(this.#config.width, `Slurm job "${this.#name}"`);
    this.#poller = new Poller(this.#config.pollInterval, () => this.#refresh(), (err) => {
      this.#lastError = `reading the job: ${errorMessage(err)}`;
    });
  }

  /** The jobs' name. */
  get name(): string {
    return this.#name;
  }

  /** Ids of the jobs submitted and not known to have ended. */
  get jobIds(): string[] {
    return [...this.#jobs].filter(([, j]) => !j.ended).map(([id]) => id);
  }

  /** Ready servers now, by node. */
  get readyByNode(): Record<string, number> {
    return this.#pool.readyByNode;
  }

  /**
   * Submits the allocation (once) and waits until `n` servers are ready.
   * @throws {NotReadyError} when they are not ready in time, with the job's state
   */
  async ready(
    n: number = this.#config.tasks,
    options: { signal?: AbortSignal; timeout?: number } = {},
  ): Promise<void> {
    await this.#start(options.signal);
    const timeout = options.timeout ?? this.#config.readyTimeout;
    using deadline = new Deadline(timeout, options.signal, "Slurm tasks ready");
    while (this.#pool.readyCount < n) {
      if (this.#closed) throw this.#closedError();
      if (deadline.signal.aborted) {
        if (options.signal?.aborted) throw options.signal.reason;
        throw new NotReadyError(
          `Cannot ready job "${this.#name}": ${this.#pool.readyCount} of ${n} servers ready after ${timeout} ms${this.#lastErrorText()}`,
        );
      }
      const ended = this.#endedText();
      if (ended !== null && !this.#config.jobPerPlacement) {
        throw new NotReadyError(`Cannot ready job "${this.#name}": ${ended}`);
      }
      await delay(100, deadline.signal).catch(() => {});
    }
  }

  /**
   * Leases a ready server (or, with `jobPerPlacement`, submits a job for one).
   * @throws {NotReadyError} when none is ready in time, with the job's state
   */
  async place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    if (this.#closed) throw this.#closedError();
    options.signal?.throwIfAborted();
    await this.#start(options.signal);
    if (this.#config.jobPerPlacement) return await this.#placeJob(options.signal);
    const ended = this.#endedText();
    if (ended !== null && this.#pool.readyCount === 0) {
      throw new NotReadyError(`Cannot place on job "${this.#name}": ${ended}`);
    }
    const task = this.#pool.take() ?? await this.#pool.wait(
      this.#config.readyTimeout,
      options.signal,
      () => `(${this.#pool.readyCount} ready of ${this.#config.tasks}${this.#lastErrorText()})`,
    );
    // A moment for the task's connection to say that its server died with the rollout.
    return this.#pool.lease(task, undefined, () => delay(50));
  }

  /** Cancels the jobs, ends the tasks' connections, waits (bounded) for the jobs to end; idempotent. */
  close(): Promise<void> {
    this.#closed ??= this.#shutdown();
    return this.#closed;
  }

  /** Same as {@linkcode SlurmRuntime.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #closedError(): Error {
    return new Deno.errors.Interrupted(
      `Cannot place on job "${this.#name}": the SlurmRuntime is closed`,
    );
  }

  #lastErrorText(): string {
    return this.#lastError === "" ? "" : `; ${this.#lastError}`;
  }

  /** How the pool's job ended, or null while it may still serve. */
  #endedText(): string | null {
    for (const [id, j] of this.#jobs) {
      if (j.ended) {
        return `job ${id} ended${
          j.state ? ` (${j.state}${j.reason && j.reason !== "None" ? `, ${j.reason}` : ""})` : ""
        }`;
      }
    }
    return null;
  }

  #start(signal?: AbortSignal): Promise<void> {
    this.#started ??= this.#setUp(signal);
    return this.#started;
  }

  async #setUp(signal?: AbortSignal): Promise<void> {
    this.#slurm = slurmConnection(this.#config.connection);
    this.#listener = Deno.listen({
      hostname: this.#config.announceHost ?? firstAddress(),
      port: 0,
    });
    this.#accepting = this.#accept(this.#listener);
    if (!this.#config.jobPerPlacement) {
      try {
        await this.#submit(this.#config.tasks, signal);
      } catch (err) {
        this.#listener.close();
        await this.#accepting;
        this.#listener = null;
        throw err;
      }
    }
    this.#poller.start();
  }

  async #submit(tasks: number, signal?: AbortSignal): Promise<string> {
    const c = this.#config;
    const perPlacement = c.jobPerPlacement;
    const spec: JobSpec = {
      name: this.#name,
      comment: `${OWNER_COMMENT}${Deno.hostname()}:${Deno.pid}`,
      script: batchScript(),
      tasks,
      nodes: perPlacement ? 1 : c.nodes,
      tasksPerNode: perPlacement ? undefined : c.tasksPerNode,
      cpusPerTask: c.cpusPerTask,
      partition: c.partition,
      account: c.account,
      qos: c.qos,
      timeLimit: c.timeLimit,
      signalGrace: c.signalGrace,
      env: this.#jobEnv(),
      cwd: c.cwd,
      output: c.output,
      extra: c.sbatchArgs,
    };
    const id = await this.#slurm!.submit(spec, signal);
    this.#jobs.set(id, { state: "PENDING", reason: "", ended: false });
    return id;
  }

  /** The job's environment: what its tasks run, and where they announce themselves. */
  #jobEnv(): Record<string, string> {
    const c = this.#config;
    const cli = new URL("../cli.ts", import.meta.url);
    return {
      ...c.env,
      PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin",
      HOME: Deno.env.get("HOME") ?? "/tmp",
      ...(Deno.env.get("DENO_DIR") ? { DENO_DIR: Deno.env.get("DENO_DIR")! } : {}),
      [SERVE_TOKEN_VAR]: this.#token,
      HUD_ANNOUNCE_TOKEN: this.#token,
      HUD_ANNOUNCE_HOST: this.#listener!.addr.hostname,
      HUD_ANNOUNCE_PORT: String(this.#listener!.addr.port),
      HUD_DENO: c.deno,
      HUD_CLI: cli.protocol === "file:" ? decodeURIComponent(cli.pathname) : cli.href,
      HUD_MODULE: c.module,
      ...(c.envName ? { HUD_ENV_NAME: c.envName } : {}),
      NO_COLOR: "1",
    };
  }

  // -- announcements -----------------------------------------------------

  #accept(listener: Deno.TcpListener): Promise<void> {
    return acceptLoop(listener, (conn) => {
      this.#conns.add(conn);
      const check = this.#announced(conn).catch((err) => {
        this.#lastError = `a task's announcement: ${errorMessage(err)}`;
        this.#closeConn(conn);
      }).finally(() => this.#checks.delete(check));
      this.#checks.add(check);
    }, {
      closing: () => this.#closed !== null,
      onError: (err) => this.#lastError = `accepting a task: ${errorMessage(err)}`,
    });
  }

  /** Reads a task's line, checks its token, handshakes, and adds it to the pool. */
  async #announced(conn: Deno.TcpConn): Promise<void> {
    if (this.#closed) return this.#closeConn(conn);
    const task = this.#task(conn, await readLine(conn, 4096, 15_000));
    this.#pool.add(task);
    this.#watch(task);
    try {
      await probeReady(task.address, { readyTimeout: 30_000, retryInterval: 200 });
    } catch (err) {
      this.#drop(task, `no handshake: ${errorMessage(err)}`);
      const { host, port } = task.params;
      throw new Error(
        `task ${task.id} on node ${task.node} (${host}:${port}): ${errorMessage(err)}`,
      );
    }
    task.checking = false;
    const waiter = this.#jobWaiters.get(task.job);
    if (waiter) {
      this.#jobWaiters.delete(task.job);
      waiter(task);
    } else if (!this.#config.jobPerPlacement) {
      this.#pool.markReady(task);
    }
  }

  /**
   * The task a connection's first line announces: `HUD_TASK TOKEN JOB STEP
   * NODE PORT`, with the runtime's token.
   * @throws {Error} for a line without the token: not one of ours
   */
  #task(conn: Deno.TcpConn, line: string): Task {
    const [word, token, job, step, node, port] = line.trim().split(" ");
    const enc = new TextEncoder();
    if (
      word !== "HUD_TASK" || !token || !timingSafeEqual(enc.encode(token), enc.encode(this.#token))
    ) {
      throw new Error(`refused a connection from ${conn.remoteAddr.hostname}: not one of ours`);
    }
    const host = conn.remoteAddr.hostname;
    return {
      id: `${job}.${step}`,
      node,
      address: controlAddress(host, Number(port), this.#token),
      params: { job, step, node, host, port: Number(port), name: this.#name },
      ready: false,
      dead: null,
      leases: 0,
      lastUsed: 0,
      job,
      conn,
      checking: true,
    };
  }

  /** The task holds its connection open while it serves: its end is the task's. */
  #watch(task: Task): void {
    const watching = (async () => {
      const buf = new Uint8Array(64);
      try {
        while ((await task.conn.read(buf)) !== null) { /* nothing else is said */ }
      } catch {
        // reset, or closed here: the same
      }
      this.#pool.kill(task, `the task on node ${task.node} ended`);
      this.#closeConn(task.conn);
    })();
    this.#checks.add(watching);
    watching.finally(() => this.#checks.delete(watching));
  }

  // -- job per placement -------------------------------------------------

  async #placeJob(signal?: AbortSignal): Promise<PlacementWithUrl> {
    const timeout = this.#config.readyTimeout;
    using deadline = new Deadline(timeout, signal, "Slurm job");
    const id = await this.#submit(1, deadline.signal);
    try {
      const task = await new Promise<Task>((resolve, reject) => {
        this.#jobWaiters.set(id, resolve);
        const fail = () => {
          this.#jobWaiters.delete(id);
          if (signal?.aborted) return reject(signal.reason);
          const j = this.#jobs.get(id);
          reject(
            new NotReadyError(
              `Cannot place on Slurm: job ${id} not serving after ${timeout} ms (${
                j?.state ?? "?"
              }${j?.reason && j.reason !== "None" ? `, ${j.reason}` : ""})`,
            ),
          );
        };
        deadline.signal.addEventListener("abort", fail, { once: true });
        // A job that ends before its task announces itself.
        const watch = () => {
          if (!this.#jobWaiters.has(id)) return;
          const j = this.#jobs.get(id);
          if (j?.ended) {
            this.#jobWaiters.delete(id);
            deadline.signal.removeEventListener("abort", fail);
            reject(
              new NotReadyError(`Cannot place on Slurm: job ${id} ended (${j.state}, ${j.reason})`),
            );
          } else if (!deadline.signal.aborted) setTimeout(watch, 200);
        };
        watch();
      });
      task.ready = true;
      task.leases = 1;
      return this.#pool.lease(task, () => {
        this.#closeConn(task.conn);
        this.#cancel(id);
      });
    } catch (err) {
      this.#cancel(id);
      throw err;
    }
  }

  #cancel(id: string): void {
    const j = this.#jobs.get(id);
    if (!j || j.ended) return;
    const cancelling = this.#slurm!.cancel(id).then(() => {
      j.ended = true;
      j.state ||= "CANCELLED";
    }, (err) => {
      this.#lastError = `cancelling job ${id}: ${errorMessage(err)}`;
    });
    this.#checks.add(cancelling);
    cancelling.finally(() => this.#checks.delete(cancelling));
  }

  // -- polling -----------------------------------------------------------

  async #refresh(): Promise<void> {
    const slurm = this.#slurm;
    if (slurm === null || this.#closed) return;
    for (const [id, j] of this.#jobs) {
      if (j.ended) continue;
      const info = await slurm.job(id);
      j.state = info.state;
      j.reason = info.reason;
      if (ENDED.has(info.state)) {
        j.ended = true;
        for (const t of this.#pool.members() as Task[]) {
          if (t.job === id) this.#drop(t, `job ${id} ended (${info.state || "gone"})`);
        }
        if (!this.#config.jobPerPlacement) {
          this.#pool.rejectWaiters(() =>
            new NotReadyError(`Cannot place on job "${this.#name}": ${this.#endedText()}`)
          );
        }
      } else if (info.state === "PENDING") {
        this.#lastError = `job ${id} pending (${info.reason})`;
      } else if (this.#lastError.startsWith(`job ${id} pending`)) {
        this.#lastError = "";
      }
    }
    // A node that stops answering may keep its connections half-open: ask Slurm.
    const nodes = [...new Set(this.#pool.members().filter((m) => !m.dead).map((m) => m.node))];
    if (nodes.length === 0) return;
    const states = await slurm.nodeStates(nodes);
    for (const m of this.#pool.members()) {
      const s = states.get(m.node) ?? "";
      if (!m.dead && /down|fail|drain/.test(s)) this.#drop(m as Task, `node ${m.node} is ${s}`);
    }
  }

  /**
   * Takes a task out of the pool and ends its connection (which stops it,
   * if it still runs: a drained node's, a half-open one's).
   */
  #drop(task: Task, reason: string): void {
    this.#pool.kill(task, reason);
    this.#closeConn(task.conn);
  }

  #closeConn(conn: Deno.TcpConn): void {
    if (!this.#conns.delete(conn)) return;
    closeQuietly(conn);
  }

  async #shutdown(): Promise<void> {
    this.#pool.rejectWaiters(() => this.#closedError());
    await this.#started?.catch(() => {});
    await this.#poller.stop();
    const slurm = this.#slurm;
    try {
      if (slurm === null) return;
      for (const [id, j] of this.#jobs) {
        if (!j.ended) {
          await slurm.cancel(id).catch((err) => this.#lastError = errorMessage(err));
        }
      }
      // The tasks stop when their connection ends, whatever Slurm does.
      this.#listener?.close();
      // Every one accepted, not only the pool's: a dead task's, one still announcing.
      for (const conn of [...this.#conns]) this.#closeConn(conn);
      await this.#accepting;
      await Promise.allSettled([...this.#checks]);
      using deadline = new Deadline(this.#config.closeTimeout, undefined, "jobs ending");
      for (const [id, j] of this.#jobs) {
        while (!j.ended && !deadline.signal.aborted) {
          const info = await slurm.job(id).catch(() => ({ state: "", reason: "", nodes: "" }));
          if (ENDED.has(info.state)) j.ended = true;
          else await delay(250, deadline.signal).catch(() => {});
        }
      }
    } finally {
      slurm?.close();
      this.#slurm = null;
    }
  }
}

/** One line from `conn`, at most `max` bytes, within `ms`. */
async function readLine(conn: Deno.TcpConn, max: number, ms: number): Promise<string> {
  const parts: Uint8Array[] = [];
  let size = 0;
  const timer = setTimeout(() => closeQuietly(conn), ms);
  try {
    const buf = new Uint8Array(512);
    while (size < max) {
      const n = await conn.read(buf);
      if (n === null) break;
      const chunk = buf.slice(0, n);
      const nl = chunk.indexOf(10);
      if (nl >= 0) {
        parts.push(chunk.subarray(0, nl));
        break;
      }
      parts.push(chunk);
      size += n;
    }
  } finally {
    clearTimeout(timer);
  }
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return new TextDecoder().decode(out);
}

/** Options for {@linkcode cancelStaleJobs}. */
export interface CancelStaleJobsOptions {
  /** As {@linkcode SlurmRuntimeOptions.rest}. */
  rest?: string;
  /** As {@linkcode SlurmRuntimeOptions.token}. */
  token?: string;
  /** As {@linkcode SlurmRuntimeOptions.user}. */
  user?: string;
  /** As {@linkcode SlurmRuntimeOptions.slurmConf}. */
  slurmConf?: string;
}

/**
 * Cancels the jobs that runners on this host which are gone left queued or
 * running (their comment says `hud:owner=HOST:PID`).
 *
 * @returns the job ids cancelled
 */
export async function cancelStaleJobs(options: CancelStaleJobsOptions = {}): Promise<string[]> {
  const slurm = slurmConnection(options);
  try {
    const cancelled: string[] = [];
    const host = Deno.hostname();
    for (const job of await slurm.jobs()) {
      if (ENDED.has(job.state) || !job.comment.startsWith(OWNER_COMMENT)) continue;
      const [h, pid] = job.comment.slice(OWNER_COMMENT.length).split(":");
      if (h !== host || Number(pid) === Deno.pid || processAlive(Number(pid))) continue;
      await slurm.cancel(job.id);
      cancelled.push(job.id);
    }
    return cancelled;
  } finally {
    slurm.close();
  }
}
