/**
 * {@linkcode runHarborTasks}: Harbor tasks run as Harbor's trial runner
 * does: the task's image in a container (`ContainerRuntime`, with the
 * task's CPUs and memory as limits) with its ENTRYPOINT kept, the
 * healthcheck awaited, the agent on it through the SSH workspace at the
 * task's workdir as `[agent] user` with `[agent] timeout_sec`, then
 * `tests/` copied in and the verifier run as `[verifier] user`. {@linkcode oracleAgent} runs
 * `solution/solve.sh`, so an oracle run validates a dataset.
 *
 * @module
 */

import type { Agent } from "../eval/agent.ts";
import { functionAgent } from "../eval/agent.ts";
import { Taskset } from "../eval/taskset.ts";
import type { RunRecord } from "../eval/results.ts";
import { ContainerRuntime } from "../engines/container.ts";
import { EngineClient } from "../engines/_engine.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { buildHarborImage, HarborBuildError, tarTree } from "./image.ts";
import type { HarborTask } from "./loader.ts";
import type { HarborHealthcheckConfig } from "./config.ts";
import type { Job } from "../eval/job.ts";
import { shellQuote } from "../_internal/shell.ts";
import { errorMessage } from "../_internal/util.ts";

/** Options for {@linkcode runHarborTasks}. */
export interface RunHarborOptions {
  /**
   * Engine socket.
   * @default as `ContainerRuntimeOptions.socket`
   */
  socket?: string;
  /**
   * Rollouts of each task.
   * @default 1
   */
  group?: number;
  /** Cancels the run. */
  signal?: AbortSignal;
  /** Called after each task, with its result. */
  onResult?: (result: HarborResult) => void;
}

/** How one Harbor task ended. */
export interface HarborResult {
  /** The task's name. */
  task: string;
  /** The reward (mean over the group's graded rollouts), or null when none was graded. */
  reward: number | null;
  /** The subscores of the first graded rollout (the keys of `reward.json`). */
  subscores: Record<string, number>;
  /** Why it failed (`build failed: ...`, `verifier timed out...`, `no reward written...`), or null. */
  error: string | null;
  /** Whether its image was built in this run (false: found by content hash). */
  built: boolean;
  /** The rollouts' records, traces included (empty when the build failed). */
  runs: RunRecord[];
}

/** Containers placed, by the host:port of their placement's url. */
const containers = new Map<string, { id: string; socket: string | undefined }>();

function placementKey(url: string): string {
  return new URL(url.replace(/^tcp:/, "http:")).host;
}

/** A ContainerRuntime that remembers which container each placement is, for copies into it. */
class HarborRuntime implements RuntimeProvider {
  readonly #inner: ContainerRuntime;
  readonly #socket: string | undefined;
  constructor(inner: ContainerRuntime, socket: string | undefined) {
    this.#inner = inner;
    this.#socket = socket;
  }
  async place(options?: PlaceOptions): Promise<Placement> {
    const placement = await this.#inner.place(options);
    const key = placementKey(placement.url);
    containers.set(key, { id: String(placement.params?.containerId), socket: this.#socket });
    return {
      ...placement,
      [Symbol.asyncDispose]: async () => {
        containers.delete(key);
        await placement[Symbol.asyncDispose]();
      },
    };
  }
}

/**
 * Copies the whole of `dir` (dot-files included, modes kept) to `dest` in
 * the container a run's client is connected to (Harbor's `upload_dir`).
 */
async function copyIn(clientUrl: string, dir: string, dest: string, signal?: AbortSignal) {
  const container = containers.get(placementKey(clientUrl));
  if (container === undefined) {
    throw new Error(`Cannot copy ${dir} in: no Harbor container for ${placementKey(clientUrl)}`);
  }
  using engine = await EngineClient.open(container.socket, signal);
  const tar = await tarTree(dir, dest.replace(/^\/+/, ""));
  const res = await engine.raw("PUT", `/containers/${container.id}/archive?path=/`, {
    body: tar,
    headers: { "content-type": "application/x-tar" },
    signal,
  });
  await res.body?.cancel();
}

/**
 * Harbor's oracle agent for `task`: copies `solution/` to /solution and runs
 * `bash /solution/solve.sh` through the SSH workspace, in the workdir, with
 * `[solution.env]`.
 *
 * @throws {TypeError} when the task has no `solution/solve.sh`
 */
export function oracleAgent(task: HarborTask): Agent {
  const dir = task.solutionDir;
  if (dir === null) {
    throw new TypeError(
      `Cannot run the oracle on Harbor task "${task.name}": it has no solution/solve.sh`,
    );
  }
  return functionAgent(async (_prompt, run, { signal }) => {
    await copyIn(run.client.url, dir, "/solution", signal);
    await using shell = await run.client.open("shell", { signal }) as unknown as {
      exec(cmd: string, o: { signal: AbortSignal }): Promise<{ code: number | null }>;
    } & AsyncDisposable;
    const cwd = (run.bindings.shell as { cwd?: string } | undefined)?.cwd ?? "/";
    // `[solution.env]` for solve.sh only, as Harbor's oracle runs it.
    const exports = Object.entries(task.config.solutionEnv)
      .map(([k, v]) => `export ${k}=${shellQuote(v)}; `).join("");
    await shell.exec(`${exports}cd ${shellQuote(cwd)} && bash /solution/solve.sh`, { signal });
  });
}

/** The agent, then `tests/` copied in (whatever the agent did), as Harbor's verifier does. */
function withTests(task: HarborTask, agent: Agent): Agent {
  return {
    async run(run, context) {
      try {
        await agent.run(run, context);
      } finally {
        await copyIn(run.client.url, task.testsDir, "/tests");
      }
    },
  };
}

function errorOf(record: RunRecord): string | null {
  const steps = (record.trace as { steps?: { type: string; content?: unknown }[] }).steps ?? [];
  const step = steps.findLast((s) => s.type === "error");
  return step ? String(step.content) : record.status === "completed" ? null : record.status;
}

/**
 * Runs each task: builds (or finds) its image, places it, runs the agent
 * with `[agent] timeout_sec`, copies `tests/` in, runs the verifier. A task
 * that fails is reported with why; the others still run.
 *
 * @param tasks tasks from `loadHarborTasks`
 * @param agent an agent, or `"oracle"` for each task's own solution
 * @param options engine socket, group size, abort signal, progress callback
 * @returns one result per task, in order
 */
export async function runHarborTasks(
  tasks: readonly HarborTask[],
  agent: Agent | "oracle",
  options: RunHarborOptions = {},
): Promise<HarborResult[]> {
  const results: HarborResult[] = [];
  for (const task of tasks) {
    options.signal?.throwIfAborted();
    const result = await runOne(task, agent, options);
    options.onResult?.(result);
    results.push(result);
  }
  return results;
}

async function runOne(
  task: HarborTask,
  agent: Agent | "oracle",
  options: RunHarborOptions,
): Promise<HarborResult> {
  const empty = { task: task.name, reward: null, subscores: {}, runs: [] };
  let image;
  try {
    image = await buildHarborImage(task, { socket: options.socket, signal: options.signal });
  } catch (err) {
    if (!(err instanceof HarborBuildError)) throw err;
    return { ...empty, error: err.message, built: true };
  }
  let inner: Agent;
  try {
    inner = agent === "oracle" ? oracleAgent(task) : agent;
  } catch (err) {
    return { ...empty, error: errorMessage(err), built: image.built };
  }
  const agentMs = task.config.agentTimeoutSec * 1000;
  const healthMs = healthcheckBound(task.config.environment.healthcheck);
  const job = await new Taskset([{
    env: `harbor-${task.name}`,
    id: "harbor",
    args: {},
    slug: task.name,
  }]).run(withTests(task, inner), {
    runtime: taskRuntime(task, image.image, image.user, options.socket),
    group: options.group ?? 1,
    agentTimeout: agentMs,
    // Placing, copying in and the verifier fit in the rest.
    rolloutTimeout: agentMs + healthMs + task.config.verifierTimeoutSec * 1000 + 120_000,
    signal: options.signal,
  });
  return harborResult(task.name, job, image.built);
}

/** The runtime of a task's container, with Harbor's semantics. */
function taskRuntime(
  task: HarborTask,
  image: string,
  imageUser: string,
  socket: string | undefined,
): HarborRuntime {
  const env = task.config.environment;
  // Another user than root anywhere (the image's USER, [agent] user,
  // [verifier] user): the server needs to switch to it (setpriv), give the
  // workdir to the agent's (chown), and drop the rest from what it runs.
  const switches = [imageUser, task.config.agentUser ?? "", task.config.verifierUser ?? ""]
    .some((u) => u !== "" && !/^(root|0)(:(root|0))?$/.test(u));
  return new HarborRuntime(
    new ContainerRuntime(image, {
      socket,
      cpus: env.cpus,
      memory: env.memoryMb * 1024 * 1024,
      // Harbor's semantics: the agent and the verifier are the container's
      // root (still without capabilities, under the runtime's seccomp list
      // and no-new-privileges), the image writable, the network of each
      // phase as the task says ("no-network": loopback alone; an
      // "allowlist" task is skipped by the loader).
      user: "0:0",
      capabilities: switches ? ["CHOWN", "SETUID", "SETGID", "SETPCAP"] : [],
      readOnly: false,
      network: {
        setup: task.config.network.environment.mode === "public",
        agent: task.config.network.agent.mode === "public",
        verifier: task.config.network.verifier.mode === "public",
      },
      labels: { "dev.hud.harbor.task": task.name },
    }),
    socket,
  );
}

/** The longest a healthcheck can take before it passes or fails, in ms. */
function healthcheckBound(hc: HarborHealthcheckConfig | null): number {
  if (hc === null) return 0;
  const startChecks = hc.startPeriodSec / Math.max(hc.startIntervalSec, 0.1);
  return (hc.startPeriodSec + (startChecks + hc.retries + 1) * hc.timeoutSec +
    hc.retries * hc.intervalSec) * 1000;
}

/** A task's result from its job: the mean reward of the graded runs, the first failure. */
function harborResult(name: string, job: Job, built: boolean): HarborResult {
  const runs = [...job.runs];
  const graded = runs.filter((r) => r.reward !== null);
  const live = job.liveRuns.find((r) => r?.grade !== null && r?.grade !== undefined);
  const subscores = (live?.grade as { subscores?: Record<string, number> } | null)?.subscores ?? {};
  const failed = runs.find((r) => r.reward === null);
  return {
    task: name,
    reward: graded.length === 0 ? null : graded.reduce((a, r) => a + r.reward!, 0) / graded.length,
    subscores,
    error: failed ? errorOf(failed) : null,
    built,
    runs,
  };
}
