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
 * Exit codes: 0 on success, 1 when the command fails (for `eval`: when any
 * rollout was not graded), 2 for bad usage, 130 when interrupted (SIGINT,
 * SIGTERM or SIGHUP).
 *
 * @module
 */

import { parseArgs } from "node:util";
import { connect, type HudClient } from "./client.ts";
import { HudProtocolError, NotReadyError } from "./errors.ts";
import {
  type Environment,
  environmentOf,
  type PromptFrame,
  type TaskEntry,
  type TaskRow,
} from "./env.ts";
import type { JsonSchema } from "./schema.ts";
import { loadEnvironment, moduleUrl } from "./loader.ts";
import { serve } from "./server.ts";
import { abortable } from "./_internal/async.ts";
import { CommandAgent, parseEnvFile } from "./agents/command.ts";
import { MODEL_FLAGS, MODEL_FLAGS_HELP, modelAgentFromFlags } from "./agents/_cli.ts";
import { formatJobTable, formatProgress } from "./eval/report.ts";
import { LocalRuntime } from "./runtime/local.ts";
import { SwarmRuntime } from "./engines/swarm.ts";
import { ContainerRuntime } from "./engines/container.ts";
import { buildEnvironmentImage } from "./engines/image.ts";
import { removeStaleContainers } from "./engines/gc.ts";
import type { RuntimeProvider } from "./runtime/placement.ts";
import { firstError, Job, type JobProgress } from "./eval/job.ts";
import { prepareResults, type RunRecord } from "./eval/results.ts";
import { Taskset } from "./eval/taskset.ts";
import { errorMessage } from "./_internal/util.ts";
import { redactUrl } from "./_internal/auth.ts";
import { renderReport, serveViewer } from "./viewer/mod.ts";

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
/** The SDK's version, as in deno.json (a test keeps them equal). */
export const VERSION = "0.1.0";
const DEFAULT_URL = "tcp://127.0.0.1:8765";
const DEFAULT_PORT = 8765;
/** How long `tasks`, `start` and `grade` keep trying to reach a served environment. */
const CONNECT_TIMEOUT_S = 10;

/** Signals that stop a command, all alike (Windows has only SIGINT). */
const STOP_SIGNALS: Deno.Signal[] = Deno.build.os === "windows"
  ? ["SIGINT"]
  : ["SIGINT", "SIGTERM", "SIGHUP"];

const EXIT_OK = 0;
const EXIT_FAILURE = 1;
const EXIT_USAGE = 2;
const EXIT_INTERRUPTED = 130;

/** Colour and cursor escapes (Deno's import errors carry them). */
// deno-lint-ignore no-control-regex
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;

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
  /** Called on a second interrupting signal: stop now, skipping grace periods. */
  onHurry?: () => void;
}

/**
 * SIGINT, SIGTERM and SIGHUP, handled alike while a command runs: the first
 * aborts the returned signal, the second calls `io.onHurry`. Dispose it to
 * remove the listeners.
 */
function trapSignals(io: Io): Disposable & { signal: AbortSignal; interrupted(): boolean } {
  const stopped = new AbortController();
  let received = 0;
  const onSignal = () => {
    if (++received === 1) stopped.abort(new DOMException("Interrupted by a signal", "AbortError"));
    else io.onHurry?.();
  };
  for (const s of STOP_SIGNALS) Deno.addSignalListener(s, onSignal);
  const signal = io.signal ? AbortSignal.any([io.signal, stopped.signal]) : stopped.signal;
  return {
    signal,
    interrupted: () => signal.aborted,
    [Symbol.dispose]() {
      for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, onSignal);
    },
  };
}

/** A command of the table: its one-line summary, its help, and its body. */
interface Command {
  summary: string;
  usage: string;
  run(args: string[], io: Io): Promise<number>;
}

type OptionSpec = Record<
  string,
  { type: "string" | "boolean"; short?: string; multiple?: boolean }
>;
type Values = Record<string, string | boolean | string[] | undefined>;

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
  if (!/^(tcp:\/\/)?([^@/?#\s]*@)?(\[[^\]]+\]|[^:/?#\s@]+):\d+\/?$/.test(url.trim())) {
    throw new UsageError(`--url must be tcp://host:port, got "${redactUrl(url)}"`);
  }
  return url;
}

function readyTimeoutMs(values: Values): number {
  const text = stringOption(values, "ready-timeout");
  if (text === undefined) return CONNECT_TIMEOUT_S * 1000;
  if (!/^\d+(\.\d+)?$/.test(text) || !(Number(text) > 0)) {
    throw new UsageError(`--ready-timeout must be a positive number of seconds, got "${text}"`);
  }
  return Number(text) * 1000;
}

async function connectTo(
  url: string,
  io: Io,
  values: Values,
  sessionId?: string,
): Promise<HudClient> {
  try {
    return await connect(url, {
      readyTimeout: readyTimeoutMs(values),
      retryInterval: 200,
      heartbeatInterval: 0,
      // Forwarders would die with this process; nobody could use them.
      forward: false,
      signal: io.signal,
      sessionId,
    });
  } catch (err) {
    // Say why it was not ready: refused, reset, closed before hello...
    if (err instanceof NotReadyError && err.cause !== undefined) {
      const cause = errorMessage(err.cause).replace(/ \(os error \d+\)$/, "");
      throw new NotReadyError(
        `${err.message}: ${cause.charAt(0).toLowerCase()}${
          cause.slice(1)
        } (wait longer with --ready-timeout S)`,
        { cause: err },
      );
    }
    throw err;
  }
}

/** The --ready-timeout lines of a help text whose descriptions start at `column`. */
function readyTimeoutHelp(column: number): string {
  const pad = " ".repeat(column);
  return `  --ready-timeout S`.padEnd(column) +
    `seconds to keep trying to reach the\n${pad}environment (default: ${CONNECT_TIMEOUT_S})`;
}

function promptText(prompt: unknown): string {
  return typeof prompt === "string" ? prompt : JSON.stringify(prompt, null, 2);
}

// ---------------------------------------------------------------- serve

/** A positive number option (`scale` converts seconds to ms), or undefined. */
function positiveOption(values: Values, name: string, scale: number): number | undefined {
  const text = stringOption(values, name);
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!/^\d+(\.\d+)?$/.test(text) || !(n > 0)) {
    throw new UsageError(`--${name} must be a positive number, got "${text}"`);
  }
  return scale === 1 ? Math.floor(n) : n * scale;
}

/**
 * `serve`'s auth options from its flags: the token from --token-file, else
 * HUD_SERVE_TOKEN (taken out of this process's environment, so that what
 * the environment's hooks start does not inherit it), else generated.
 */
async function serveAuth(
  values: Values,
  hostname: string,
): Promise<{ auth: boolean; token?: string; insecureListen?: boolean }> {
  const tokenFile = stringOption(values, "token-file");
  let fromEnv: string | undefined;
  try {
    fromEnv = Deno.env.get("HUD_SERVE_TOKEN") || undefined;
    Deno.env.delete("HUD_SERVE_TOKEN");
  } catch {
    // No --allow-env: nothing to take.
  }
  if (values["no-auth"]) {
    if (tokenFile !== undefined) throw new UsageError("give --token-file or --no-auth, not both");
    const loopback = /^(localhost|127\.\d+\.\d+\.\d+|::1|\[::1\])$/i.test(hostname);
    if (!loopback && !values["insecure-listen"]) {
      throw new UsageError(
        `--no-auth on "${hostname}" lets anyone who can reach it in; add --insecure-listen to mean it, or listen on 127.0.0.1`,
      );
    }
    return { auth: false, insecureListen: Boolean(values["insecure-listen"]) };
  }
  if (values["insecure-listen"]) throw new UsageError("--insecure-listen needs --no-auth");
  if (tokenFile === undefined) return { auth: true, token: fromEnv };
  let text: string;
  try {
    text = await Deno.readTextFile(tokenFile);
  } catch (err) {
    throw new UsageError(`cannot read --token-file "${tokenFile}": ${errorMessage(err)}`);
  }
  const token = text.replace(/\r?\n$/, "");
  if (token === "") throw new UsageError(`--token-file "${tokenFile}" is empty`);
  return { auth: true, token };
}

const serveCommand: Command = {
  summary: "Serve an environment module on a control port",
  usage: `Usage: ${PROGRAM} serve FILE [--env NAME] [--host HOST] [--port PORT] [--stop-on-eof]
                 [--token-file PATH | --no-auth [--insecure-listen]]

Loads the environment from FILE (a TypeScript module), runs its initialize
hooks, binds the control port and prints HUD_SERVE_PORT=<port> on standard
output. Serves until SIGINT, SIGTERM or SIGHUP, then closes every
connection, cancels held tasks and runs the shutdown hooks (a second signal
skips waiting for connections, but the shutdown hooks still run).

Clients must present a token: the one in --token-file, else the one in
HUD_SERVE_TOKEN, else a fresh random one, printed as HUD_SERVE_TOKEN=<token>
on standard output before the port line (and nowhere else). Clients take it
from HUD_SERVE_TOKEN or the url (tcp://:TOKEN@host:port).

Options:
  --env NAME            the environment to serve, by export or environment
                        name (default: the module's only environment)
  --host HOST           interface to listen on (default: 127.0.0.1; use
                        0.0.0.0 in a container)
  --port PORT           port to listen on, 0 for any free port (default: ${DEFAULT_PORT})
  --stop-on-eof         also stop when standard input closes, so that a
                        server started by another program ends when that
                        program does
  --token-file PATH     read the token from this file (one line)
  --no-auth             accept clients without a token, as HUD's Python
                        SDK does: anyone who can reach the port can use the
                        environment; loopback hosts only, unless also given
  --insecure-listen     allow --no-auth on a non-loopback host
  --parked-ttl SECONDS  how long a parked task waits for its grader
                        (default: 3600)
  --max-parked N        most tasks parked at once (default: 10000)
  --max-connections N   most connections at once (default: 1024)
  -h, --help            show this help
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
        "token-file": { type: "string" },
        "no-auth": { type: "boolean" },
        "insecure-listen": { type: "boolean" },
        "parked-ttl": { type: "string" },
        "max-parked": { type: "string" },
        "max-connections": { type: "string" },
      },
      { names: ["FILE"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [file] } = parsed;
    const hostname = stringOption(values, "host") ?? "127.0.0.1";
    const port = parsePort(stringOption(values, "port"));
    const limits = {
      parkedTtl: positiveOption(values, "parked-ttl", 1000),
      maxParked: positiveOption(values, "max-parked", 1),
      maxConnections: positiveOption(values, "max-connections", 1),
    };
    const auth = await serveAuth(values, hostname);
    // Signals are handled from the start, not from when serve() announces the
    // port: a SIGTERM that arrives while the module loads or the initialize
    // hooks run then still ends in the shutdown hooks, and one sent right
    // after the announcement cannot kill the process before its handler is
    // in place. A second signal exits sooner, once the shutdown hooks have
    // removed what must not stay on disk (key files).
    const stopped = new AbortController();
    const signal = io.signal ? AbortSignal.any([io.signal, stopped.signal]) : stopped.signal;
    let received = 0;
    let loaded: Environment | null = null;
    const onSignal = () => {
      if (++received > 1) {
        const stopping = loaded ? loaded.stop().catch(() => {}) : Promise.resolve();
        void stopping.then(() => Deno.exit(EXIT_INTERRUPTED));
        return;
      }
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
      loaded = env;
      const server = await serve(env, {
        hostname,
        port,
        ...auth,
        ...limits,
        signal,
        handleSignals: false,
        announce: (line) => io.out(line + "\n"),
        onError: (err) => io.err(`warning: ${errorMessage(err)}\n`),
      }).catch((err) => {
        if (err instanceof Deno.errors.AddrInUse) {
          throw new Error(
            `Cannot serve: address ${hostname}:${port} is already in use; pick another with --port`,
            { cause: err },
          );
        }
        throw err;
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
${readyTimeoutHelp(21)}
  -h, --help     show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "tasks",
      args,
      {
        url: { type: "string" },
        env: { type: "string" },
        json: { type: "boolean" },
        "ready-timeout": { type: "string" },
      },
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
      await using client = await connectTo(checkUrl(url ?? DEFAULT_URL), io, values);
      tasks = await client.listTasks();
    }
    io.out(values.json ? JSON.stringify(tasks) + "\n" : taskTable(tasks));
    return EXIT_OK;
  },
};

// ---------------------------------------------------------------- start

function unknownTemplate(verb: string, taskId: string, templates: TaskEntry[]): RangeError {
  const known = templates.map((t) => `"${t.id}"`).join(", ") || "none";
  return new RangeError(`Cannot ${verb}: unknown template "${taskId}" (available: ${known})`);
}

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
  if (!env.hasTemplate(taskId)) throw unknownTemplate("start", taskId, env.listTasks());
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
${readyTimeoutHelp(21)}
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
        "ready-timeout": { type: "string" },
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
    await using client = await connectTo(target, io, values);
    let prompt: PromptFrame;
    try {
      prompt = await client.startTask(taskId, taskArgs);
    } catch (err) {
      if (err instanceof HudProtocolError && /unknown task/.test(err.message)) {
        throw unknownTemplate("start", taskId, await client.listTasks());
      }
      throw err;
    }
    const sessionId = client.sessionId;
    if (values.json) {
      io.out(JSON.stringify({ ...prompt, session_id: sessionId }) + "\n");
    } else {
      io.out(promptText(prompt.prompt) + "\n");
      io.err(
        `Session ${sessionId} holds the task. Grade it with:\n  ${PROGRAM} grade ${taskId} --url ${
          redactUrl(target)
        } --session ${sessionId} --answer TEXT\n`,
      );
    }
    // Closing without "bye" leaves the task parked for the grader.
    return EXIT_OK;
  },
};

// ---------------------------------------------------------------- grade

const gradeCommand: Command = {
  summary: "Grade a parked task (the split start/grade flow)",
  usage:
    `Usage: ${PROGRAM} grade TASK (--answer TEXT | --answer-file PATH) [--url URL] [--session ID]

Grades a task that "${PROGRAM} start --url" left parked, and prints the grade
as JSON. With --session, resumes that session and grades its task; without,
the environment grades its only parked task (and refuses when several are
parked).

TASK is the template the task was started from; it is checked to exist
(the protocol does not say which template a parked task came from).

Options:
  --answer TEXT       the answer
  --answer-file PATH  read the answer from a file, or from standard input
                      with "-" (one trailing newline is dropped)
  --url URL           the served environment (default: ${DEFAULT_URL})
  --session ID        the session id "${PROGRAM} start" printed
${readyTimeoutHelp(22)}
  -h, --help          show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "grade",
      args,
      {
        answer: { type: "string" },
        "answer-file": { type: "string" },
        url: { type: "string" },
        session: { type: "string" },
        "ready-timeout": { type: "string" },
      },
      { names: ["TASK"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [taskId] } = parsed;
    let answer = stringOption(values, "answer");
    const answerFile = stringOption(values, "answer-file");
    if (answer !== undefined && answerFile !== undefined) {
      throw new UsageError("give --answer or --answer-file, not both");
    }
    if (answer === undefined && answerFile === undefined) {
      throw new UsageError(`missing --answer or --answer-file (see "${PROGRAM} grade --help")`);
    }
    const target = checkUrl(stringOption(values, "url") ?? DEFAULT_URL);
    readyTimeoutMs(values); // a bad value is a usage error before anything is read
    if (answerFile !== undefined) {
      const text = answerFile === "-"
        ? await abortable(new Response(io.stdin()).text(), io.signal)
        : await Deno.readTextFile(answerFile).catch((err) => {
          throw new Error(`Cannot read answer file "${answerFile}": ${errorMessage(err)}`, {
            cause: err,
          });
        });
      answer = text.endsWith("\n") ? text.slice(0, -1).replace(/\r$/, "") : text;
    }
    await using client = await connectTo(target, io, values, stringOption(values, "session"));
    const templates = await client.listTasks();
    if (!templates.some((t) => t.id === taskId)) throw unknownTemplate("grade", taskId, templates);
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
    if (set.rows.length === 0) {
      throw new UsageError(`${tasksFile} holds no rows: add tasks to it, or leave out --tasks`);
    }
    return [...set.rows];
  }
  // The module is in the cache already: loadEnvironment imported it.
  const mod = await import(moduleUrl(file).href) as Record<string, unknown>;
  const exported = mod.tasks instanceof Taskset ? [...mod.tasks.rows] : mod.tasks;
  if (Array.isArray(exported)) {
    const rows = (exported as TaskRow[]).filter((r) =>
      environmentOf(r) === env || r.env === env.name
    );
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

function seconds(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d+(\.\d+)?$/.test(text) || !(Number(text) > 0)) {
    throw new UsageError(`${flag} must be a positive number of seconds, got "${text}"`);
  }
  return Number(text);
}

const evalCommand: Command = {
  summary: "Run an external agent against an environment's tasks",
  usage:
    `Usage: ${PROGRAM} eval FILE (--agent CMD | --model NAME) [--env NAME] [--tasks ROWS] [--group N]
            [--max-concurrent N] [--timeout S] [--agent-timeout S]
            [--pass-env NAME]... [--env-file PATH] [--max-output BYTES]
            [--out results.jsonl [--resume | --force]] [--json]

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
finished rollout. A table per task closes the run, then the first error of
each failing task. Results are only ever appended to the --out file, one
synced line per rollout; --resume runs only what is not graded there.

SIGINT, SIGTERM or SIGHUP stop the job: running agents get SIGTERM, then
SIGKILL after 2 s (a second signal kills them at once), the environment's
shutdown hooks run, and key files are removed.

Exit codes: 0 when every rollout was graded, 1 when any was not (or the
environment could not start), 2 for bad usage, 130 when interrupted.

Options:
  --agent CMD           the agent command, run with bash -c
  --env NAME            the environment, by export or environment name
  --tasks ROWS          a taskset file to run instead of the module's tasks
  --group N             rollouts per task (default: 1); the table then
                        shows mean ± standard error, and pass@1 and pass@N
  --max-concurrent N    rollouts at once (default: 4)
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
                        image made by "${PROGRAM} image") or "swarm:IMAGE"
                        (a pool of replicas on the Docker Swarm whose
                        manager DOCKER_HOST names, removed at the end)
${MODEL_FLAGS_HELP}  -h, --help            show this help
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
        "agent-timeout": { type: "string" },
        "pass-env": { type: "string", multiple: true },
        "env-file": { type: "string" },
        "max-output": { type: "string" },
        out: { type: "string" },
        resume: { type: "boolean" },
        force: { type: "boolean" },
        json: { type: "boolean" },
        ...MODEL_FLAGS,
        runtime: { type: "string" },
      },
      { names: ["FILE"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [file] } = parsed;
    const command = stringOption(values, "agent");
    const runtimeSpec = stringOption(values, "runtime") ?? "local";
    if (runtimeSpec !== "local" && !/^(container|swarm):\S+$/.test(runtimeSpec)) {
      throw new UsageError(
        `--runtime must be "local", "container:IMAGE" or "swarm:IMAGE", got "${runtimeSpec}"`,
      );
    }
    const runtimeKind = runtimeSpec.split(":")[0];
    const image = runtimeSpec.slice(runtimeKind.length + 1);
    // A model agent (--model ...) or an external one (--agent CMD).
    const model = modelAgentFromFlags(values, (m) => new UsageError(m));
    if (model && command !== undefined) throw new UsageError("pass --agent or --model, not both");
    if (!model && (command === undefined || command.trim() === "")) {
      throw new UsageError(`missing --agent or --model (see "${PROGRAM} eval --help")`);
    }
    const group = positiveInt("--group", stringOption(values, "group"), 1);
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
    const rows = await evalRows(file, env, stringOption(values, "tasks"));
    const total = rows.length * group;
    // Start the environment once, up front: when it cannot start, that is
    // one error with its message, not one per rollout. The held placement
    // keeps it up between rollouts.
    // A swarm pool: one replica per concurrent rollout, and one for the held placement.
    const swarm = runtimeKind === "swarm"
      ? new SwarmRuntime(image, { maxReplicas: maxConcurrent + 1 })
      : null;
    const runtime: RuntimeProvider = runtimeKind === "local"
      ? new LocalRuntime(env)
      : swarm ?? new ContainerRuntime(image);
    let held: AsyncDisposable;
    try {
      held = await runtime.place({ signal: io.signal });
    } catch (err) {
      await swarm?.close().catch(() => {});
      await env.stop().catch(() => {});
      if (io.signal?.aborted) return interrupted(io, 0, total);
      throw new Error(`Cannot start environment "${env.name}": ${errorMessage(err)}`, {
        cause: err,
      });
    }
    const commandAgent = model ? null : new CommandAgent(command!, {
      passEnv,
      envFile,
      maxOutputBytes: maxOutput,
    });
    const agent = model?.agent ?? commandAgent!;
    io.onHurry = () => commandAgent?.kill();
    const live = io.live;
    io.err(
      `eval: ${rows.length} tasks x ${group} from "${env.name}", agent: ${
        model?.label ?? commandShown(command!)
      }\n`,
    );
    const show = (p: JobProgress) => {
      if (live) io.err(`\r\x1b[2K${formatProgress(p)}`);
      else if (p.last) {
        const what = p.last.reward ?? `${p.last.status} (${firstError([p.last]) ?? "-"})`;
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
        signal: io.signal,
        onProgress: show,
      });
    } finally {
      // Nothing of the run may outlive it: agents' process groups, key and
      // prompt files, the environment (its shutdown hooks remove its keys).
      await commandAgent?.whenIdle();
      await Promise.resolve(held[Symbol.asyncDispose]()).catch(() => {});
      await swarm?.close().catch((err) => io.err(`warning: ${errorMessage(err)}\n`));
      await env.stop().catch((err) => io.err(`warning: ${errorMessage(err)}\n`));
      if (live) io.err("\n");
    }
    if (io.signal?.aborted) {
      const done = job.runs.filter((r) => r.status !== "cancelled").length;
      return interrupted(io, done, total);
    }
    io.out(values.json ? JSON.stringify(job.summary()) + "\n" : formatJobTable(job));
    return job.errored.length === 0 ? EXIT_OK : EXIT_FAILURE;
  },
};

function interrupted(io: Io, done: number, total: number): number {
  io.err(`interrupted: ${done} of ${total} rollouts done; rerun with --resume to finish\n`);
  return EXIT_INTERRUPTED;
}

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
const imageCommand: Command = {
  summary: "Build a container image of an environment module (Docker or Podman)",
  usage: `Usage: ${PROGRAM} image FILE --tag NAME [--env NAME] [--from IMAGE] [--socket PATH]

Builds an OCI image of the environment in FILE with the local engine, with no
registry: Deno's binary and the libraries it links, FILE and its local
imports, and this command line, serving on 0.0.0.0:8765 with the token the
runtime passes in HUD_SERVE_TOKEN. Labels: dev.hud.env, dev.hud.env.version.

Options:
  --tag NAME      the image name (required)
  --env NAME      the environment, by export or environment name
  --from IMAGE    base image (one with bash and coreutils, for workspaces);
                  default: scratch (Deno and its libraries only)
  --socket PATH   the engine's socket (default: DOCKER_HOST, then
                  /var/run/docker.sock, then Podman's)
  -h, --help      show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "image",
      args,
      {
        tag: { type: "string" },
        env: { type: "string" },
        from: { type: "string" },
        socket: { type: "string" },
      },
      { names: ["FILE"], min: 1 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values, positionals: [file] } = parsed;
    const tag = stringOption(values, "tag");
    if (tag === undefined) {
      throw new UsageError(`--tag is required (see "${PROGRAM} image --help")`);
    }
    const env = await loadEnvironment(file, { name: stringOption(values, "env") });
    const id = await buildEnvironmentImage(file, tag, {
      envName: env.name,
      envVersion: env.version,
      from: stringOption(values, "from"),
      socket: stringOption(values, "socket"),
      signal: io.signal,
    });
    io.out(`${tag} ${id}\n`);
    return EXIT_OK;
  },
};

const gcCommand: Command = {
  summary: "Remove containers that killed runs left behind",
  usage: `Usage: ${PROGRAM} gc [--older-than SECONDS] [--socket PATH]

Removes the containers ContainerRuntime started whose creating process is
gone, and with --older-than also those older than that, and prints their ids.

Options:
  --older-than SECONDS  also remove containers of live runs this old
  --socket PATH         the engine's socket
  -h, --help            show this help
`,
  async run(args, io) {
    const parsed = parseCommand(
      "gc",
      args,
      { "older-than": { type: "string" }, socket: { type: "string" } },
      { names: [], min: 0 },
      io,
    );
    if (parsed === null) return EXIT_OK;
    const { values } = parsed;
    const olderText = stringOption(values, "older-than");
    const olderThan = olderText === undefined ? undefined : Number(olderText);
    if (olderThan !== undefined && (!Number.isFinite(olderThan) || olderThan < 0)) {
      throw new UsageError(`--older-than must be a number of seconds, got "${olderText}"`);
    }
    const removed = await removeStaleContainers({
      socket: stringOption(values, "socket"),
      olderThan: olderThan === undefined ? undefined : olderThan * 1000,
    });
    for (const id of removed) io.out(`${id}\n`);
    io.err(`gc: removed ${removed.length} container${removed.length === 1 ? "" : "s"}\n`);
    return EXIT_OK;
  },
};

const COMMANDS: Record<string, Command> = {
  serve: serveCommand,
  tasks: tasksCommand,
  start: startCommand,
  grade: gradeCommand,
  eval: evalCommand,
  image: imageCommand,
  gc: gcCommand,
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

Run "${PROGRAM} <command> --help" for a command's options, "${PROGRAM} --version"
for the version.

Exit codes: 0 on success, 1 when the command fails (eval: when any rollout
was not graded), 2 for bad usage, 130 when interrupted.
`;
}

/** Writes all of `text`; after a broken pipe, later writes are dropped. */
function streamWriter(w: { writeSync(p: Uint8Array): number }): (text: string) => void {
  let broken = false;
  return (text) => {
    if (broken) return;
    const data = new TextEncoder().encode(text);
    let off = 0;
    try {
      while (off < data.length) off += w.writeSync(data.subarray(off));
    } catch {
      // A closed pipe (`| head`) must not kill the run halfway: whatever
      // it started still has to be stopped and cleaned up.
      broken = true;
    }
  };
}

/**
 * Runs the command line with `args` (without the program name) and returns
 * the exit code: 0 on success, 1 when the command fails, 2 for bad usage,
 * 130 when interrupted by SIGINT, SIGTERM or SIGHUP (which every command
 * handles: it stops, cleans up, then returns). Errors are reported on one
 * line on standard error; nothing is thrown.
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
  const live = options.stderr === undefined && Deno.stderr.isTerminal() &&
    !Deno.env.get("NO_COLOR");
  const rawErr = options.stderr ?? streamWriter(Deno.stderr);
  const io: Io = {
    out: options.stdout ?? streamWriter(Deno.stdout),
    // Colour codes only on a live terminal (progress redraws); never in
    // messages that go to a pipe or a file.
    err: live ? rawErr : (t) => rawErr(t.replace(ANSI, "")),
    stdin: () => options.stdin ?? Deno.stdin.readable,
    signal: options.signal,
    live,
  };
  const [name, ...rest] = args;
  if (name === undefined) {
    io.err(topUsage());
    return EXIT_USAGE;
  }
  if (name === "--version" || name === "-V") {
    io.out(`${PROGRAM} ${VERSION}\n`);
    return EXIT_OK;
  }
  if (name === "--help" || name === "-h" || name === "help") {
    const topic = name === "help" ? rest[0] : undefined;
    if (topic !== undefined && !Object.hasOwn(COMMANDS, topic)) {
      io.err(`error: unknown command "${topic}" (see "${PROGRAM} --help")\n`);
      return EXIT_USAGE;
    }
    io.out(topic !== undefined ? COMMANDS[topic].usage : topUsage());
    return EXIT_OK;
  }
  if (!Object.hasOwn(COMMANDS, name)) {
    const what = name.startsWith("-") ? `unknown option "${name}"` : `unknown command "${name}"`;
    io.err(`error: ${what} (see "${PROGRAM} --help")\n`);
    return EXIT_USAGE;
  }
  // serve handles its signals itself: they end a normal run.
  using trap = name === "serve" ? null : trapSignals(io);
  if (trap) io.signal = trap.signal;
  try {
    return await COMMANDS[name].run(rest, io);
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`error: ${err.message}\n`);
      return EXIT_USAGE;
    }
    if (trap?.interrupted()) {
      io.err("interrupted\n");
      return EXIT_INTERRUPTED;
    }
    io.err(`error: ${errorMessage(err).replace(ANSI, "").split("\n")[0]}\n`);
    return EXIT_FAILURE;
  }
}

if (import.meta.main) {
  Deno.exit(await main(Deno.args));
}
