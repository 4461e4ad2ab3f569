/**
 * {@linkcode runHarborTasks}: Harbor tasks run as Harbor's trial runner
 * does: the task's image in a container (`ContainerRuntime`, with the
 * task's CPUs and memory as limits) with its ENTRYPOINT kept, the
 * healthcheck awaited, the agent on it through the SSH workspace at the
 * task's workdir as `[agent] user` with `[agent] timeout_sec`, then
 * `tests/` copied in and the verifier run as `[verifier] user`; a task
 * with `[[steps]]`, each step so in turn in one container (harbor/_steps.ts);
 * a task whose verifier has a container of its own (`environment_mode =
 * "separate"`), the verifier there (harbor/_separate.ts); a task with
 * `environment/docker-compose.yaml`, its other services started first, the
 * agent and the verifier in `main` (harbor/_compose_run.ts).
 * {@linkcode oracleAgent} runs `solution/solve.sh`, so an oracle run validates a dataset.
 *
 * @module
 */

import type { Agent } from "../eval/agent.ts";
import type { RolloutObserver } from "../eval/rollout.ts";
import { isGraded } from "../eval/failure.ts";
import { functionAgent } from "../eval/agent.ts";
import { Taskset } from "../eval/taskset.ts";
import type { RunRecord } from "../eval/results.ts";
import { ContainerRuntime, type ContainerRuntimeOptions } from "../engines/container.ts";
import { containerPhaseNetwork } from "./_allowlist.ts";
import { EngineClient } from "../engines/_engine.ts";
import type { Placement, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { buildHarborImage, buildVerifierImage, HarborBuildError, tarTree } from "./image.ts";
import { composeImages, ComposeRuntime, composeStartBound } from "./_compose_run.ts";
import { alteredVerdict, type PlacedContainer, separateVerifier } from "./_separate.ts";
import { DOCKER_DEFAULT_CAPS } from "./_verifier_container.ts";
import type { HarborStep, HarborTask } from "./loader.ts";
import { runTrial, scoreOf, type Trial } from "./_steps.ts";
import { exists } from "../_internal/fs.ts";
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
  /**
   * Tasks run at once (each builds its image, then runs its group).
   * @default 1
   */
  maxConcurrent?: number;
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
  /**
   * How the first graded rollout's verifier ended: `tests/test.sh`'s exit
   * code (null when a signal ended it) and the tail of its output (why a 0
   * is a 0), or null when none ran.
   */
  verifier: { code: number | null; output: string } | null;
  /**
   * Why it failed (`build failed: ...`, `verifier timed out...`, `no reward written...`), or
   * why a graded rollout did not complete (the agent's time-out, tampering), or null.
   */
  error: string | null;
  /** Whether its image was built in this run (false: found by content hash). */
  built: boolean;
  /** The rollouts' records, traces included (empty when the build failed). */
  runs: RunRecord[];
}

/** Containers placed, by the host:port of their placement's url. */
const containers = new Map<string, PlacedContainer>();

function placementKey(url: string): string {
  return new URL(url.replace(/^tcp:/, "http:")).host;
}

/** A ContainerRuntime that remembers which container each placement is, for copies into it. */
class HarborRuntime implements RuntimeProvider {
  readonly #inner: ContainerRuntime | ComposeRuntime;
  readonly #socket: string | undefined;
  constructor(inner: ContainerRuntime | ComposeRuntime, socket: string | undefined) {
    this.#inner = inner;
    this.#socket = socket;
  }
  async place(options?: PlaceOptions): Promise<Placement> {
    const placement = await this.#inner.place(options);
    const key = placementKey(placement.url);
    containers.set(key, {
      id: String(placement.params?.containerId),
      socket: this.#socket,
      enterPhase: placement.enterPhase?.bind(placement),
    });
    return {
      ...placement,
      [Symbol.asyncDispose]: async () => {
        containers.delete(key);
        await placement[Symbol.asyncDispose]();
      },
    };
  }
}

/** The container a run's client is connected to. */
function placedContainer(clientUrl: string): PlacedContainer {
  const container = containers.get(placementKey(clientUrl));
  if (container === undefined) {
    throw new Error(`Cannot reach the Harbor container of ${placementKey(clientUrl)}: not placed`);
  }
  return container;
}

/**
 * Copies the whole of `dir` (dot-files included, modes kept) to `dest` in
 * the container a run's client is connected to (Harbor's `upload_dir`).
 */
async function copyIn(clientUrl: string, dir: string, dest: string, signal?: AbortSignal) {
  const container = placedContainer(clientUrl);
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
 * `[solution.env]`. In a task with `[[steps]]`, each step's: its
 * `steps/NAME/solution/` when it has one, else the task's.
 *
 * @throws {TypeError} when the task (or one of its steps) has no `solve.sh`
 */
export function oracleAgent(task: HarborTask): Agent {
  const dirs = task.steps === null ? [task.solutionDir] : task.steps.map((s) => s.solutionDir);
  const missing = dirs.findIndex((d) => d === null);
  if (missing >= 0) {
    const where = task.steps === null
      ? "solution/solve.sh"
      : `steps/${task.steps[missing].config.name}/solution/solve.sh nor solution/solve.sh`;
    throw new TypeError(`Cannot run the oracle on Harbor task "${task.name}": it has no ${where}`);
  }
  return functionAgent(async (_prompt, run, { signal }) => {
    const step = run.task.args.step;
    const dir = dirs[typeof step === "number" ? step : 0]!;
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

/**
 * Copies `tests/` in once the agent is done, however it ended (finished,
 * failed, or out of `[agent] timeout_sec`, which Harbor grades too), before
 * the verifier runs.
 */
function testsCopier(task: HarborTask): RolloutObserver {
  return { after: (run, signal) => copyIn(run.client.url, task.testsDir, "/tests", signal) };
}

/** A step's {@linkcode testsCopier}: the task's `tests/` (when it has one), then the step's over it, as Harbor uploads them. */
function stepTestsCopier(task: HarborTask, step: HarborStep): RolloutObserver {
  return {
    after: async (run, signal) => {
      if (await exists(task.testsDir)) {
        await copyIn(run.client.url, task.testsDir, "/tests", signal);
      }
      if (step.testsDir !== null) await copyIn(run.client.url, step.testsDir, "/tests", signal);
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
 * @param options engine socket, group size, tasks at once, abort signal, progress callback
 * @throws {RangeError} when `maxConcurrent` is not an integer >= 1
 * @returns one result per task, in order
 */
export async function runHarborTasks(
  tasks: readonly HarborTask[],
  agent: Agent | "oracle",
  options: RunHarborOptions = {},
): Promise<HarborResult[]> {
  const limit = options.maxConcurrent ?? 1;
  if (!(Number.isSafeInteger(limit) && limit >= 1)) {
    throw new RangeError(
      `Cannot run Harbor tasks: maxConcurrent must be an integer >= 1, got ${limit}`,
    );
  }
  const results: HarborResult[] = new Array(tasks.length);
  let next = 0;
  // Each worker takes the next task until none is left; results stay in the tasks' order.
  const worker = async () => {
    while (next < tasks.length) {
      const i = next++;
      options.signal?.throwIfAborted();
      results[i] = await runOne(tasks[i], agent, options);
      options.onResult?.(results[i]);
    }
  };
  const settled = await Promise.allSettled(
    Array.from({ length: Math.min(limit, tasks.length) }, worker),
  );
  const failed = settled.find((s) => s.status === "rejected");
  if (failed !== undefined) throw failed.reason;
  return results;
}

async function runOne(
  task: HarborTask,
  agent: Agent | "oracle",
  options: RunHarborOptions,
): Promise<HarborResult> {
  const empty = { task: task.name, reward: null, subscores: {}, verifier: null, runs: [] };
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
  if (task.steps !== null) return await runSteps(task, inner, image, options);
  const observer = await verification(task, options);
  if (typeof observer === "string") return { ...empty, error: observer, built: image.built };
  // A compose task's other services: their images built (or pulled) once for the group.
  let services = new Map<string, string>();
  if (task.compose !== null) {
    try {
      const made = await composeImages(task, task.compose, options);
      services = made.images;
      image.built ||= made.built;
    } catch (err) {
      if (!(err instanceof HarborBuildError)) throw err;
      return { ...empty, error: err.message, built: true };
    }
  }
  const agentMs = task.config.agentTimeoutSec * 1000;
  const healthMs = healthcheckBound(task.config.environment.healthcheck) +
    (task.compose === null ? 0 : composeStartBound(task.compose));
  const job = await new Taskset([{
    env: `harbor-${task.name}`,
    id: "harbor",
    args: {},
    slug: task.name,
  }]).run(inner, {
    runtime: taskRuntime(task, image.image, options.socket, services),
    observers: [observer],
    group: options.group ?? 1,
    agentTimeout: agentMs,
    // Placing, copying in and the verifier fit in the rest.
    rolloutTimeout: agentMs + healthMs + task.config.verifierTimeoutSec * 1000 + 120_000,
    signal: options.signal,
  });
  return harborResult(task.name, job, image.built);
}

/**
 * What runs the verifier once the agent is done: `tests/` copied into the
 * task's container, or, for a verifier of its own ("separate"), its image
 * built and the observer that runs it; or why its image did not build.
 */
async function verification(
  task: HarborTask,
  options: RunHarborOptions,
): Promise<RolloutObserver | string> {
  if (task.config.verifierMode === "shared") return testsCopier(task);
  try {
    const image = await buildVerifierImage(task, {
      socket: options.socket,
      signal: options.signal,
    });
    return separateVerifier(task, image, placedContainer);
  } catch (err) {
    if (!(err instanceof HarborBuildError)) throw err;
    return err.message;
  }
}

/**
 * The runtime of a task's container, with Harbor's semantics; of a compose
 * task, its services (`services`: their images) started first, each rollout.
 */
function taskRuntime(
  task: HarborTask,
  image: string,
  socket: string | undefined,
  services = new Map<string, string>(),
): HarborRuntime {
  const env = task.config.environment;
  const options: ContainerRuntimeOptions = {
    socket,
    cpus: env.cpus,
    memory: env.memoryMb * 1024 * 1024,
    // Harbor's semantics: the agent and the verifier are the container's
    // root with Docker's default capabilities (under the runtime's seccomp
    // list and no-new-privileges), the image writable, the network of each
    // phase as the task says ("no-network": loopback alone; "allowlist":
    // loopback alone and the egress proxy, `_allowlist.ts`).
    user: "0:0",
    capabilities: DOCKER_DEFAULT_CAPS,
    readOnly: false,
    network: {
      setup: containerPhaseNetwork(task.config.network.environment),
      agent: containerPhaseNetwork(task.config.network.agent),
      // A separate verifier's phase is in its own container: this one has
      // none then (Harbor stops it before the verifier's starts).
      verifier: task.config.verifierMode === "shared"
        ? containerPhaseNetwork(task.config.network.verifier)
        : "none",
    },
    // Which task a container runs, by name and by folder (`docker ps --filter label=...`).
    labels: { "dev.hud.harbor.task": task.name, "dev.hud.harbor.path": task.path },
  };
  return new HarborRuntime(
    task.compose === null
      ? new ContainerRuntime(image, options)
      : new ComposeRuntime(task, image, services, options),
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

/** How much of the verifier's output a result keeps: its last lines, for why a 0 is a 0. */
const VERIFIER_OUTPUT_SHOWN = 2000;

/** What a result keeps of a grade's `info.verifier`: the exit code and the output's tail. */
function verifierSummary(ran: unknown): HarborResult["verifier"] {
  if (typeof ran !== "object" || ran === null) return null;
  const { exit_code: code, stdout } = ran as Record<string, unknown>;
  return {
    code: typeof code === "number" ? code : null,
    output: String(stdout ?? "").slice(-VERIFIER_OUTPUT_SHOWN),
  };
}

/** A task's result from its job: the mean reward of the graded runs, the first failure. */
function harborResult(name: string, job: Job, built: boolean): HarborResult {
  const runs = [...job.runs];
  // A separate verifier's verdict that came back altered is no reward.
  const altered = job.liveRuns.map((r) => r === null ? null : alteredVerdict(r));
  // Graded as eval/failure.ts counts it: a tampered rollout's 0 is not a reward.
  const graded = runs.filter((r, i) => isGraded(r) && altered[i] === null);
  const live = job.liveRuns.find((r) => r?.grade !== null && r?.grade !== undefined);
  const subscores = (live?.grade as { subscores?: Record<string, number> } | null)?.subscores ?? {};
  const ran = (live?.grade?.info as { verifier?: unknown } | undefined)?.verifier;
  // Ungraded, else graded but not completed (tampered, the agent's time-out).
  const failed = runs.find((r) => !isGraded(r)) ??
    runs.find((r) => r.status !== "completed");
  return {
    task: name,
    reward: graded.length === 0 ? null : graded.reduce((a, r) => a + r.reward!, 0) / graded.length,
    subscores,
    verifier: verifierSummary(ran),
    error: altered.find((a) => a !== null) ?? (failed ? errorOf(failed) : null),
    built,
    runs,
  };
}

/**
 * Runs a task with `[[steps]]`: `group` trials, each in a container of its
 * own through every step (harbor/_steps.ts), one after the other.
 */
async function runSteps(
  task: HarborTask,
  agent: Agent,
  image: { image: string; built: boolean },
  options: RunHarborOptions,
): Promise<HarborResult> {
  const jobId = crypto.randomUUID();
  const groupId = `${jobId}:${task.name}`;
  const taskHealth = healthcheckBound(task.config.environment.healthcheck);
  const trials: Trial[] = [];
  for (let repeat = 0; repeat < (options.group ?? 1); repeat++) {
    options.signal?.throwIfAborted();
    trials.push(
      await runTrial(task, agent, {
        runtime: taskRuntime(task, image.image, options.socket),
        observers: (step) => [stepTestsCopier(task, step)],
        healthBound: (i) =>
          (i === 0 ? taskHealth : 0) + healthcheckBound(task.steps![i].config.healthcheck),
        jobId,
        groupId,
        repeat,
        signal: options.signal,
      }),
    );
  }
  return stepsResult(task.name, trials, image.built);
}

/**
 * A multi-step task's result: the mean over its graded trials of each
 * one's score (Harbor's combination of its steps' rewards); the subscores
 * of the first graded trial, its combined keys and each step's as
 * `STEP/KEY`; its last step's verifier; the first failure, named by step.
 */
function stepsResult(name: string, trials: Trial[], built: boolean): HarborResult {
  const graded = trials.filter((t) => t.rewards !== null);
  const first = graded[0];
  const subscores: Record<string, number> = { ...first?.rewards };
  for (const step of first?.steps ?? []) {
    for (const [key, value] of Object.entries(step.rewards)) {
      subscores[`${step.name}/${key}`] = value;
    }
  }
  const failed = trials.find((t) => t.failed !== null)?.failed ??
    trials.flatMap((t) => t.records.map((r) => ({ r, t })))
      .filter(({ r }) => r.status !== "completed")
      .map(({ r }) => ({ step: r.task.slug.slice(name.length + 1), record: r }))[0];
  return {
    task: name,
    reward: graded.length === 0
      ? null
      : graded.reduce((a, t) => a + scoreOf(t.rewards!), 0) / graded.length,
    subscores,
    verifier: verifierSummary(first?.info?.verifier),
    error: failed ? `step "${failed.step}": ${errorOf(failed.record)}` : null,
    built,
    runs: trials.flatMap((t) => t.records),
  };
}
