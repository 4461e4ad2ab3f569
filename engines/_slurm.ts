// Talking to Slurm: through slurmrestd (OpenAPI v0.0.38, Slurm 22.05 and
// later, over a unix socket or HTTP, JWT or local authentication) where
// there is one, else through sbatch/scontrol/sinfo/scancel. The few calls
// SlurmRuntime and `hud gc` need.

import { errorMessage, isRecord } from "../_internal/util.ts";
import { isPeerGone } from "../_internal/io.ts";

/** A job to submit. */
export interface JobSpec {
  name: string;
  comment: string;
  script: string;
  tasks: number;
  nodes?: number;
  tasksPerNode?: number;
  cpusPerTask?: number;
  partition?: string;
  account?: string;
  qos?: string;
  /** Minutes. */
  timeLimit: number;
  /** Seconds before the time limit when the job is sent SIGTERM. */
  signalGrace: number;
  /** Variables of the job (the script's environment). */
  env: Record<string, string>;
  cwd: string;
  output: string;
  /** Extra sbatch options (command line only). */
  extra: string[];
}

/** A job's state. */
export interface JobInfo {
  /** PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL... ; "" once forgotten. */
  state: string;
  reason: string;
  nodes: string;
}

/** A job as `hud gc` sees it. */
export interface JobListing {
  id: string;
  name: string;
  comment: string;
  state: string;
}

/** How to reach Slurm. */
export interface SlurmConnection {
  submit(job: JobSpec, signal?: AbortSignal): Promise<string>;
  job(id: string): Promise<JobInfo>;
  cancel(id: string): Promise<void>;
  /** States of the named nodes (lower case: idle, mixed, down...). */
  nodeStates(names: string[]): Promise<Map<string, string>>;
  jobs(): Promise<JobListing[]>;
  close(): void;
}

/** Job states after which nothing runs. */
export const ENDED = new Set([
  "",
  "BOOT_FAIL",
  "CANCELLED",
  "COMPLETED",
  "DEADLINE",
  "FAILED",
  "NODE_FAIL",
  "OUT_OF_MEMORY",
  "PREEMPTED",
  "TIMEOUT",
]);

/** A refused call: Slurm's own words. */
export class SlurmError extends Error {
  /** An error with Slurm's `message`. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "SlurmError";
  }
}

/** slurmrestd: `unix:/path/to.sock` or `http://host:port`. */
export class RestConnection implements SlurmConnection {
  readonly #http: Deno.HttpClient | undefined;
  readonly #base: string;
  readonly #headers: Record<string, string>;
  readonly #where: string;

  constructor(url: string, user: string | undefined, token: string | undefined) {
    if (url.startsWith("unix:")) {
      const path = url.slice("unix:".length).replace(/^\/\/(?=\/)/, "");
      this.#http = Deno.createHttpClient({ proxy: { transport: "unix", path } });
      this.#base = "http://slurmrestd";
    } else if (/^https?:\/\//.test(url)) {
      this.#base = url.replace(/\/+$/, "");
    } else {
      throw new TypeError(
        `Cannot reach slurmrestd: "${url}" is not unix:/path or http(s)://host:port`,
      );
    }
    this.#where = url;
    this.#headers = {
      accept: "application/json",
      ...(user ? { "x-slurm-user-name": user } : {}),
      ...(token ? { "x-slurm-user-token": token } : {}),
    };
  }

  async #call(method: string, path: string, body?: unknown, signal?: AbortSignal) {
    let res: Response;
    try {
      res = await fetch(`${this.#base}/slurm/v0.0.38${path}`, {
        method,
        client: this.#http,
        headers: body === undefined
          ? this.#headers
          : { ...this.#headers, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
    } catch (err) {
      if (signal?.aborted) throw err;
      throw new Deno.errors.ConnectionRefused(
        `Cannot reach slurmrestd at ${this.#where}: ${errorMessage(err)}`,
        { cause: err },
      );
    }
    const text = await res.text();
    let json: Record<string, unknown> = {};
    try {
      json = JSON.parse(text);
    } catch {
      json = {};
    }
    const errors = Array.isArray(json.errors) ? json.errors.filter(isRecord) : [];
    if (!res.ok || errors.length > 0) {
      const words = errors.map((e) => e.error ?? e.description).filter(Boolean).join("; ") ||
        text.trim().slice(0, 300) || res.statusText;
      throw new SlurmError(`slurmrestd ${method} ${path}: ${res.status} ${words}`);
    }
    return json;
  }

  async submit(job: JobSpec, signal?: AbortSignal): Promise<string> {
    const reply = await this.#call("POST", "/job/submit", {
      script: job.script,
      job: {
        name: job.name,
        comment: job.comment,
        tasks: job.tasks,
        ...(job.nodes ? { nodes: [job.nodes, job.nodes] } : {}),
        ...(job.tasksPerNode ? { tasks_per_node: job.tasksPerNode } : {}),
        ...(job.cpusPerTask ? { cpus_per_task: job.cpusPerTask } : {}),
        ...(job.partition ? { partition: job.partition } : {}),
        ...(job.account ? { account: job.account } : {}),
        ...(job.qos ? { qos: job.qos } : {}),
        time_limit: job.timeLimit,
        // To the job's steps: slurmrestd 22.05 refuses the "B:" (batch shell) form.
        signal: `TERM@${job.signalGrace}`,
        // As sbatch spells --no-kill inside (22.05 takes no boolean here).
        no_kill: "set",
        requeue: false,
        environment: job.env,
        current_working_directory: job.cwd,
        standard_output: job.output,
        standard_error: job.output,
      },
    }, signal);
    const id = reply.job_id;
    if (typeof id !== "number" && typeof id !== "string") {
      throw new SlurmError(`slurmrestd gave no job id: ${JSON.stringify(reply).slice(0, 200)}`);
    }
    return String(id);
  }

  async job(id: string): Promise<JobInfo> {
    let reply: Record<string, unknown>;
    try {
      reply = await this.#call("GET", `/job/${id}`);
    } catch (err) {
      // Forgotten after MinJobAge: it ended.
      if (err instanceof SlurmError && /invalid job id|not found/i.test(err.message)) {
        return { state: "", reason: "", nodes: "" };
      }
      throw err;
    }
    const job = (Array.isArray(reply.jobs) ? reply.jobs[0] : undefined) as
      | Record<string, unknown>
      | undefined;
    return {
      state: String(job?.job_state ?? ""),
      reason: String(job?.state_reason ?? ""),
      nodes: String(job?.nodes ?? ""),
    };
  }

  async cancel(id: string): Promise<void> {
    try {
      await this.#call("DELETE", `/job/${id}`);
    } catch (err) {
      if (
        err instanceof SlurmError && /already completed|invalid job id|not found/i.test(err.message)
      ) return;
      throw err;
    }
  }

  async nodeStates(names: string[]): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    await Promise.all(names.map(async (name) => {
      try {
        const reply = await this.#call("GET", `/node/${encodeURIComponent(name)}`);
        const node = (Array.isArray(reply.nodes) ? reply.nodes[0] : undefined) as
          | Record<string, unknown>
          | undefined;
        out.set(name, String(node?.state ?? "unknown").toLowerCase());
      } catch {
        out.set(name, "unknown");
      }
    }));
    return out;
  }

  async jobs(): Promise<JobListing[]> {
    const reply = await this.#call("GET", "/jobs");
    return (Array.isArray(reply.jobs) ? reply.jobs.filter(isRecord) : []).map((j) => ({
      id: String(j.job_id),
      name: String(j.name ?? ""),
      comment: String(j.comment ?? ""),
      state: String(j.job_state ?? ""),
    }));
  }

  close(): void {
    this.#http?.close();
  }
}

/** sbatch, scontrol, sinfo and scancel, found on PATH. */
export class CommandConnection implements SlurmConnection {
  readonly #env: Record<string, string>;

  /** @param slurmConf SLURM_CONF for the commands, if not the default */
  constructor(slurmConf?: string) {
    this.#env = slurmConf ? { SLURM_CONF: slurmConf } : {};
  }

  async #run(
    cmd: string,
    args: string[],
    options: { stdin?: string; env?: Record<string, string>; signal?: AbortSignal } = {},
  ): Promise<{ ok: boolean; out: string; err: string }> {
    let child: Deno.ChildProcess;
    try {
      child = new Deno.Command(cmd, {
        args,
        env: { ...this.#env, ...options.env },
        stdin: options.stdin === undefined ? "null" : "piped",
        stdout: "piped",
        stderr: "piped",
        signal: options.signal ?? AbortSignal.timeout(60_000),
      }).spawn();
    } catch (err) {
      throw new Deno.errors.NotFound(
        `Cannot run ${cmd}: ${
          errorMessage(err)
        }; install Slurm's client commands or give slurmrestd`,
        { cause: err },
      );
    }
    if (options.stdin !== undefined) {
      const w = child.stdin.getWriter();
      try {
        await w.write(new TextEncoder().encode(options.stdin));
        await w.close();
      } catch (err) {
        // The command exited without reading (a bad configuration): its output says why.
        if (!isPeerGone(err)) throw err;
      }
    }
    const out = await child.output();
    const dec = new TextDecoder();
    // One line for errors: the command's own prefix off, lines joined.
    const err = dec.decode(out.stderr).trim().split("\n").map((l) =>
      l.replace(new RegExp(`^${cmd}: `), "").trim()
    ).filter((l) => l !== "").join("; ");
    return { ok: out.success, out: dec.decode(out.stdout), err };
  }

  /** Where the commands look for the cluster, for errors that may mean it is not found. */
  #wayOut(): string {
    return `; is SLURM_CONF (${
      this.#env.SLURM_CONF ?? Deno.env.get("SLURM_CONF") ?? "the default /etc/slurm/slurm.conf"
    }) this cluster's? Or give slurmrestd (SLURMRESTD)`;
  }

  async submit(job: JobSpec, signal?: AbortSignal): Promise<string> {
    // Values travel in the environment, names on the command line: the token is never an argument.
    const args = [
      "--parsable",
      `--job-name=${job.name}`,
      `--comment=${job.comment}`,
      `--ntasks=${job.tasks}`,
      ...(job.nodes ? [`--nodes=${job.nodes}`] : []),
      ...(job.tasksPerNode ? [`--ntasks-per-node=${job.tasksPerNode}`] : []),
      ...(job.cpusPerTask ? [`--cpus-per-task=${job.cpusPerTask}`] : []),
      ...(job.partition ? [`--partition=${job.partition}`] : []),
      ...(job.account ? [`--account=${job.account}`] : []),
      ...(job.qos ? [`--qos=${job.qos}`] : []),
      `--time=${job.timeLimit}`,
      `--signal=B:TERM@${job.signalGrace}`,
      "--no-kill",
      "--no-requeue",
      `--chdir=${job.cwd}`,
      `--output=${job.output}`,
      `--export=${Object.keys(job.env).join(",")}`,
      ...job.extra,
    ];
    const r = await this.#run("sbatch", args, { stdin: job.script, env: job.env, signal });
    if (!r.ok) {
      throw new SlurmError(`sbatch refused the job: ${r.err || r.out.trim()}${this.#wayOut()}`);
    }
    const id = r.out.trim().split(";")[0];
    if (!/^\d+$/.test(id)) throw new SlurmError(`sbatch gave no job id: "${r.out.trim()}"`);
    return id;
  }

  async job(id: string): Promise<JobInfo> {
    const r = await this.#run("scontrol", ["show", "job", "-o", id]);
    if (!r.ok) {
      if (/invalid job id/i.test(r.err)) return { state: "", reason: "", nodes: "" };
      throw new SlurmError(`scontrol show job ${id}: ${r.err}`);
    }
    const field = (k: string) => new RegExp(`(?:^| )${k}=(\\S*)`).exec(r.out)?.[1] ?? "";
    return { state: field("JobState"), reason: field("Reason"), nodes: field("NodeList") };
  }

  async cancel(id: string): Promise<void> {
    const r = await this.#run("scancel", [id]);
    if (!r.ok && !/already completed|invalid job id/i.test(r.err)) {
      throw new SlurmError(`scancel ${id}: ${r.err}`);
    }
  }

  async nodeStates(names: string[]): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    if (names.length === 0) return out;
    const r = await this.#run("sinfo", ["-h", "-N", "-n", names.join(","), "-o", "%N %T"]);
    for (const line of r.out.split("\n")) {
      const [name, state] = line.trim().split(/\s+/);
      if (name) out.set(name, (state ?? "unknown").toLowerCase());
    }
    return out;
  }

  async jobs(): Promise<JobListing[]> {
    const r = await this.#run("squeue", ["-h", "-o", "%i|%T|%j|%k"]);
    if (!r.ok) throw new SlurmError(`squeue failed: ${r.err}${this.#wayOut()}`);
    return r.out.split("\n").filter((l) => l !== "").map((l) => {
      const [id, state, name, ...comment] = l.split("|");
      return { id, state, name, comment: comment.join("|") };
    });
  }

  close(): void {}
}
