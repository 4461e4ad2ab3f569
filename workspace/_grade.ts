// One grading command (`Workspace.exec()` within a phase): its arguments
// checked, a fresh directory for its HOME and hidden files, the agent's
// sandbox with those in place, and its run under a timeout with its output
// kept up to a bound.

import { errorMessage, readEnv, refuseRenamed } from "../_internal/util.ts";
import { concat } from "../_internal/io.ts";
import { DEFAULT_PATH, type SandboxConfig, spawnInSandbox } from "./_sandbox.ts";
import { isUnder } from "../_internal/fs.ts";
import { killTrees } from "./_processes.ts";
import type { HandOverHint } from "./_handover.ts";
import { WaitingSandbox } from "./_waiting.ts";
import { absolute } from "./_config.ts";
import { WORKSPACE_RUN_DIR } from "./_sftp.ts";
import type { WorkspaceExecOptions, WorkspaceExecResult } from "./_types.ts";
import { type ParsedPolicy, parseNetworkPolicy } from "./_netpolicy.ts";
import { phaseNetwork } from "./_netphase.ts";
import { removeScratch, scratchDir } from "./_scratch.ts";

/** Where a grading command finds its `files`, inside the sandbox. */
const GRADER_FILES = "/grader";

/** A grading command, checked, with every default applied. */
export interface GradeCommand {
  readonly argv: readonly string[];
  /** Absolute and normalised, inside the root. */
  readonly cwd: string;
  readonly timeout: number;
  readonly maxOutput: number;
  readonly files: readonly (readonly [string, string | Uint8Array])[];
  readonly env: Readonly<Record<string, string>>;
  readonly stdin: string | Uint8Array | undefined;
  readonly signal: AbortSignal | undefined;
  /** A policy of its own, or null for the workspace's. */
  readonly network: ParsedPolicy | null;
}

/** What of the agent's episode a grading command runs with. */
export interface GradeSandbox {
  /** The agent's sandbox. */
  readonly sandbox: SandboxConfig;
  /** The agent's uid and gid (as root), or null. */
  readonly user: { uid: number; gid: number } | null;
  /** The agent's commands' HOME, USER and the author's variables. */
  readonly commandEnv: Readonly<Record<string, string>>;
  /** Whether root may have added files to hand over since the last command; null: always. */
  readonly handOver?: HandOverHint | null;
}

/** @throws {TypeError} unless `argv` is a non-empty array of strings */
export function checkArgv(verb: string, name: string, argv: readonly string[]): void {
  if (
    !Array.isArray(argv) || argv.length === 0 || !argv.every((a) => typeof a === "string")
  ) {
    throw new TypeError(
      `Cannot ${verb} workspace "${name}": argv must be a non-empty string array`,
    );
  }
}

/** `path` without ".", ".." and doubled slashes (links are not resolved). */
function normalize(path: string): string {
  const parts: string[] = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") parts.pop();
    else parts.push(part);
  }
  return `/${parts.join("/")}`;
}

function checkFiles(
  name: string,
  files: Record<string, string | Uint8Array>,
): [string, string | Uint8Array][] {
  const entries = Object.entries(files);
  for (const [path, content] of entries) {
    const parts = path.split("/");
    if (
      path === "" || path.startsWith("/") || path.includes("\0") ||
      parts.some((p) => p === "" || p === "." || p === "..") ||
      (typeof content !== "string" && !(content instanceof Uint8Array))
    ) {
      throw new TypeError(
        `Cannot run in workspace "${name}": invalid file "${path}" (a relative path to a string or bytes)`,
      );
    }
  }
  return entries;
}

/**
 * Checks a grading command's arguments and applies the defaults.
 * @param name the workspace's name, for messages
 * @param root the workspace's root
 * @throws {TypeError} for a bad `argv` or `files`, or an option by its old name
 * @throws {RangeError} for a `cwd` outside the root or a bad `timeout`
 */
export function gradeCommand(
  name: string,
  root: string,
  argv: readonly string[],
  options: WorkspaceExecOptions,
): GradeCommand {
  checkArgv("run in", name, argv);
  refuseRenamed(`run in workspace "${name}"`, options, { timeoutMs: "timeout" });
  const cwd = normalize(options.cwd === undefined ? root : absolute(options.cwd));
  if (!isUnder(cwd, normalize(root))) {
    throw new RangeError(
      `Cannot run in workspace "${name}": cwd "${options.cwd}" is outside the root "${root}"`,
    );
  }
  const timeout = options.timeout ?? 600_000;
  if (!(timeout > 0)) {
    throw new RangeError(`Cannot run in workspace "${name}": invalid timeout "${timeout}"`);
  }
  return {
    argv,
    cwd,
    timeout,
    maxOutput: options.maxOutput ?? 1024 * 1024,
    files: checkFiles(name, options.files ?? {}),
    env: options.env ?? {},
    stdin: options.stdin,
    signal: options.signal,
    network: commandNetwork(name, options.network),
  };
}

function commandNetwork(name: string, network: WorkspaceExecOptions["network"]) {
  if (network === undefined) return null;
  try {
    return parseNetworkPolicy(network);
  } catch (err) {
    throw new TypeError(`Cannot run in workspace "${name}": ${errorMessage(err)}`);
  }
}

/**
 * Makes a directory for one grading command: `home/`, its HOME (the agent's
 * uid's), and `files/`, its hidden files (world-readable, for any uid).
 */
async function gradingDir(
  files: GradeCommand["files"],
  user: GradeSandbox["user"],
): Promise<string> {
  const dir = await scratchDir("hud-grade-");
  try {
    await Deno.chmod(dir, 0o711);
    await Deno.mkdir(`${dir}/home`, { mode: 0o700 });
    await Deno.mkdir(`${dir}/files`, { mode: 0o755 });
    await Deno.chmod(`${dir}/files`, 0o755);
    await writeFiles(dir, files);
    if (user !== null) await Deno.chown(`${dir}/home`, user.uid, user.gid);
    return dir;
  } catch (err) {
    await removeScratch(dir);
    throw err;
  }
}

/** Writes a grading command's hidden files into its directory's `files/`. */
async function writeFiles(dir: string, files: GradeCommand["files"]): Promise<void> {
  for (const [path, content] of files) {
    const full = `${dir}/files/${path}`;
    await Deno.mkdir(full.slice(0, full.lastIndexOf("/")), { recursive: true, mode: 0o755 });
    if (typeof content === "string") await Deno.writeTextFile(full, content, { mode: 0o755 });
    else await Deno.writeFile(full, content, { mode: 0o755 });
  }
}

/**
 * A grading command's directory and sandbox, made ahead: the command then
 * only writes its files into the directory (the sandbox shows it as it is)
 * and sends its words.
 */
export interface PreparedGrading {
  readonly dir: string;
  readonly waiting: WaitingSandbox | null;
}

/** Makes the directory and the waiting sandbox of the next grading command. */
export async function prepareGrading(agent: GradeSandbox, root: string): Promise<PreparedGrading> {
  const dir = await gradingDir([], agent.user);
  return { dir, waiting: WaitingSandbox.start(graderSandbox(agent.sandbox, root, dir), root) };
}

/** Discards a prepared grading that no command took. */
export async function discardGrading(prepared: PreparedGrading): Promise<void> {
  await prepared.waiting?.discard();
  await removeScratch(prepared.dir);
}

/**
 * The agent's sandbox for a grading command: the root and a fresh HOME
 * writable, the hidden files read-only at /grader, nothing of the
 * workspace's own (the SFTP server).
 */
function graderSandbox(sandbox: SandboxConfig, root: string, dir: string): SandboxConfig {
  return {
    ...sandbox,
    writable: [root, `${dir}/home`],
    mounts: [
      ...(sandbox.mounts ?? []).filter((m) => !m.dest.startsWith(WORKSPACE_RUN_DIR)),
      { src: `${dir}/files`, dest: GRADER_FILES },
    ],
  };
}

/**
 * Runs a grading command in the agent's sandbox and waits for it, its
 * process id in `running` meanwhile (the workspace kills those when it
 * stops).
 */
export async function runGradeCommand(
  agent: GradeSandbox,
  root: string,
  command: GradeCommand,
  running: Set<number>,
  prepared: PreparedGrading | null = null,
): Promise<WorkspaceExecResult> {
  const started = performance.now();
  let dir: string;
  if (prepared === null) dir = await gradingDir(command.files, agent.user);
  else {
    dir = prepared.dir;
    await writeFiles(dir, command.files).catch(async (err) => {
      await discardGrading(prepared);
      throw err;
    });
  }
  try {
    const sandboxed = agent.sandbox.isolation !== "none";
    const env = {
      PATH: readEnv("PATH") ?? DEFAULT_PATH,
      LANG: readEnv("LANG") ?? "C.UTF-8",
      ...agent.commandEnv,
      HOME: `${dir}/home`,
      HUD_GRADER_FILES: sandboxed ? GRADER_FILES : `${dir}/files`,
      ...command.env,
    };
    const sandbox = graderSandbox(agent.sandbox, root, dir);
    if (command.network === null) {
      const waiting = prepared?.waiting ?? null;
      // Asked only when the sandbox made ahead runs it (a sandbox started
      // now hands over at its start).
      const handOver = waiting === null || (agent.handOver?.needed() ?? true);
      return await runIn(sandbox, env, { waiting, handOver }, running, command, started);
    }
    // Its own network: the sandbox made ahead for the workspace's will not do.
    await prepared?.waiting?.discard();
    await using net = await phaseNetwork(sandbox, env, command.network);
    return await runIn(net.sandbox, net.env, null, running, command, started);
  } finally {
    await removeScratch(dir);
  }
}

/** The sandbox made ahead, and whether it is to hand root's files over first. */
interface Ahead {
  readonly waiting: WaitingSandbox | null;
  readonly handOver: boolean;
}

/** Starts the command (in the sandbox made ahead when it is ready) and captures it. */
async function runIn(
  sandbox: SandboxConfig,
  env: Record<string, string>,
  ahead: Ahead | null,
  running: Set<number>,
  command: GradeCommand,
  started: number,
): Promise<WorkspaceExecResult> {
  const child = await startGrader(
    ahead,
    running,
    command,
    env,
    () => spawnInSandbox(command.argv, { cwd: command.cwd, env, sandbox }),
  );
  try {
    return await capture(child, command, started);
  } finally {
    running.delete(child.pid);
  }
}

/**
 * Starts a grading command in `waiting` when it is ready, else with
 * `spawn`; its pid in `running` from before its words go (the workspace's
 * stop kills those).
 */
async function startGrader(
  ahead: Ahead | null,
  running: Set<number>,
  command: GradeCommand,
  env: Record<string, string>,
  spawn: () => Deno.ChildProcess,
): Promise<Deno.ChildProcess> {
  const waiting = ahead?.waiting ?? null;
  if (waiting?.ready) {
    running.add(waiting.child.pid);
    try {
      return await waiting.run(command.argv, command.cwd, env, ahead!.handOver);
    } catch {
      // It exited meanwhile (or a word holds a NUL byte, which spawn refuses too).
      running.delete(waiting.child.pid);
    }
  }
  await waiting?.discard();
  const child = spawn();
  running.add(child.pid);
  return child;
}

/**
 * Feeds `child` its stdin, keeps up to `maxOutput` bytes of each of its
 * outputs and waits for it to end, killing its whole tree at the timeout or
 * when the signal aborts.
 */
async function capture(
  child: Deno.ChildProcess,
  command: GradeCommand,
  started: number,
): Promise<WorkspaceExecResult> {
  const { signal, timeout, maxOutput } = command;
  let timedOut = false;
  const kill = () => killTrees([child.pid]);
  const timer = setTimeout(() => {
    timedOut = true;
    kill();
  }, timeout);
  signal?.addEventListener("abort", kill, { once: true });
  if (signal?.aborted) kill();
  try {
    const [status, stdout, stderr] = await Promise.all([
      child.status,
      collect(child.stdout, maxOutput),
      collect(child.stderr, maxOutput),
      feed(child.stdin, command.stdin),
    ]);
    return {
      code: status.signal === null ? status.code : null,
      signal: status.signal,
      stdout,
      stderr,
      timedOut,
      durationMs: Math.round(performance.now() - started),
    };
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", kill);
  }
}

/** Writes `input` (if any) to `stdin` and closes it; a command may stop reading. */
async function feed(
  stdin: WritableStream<Uint8Array>,
  input: string | Uint8Array | undefined,
): Promise<void> {
  const w = stdin.getWriter();
  try {
    if (input !== undefined) {
      await w.write(typeof input === "string" ? new TextEncoder().encode(input) : input);
    }
    await w.close();
  } catch {
    // It stopped reading.
  }
}

/** Reads `stream` to its end, keeping its first `max` bytes, as text. */
async function collect(stream: ReadableStream<Uint8Array>, max: number): Promise<string> {
  const chunks: Uint8Array[] = [];
  let kept = 0;
  for await (const chunk of stream) {
    if (kept >= max) continue;
    const part = chunk.subarray(0, max - kept);
    chunks.push(part);
    kept += part.length;
  }
  return new TextDecoder().decode(concat(chunks));
}
