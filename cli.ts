/**
 * The command line: serve an environment module, list its task templates,
 * start tasks and grade them, from a shell.
 *
 * ```sh
 * deno run -A jsr:@hud/sdk/cli serve my_env.ts --port 8765
 * deno run -A jsr:@hud/sdk/cli tasks --url tcp://127.0.0.1:8765
 * deno run -A jsr:@hud/sdk/cli start add --args '{"a":2,"b":3}' --url tcp://127.0.0.1:8765
 * deno run -A jsr:@hud/sdk/cli grade add --answer 5 --url tcp://127.0.0.1:8765
 * ```
 *
 * Exit codes: 0 on success, 1 when the command fails, 2 for bad usage.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { connect, type HudClient } from "./client.ts";
import {
  type Environment,
  environmentOf,
  type PromptFrame,
  type TaskEntry,
  type TaskRow,
} from "./env.ts";
import type { JsonSchema } from "./schema.ts";
import { loadEnvironment } from "./runtime/loader.ts";
import { serve } from "./server.ts";
import { abortable } from "./_internal/async.ts";
import { CommandAgent } from "./eval/command_agent.ts";
import { formatJobTable, formatProgress } from "./eval/report.ts";
import { LocalRuntime } from "./runtime/runtime.ts";
import { type JobProgress, Taskset } from "./eval/taskset.ts";
import { errorMessage } from "./_internal/util.ts";
import { renderReport, serveViewer } from "./viewer/mod.ts";
import { Job, type RunRecord } from "./eval/taskset.ts";

/** Where {@linkcode main} reads and writes; the process's standard streams by default. */
export interface MainOptions {
  /**
   * Receives what the command prints on standard output.
   * @default writes to `Deno.stdout`
   */
  stdout?: (text: string) => void;
  /**
   * Receives errors, hints and progress.
   * @default writes to `Deno.stderr`
   */
  stderr?: (text: string) => void;
  /**
   * Where `start --source` reads the answer.
   * @default `Deno.stdin.readable`
   */
  stdin?: ReadableStream<Uint8Array>;
  /** Aborting it stops a running command (`serve` shuts down). */
  signal?: AbortSignal;
}

/** The program name shown in usage texts. */
const PROGRAM = "hud";
const DEFAULT_URL = "tcp://127.0.0.1:8765";
const DEFAULT_PORT = 8765;
/** How long `tasks`, `start` and `grade` keep trying to reach a served environment. */
const CONNECT_TIMEOUT_MS = 10_000;

/** Signals that stop `serve` (Windows has no SIGTERM listener). */
const STOP_SIGNALS: Deno.Signal[] = Deno.build.os === "windows"
  ? ["SIGINT"]
  : ["SIGINT", "SIGTERM"];

const EXIT_OK = 0;
const EXIT_FAILURE = 1;
const EXIT_USAGE = 2;

/** Bad usage: reported on one line, exit code 2. */
class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** What a command gets to talk to the world. */
interface Io {
  out(text: string): void;
  err(text: string): void;
  stdin(): ReadableStream<Uint8Array>;
  signal: AbortSignal | undefined;
  /** Whether progress may redraw one line (standard error is a terminal). */
  live: boolean;
}

/** A command of the table: its one-line summary, its help, and its body. */
interface Command {
  summary: string;
  usage: string;
  run(args: string[], io: Io): Promise<number>;
}

type OptionSpec = Record<string, { type: "string" | "boolean"; short?: string }>;
type Values = Record<string, string | boolean | undefined>;

/**
 * Parses a command's arguments. Returns `null` when `--help` was given (the
 * usage has been printed).
 * @throws {UsageError} for unknown options, missing values, wrong positionals
 */
function parseCommand(
  name: string,
  args: string[],
  options: OptionSpec,
  positionals: { names: string[]; min: number },
  io: Io,
): { values: Values; positionals: string[] } | null {
  let parsed: { values: Values; positionals: string[] };
  try {
    parsed = parseArgs({
      args,
      options: { ...options, help: { type: "boolean", short: "h" } },
      strict: true,
      allowPositionals: true,
    }) as { values: Values; positionals: string[] };
  } catch (err) {
    throw new UsageError(`${parseArgsMessage(err)} (see "${PROGRAM} ${name} --help")`);
  }
  if (parsed.values.help) {
    io.out(COMMANDS[name].usage);
    return null;
  }
  const given = parsed.positionals;
  if (given.length < positionals.min) {
    throw new UsageError(
      `missing ${positionals.names[given.length]} (see "${PROGRAM} ${name} --help")`,
    );
  }
  if (given.length > positionals.names.length) {
    throw new UsageError(
      `unexpected argument "${given[positionals.names.length]}" (see "${PROGRAM} ${name} --help")`,
    );
  }
  return parsed;
}

/** node:util's parse errors, as one short line. */
function parseArgsMessage(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  const code = (err as { code?: string }).code;
  const option = /'(-[^' ]*)/.exec(message)?.[1];
  if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION" && option) return `unknown option "${option}"`;
  if (code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE" && option) {
    if (message.includes("argument missing")) return `option "${option}" needs a value`;
    if (message.includes("does not take an argument")) {
      return `option "${option}" does not take a value`;
    }
    if (message.includes("ambiguous")) {
      return `option "${option}" needs a value; write ${option}=VALUE for one that starts with "-"`;
    }
  }
  return message.split("\n").map((l) => l.trim()).filter(Boolean).join(" ");
}

function stringOption(values: Values, name: string): string | undefined {
  const v = values[name];
  return typeof v === "string" ? v : undefined;
}

function parsePort(text: string | undefined): number {
  if (text === undefined) return DEFAULT_PORT;
  if (!/^\d+$/.test(text) || Number(text) > 65535) {
    throw new UsageError(`--port must be an integer from 0 to 65535, got "${text}"`);
  }
  return Number(text);
}

function parseJsonObject(flag: string, text: string | undefined): Record<string, unknown> {
  if (text === undefined) return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new UsageError(`${flag} is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new UsageError(`${flag} must be a JSON object, got ${text}`);
  }
  return value as Record<string, unknown>;
}

function checkUrl(url: string): string {
  if (!/^(tcp:\/\/)?(\[[^\]]+\]|[^:/?#\s]+):\d+\/?$/.test(url.trim())) {
    throw new UsageError(`--url must be tcp://host:port, got "${url}"`);
  }
  return url;
}

function connectTo(url: string, io: Io, sessionId?: string): Promise<HudClient> {
  return connect(url, {
    readyTimeout: CONNECT_TIMEOUT_MS,
    retryInterval: 200,
    heartbeatInterval: 0,
    // Forwarders would die with this process; nobody could use them.
    forward: false,
    signal: io.signal,
    sessionId,
  });
}

function promptText(prompt: unknown): string {
  return typeof prompt === "string" ? prompt : JSON.stringify(prompt, null, 2);
}

// ---------------------------------------------------------------- serve

const serveCommand: Command = {
  summary: "Serve an environment module on a control port",
  usage: `Usage: ${PROGRAM} serve FILE [--env NAME] [--host HOST] [--port PORT] [--stop-on-eof]

Loads the environment from FILE (a TypeScript module), runs its initialize
hooks, binds the control port and prints HUD_SERVE_PORT=<port> on standard
output. Serves until SIGINT or SIGTERM, then closes every connection,
cancels held tasks and runs the shutdown hooks.

Options:
  --env NAME     the environment to serve, by export or environment name
                 (default: the module's only environment)
  --host HOST    interface to listen on (default: 127.0.0.1; use 0.0.0.0 in
                 a container)
  --port PORT    port to listen on, 0 for any free port (default: ${DEFAULT_PORT})
  --stop-on-eof  also stop when standard input closes, so that a server
                 started by another program ends when that program does
  -h, --help     show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "serve",
      args,
      {
        env: { type: "string" },
        host: { type: "string" },
        port: { type: "string" },
        "stop-on-eof": { type: "boolean" },
      },
      { names: ["FILE"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [file] } = parsed;
    const hostname = stringOption(values, "host") ?? "127.0.0.1";
    const port = parsePort(stringOption(values, "port"));
    // Signals are handled from the start, not from when serve() announces the
    // port: a SIGTERM that arrives while the module loads or the initialize
    // hooks run then still ends in the shutdown hooks, and one sent right
    // after the announcement cannot kill the process before its handler is
    // in place. A second signal exits at once.
    const stopped = new AbortController();
    const signal = io.signal ? AbortSignal.any([io.signal, stopped.signal]) : stopped.signal;
    let received = 0;
    const onSignal = () => {
      if (++received > 1) Deno.exit(130);
      stopped.abort(new Error("Stopped by a signal before serving"));
    };
    for (const s of STOP_SIGNALS) Deno.addSignalListener(s, onSignal);
    // The parent holds our stdin open; end of file means it is gone.
    const lifeline = values["stop-on-eof"] ? io.stdin().getReader() : null;
    const watching = lifeline && (async () => {
      try {
        while (!(await lifeline.read()).done) { /* discard */ }
      } catch {
        // A broken pipe means the same as end of file.
      }
      stopped.abort(new Error("Standard input closed before serving"));
    })();
    try {
      const env = await loadEnvironment(file, { name: stringOption(values, "env") });
      const server = await serve(env, {
        hostname,
        port,
        signal,
        handleSignals: false,
        announce: (line) => io.out(line + "\n"),
        onError: (err) => io.err(`warning: ${errorMessage(err)}\n`),
      });
      if (!signal.aborted) {
        io.err(
          `Serving "${env.name}" ${env.version} on tcp://${hostname}:${server.addr.port} (stop with Ctrl-C)\n`,
        );
      }
      await server.finished;
    } finally {
      for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, onSignal);
      if (lifeline) {
        await lifeline.cancel().catch(() => {});
        await watching;
      }
    }
    return EXIT_OK;
  },
};

// ---------------------------------------------------------------- tasks

/** A JSON Schema type, briefly: `integer`, `"a"|"b"`, `string[]`... */
function typeName(schema: JsonSchema): string {
  if (Array.isArray(schema.enum)) return schema.enum.map((v) => JSON.stringify(v)).join("|");
  if ("const" in schema) return JSON.stringify(schema.const);
  if (Array.isArray(schema.anyOf)) return (schema.anyOf as JsonSchema[]).map(typeName).join("|");
  if (schema.type === "array") {
    const item = typeName((schema.items ?? {}) as JsonSchema);
    return item.includes("|") ? `(${item})[]` : `${item}[]`;
  }
  if (Array.isArray(schema.type)) return schema.type.join("|");
  return typeof schema.type === "string" ? schema.type : "any";
}

/** A template's arguments on one line: `a: integer, b?: string, c: integer = 2`. */
function argsSummary(schema: JsonSchema): string {
  const properties = (schema.properties ?? {}) as Record<string, JsonSchema>;
  const required = new Set(Array.isArray(schema.required) ? schema.required as string[] : []);
  const parts = Object.entries(properties).map(([name, p]) => {
    const hasDefault = "default" in p;
    const optional = !required.has(name) && !hasDefault ? "?" : "";
    const def = hasDefault ? ` = ${JSON.stringify(p.default)}` : "";
    return `${name}${optional}: ${typeName(p)}${def}`;
  });
  if (schema.additionalProperties === true) parts.push("...");
  return parts.length === 0 ? "-" : parts.join(", ");
}

function taskTable(tasks: TaskEntry[]): string {
  if (tasks.length === 0) return "No task templates.\n";
  const rows = [
    ["ID", "ARGS", "DESCRIPTION"],
    ...tasks.map((t) => [t.id, argsSummary(t.args), t.description.replace(/\s+/g, " ").trim()]),
  ];
  const widths = [0, 1].map((i) => Math.max(...rows.map((r) => r[i].length)));
  return rows.map((r) =>
    `${r[0].padEnd(widths[0])}  ${r[1].padEnd(widths[1])}  ${r[2]}`.trimEnd() + "\n"
  ).join("");
}

const tasksCommand: Command = {
  summary: "List an environment's task templates and their arguments",
  usage: `Usage: ${PROGRAM} tasks FILE [--env NAME] [--json]
       ${PROGRAM} tasks [--url URL] [--json]

Lists the task templates of an environment module (its hooks are not run)
or of a served environment, with their arguments: "name?" is optional,
"= value" is the default, "..." means any further arguments are accepted.

Options:
  --url URL      a served environment (default: ${DEFAULT_URL})
  --env NAME     with FILE: the environment, by export or environment name
  --json         print the tasks.list entries as JSON
  -h, --help     show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "tasks",
      args,
      { url: { type: "string" }, env: { type: "string" }, json: { type: "boolean" } },
      { names: ["FILE"], min: 0 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [file] } = parsed;
    const url = stringOption(values, "url");
    if (file !== undefined && url !== undefined) {
      throw new UsageError("give FILE or --url, not both");
    }
    if (file === undefined && values.env !== undefined) {
      throw new UsageError("--env needs FILE");
    }
    let tasks: TaskEntry[];
    if (file !== undefined) {
      const env = await loadEnvironment(file, { name: stringOption(values, "env") });
      tasks = env.listTasks();
    } else {
      await using client = await connectTo(checkUrl(url ?? DEFAULT_URL), io);
      tasks = await client.listTasks();
    }
    io.out(values.json ? JSON.stringify(tasks) + "\n" : taskTable(tasks));
    return EXIT_OK;
  },
};

// ---------------------------------------------------------------- start

/** Reads one line (without its newline); `null` when the stream ends first with nothing. */
async function readLine(stream: ReadableStream<Uint8Array>): Promise<string | null> {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let text = "";
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) {
        text += decoder.decode();
        return text === "" ? null : text.replace(/\r$/, "");
      }
      text += decoder.decode(value, { stream: true });
      const nl = text.indexOf("\n");
      if (nl >= 0) return text.slice(0, nl).replace(/\r$/, "");
    }
  } finally {
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

async function startSource(
  taskId: string,
  taskArgs: Record<string, unknown>,
  file: string,
  values: Values,
  io: Io,
): Promise<number> {
  const env: Environment = await loadEnvironment(file, { name: stringOption(values, "env") });
  const json = values.json === true;
  await env.start();
  try {
    const task = await env.startTask(taskId, taskArgs);
    try {
      io.out(json ? JSON.stringify(task.prompt) + "\n" : promptText(task.prompt.prompt) + "\n");
      let answer = stringOption(values, "answer");
      if (answer === undefined) {
        const stdin = io.stdin();
        if (stdin === Deno.stdin.readable && Deno.stdin.isTerminal()) io.err("Answer: ");
        const line = await abortable(readLine(stdin), io.signal);
        if (line === null) throw new Error("Cannot grade: standard input ended before an answer");
        answer = line;
      }
      const grade = await task.grade(answer);
      io.out(JSON.stringify(grade) + "\n");
    } finally {
      await task.cancel();
    }
  } finally {
    await env.stop();
  }
  return EXIT_OK;
}

const startCommand: Command = {
  summary: "Start a task and print its prompt",
  usage: `Usage: ${PROGRAM} start TASK [--args JSON] [--url URL] [--json]
       ${PROGRAM} start TASK [--args JSON] --source FILE [--env NAME] [--answer TEXT] [--json]

Starts a task from template TASK and prints its prompt.

With --url (the split flow), the task stays parked on the served
environment when this command exits, and the session id that holds it is
printed on standard error; grade it later, from any process, with
"${PROGRAM} grade TASK --answer TEXT --session ID".

With --source, the environment runs in this process: the prompt is
printed, the answer is read from one line of standard input (or taken from
--answer), and the grade is printed as JSON.

Options:
  --args JSON     the task's arguments, a JSON object (default: {})
  --url URL       a served environment (default: ${DEFAULT_URL})
  --source FILE   run the environment module FILE in this process
  --env NAME      with --source: the environment, by export or environment name
  --answer TEXT   with --source: the answer, instead of reading standard input
  --json          print the prompt frame as JSON (with "session_id" when
                  served), then with --source the grade
  -h, --help      show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "start",
      args,
      {
        args: { type: "string" },
        url: { type: "string" },
        source: { type: "string" },
        env: { type: "string" },
        answer: { type: "string" },
        json: { type: "boolean" },
      },
      { names: ["TASK"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [taskId] } = parsed;
    const taskArgs = parseJsonObject("--args", stringOption(values, "args"));
    const source = stringOption(values, "source");
    const url = stringOption(values, "url");
    if (source !== undefined && url !== undefined) {
      throw new UsageError("give --url or --source, not both");
    }
    if (source !== undefined) return await startSource(taskId, taskArgs, source, values, io);
    if (values.env !== undefined) throw new UsageError("--env needs --source");
    if (values.answer !== undefined) {
      throw new UsageError(`--answer needs --source; with --url, answer with "${PROGRAM} grade"`);
    }
    const target = checkUrl(url ?? DEFAULT_URL);
    await using client = await connectTo(target, io);
    const prompt: PromptFrame = await client.startTask(taskId, taskArgs);
    const sessionId = client.sessionId;
    if (values.json) {
      io.out(JSON.stringify({ ...prompt, session_id: sessionId }) + "\n");
    } else {
      io.out(promptText(prompt.prompt) + "\n");
      io.err(
        `Session ${sessionId} holds the task. Grade it with:\n  ${PROGRAM} grade ${taskId} --url ${target} --session ${sessionId} --answer TEXT\n`,
      );
    }
    // Closing without "bye" leaves the task parked for the grader.
    return EXIT_OK;
  },
};

// ---------------------------------------------------------------- grade

const gradeCommand: Command = {
  summary: "Grade a parked task (the split start/grade flow)",
  usage: `Usage: ${PROGRAM} grade TASK --answer TEXT [--url URL] [--session ID]

Grades a task that "${PROGRAM} start --url" left parked, and prints the grade
as JSON. With --session, resumes that session and grades its task; without,
the environment grades its only parked task (and refuses when several are
parked).

TASK is the template the task was started from; it is checked to exist
(the protocol does not say which template a parked task came from).

Options:
  --answer TEXT   the answer (required)
  --url URL       the served environment (default: ${DEFAULT_URL})
  --session ID    the session id "${PROGRAM} start" printed
  -h, --help      show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "grade",
      args,
      { answer: { type: "string" }, url: { type: "string" }, session: { type: "string" } },
      { names: ["TASK"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [taskId] } = parsed;
    const answer = stringOption(values, "answer");
    if (answer === undefined) {
      throw new UsageError(`missing --answer (see "${PROGRAM} grade --help")`);
    }
    const target = checkUrl(stringOption(values, "url") ?? DEFAULT_URL);
    await using client = await connectTo(target, io, stringOption(values, "session"));
    const templates = await client.listTasks();
    if (!templates.some((t) => t.id === taskId)) {
      const known = templates.map((t) => `"${t.id}"`).join(", ") || "none";
      throw new RangeError(`Cannot grade: unknown template "${taskId}" (available: ${known})`);
    }
    const grade = await client.grade({ answer });
    io.out(JSON.stringify(grade) + "\n");
    return EXIT_OK;
  },
};

// ---------------------------------------------------------------- eval

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
    return [...set.rows];
  }
  const url = new URL(file, `file://${Deno.cwd()}/`);
  const mod = await import(url.href) as Record<string, unknown>;
  const exported = mod.tasks instanceof Taskset ? [...mod.tasks.rows] : mod.tasks;
  if (Array.isArray(exported)) {
    return (exported as TaskRow[]).filter((r) => environmentOf(r) === env || r.env === env.name);
  }
  const free = env.listTasks().filter((t) => !Array.isArray(t.args.required));
  if (free.length === 0) {
    throw new UsageError(
      `${file} exports no "tasks" and every template needs arguments; export tasks or pass --tasks`,
    );
  }
  return free.map((t) => ({ env: env.name, id: t.id, args: {}, slug: t.id }));
}

const evalCommand: Command = {
  summary: "Run an external agent against an environment's tasks",
  usage: `Usage: ${PROGRAM} eval FILE --agent CMD [--env NAME] [--tasks ROWS] [--group N]
            [--max-concurrent N] [--timeout S] [--out results.jsonl] [--resume]

Serves the environment module FILE in this process and runs the agent
command CMD once per task and repeat, grading each answer. The tasks are
the rows in ROWS (a .json or .jsonl taskset), else the module's "tasks"
export, else every template that needs no arguments.

CMD follows the command agent contract: prompt on stdin and in HUD_PROMPT,
capability urls in HUD_CAP_<NAME>_URL, the answer on stdout.

On a terminal the progress is one live line; otherwise one line per
finished rollout. A table per task closes the run. The exit code is 1 when
any rollout was not graded.

Options:
  --agent CMD           the agent command, run with bash -c (required)
  --env NAME            the environment, by export or environment name
  --tasks ROWS          a taskset file to run instead of the module's tasks
  --group N             rollouts per task (default: 1)
  --max-concurrent N    rollouts at once (default: 4)
  --timeout S           seconds each rollout may take (default: 600)
  --out FILE            write one JSON line per finished rollout
  --resume              with --out: keep graded rollouts found in FILE
  -h, --help            show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "eval",
      args,
      {
        agent: { type: "string" },
        env: { type: "string" },
        tasks: { type: "string" },
        group: { type: "string" },
        "max-concurrent": { type: "string" },
        timeout: { type: "string" },
        out: { type: "string" },
        resume: { type: "boolean" },
      },
      { names: ["FILE"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [file] } = parsed;
    const command = stringOption(values, "agent");
    if (command === undefined || command.trim() === "") {
      throw new UsageError(`missing --agent (see "${PROGRAM} eval --help")`);
    }
    const group = positiveInt("--group", stringOption(values, "group"), 1);
    const maxConcurrent = positiveInt(
      "--max-concurrent",
      stringOption(values, "max-concurrent"),
      4,
    );
    const timeout = positiveInt("--timeout", stringOption(values, "timeout"), 600);
    const out = stringOption(values, "out");
    if (values.resume === true && out === undefined) {
      throw new UsageError(`--resume needs --out (see "${PROGRAM} eval --help")`);
    }
    const env = await loadEnvironment(file, { name: stringOption(values, "env") });
    const rows = await evalRows(file, env, stringOption(values, "tasks"));
    const live = io.live;
    io.err(`eval: ${rows.length} tasks x ${group} from "${env.name}", agent: ${command}\n`);
    const show = (p: JobProgress) => {
      if (live) io.err(`\r\x1b[2K${formatProgress(p)}`);
      else if (p.last) {
        io.err(`${p.last.task.slug}: ${p.last.reward ?? p.last.status}  (${formatProgress(p)})\n`);
      }
    };
    const job = await new Taskset(rows).run(new CommandAgent(command), {
      runtime: new LocalRuntime(env),
      group,
      maxConcurrent,
      rolloutTimeout: timeout * 1000,
      out,
      resume: values.resume === true,
      signal: io.signal,
      onProgress: show,
    });
    if (live) io.err("\n");
    io.out(formatJobTable(job));
    return job.errored.length === 0 ? EXIT_OK : EXIT_FAILURE;
  },
};

// ---------------------------------------------------------------- view and report

const viewCommand: Command = {
  summary: "Show results files in a local web page",
  usage: `Usage: ${PROGRAM} view FILE [FILE...] [--port PORT]

Serves a page over the results files (the JSONL that "eval --out" writes)
on 127.0.0.1 and prints its url. The page shows each job's summary, a
sortable, filterable table of rollouts, each rollout's steps with the
file diffs and the grade, and, with two files or more, a comparison of
rewards task by task. Rollouts appended to a file while the page is open
appear as they arrive. Serves until SIGINT or SIGTERM.

Options:
  --port PORT    port to listen on, 0 for any free port (default: 0)
  -h, --help     show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "view",
      args,
      { port: { type: "string" } },
      { names: ["FILE", ...Array(64).fill("FILE")], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const port = parsePort(stringOption(parsed.values, "port") ?? "0");
    const stopped = new AbortController();
    const signal = io.signal ? AbortSignal.any([io.signal, stopped.signal]) : stopped.signal;
    const onSignal = () => stopped.abort();
    for (const s of STOP_SIGNALS) Deno.addSignalListener(s, onSignal);
    try {
      const viewer = await serveViewer(parsed.positionals, { port, signal });
      io.out(`Viewing ${parsed.positionals.length} results file(s) at ${viewer.url}\n`);
      await viewer.finished;
    } finally {
      for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, onSignal);
    }
    return EXIT_OK;
  },
};

const reportCommand: Command = {
  summary: "Summarise results files, as text or as one HTML page",
  usage: `Usage: ${PROGRAM} report FILE [FILE...] [--html OUT]

Prints a table per task of the results file (the JSONL that "eval --out"
writes). With --html, writes instead one self-contained HTML page (inline
CSS and script, no network) that shows what "view" shows, to attach to a
review or open from disk.

Options:
  --html OUT     write the page to OUT
  -h, --help     show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "report",
      args,
      { html: { type: "string" } },
      { names: ["FILE", ...Array(64).fill("FILE")], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const html = stringOption(parsed.values, "html");
    if (html !== undefined) {
      await Deno.writeTextFile(html, await renderReport(parsed.positionals));
      io.err(`Wrote ${html}\n`);
      return EXIT_OK;
    }
    for (const path of parsed.positionals) {
      const records: RunRecord[] = [];
      for (const line of (await Deno.readTextFile(path)).split("\n")) {
        if (line.trim() === "") continue;
        try {
          records.push(JSON.parse(line));
        } catch {
          // A line cut short by a crash.
        }
      }
      if (parsed.positionals.length > 1) io.out(`${path}\n`);
      io.out(formatJobTable(new Job(records[0]?.job_id ?? "-", records, records.map(() => null))));
    }
    return EXIT_OK;
  },
};

// ---------------------------------------------------------------- main

/** Every command, by name, in the order `--help` lists them. */
const COMMANDS: Record<string, Command> = {
  serve: serveCommand,
  tasks: tasksCommand,
  start: startCommand,
  grade: gradeCommand,
  eval: evalCommand,
  view: viewCommand,
  report: reportCommand,
};

function topUsage(): string {
  const names = Object.keys(COMMANDS);
  const width = Math.max(...names.map((n) => n.length));
  const list = names.map((n) => `  ${n.padEnd(width)}   ${COMMANDS[n].summary}`).join("\n");
  return `Usage: ${PROGRAM} <command> [options]

Serve HUD environments and run their tasks. Run it with
"deno run -A jsr:@hud/sdk/cli <command>", or install it as "${PROGRAM}" with
"deno install -g -A -n ${PROGRAM} jsr:@hud/sdk/cli".

Commands:
${list}

Run "${PROGRAM} <command> --help" for a command's options.
`;
}

function writeAllSync(w: { writeSync(p: Uint8Array): number }, text: string): void {
  const data = new TextEncoder().encode(text);
  let off = 0;
  while (off < data.length) off += w.writeSync(data.subarray(off));
}

/**
 * Runs the command line with `args` (without the program name) and returns
 * the exit code: 0 on success, 1 when the command fails, 2 for bad usage.
 * Errors are reported on one line on standard error; nothing is thrown.
 *
 * @example
 * ```ts
 * import { main } from "./cli.ts";
 * import assert from "node:assert/strict";
 *
 * let help = "";
 * assert.equal(await main(["--help"], { stdout: (t) => help += t }), 0);
 * assert.match(help, /Usage: hud <command>/);
 * ```
 *
 * @param args the arguments, as in `Deno.args`
 * @returns the exit code
 */
export async function main(args: string[], options: MainOptions = {}): Promise<number> {
  const io: Io = {
    out: options.stdout ?? ((t) => writeAllSync(Deno.stdout, t)),
    err: options.stderr ?? ((t) => writeAllSync(Deno.stderr, t)),
    stdin: () => options.stdin ?? Deno.stdin.readable,
    signal: options.signal,
    live: options.stderr === undefined && Deno.stderr.isTerminal(),
  };
  const [name, ...rest] = args;
  if (name === undefined) {
    io.err(topUsage());
    return EXIT_USAGE;
  }
  if (name === "--help" || name === "-h" || name === "help") {
    const topic = name === "help" ? rest[0] : undefined;
    if (topic !== undefined && Object.hasOwn(COMMANDS, topic)) {
      io.out(COMMANDS[topic].usage);
    } else {
      io.out(topUsage());
    }
    return EXIT_OK;
  }
  if (!Object.hasOwn(COMMANDS, name)) {
    const what = name.startsWith("-") ? `unknown option "${name}"` : `unknown command "${name}"`;
    io.err(`error: ${what} (see "${PROGRAM} --help")\n`);
    return EXIT_USAGE;
  }
  try {
    return await COMMANDS[name].run(rest, io);
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`error: ${err.message}\n`);
      return EXIT_USAGE;
    }
    io.err(`error: ${errorMessage(err)}\n`);
    return EXIT_FAILURE;
  }
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
