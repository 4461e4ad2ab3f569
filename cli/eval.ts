// `hud eval FILE`: run an agent (a command, or a model) against an
// environment's tasks, locally or on a container engine, and grade each
// rollout. The engines are loaded only when --runtime names one.

import type { Environment, TaskRow } from "../env.ts";
import { loadEnvironment, moduleUrl } from "../loader.ts";
import { exportedRows } from "../eval/_rows.ts";
import { LocalRuntime } from "../runtime/local.ts";
import type { RuntimeProvider } from "../runtime/placement.ts";
import { CommandAgent, parseEnvFile } from "../agents/command.ts";
import { MODEL_FLAGS, MODEL_FLAGS_HELP, modelAgentFromFlags } from "../agents/_cli.ts";
import {
  checkTrainingFlags,
  groupWriter,
  startProxy,
  TRAINING_FLAGS,
  TRAINING_FLAGS_HELP,
} from "./_eval_training.ts";
import { formatJobTable, formatProgress, formatReward } from "../eval/report.ts";
import { firstError, type Job, type JobProgress } from "../eval/job.ts";
import { prepareResults } from "../eval/results.ts";
import { Taskset } from "../eval/taskset.ts";
import { errorMessage } from "../_internal/util.ts";
import {
  EXIT_FAILURE,
  EXIT_INTERRUPTED,
  EXIT_OK,
  type Io,
  parseCommand,
  PROGRAM,
  stringOption,
  UsageError,
} from "./_common.ts";

function positiveInt(flag: string, text: string | undefined, fallback: number): number {
  if (text === undefined) return fallback;
  if (!/^\d+$/.test(text) || Number(text) < 1) {
    throw new UsageError(`${flag} must be a positive integer, got "${text}"`);
  }
  return Number(text);
}

/** The rows to run: `--tasks FILE`, else the module's `tasks` export, else argument-free templates. */
async function evalRows(
  file: string,
  env: Environment,
  tasksFile: string | undefined,
): Promise<TaskRow[]> {
  if (tasksFile !== undefined) {
    const set = await Taskset.load(tasksFile);
    const foreign = set.rows.filter((r) => r.env !== env.name).map((r) => r.slug);
    if (foreign.length > 0) {
      throw new RangeError(
        `Cannot evaluate: rows ${
          foreign.map((s) => `"${s}"`).join(", ")
        } are not for environment "${env.name}"`,
      );
    }
    if (set.rows.length === 0) {
      throw new UsageError(`${tasksFile} holds no rows: add tasks to it, or leave out --tasks`);
    }
    return [...set.rows];
  }
  const rows = await exportedRows(file, env);
  if (rows !== null) {
    if (rows.length === 0) {
      throw new UsageError(
        `${file} exports "tasks" with no rows for environment "${env.name}"; ` +
          `add some, or pass --tasks`,
      );
    }
    return rows;
  }
  const free = env.listTasks().filter((t) => !Array.isArray(t.args.required));
  if (free.length === 0) {
    throw new UsageError(
      `${file} exports no "tasks" and every template needs arguments; export tasks or pass --tasks`,
    );
  }
  return free.map((t) => ({ env: env.name, id: t.id, args: {}, slug: t.id }));
}

/** What is safe to echo of an agent command: its program, never its arguments or assignments. */
function commandShown(command: string): string {
  const words = command.trim().split(/\s+/);
  const program = words.find((w) => !/^[A-Za-z_][A-Za-z0-9_]*=/.test(w)) ?? "";
  const hidden = words.length - 1;
  return hidden > 0 ? `${program} (+${hidden} more words, not shown)` : program;
}

function positiveNumber(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d+(\.\d+)?$/.test(text) || !(Number(text) > 0)) {
    throw new UsageError(`${flag} must be a positive number, got "${text}"`);
  }
  return Number(text);
}

/** `*` as any run of characters, the rest literal. */
function globMatcher(pattern: string): RegExp {
  return new RegExp(
    `^${pattern.split("*").map((p) => p.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`,
  );
}

/**
 * The rows `--filter` (globs over slug or id, any of them) and `--limit`
 * (the first N of those) keep.
 */
function selectRows(rows: TaskRow[], filters: string[], limit: number | undefined): TaskRow[] {
  let kept = rows;
  if (filters.length > 0) {
    const patterns = filters.map(globMatcher);
    kept = rows.filter((r) => patterns.some((p) => p.test(r.slug) || p.test(r.id)));
    if (kept.length === 0) {
      throw new UsageError(
        `--filter ${
          filters.map((f) => `"${f}"`).join(", ")
        } matches none of the ${rows.length} tasks (slugs such as "${rows[0]?.slug}")`,
      );
    }
  }
  return limit === undefined ? kept : kept.slice(0, limit);
}

function seconds(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d+(\.\d+)?$/.test(text) || !(Number(text) > 0)) {
    throw new UsageError(`${flag} must be a positive number of seconds, got "${text}"`);
  }
  return Number(text);
}

function interrupted(io: Io, done: number, total: number): number {
  io.err(`interrupted: ${done} of ${total} rollouts done; rerun with --resume to finish\n`);
  return EXIT_INTERRUPTED;
}

/** The help of `hud eval`. */
export const USAGE: string =
  `Usage: ${PROGRAM} eval FILE (--agent CMD | --model NAME) [--env NAME] [--tasks ROWS] [--group N]
            [--filter GLOB]... [--limit N] [--max-concurrent N] [--retries N]
            [--timeout S] [--agent-timeout S] [--token-limit N] [--cost-limit USD]
            [--pass-env NAME]... [--env-file PATH] [--max-output BYTES]
            [--out results.jsonl [--resume | --force]] [--json]
            [--runtime WHERE [--container-network] [--container-env NAME=VALUE]...]
            [--model-proxy URL [--model-server KIND]] [--training-out FILE]

FILE may be harbor:PATH, a Harbor task directory or a dataset of them: each
task runs in a container of its own Dockerfile's image (built once, cached
by content), its instruction the prompt, its tests/test.sh the grader;
--agent oracle runs each task's solution/solve.sh (a dataset validates when
every task scores 1.0). With harbor:PATH only --agent, --model flags,
--group and --json apply.

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
  --tasks ROWS          a taskset file to run instead of the module's tasks
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
  --force               with --out: rename an existing FILE aside and
                        start over
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
${MODEL_FLAGS_HELP}${TRAINING_FLAGS_HELP}  -h, --help            show this help
`;

/** Runs `hud eval` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "eval",
    usage: USAGE,
    options: {
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
      ...MODEL_FLAGS,
      ...TRAINING_FLAGS,
      runtime: { type: "string" },
      "container-network": { type: "boolean" },
      "container-env": { type: "string", multiple: true },
    },
    positionals: { names: ["FILE"], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [file] } = parsed;
  if (file.startsWith("harbor:")) {
    const { runHarborEval } = await import("./_eval_harbor.ts");
    return await runHarborEval(file.slice("harbor:".length), values, io);
  }
  const command = stringOption(values, "agent");
  const runtimeSpec = stringOption(values, "runtime") ?? "local";
  if (
    runtimeSpec !== "local" && !/^(container|swarm|k8s):\S+$|^slurm(:\S+)?$/.test(runtimeSpec)
  ) {
    throw new UsageError(
      `--runtime must be "local", "container:IMAGE", "swarm:IMAGE", "k8s:IMAGE" or "slurm[:PARTITION]", got "${runtimeSpec}"`,
    );
  }
  const runtimeKind = runtimeSpec.split(":")[0];
  // The image, or (slurm) the partition.
  const where = runtimeSpec.slice(runtimeKind.length + 1);
  const containerEnv: Record<string, string> = {};
  for (const pair of (values["container-env"] ?? []) as unknown as string[]) {
    const m = pair.match(/^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/s);
    if (m === null) throw new UsageError(`--container-env takes NAME=VALUE, got "${pair}"`);
    containerEnv[m[1]] = m[2];
  }
  for (const flag of ["container-network", "container-env"]) {
    if (values[flag] !== undefined && runtimeKind !== "container") {
      throw new UsageError(`--${flag} needs --runtime container:IMAGE`);
    }
  }
  // A model agent (--model ...) or an external one (--agent CMD).
  const model = await modelAgentFromFlags(values, (m) => new UsageError(m));
  if (model && command !== undefined) throw new UsageError("pass --agent or --model, not both");
  if (!model && (command === undefined || command.trim() === "")) {
    throw new UsageError(`missing --agent or --model (see "${PROGRAM} eval --help")`);
  }
  checkTrainingFlags(values, !model, (m) => new UsageError(m));
  const group = positiveInt("--group", stringOption(values, "group"), 1);
  const filters = (values.filter ?? []) as unknown as string[];
  const limitText = stringOption(values, "limit");
  const limit = limitText === undefined ? undefined : positiveInt("--limit", limitText, 1);
  const retriesText = stringOption(values, "retries");
  if (retriesText !== undefined && !/^\d+$/.test(retriesText)) {
    throw new UsageError(`--retries must be an integer of at least 0, got "${retriesText}"`);
  }
  const retries = retriesText === undefined ? 0 : Number(retriesText);
  const tokenLimitText = stringOption(values, "token-limit");
  const tokenLimit = tokenLimitText === undefined
    ? undefined
    : positiveInt("--token-limit", tokenLimitText, 1);
  const costLimit = positiveNumber("--cost-limit", stringOption(values, "cost-limit"));
  if ((tokenLimit !== undefined || costLimit !== undefined) && !model && !values["model-proxy"]) {
    throw new UsageError(
      "--token-limit and --cost-limit count a model's calls: use them with --model or --model-proxy",
    );
  }
  const maxConcurrent = positiveInt(
    "--max-concurrent",
    stringOption(values, "max-concurrent"),
    4,
  );
  const timeout = seconds("--timeout", stringOption(values, "timeout")) ?? 600;
  const agentTimeout = seconds("--agent-timeout", stringOption(values, "agent-timeout"));
  if (agentTimeout !== undefined && agentTimeout >= timeout) {
    throw new UsageError(
      `--agent-timeout (${agentTimeout} s) must be less than --timeout (${timeout} s)`,
    );
  }
  const maxOutput = positiveInt(
    "--max-output",
    stringOption(values, "max-output"),
    16 * 1024 * 1024,
  );
  const passEnv = (values["pass-env"] ?? []) as unknown as string[];
  for (const name of passEnv) {
    if (!/^[A-Za-z_*][A-Za-z0-9_*]*$/.test(name)) {
      throw new UsageError(`--pass-env takes a variable name or glob, got "${name}"`);
    }
  }
  const envFile = stringOption(values, "env-file");
  const out = stringOption(values, "out");
  const resume = values.resume === true;
  const force = values.force === true;
  if (resume && out === undefined) {
    throw new UsageError(`--resume needs --out (see "${PROGRAM} eval --help")`);
  }
  if (force && out === undefined) {
    throw new UsageError(`--force needs --out (see "${PROGRAM} eval --help")`);
  }
  if (resume && force) throw new UsageError("give --resume or --force, not both");
  // Everything that can be refused is refused before the environment loads.
  if (envFile !== undefined) {
    const text = await Deno.readTextFile(envFile).catch((err) => {
      throw new Error(`Cannot read env file "${envFile}": ${errorMessage(err)}`, { cause: err });
    });
    parseEnvFile(text, `env file "${envFile}"`);
  }
  if (out !== undefined) {
    const aside = await prepareResults(out, { resume, force });
    if (aside !== null) io.err(`eval: moved the old results to ${aside}\n`);
  }
  if (io.signal?.aborted) return interrupted(io, 0, 0);

  const env = await loadEnvironment(file, { name: stringOption(values, "env") });
  let rows: TaskRow[];
  try {
    rows = selectRows(await evalRows(file, env, stringOption(values, "tasks")), filters, limit);
  } catch (err) {
    await env.stop().catch(() => {});
    throw err;
  }
  const total = rows.length * group;
  // The engines' code loads only when --runtime names one. A pool (swarm,
  // k8s, slurm) has a server per concurrent rollout and one for the held
  // placement, and is closed at the end.
  let pool: { close(): Promise<void> } | null = null;
  let runtime: RuntimeProvider;
  // The dead-man's switch of pods and jobs: every rollout's turn at the
  // slowest, plus grace, should this process die without closing them.
  const lifetime = (Math.ceil(total / maxConcurrent) * timeout + 600) * 1000;
  if (runtimeKind === "local") {
    runtime = new LocalRuntime(env);
  } else if (runtimeKind === "swarm") {
    const { SwarmRuntime } = await import("../engines/swarm.ts");
    runtime = pool = new SwarmRuntime(where, { maxReplicas: maxConcurrent + 1 });
  } else if (runtimeKind === "k8s") {
    const { KubernetesRuntime } = await import("../engines/kubernetes.ts");
    runtime = pool = new KubernetesRuntime(where, {
      pool: { minReplicas: 1, maxReplicas: maxConcurrent + 1 },
      activeDeadline: lifetime,
    });
  } else if (runtimeKind === "slurm") {
    const { SlurmRuntime } = await import("../engines/slurm.ts");
    runtime = pool = new SlurmRuntime({
      // The nodes load it themselves: an absolute file url (or the url given).
      module: moduleUrl(file).href,
      envName: stringOption(values, "env"),
      partition: where === "" ? undefined : where,
      tasks: maxConcurrent + 1,
      announceHost: Deno.env.get("HUD_ANNOUNCE_HOST") || undefined,
      time: lifetime,
    });
  } else {
    const { ContainerRuntime } = await import("../engines/container.ts");
    // close() waits for the containers that rollouts cut short release in
    // the background: none may outlive the run.
    runtime = pool = new ContainerRuntime(where, {
      network: values["container-network"] === true,
      env: containerEnv,
    });
  }
  // Start the environment once, up front: when it cannot start, that is
  // one error with its message, not one per rollout. The held placement
  // keeps it up between rollouts.
  let held: AsyncDisposable;
  try {
    held = await runtime.place({ signal: io.signal });
  } catch (err) {
    await pool?.close().catch(() => {});
    await env.stop().catch(() => {});
    if (io.signal?.aborted) return interrupted(io, 0, total);
    throw new Error(`Cannot start environment "${env.name}": ${errorMessage(err)}`, {
      cause: err,
    });
  }
  const proxy = await startProxy(values);
  const groups = await groupWriter(values, io);
  const commandAgent = model ? null : new CommandAgent(command!, {
    passEnv,
    envFile,
    maxOutputBytes: maxOutput,
    modelProxy: proxy ?? undefined,
  });
  const agent = model?.agent ?? commandAgent!;
  io.onHurry = () => commandAgent?.kill();
  const live = io.live;
  io.err(
    `eval: ${rows.length} tasks x ${group} from "${env.name}", agent: ${
      model?.label ?? commandShown(command!)
    }\n`,
  );
  if (out === undefined) {
    io.err("eval: no --out FILE: the traces are not kept (only the table below is printed)\n");
  }
  // The interrupt line says what the progress line said last.
  let done = 0;
  const show = (p: JobProgress) => {
    done = p.done;
    if (live) io.err(`\r\x1b[2K${formatProgress(p)}`);
    else if (p.last) {
      const what = p.last.reward === null
        ? `${p.last.status} (${firstError([p.last]) ?? "-"})`
        : formatReward(p.last.reward);
      io.err(`${p.last.task.slug}: ${what}  (${formatProgress(p)})\n`);
    }
  };
  let job: Job;
  try {
    job = await new Taskset(rows).run(agent, {
      runtime,
      group,
      maxConcurrent,
      rolloutTimeout: timeout * 1000,
      agentTimeout: agentTimeout === undefined ? undefined : agentTimeout * 1000,
      out,
      resume,
      retries,
      tokenLimit,
      costLimit,
      signal: io.signal,
      onProgress: show,
      onGroup: groups?.write,
    });
  } finally {
    // Nothing of the run may outlive it: agents' process groups, key and
    // prompt files, the environment (its shutdown hooks remove its keys).
    await commandAgent?.whenIdle();
    await proxy?.shutdown();
    groups?.close();
    await Promise.resolve(held[Symbol.asyncDispose]()).catch(() => {});
    await pool?.close().catch((err) => io.err(`warning: ${errorMessage(err)}\n`));
    await env.stop().catch((err) => io.err(`warning: ${errorMessage(err)}\n`));
    if (live) io.err("\n");
  }
  if (io.signal?.aborted) return interrupted(io, done, total);
  // With the rows on standard output, the table goes to standard error.
  const closing = values.json ? JSON.stringify(job.summary()) + "\n" : formatJobTable(job);
  if (values["training-out"] === "-") io.err(closing);
  else io.out(closing);
  const stop = job.stopped;
  if (stop !== null) {
    const notRun = job.runs.filter((r) => r.status === "cancelled").length;
    const spent = stop.reason === "cost_limit"
      ? `$${stop.spent.toFixed(4)} of $${stop.limit}`
      : `${stop.spent} of ${stop.limit} tokens`;
    const flag = stop.reason === "cost_limit" ? "--cost-limit" : "--token-limit";
    io.err(
      `eval: stopped at the ${
        flag.slice(2)
      } (${spent} spent); ${notRun} of ${total} rollouts not run${
        out === undefined ? "" : `; raise ${flag} (or leave it out) and rerun with --resume`
      }\n`,
    );
  }
  return job.errored.length === 0 ? EXIT_OK : EXIT_FAILURE;
}
