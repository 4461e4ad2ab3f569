// `hud eval FILE`: run an agent (a command, or a model) against an
// environment's tasks, locally or on a container engine, and grade each
// rollout. A thin layer: it reads the flags into the library's options
// (whose checks, made before the environment loads, are its usage errors),
// runs Taskset.run(), and prints (cli/_eval_print.ts). The engines are
// loaded only when --runtime names one (cli/_eval_runtime.ts), the model
// proxy only when --model-proxy asks for it (cli/_eval_training.ts).

import type { Environment, TaskRow } from "../env.ts";
import type { RuntimeProvider } from "../runtime/placement.ts";
import { loadEnvironment } from "../loader.ts";
import type { Agent } from "../eval/agent.ts";
import { CommandAgent, type CommandAgentOptions, parseEnvFile } from "../agents/command.ts";
import { MODEL_FLAGS, MODEL_FLAGS_HELP, modelAgentFromFlags } from "../agents/_cli.ts";
import type { Job } from "../eval/job.ts";
import { prepareResults } from "../eval/results.ts";
import { Taskset, type TasksetRunConfig, type TasksetRunOptions } from "../eval/taskset.ts";
import { errorMessage } from "../_internal/util.ts";
import {
  EXIT_FAILURE,
  EXIT_OK,
  type Io,
  type OptionSpec,
  parseCommand,
  positiveIntOption,
  PROGRAM,
  stringOption,
  UsageError,
  type Values,
} from "./_common.ts";
import {
  commandShown,
  interrupted,
  printJob,
  printStart,
  ProgressLine,
  stopLine,
} from "./_eval_print.ts";
import { evalRows, selectRows } from "./_eval_rows.ts";
import { proxyOptions, runOptions } from "./_eval_options.ts";
import { RunProxy, TrainingOut } from "./_eval_training.ts";
import { evalRuntime, type RuntimeChoice, runtimeChoice } from "./_eval_runtime.ts";

/** The help of `hud eval`. */
export const USAGE: string =
  `Usage: ${PROGRAM} eval FILE (--agent CMD | --model NAME) [--env NAME] [--tasks ROWS] [--group N]
            [--filter GLOB]... [--limit N] [--max-concurrent N] [--retries N]
            [--timeout S] [--agent-timeout S] [--token-limit N] [--cost-limit USD]
            [--pass-env NAME]... [--env-file PATH] [--max-output BYTES]
            [--out results.jsonl [--resume] [--force]] [--json]
            [--runtime WHERE [--container-network] [--container-env NAME=VALUE]...]
            [--model-proxy URL [--model-server KIND] [--proxy-model NAME]]
            [--training-out FILE]

FILE may be harbor:PATH, a Harbor task directory or a dataset of them: each
task runs in a container of its own Dockerfile's image (built once, cached
by content), its instruction the prompt, its tests/test.sh the grader;
--agent oracle runs each task's solution/solve.sh (a dataset validates when
every task scores 1.0). With harbor:PATH only --agent, --model flags,
--group, --filter (over task names), --limit, --max-concurrent (tasks at
once, default 1) and --json apply.

Serves the environment module FILE in this process and runs the agent
command CMD once per task and repeat, grading each answer. The tasks are
the rows in ROWS (a .json or .jsonl taskset; a row without "slug" gets the
Python SDK's), else the module's "tasks" export, else every template that
needs no arguments.

CMD follows the command agent contract: prompt on stdin and in the file
named by HUD_PROMPT_FILE (and in HUD_PROMPT when under 64 KiB), capability
urls in HUD_CAP_<NAME>_URL, the answer on stdout. It gets only PATH, HOME
and the HUD_* variables, plus what --pass-env and --env-file give it. The
command itself is not echoed: it may hold secrets.

On a terminal the progress is one live line; otherwise one line per
finished rollout. For a model agent it shows the tokens and cost so far and
the adaptive limit on model calls in flight (it starts at 20 or
--max-concurrent, shrinks on rate limits and grows back). A table per task
closes the run, then the first error of each failing task. Results are only
ever appended to the --out file, one synced line per rollout attempt;
--resume runs only what is not graded there.

--retries N tries a rollout again (with backoff) when it failed for the
infrastructure's reasons: the environment could not be placed, a connection
was lost, or the model server stayed unavailable after its own retries;
never for the agent's own errors, timeouts or a context overflow. Every
attempt stays in the --out file; the latest counts.

--token-limit and --cost-limit stop the job once its model calls used that
many tokens or dollars (every attempt in the --out file counts): no new
rollouts start and running ones finish; rerun with --resume (and a higher
limit, or none) to go on.

SIGINT, SIGTERM or SIGHUP stop the job: running agents get SIGTERM, then
SIGKILL after 2 s (a second signal kills them at once), the environment's
shutdown hooks run, and key files are removed.

Exit codes: 0 when every rollout was graded, 1 when any was not (or the
environment could not start), 2 for bad usage, 130 when interrupted.

Options:
  --agent CMD           the agent command, run with bash -c
  --env NAME            the environment, by export or environment name
  --tasks ROWS          a taskset file to run instead of the module's tasks (each
                        row checked against the templates before any starts)
  --filter GLOB         run only the tasks whose slug or id matches
                        ("*" matches anything; repeatable: any of them)
  --limit N             run only the first N tasks (after --filter)
  --group N             rollouts per task (default: 1); the table then
                        shows mean ± standard error, and pass@1 and pass@N
  --max-concurrent N    rollouts at once (default: 4); also the bound of the
                        adaptive limit on model calls
  --retries N           tries after the first for a rollout that failed for
                        an infrastructure reason (default: 0)
  --token-limit N       stop starting rollouts past N tokens (prompt plus
                        completion) of model calls
  --cost-limit USD      stop starting rollouts past USD dollars of model
                        calls (priced by --pricing and the built-in prices)
  --timeout S           seconds each rollout may take (default: 600)
  --agent-timeout S     seconds the agent may take; what it answered by
                        then is still graded (default: the rollout's)
  --pass-env NAME       pass this variable of ours to the agent; a glob
                        such as "OPENAI_*" passes all that match (repeatable)
  --env-file PATH       NAME=value lines for the agent's environment
  --max-output BYTES    the most an agent may write on stdout; past it the
                        rollout errors, ungraded (default: 16777216)
  --out FILE            append one JSON line per finished rollout
  --resume              with --out: keep what FILE holds, run the rest
                        (refused when the agent, its model or settings
                        differ from the job's: the message names them)
  --force               with --out: rename an existing FILE aside and
                        start over; with --resume: resume with another
                        agent anyway, mixing both into one job
  --json                print a JSON summary instead of the table
  --runtime WHERE       "local" (this process, the default),
                        "container:IMAGE" (a container per rollout, from an
                        image made by "${PROGRAM} image"), "swarm:IMAGE"
                        (a pool of replicas on the Docker Swarm whose
                        manager DOCKER_HOST names), "k8s:IMAGE" (a pool of
                        pods on the Kubernetes cluster KUBECONFIG names, or
                        the one this runs in) or "slurm[:PARTITION]" (the
                        tasks of one Slurm job serve FILE, through
                        slurmrestd when SLURMRESTD is set, else sbatch;
                        the nodes must read FILE at its path and reach this
                        machine at HUD_ANNOUNCE_HOST, by default its first
                        address); pools and jobs are removed at the end
  --container-network   with container:IMAGE, put each container on the
                        engine's bridge network, for an environment that
                        downloads or calls out (default: no network at all)
  --container-env NAME=VALUE
                        with container:IMAGE, a variable for the
                        environment in each container, such as
                        ROBOLAB_ISOLATION=none where the engine lets no
                        sandbox be made there (repeatable)
  --model-proxy URL     with --agent: put a recording proxy between the agent
                        and the model server at URL (its base url, up to /v1;
                        Anthropic's origin): each rollout gets its own
                        OPENAI_BASE_URL, OPENAI_API_KEY, ANTHROPIC_BASE_URL and
                        ANTHROPIC_API_KEY, and every call it makes is recorded
                        in its trace, with token ids where the server gives
                        them; the server's key (OPENAI_API_KEY, or
                        ANTHROPIC_API_KEY) stays with the proxy
  --model-server KIND   what serves URL: llama-server, vllm, sglang (asked for
                        token ids in their own fields), openai (any other
                        OpenAI-compatible server) or anthropic (default: openai)
  --proxy-model NAME    the model the proxy asks for, whatever the agent names
  --training-out FILE   append each group's training rows (as export-training
                        writes them) as JSON lines to FILE as soon as the
                        group is done; "-" writes them to standard output,
                        and the closing table to standard error
${MODEL_FLAGS_HELP}  -h, --help            show this help
`;

/** The options `hud eval` takes (parseArgs's spec). */
const OPTIONS: OptionSpec = {
  agent: { type: "string" },
  env: { type: "string" },
  tasks: { type: "string" },
  group: { type: "string" },
  filter: { type: "string", multiple: true },
  limit: { type: "string" },
  retries: { type: "string" },
  "token-limit": { type: "string" },
  "cost-limit": { type: "string" },
  "max-concurrent": { type: "string" },
  timeout: { type: "string" },
  "agent-timeout": { type: "string" },
  "pass-env": { type: "string", multiple: true },
  "env-file": { type: "string" },
  "max-output": { type: "string" },
  out: { type: "string" },
  resume: { type: "boolean" },
  force: { type: "boolean" },
  json: { type: "boolean" },
  "model-proxy": { type: "string" },
  "model-server": { type: "string" },
  "proxy-model": { type: "string" },
  "training-out": { type: "string" },
  ...MODEL_FLAGS,
  runtime: { type: "string" },
  "container-network": { type: "boolean" },
  "container-env": { type: "string", multiple: true },
};

/** The agent that runs: a model (`--model`), or a command (`--agent`). */
interface EvalAgent {
  readonly agent: Agent;
  /** What the opening line shows of it (never a command's arguments). */
  readonly label: string;
  /** The command agent, whose processes are killed and awaited at the end; null for a model. */
  readonly command: CommandAgent | null;
  /** The recording proxy the command agent's calls go through (`--model-proxy`), if any. */
  readonly proxy: RunProxy | null;
}

/** Everything the flags say, checked before the environment loads. */
interface EvalPlan {
  readonly agent: EvalAgent;
  readonly runtime: RuntimeChoice;
  /** The options for Taskset.run() (its runtime, signal and progress added at the end). */
  readonly options: TasksetRunOptions;
  /** Those options resolved by the library. */
  readonly config: TasksetRunConfig;
  readonly envName: string | undefined;
  readonly tasksFile: string | undefined;
  readonly filters: readonly string[];
  readonly limit: number | undefined;
  readonly json: boolean;
  /** `--training-out`: a file, `-` for standard output, or none. */
  readonly trainingOut: string | undefined;
}

/**
 * The command agent's flags (`--pass-env`, `--max-output`, `--env-file`,
 * read and checked now), checked whichever agent runs.
 * @throws {UsageError} for a bad name or size
 */
async function commandOptions(values: Values): Promise<CommandAgentOptions> {
  const passEnv = (values["pass-env"] ?? []) as string[];
  for (const name of passEnv) {
    if (!/^[A-Za-z_*][A-Za-z0-9_*]*$/.test(name)) {
      throw new UsageError(`--pass-env takes a variable name or glob, got "${name}"`);
    }
  }
  const maxOutputBytes = positiveIntOption(
    "--max-output",
    stringOption(values, "max-output"),
    16 * 1024 * 1024,
  );
  const envFile = stringOption(values, "env-file");
  if (envFile !== undefined) {
    const text = await Deno.readTextFile(envFile).catch((err) => {
      throw new Error(`Cannot read env file "${envFile}": ${errorMessage(err)}`, { cause: err });
    });
    parseEnvFile(text, `env file "${envFile}"`);
  }
  return { passEnv, envFile, maxOutputBytes };
}

/**
 * The agent the flags name: `--model` and its flags, or the `--agent`
 * command with the command agent's flags and `--model-proxy`'s proxy.
 * @throws {UsageError} for neither or both, or a bad flag of either
 */
async function evalAgent(values: Values): Promise<EvalAgent> {
  const command = stringOption(values, "agent");
  const model = await modelAgentFromFlags(values, (m) => new UsageError(m));
  if (model && command !== undefined) throw new UsageError("pass --agent or --model, not both");
  if (!model && (command === undefined || command.trim() === "")) {
    throw new UsageError(`missing --agent or --model (see "${PROGRAM} eval --help")`);
  }
  const options = await commandOptions(values);
  const proxyConfig = await proxyOptions(values);
  if (model && proxyConfig) {
    throw new UsageError("--model-proxy records a command agent's calls: use it with --agent");
  }
  if (model) return { agent: model.agent, label: model.label, command: null, proxy: null };
  const proxy = proxyConfig && new RunProxy(proxyConfig);
  const agent = new CommandAgent(command!, { ...options, modelProxy: proxy ?? undefined });
  return { agent, label: commandShown(command!), command: agent, proxy };
}

/**
 * Reads every flag into a plan, and refuses what can be refused before the
 * environment loads; an existing results file is checked (and with
 * `--force` moved aside) now too.
 */
async function evalPlan(values: Values, io: Io): Promise<EvalPlan> {
  const runtime = runtimeChoice(values);
  const agent = await evalAgent(values);
  const { options, config } = runOptions(values);
  const limited = config.tokenLimit !== undefined || config.costLimit !== undefined;
  if (limited && agent.command && !agent.proxy) {
    throw new UsageError(
      "--token-limit and --cost-limit count a model's calls: use them with --model or --model-proxy",
    );
  }
  const trainingOut = stringOption(values, "training-out");
  if (trainingOut === "") throw new UsageError("--training-out needs a file, or -");
  const plan: EvalPlan = {
    agent,
    runtime,
    options,
    config,
    envName: stringOption(values, "env"),
    tasksFile: stringOption(values, "tasks"),
    filters: (values.filter ?? []) as string[],
    limit: positiveIntOption("--limit", stringOption(values, "limit")),
    json: values.json === true,
    trainingOut,
  };
  if (config.out !== undefined) {
    const aside = await prepareResults(config.out, config);
    if (aside !== null) io.err(`eval: moved the old results to ${aside}\n`);
  }
  return plan;
}

/** Runs `hud eval` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "eval",
    usage: USAGE,
    options: OPTIONS,
    positionals: { names: ["FILE"], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [file] } = parsed;
  if (file.startsWith("harbor:")) {
    const { runHarborEval } = await import("./_eval_harbor.ts");
    return await runHarborEval(file.slice("harbor:".length), values, io);
  }
  const plan = await evalPlan(values, io);
  if (io.signal?.aborted) return interrupted(io, 0, 0);
  const env = await loadEnvironment(file, { name: plan.envName });
  let rows: TaskRow[];
  try {
    rows = selectRows(await evalRows(file, env, plan.tasksFile), plan.filters, plan.limit);
  } catch (err) {
    await env.stop().catch(() => {});
    throw err;
  }
  return await evaluate(file, env, rows, plan, io);
}

/** A runtime that holds servers: closed at the end. */
type Pool = { close(): Promise<void> };

/**
 * Starts the environment once, up front: when it cannot start, that is one
 * error with its message, not one per rollout. The held placement keeps it
 * up between rollouts. `null` when `signal` stopped it (all released).
 * @throws {Error} `Cannot start environment "NAME": why`
 */
async function holdEnvironment(
  runtime: RuntimeProvider,
  pool: Pool | null,
  env: Environment,
  signal: AbortSignal | undefined,
): Promise<AsyncDisposable | null> {
  try {
    return await runtime.place({ signal });
  } catch (err) {
    await pool?.close().catch(() => {});
    await env.stop().catch(() => {});
    if (signal?.aborted) return null;
    throw new Error(`Cannot start environment "${env.name}": ${errorMessage(err)}`, {
      cause: err,
    });
  }
}

/** What a run holds until it ends. */
interface Held {
  readonly agent: EvalAgent;
  readonly placement: AsyncDisposable;
  readonly pool: Pool | null;
  /** Where finished groups' rows go, once opened. */
  training: TrainingOut | null;
}

/**
 * Nothing of the run may outlive it: agents' process groups, key and
 * prompt files, the model proxy and its routes, the training rows' file,
 * the environment (its shutdown hooks remove its keys).
 */
async function releaseRun(io: Io, held: Held, env: Environment): Promise<void> {
  await held.agent.command?.whenIdle();
  await held.agent.proxy?.shutdown();
  held.training?.close();
  await Promise.resolve(held.placement[Symbol.asyncDispose]()).catch(() => {});
  await held.pool?.close().catch((err) => io.err(`warning: ${errorMessage(err)}\n`));
  await env.stop().catch((err) => io.err(`warning: ${errorMessage(err)}\n`));
}

/**
 * Runs the plan's job over `rows` of `env`: places the environment once
 * up front, runs the taskset, releases everything, prints; returns the
 * exit code.
 */
async function evaluate(
  file: string,
  env: Environment,
  rows: TaskRow[],
  plan: EvalPlan,
  io: Io,
): Promise<number> {
  const { group, maxConcurrent } = plan.config;
  const total = rows.length * group;
  // The dead-man's switch of pods and jobs: every rollout's turn at the
  // slowest, plus grace, should this process die without closing them.
  const lifetime = Math.ceil(total / maxConcurrent) * plan.options.rolloutTimeout! + 600_000;
  const use = { file, env, envName: plan.envName, maxConcurrent, lifetime };
  const { runtime, pool } = await evalRuntime(plan.runtime, use);
  const placement = await holdEnvironment(runtime, pool, env, io.signal);
  if (placement === null) return interrupted(io, 0, total);
  const { agent, config: { out }, trainingOut } = plan;
  io.onHurry = () => agent.command?.kill();
  printStart(io, { tasks: rows.length, group, env: env.name, agent: agent.label, out });
  const progress = new ProgressLine(io);
  const held: Held = { agent, placement, pool, training: null };
  let job: Job;
  try {
    await agent.proxy?.start();
    if (trainingOut !== undefined) held.training = await TrainingOut.open(trainingOut, io);
    job = await new Taskset(rows).run(agent.agent, {
      ...plan.options,
      runtime,
      signal: io.signal,
      onProgress: progress.show,
      onGroup: held.training?.write,
    });
  } finally {
    await releaseRun(io, held, env);
    progress.end();
  }
  if (io.signal?.aborted) return interrupted(io, progress.done, total);
  // With the rows on standard output, the table goes to standard error.
  const table = trainingOut === "-" ? "err" : "out";
  return report(io, job, { json: plan.json, total, resumable: out !== undefined, table });
}

/** Prints the job and the line of a limit that stopped it; returns the exit code. */
function report(
  io: Io,
  job: Job,
  how: { json: boolean; total: number; resumable: boolean; table: "out" | "err" },
): number {
  printJob(io, job, how.json, how.table);
  if (job.stopped !== null) {
    const notRun = job.runs.filter((r) => r.status === "cancelled").length;
    io.err(stopLine(job.stopped, notRun, how.total, how.resumable));
  }
  return job.errored.length === 0 ? EXIT_OK : EXIT_FAILURE;
}
