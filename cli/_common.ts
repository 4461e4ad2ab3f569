// What every command of the command line shares: how it talks to the world
// (Io), its exit codes, and the argument helpers. Kept free of the SDK's
// subsystems, so that loading a command loads only what that command needs.

import { parseArgs } from "node:util";
import type { TaskEntry } from "../env.ts";
import { readCapped } from "../_internal/body.ts";
import { errorMessage } from "../_internal/util.ts";

/** The program name shown in usage texts. */
export const PROGRAM = "hud";
/** The port `serve` listens on unless told otherwise. */
export const DEFAULT_PORT = 8765;

/** Signals that stop a command, all alike (Windows has only SIGINT). */
export const STOP_SIGNALS: Deno.Signal[] = Deno.build.os === "windows"
  ? ["SIGINT"]
  : ["SIGINT", "SIGTERM", "SIGHUP"];

/** Exit codes: success, failure, bad usage, interrupted by a signal. */
export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;
export const EXIT_INTERRUPTED = 130;

/** Colour and cursor escapes (Deno's import errors carry them). */
// deno-lint-ignore no-control-regex
const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;

/** Bad usage: reported on one line, exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** What a command gets to talk to the world. */
export interface Io {
  out(text: string): void;
  err(text: string): void;
  stdin(): ReadableStream<Uint8Array>;
  signal: AbortSignal | undefined;
  /** Whether progress may redraw one line (standard error is a terminal). */
  live: boolean;
  /**
   * How the user ran the command line (`hud`, or `deno run -A cli.ts`), for
   * hints that repeat a command; usage texts say `hud`.
   */
  program: string;
  /** Called on a second interrupting signal: stop now, skipping grace periods. */
  onHurry?: () => void;
}

/** A command module under `cli/`: its help and its body. */
export interface Command {
  USAGE: string;
  run(args: string[], io: Io): Promise<number>;
}

/** The options of a command, as `node:util` `parseArgs` takes them. */
export type OptionSpec = Record<
  string,
  { type: "string" | "boolean"; short?: string; multiple?: boolean }
>;
/** Parsed option values. */
export type Values = Record<string, string | boolean | string[] | undefined>;

/** What {@linkcode parseCommand} checks a command's arguments against. */
export interface CommandSpec {
  /** The command's name, for "see hud NAME --help". */
  name: string;
  /** The help text `--help` prints. */
  usage: string;
  options: OptionSpec;
  /**
   * The positional arguments' names, and how many are required; with
   * `rest`, the last name takes any number of words (`shell -- COMMAND...`).
   */
  positionals: { names: string[]; min: number; rest?: boolean };
}

/**
 * Parses a command's arguments. Returns `null` when `--help` was given (the
 * usage has been printed).
 * @throws {UsageError} for unknown options, missing values, wrong positionals
 */
export function parseCommand(
  args: string[],
  spec: CommandSpec,
  io: Io,
): { values: Values; positionals: string[] } | null {
  const { name, positionals } = spec;
  let parsed: { values: Values; positionals: string[] };
  try {
    parsed = parseArgs({
      args,
      options: { ...spec.options, help: { type: "boolean", short: "h" } },
      strict: true,
      allowPositionals: true,
    }) as { values: Values; positionals: string[] };
  } catch (err) {
    throw new UsageError(`${parseArgsMessage(err)} (see "${PROGRAM} ${name} --help")`);
  }
  if (parsed.values.help) {
    io.out(spec.usage);
    return null;
  }
  const given = parsed.positionals;
  if (given.length < positionals.min) {
    throw new UsageError(
      `missing ${positionals.names[given.length]} (see "${PROGRAM} ${name} --help")`,
    );
  }
  if (!positionals.rest && given.length > positionals.names.length) {
    throw new UsageError(
      `unexpected argument "${given[positionals.names.length]}" (see "${PROGRAM} ${name} --help")`,
    );
  }
  return parsed;
}

/** node:util's parse errors, as one short line. */
function parseArgsMessage(err: unknown): string {
  const message = errorMessage(err);
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

/** A string option's value, or undefined. */
export function stringOption(values: Values, name: string): string | undefined {
  const v = values[name];
  return typeof v === "string" ? v : undefined;
}

/**
 * A flag that takes a positive integer: its value, or `fallback` when not
 * given.
 * @throws {UsageError} naming the flag, for any other text
 */
export function positiveIntOption(flag: string, text: string | undefined, fallback: number): number;
export function positiveIntOption(flag: string, text: string | undefined): number | undefined;
export function positiveIntOption(
  flag: string,
  text: string | undefined,
  fallback?: number,
): number | undefined {
  if (text === undefined) return fallback;
  if (!/^\d+$/.test(text) || Number(text) < 1) {
    throw new UsageError(`${flag} must be a positive integer, got "${text}"`);
  }
  return Number(text);
}

/**
 * A flag that takes a positive number of seconds, or `undefined` when not given.
 * @throws {UsageError} naming the flag, for any other text
 */
export function secondsOption(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d+(\.\d+)?$/.test(text) || !(Number(text) > 0)) {
    throw new UsageError(`${flag} must be a positive number of seconds, got "${text}"`);
  }
  return Number(text);
}

/**
 * The number a flag's text spells in decimal digits (`8`, `0.05`), else
 * NaN: what is left to check is the library's, whose refusal then quotes
 * the text as given.
 */
export function decimalNumber(text: string): number {
  return /^\d+(\.\d+)?$/.test(text) ? Number(text) : NaN;
}

/**
 * Reads the token in `--token-file` (one line): a file that only its owner
 * may read and write, since the token opens the environment.
 * @throws {UsageError} for a file its group or others can use, an empty one,
 *   or one that cannot be read
 */
export async function readTokenFile(path: string): Promise<string> {
  let text: string;
  try {
    // One descriptor for the check and the read: the file checked is the file read.
    const file = await Deno.open(path, { read: true });
    let mode: number | null;
    try {
      mode = (await file.stat()).mode;
    } catch (err) {
      file.close();
      throw err;
    }
    if (mode !== null && (mode & 0o077) !== 0) {
      file.close();
      const how = (mode & 0o044) !== 0 ? "read" : "written";
      throw new UsageError(
        `--token-file "${path}" can be ${how} by its group or others (mode 0${
          (mode & 0o777).toString(8)
        }); chmod 600 "${path}"`,
      );
    }
    // A token is one short line; the readable closes the file.
    text = new TextDecoder().decode(await readCapped(file.readable, 64 * 1024, "the file"));
  } catch (err) {
    if (err instanceof UsageError) throw err;
    throw new UsageError(`cannot read --token-file "${path}": ${errorMessage(err)}`);
  }
  const token = text.replace(/\r?\n$/, "");
  if (token === "") throw new UsageError(`--token-file "${path}" is empty`);
  return token;
}

/** A --port value (0 to 65535), or {@linkcode DEFAULT_PORT} when not given. */
export function parsePort(text: string | undefined): number {
  if (text === undefined) return DEFAULT_PORT;
  if (!/^\d+$/.test(text) || Number(text) > 65535) {
    throw new UsageError(`--port must be an integer from 0 to 65535, got "${text}"`);
  }
  return Number(text);
}

/** The error for a template the environment does not have, listing those it has. */
export function unknownTemplate(verb: string, taskId: string, templates: TaskEntry[]): RangeError {
  const known = templates.map((t) => `"${t.id}"`).join(", ") || "none";
  return new RangeError(`Cannot ${verb}: unknown template "${taskId}" (available: ${known})`);
}

// How the command line's process talks to the world: its standard streams
// as an Io, and a command's outcome as an exit code. For cli.ts and
// cli/_serve_main.ts, the serve command alone, which `cli.ts serve`
// re-executes itself into when it gives itself its V8 flags.

/** Replacements for the process's standard streams (`MainOptions` of cli.ts). */
export interface StreamOptions {
  stdout?: (text: string) => void;
  stderr?: (text: string) => void;
  stdin?: ReadableStream<Uint8Array>;
  signal?: AbortSignal;
  /** How the user ran the command line, for hints. @default {@linkcode PROGRAM} */
  program?: string;
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

/** The process's standard streams, or the replacements given, as an {@linkcode Io}. */
export function processIo(options: StreamOptions = {}): Io {
  const live = options.stderr === undefined && Deno.stderr.isTerminal() &&
    !Deno.env.get("NO_COLOR");
  const rawErr = options.stderr ?? streamWriter(Deno.stderr);
  return {
    out: options.stdout ?? streamWriter(Deno.stdout),
    // Colour codes only on a live terminal (progress redraws); never in
    // messages that go to a pipe or a file.
    err: live ? rawErr : (t) => rawErr(t.replace(ANSI, "")),
    stdin: () => options.stdin ?? Deno.stdin.readable,
    signal: options.signal,
    live,
    program: options.program ?? PROGRAM,
  };
}

/**
 * Reports a failed command on one line; an environment's task code that
 * threw (an error reply whose data says where) with its file and line.
 * The exit code for it.
 */
export function failed(io: Io, err: unknown): number {
  const first = errorMessage(err).replace(ANSI, "").split("\n")[0];
  const data = (err as { data?: { at?: unknown } } | null)?.data;
  const at = typeof data?.at === "string" && !first.includes(data.at) ? ` (at ${data.at})` : "";
  io.err(`error: ${first}${at}\n`);
  return EXIT_FAILURE;
}

/**
 * Loads and runs a command; its exit code, with what went wrong on one
 * line: bad usage is 2, a failure after an interrupting signal
 * (`interrupted`) 130, any other failure 1.
 */
export async function runModule(
  load: () => Promise<Command>,
  args: string[],
  io: Io,
  interrupted: () => boolean = () => false,
): Promise<number> {
  try {
    const command = await load();
    return await command.run(args, io);
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`error: ${err.message}\n`);
      return EXIT_USAGE;
    }
    if (interrupted()) {
      io.err("interrupted\n");
      return EXIT_INTERRUPTED;
    }
    return failed(io, err);
  }
}
