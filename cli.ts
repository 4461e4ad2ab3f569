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

import meta from "./deno.json" with { type: "json" };
import { shellQuote } from "./_internal/shell.ts";
import {
  type Command,
  EXIT_OK,
  EXIT_USAGE,
  failed,
  type Io,
  processIo,
  PROGRAM,
  runModule,
  STOP_SIGNALS,
} from "./cli/_common.ts";

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
  /**
   * How the user ran the command line, for hints that repeat a command
   * (`start`'s "Grade it with: ...").
   * @default `deno run -A cli.ts` (its path from the current directory) when
   *   this module is the program run from a file, else `hud`
   */
  program?: string;
}

/** The SDK's version, read from deno.json. */
export const VERSION: string = meta.version;

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

/**
 * Every command, by name, in the order `--help` lists them: its summary, and
 * its module under `cli/`, loaded only when the command runs (literal
 * specifiers, so that the module graph and JSR see every command).
 */
const COMMANDS: Record<string, { summary: string; load(): Promise<Command> }> = {
  serve: {
    summary: "Serve an environment module on a control port",
    load: () => import("./cli/serve.ts"),
  },
  tasks: {
    summary: "List an environment's task templates and their arguments",
    load: () => import("./cli/tasks.ts"),
  },
  start: {
    summary: "Start a task and print its prompt",
    load: () => import("./cli/start.ts"),
  },
  grade: {
    summary: "Grade a parked task (the split start/grade flow)",
    load: () => import("./cli/grade.ts"),
  },
  shell: {
    summary: "Open the shell of a served environment, where a parked task's files are",
    load: () => import("./cli/shell.ts"),
  },
  eval: {
    summary: "Run an external agent against an environment's tasks",
    load: () => import("./cli/eval.ts"),
  },
  image: {
    summary: "Build a container image of an environment module (Docker or Podman)",
    load: () => import("./cli/image.ts"),
  },
  gc: {
    summary: "Remove containers that killed runs left behind",
    load: () => import("./cli/gc.ts"),
  },
  view: {
    summary: "Show results files in a local web page",
    load: () => import("./cli/view.ts"),
  },
  report: {
    summary: "Summarise results files, as text or as one HTML page",
    load: () => import("./cli/report.ts"),
  },
  "export-harbor": {
    summary: "Write an environment's tasks as Harbor task folders, with their images",
    load: () => import("./cli/export_harbor.ts"),
  },
  "export-training": {
    summary: "Write a results file as training data (tokens, loss masks, rewards)",
    load: () => import("./cli/export_training.ts"),
  },
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
  const io = processIo({ ...options, program: options.program ?? invokedAs() });
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
    return await help(name === "help" ? rest[0] : undefined, io);
  }
  if (!Object.hasOwn(COMMANDS, name)) {
    const what = name.startsWith("-") ? `unknown option "${name}"` : `unknown command "${name}"`;
    io.err(`error: ${what} (see "${PROGRAM} --help")\n`);
    return EXIT_USAGE;
  }
  return await runCommand(name, rest, io);
}

/**
 * How this program was run, for hints: `deno run -A PATH` when this module
 * is the main module, from a file (a checkout), else `hud` (installed, or
 * from jsr).
 */
function invokedAs(): string {
  const url = new URL(import.meta.url);
  if (!import.meta.main || url.protocol !== "file:") return PROGRAM;
  const path = decodeURIComponent(url.pathname);
  const cwd = Deno.cwd();
  const shown = path.startsWith(`${cwd}/`) ? path.slice(cwd.length + 1) : path;
  return `deno run -A ${/^[\w./-]+$/.test(shown) ? shown : shellQuote(shown)}`;
}

/** `--help`, or `help TOPIC`: the program's usage, or a command's. */
async function help(topic: string | undefined, io: Io): Promise<number> {
  if (topic !== undefined && !Object.hasOwn(COMMANDS, topic)) {
    io.err(`error: unknown command "${topic}" (see "${PROGRAM} --help")\n`);
    return EXIT_USAGE;
  }
  if (topic === undefined) {
    io.out(topUsage());
    return EXIT_OK;
  }
  try {
    io.out((await COMMANDS[topic].load()).USAGE);
    return EXIT_OK;
  } catch (err) {
    return failed(io, err);
  }
}

/**
 * Runs command `name` under the stop signals; its usage errors, an
 * interruption and failures become one line and an exit code.
 */
async function runCommand(name: string, args: string[], io: Io): Promise<number> {
  // serve handles its signals itself: they end a normal run.
  using trap = name === "serve" ? null : trapSignals(io);
  if (trap) io.signal = trap.signal;
  return await runModule(COMMANDS[name].load, args, io, () => trap?.interrupted() ?? false);
}

if (import.meta.main) {
  // A server gives itself its V8 flags (young generation) before it loads
  // anything more, re-executing into the serve command alone: see
  // _server/v8_flags.ts.
  if (Deno.args[0] === "serve") {
    const { execWithServerV8Flags } = await import("./_server/v8_flags.ts");
    execWithServerV8Flags(new URL("./cli/_serve_main.ts", import.meta.url));
  }
  Deno.exit(await main(Deno.args));
}
