/**
 * Tools a chat agent offers its model: typed tools an author writes with
 * {@linkcode defineTool}, and the tools a `shell` capability gives
 * ({@linkcode shellTools}: `bash`, `read_file`, `write_file`, `list_dir`).
 *
 * @module
 */

import {
  type ArgsShape,
  type InferArgs,
  type JsonSchema,
  shapeToJsonSchema,
  string as stringSchema,
} from "../schema.ts";
import type { Run } from "../eval/run.ts";
import type { AnthropicToolDefinition } from "./model.ts";
import { checkArgs } from "../mcp/server.ts";
import type { SshClient } from "../ssh/client.ts";
import { shellQuote } from "../_internal/shell.ts";
import { isRecord } from "../_internal/util.ts";

/** What a tool gets besides its arguments. */
export interface ToolContext {
  /** The run the agent works on. */
  run: Run;
  /** Aborts when the agent's time is up. */
  signal: AbortSignal;
}

/** A tool the model may call. */
export interface AgentTool {
  /** The tool's name: letters, digits, `_` and `-`. */
  readonly name: string;
  /** What it does, for the model. */
  readonly description: string;
  /** JSON Schema of its arguments object. */
  readonly parameters: JsonSchema;
  /** Its Anthropic-defined form (the computer tool's), which the Anthropic format sends instead. */
  readonly anthropic?: AnthropicToolDefinition;
  /**
   * Runs the tool. A string is given to the model as is, an `ImageResult`
   * as its text and pictures, anything else as JSON; a thrown error's
   * message goes back as an error result.
   */
  call(args: Record<string, unknown>, context: ToolContext): Promise<unknown>;
}

/** What {@linkcode defineTool} takes. */
export interface ToolDefinition<S extends ArgsShape> {
  /** The tool's name: letters, digits, `_` and `-`. */
  name: string;
  /** What it does, for the model. */
  description: string;
  /** Its arguments, as schema.ts builders (`string()`, `integer()`...). */
  args: S;
  /** Runs the tool on checked arguments. */
  run(args: InferArgs<S>, context: ToolContext): unknown;
}

const NAME = /^[A-Za-z0-9_-]{1,64}$/;

/**
 * Makes a typed tool: its JSON Schema comes from `args`, and a call's
 * arguments are coerced and checked before `run` sees them.
 * @throws {TypeError} for a bad name or a missing function
 */
export function defineTool<S extends ArgsShape>(definition: ToolDefinition<S>): AgentTool {
  const { name, description, args, run } = definition ?? {};
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new TypeError(
      `Cannot define tool: name "${name}" must be 1-64 letters, digits, "_" or "-"`,
    );
  }
  if (typeof run !== "function") {
    throw new TypeError(`Cannot define tool "${name}": run must be a function`);
  }
  const shape = args ?? ({} as S);
  return {
    name,
    description: description ?? "",
    parameters: shapeToJsonSchema(shape, false),
    async call(input, context) {
      const checked = checkArgs(shape, input);
      return await run(checked as InferArgs<S>, context);
    },
  };
}

/** Options for {@linkcode shellTools}. */
export interface ShellToolsOptions {
  /**
   * The most characters of stdout, of stderr, and of a file read, that the
   * model sees; the rest is cut with a note.
   * @default 16_000
   */
  outputLimit?: number;
  /**
   * The longest a `bash` command may run, in ms.
   * @default 120_000
   */
  commandTimeout?: number;
  /**
   * Where `bash` commands run and relative paths of the file tools resolve
   * ({@linkcode ChatAgent} takes it from the task's `bindings.shell.cwd`).
   * @default the shell's own start directory
   */
  cwd?: string;
}

/** Keeps the head and tail of `text` within `limit` characters, saying what was cut. */
export function truncate(text: string, limit: number): string {
  if (text.length <= limit) return text;
  const head = Math.ceil(limit * 0.6);
  const tail = limit - head;
  const cut = text.length - head - tail;
  return `${text.slice(0, head)}\n[... ${cut} characters cut: output over ${limit} ...]\n${
    tail > 0 ? text.slice(-tail) : ""
  }`;
}

/**
 * The tools an SSH workspace gives: `bash` (exit code, stdout, stderr) and
 * the file tools `read_file`, `write_file` and `list_dir`.
 */
export function shellTools(ssh: SshClient, options: ShellToolsOptions = {}): AgentTool[] {
  const limit = options.outputLimit ?? 16_000;
  const timeout = options.commandTimeout ?? 120_000;
  const cwd = options.cwd;
  // readText/writeText/listDir go over SFTP (commands only where a server
  // refuses SFTP): binary-safe, no shell quoting of paths.
  return [
    bashTool(ssh, limit, timeout, cwd),
    readFileTool(ssh, limit, cwd),
    writeFileTool(ssh, cwd),
    listDirTool(ssh, cwd),
  ];
}

/** `path` resolved against `cwd`, when relative and a `cwd` is given. */
function inDir(cwd: string | undefined, path: string): string {
  return cwd === undefined || path.startsWith("/") ? path : `${cwd.replace(/\/+$/, "")}/${path}`;
}

function bashTool(
  ssh: SshClient,
  limit: number,
  timeout: number,
  cwd: string | undefined,
): AgentTool {
  // On a line of its own: a command's `;` or `||` must not escape the cd.
  const inCwd = (command: string) =>
    cwd === undefined ? command : `cd -- ${shellQuote(cwd)} || exit 1\n${command}`;
  return defineTool({
    name: "bash",
    description: "Run a bash command in the workspace. Returns the exit code, stdout and stderr.",
    args: { command: stringSchema({ description: "The command line, run by bash" }) },
    async run({ command }, { signal }) {
      const r = await ssh.exec(inCwd(command), { signal, timeout });
      const out = [`exit_code: ${r.signal ? `killed by ${signalName(r.signal)}` : r.code}`];
      if (r.stdoutText !== "") out.push(`stdout:\n${truncate(r.stdoutText, limit)}`);
      if (r.stderrText !== "") out.push(`stderr:\n${truncate(r.stderrText, limit)}`);
      return out.join("\n");
    },
  });
}

function readFileTool(ssh: SshClient, limit: number, cwd: string | undefined): AgentTool {
  return defineTool({
    name: "read_file",
    description: "Read a text file in the workspace.",
    args: { path: stringSchema({ description: "The file's path" }) },
    async run({ path }, { signal }) {
      return truncate(await ssh.readText(inDir(cwd, path), { signal }), limit);
    },
  });
}

function writeFileTool(ssh: SshClient, cwd: string | undefined): AgentTool {
  return defineTool({
    name: "write_file",
    description: "Write a text file in the workspace, replacing it.",
    args: {
      path: stringSchema({ description: "The file's path" }),
      content: stringSchema({ description: "The file's new content" }),
    },
    async run({ path, content }, { signal }) {
      await ssh.writeText(inDir(cwd, path), content, { signal });
      return `wrote ${content.length} characters to ${path}`;
    },
  });
}

function listDirTool(ssh: SshClient, cwd: string | undefined): AgentTool {
  return defineTool({
    name: "list_dir",
    description: "List a directory in the workspace.",
    args: { path: stringSchema({ description: "The directory's path" }) },
    async run({ path }, { signal }) {
      const entries = await ssh.listDir(inDir(cwd, path), { signal });
      return entries.map((e) => e.isDirectory ? `${e.name}/` : e.name).join("\n") || "(empty)";
    },
  });
}

/**
 * A signal as Deno names it (`SIGKILL`): SSH's exit-signal names it without
 * the prefix (RFC 4254), which ExitStatus adds.
 */
function signalName(signal: string): string {
  return signal.startsWith("SIG") ? signal : `SIG${signal}`;
}

/** A tool result as the text the model sees. */
export function resultText(value: unknown): string {
  if (typeof value === "string") return value;
  if (value === undefined) return "ok";
  try {
    return JSON.stringify(value);
  } catch {
    return String(value);
  }
}

/** Whether a parsed arguments value is an object. */
export function isArgs(value: unknown): value is Record<string, unknown> {
  return isRecord(value);
}
