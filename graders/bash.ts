/**
 * {@linkcode bashGrader}: runs a command in the workspace's sandbox, after
 * the agent's processes are gone, and scores it by its exit code, keeping
 * the code, the output (bounded) and the timing in `info`. It needs only
 * an {@linkcode ExecTarget}: anything with the `exec(argv, options)` of
 * the workspace handle `addWorkspace` returns (its options and result are
 * `WorkspaceExecOptions` and `WorkspaceExecResult`).
 *
 * @module
 */

import type { SubScore } from "./combine.ts";
import type { WorkspaceExecOptions, WorkspaceExecResult } from "../workspace/workspace.ts";
import { errorMessage, refuseRenamed } from "../_internal/util.ts";

/**
 * Where a command runs: the workspace handle `addWorkspace` returns, or
 * anything with the same `exec` (its options and result are the
 * workspace's).
 */
export interface ExecTarget {
  /** Runs `argv` (no shell) and waits for it to end. */
  exec(argv: string[], options?: WorkspaceExecOptions): Promise<WorkspaceExecResult>;
}

/** Options for {@linkcode bashGrader}. */
export interface BashGraderOptions {
  /**
   * The subscore's name.
   * @default "bash"
   */
  name?: string;
  /**
   * The subscore's weight; negative for a penalty (a command that should fail).
   * @default 1
   */
  weight?: number;
  /** The working directory. @default the workspace's */
  cwd?: string;
  /**
   * Milliseconds after which the command is killed; it then scores 0.
   * @default 600_000
   */
  timeout?: number;
  /** Extra environment variables. */
  env?: Record<string, string>;
  /** Input for the command. */
  stdin?: string | Uint8Array;
  /**
   * Hidden files for this check only (Harbor-style tests, a check script),
   * by relative path: the workspace writes them into a fresh directory the
   * agent never saw and shows it read-only in the sandbox, named by
   * `$HUD_GRADER_FILES` (`/grader`), for this command alone
   * (`WorkspaceExecOptions.files`). The command reaches them there:
   * `bash "$HUD_GRADER_FILES/test.sh"`.
   * @default {}
   */
  files?: Record<string, string | Uint8Array>;
  /** Abort grading. */
  signal?: AbortSignal;
  /**
   * The most characters of each of stdout and stderr kept in `info`; the
   * end is kept, where test runners print their summary.
   * @default 16_384
   */
  maxOutput?: number;
}

/** The end of `s`, at most `max` characters, saying how much went before. */
function tail(s: string, max: number): string {
  if (s.length <= max) return s;
  const cut = s.length - max;
  return `[${cut} earlier characters cut]\n${s.slice(cut)}`;
}

/**
 * Why a finished command says nothing of the agent's work, or `null`: it
 * could not be found (exit 127) or executed (126), or it was killed
 * (SIGKILL, or 137 from a shell: the sandbox's memory or process limit, or
 * a kill from outside) before its time was up.
 */
function cannotRun(result: WorkspaceExecResult): string | null {
  const said = result.stderr.trim().split("\n").at(-1)?.slice(0, 300) ?? "";
  const detail = said === "" ? "" : `: ${said}`;
  if (result.code === 127) return `the command was not found (exit 127)${detail}`;
  if (result.code === 126) return `the command could not be executed (exit 126)${detail}`;
  if (!result.timedOut && (result.signal === "SIGKILL" || result.code === 137)) {
    return `the command was killed (${
      result.signal ?? "exit 137"
    }) before its timeout: the sandbox's memory or process limit, or a kill from outside${detail}`;
  }
  return null;
}

/**
 * Runs `command` in the sandbox and scores 1 when it exits 0, else 0 (a
 * time-out too). A string runs with `bash -lc`, as the Python SDK's
 * `BashGrader` does; an array is the argv itself. A command that cannot
 * run is no score at all but a grading error: not found (exit 127), not
 * executable (126), or killed before its timeout (the sandbox's limits).
 *
 * `info` holds `command`, `exit_code`, `signal`, `timed_out`,
 * `duration_ms`, `stdout` and `stderr` (each the last `maxOutput`
 * characters), and with `files` their paths (not their content).
 *
 * Hidden tests go in `files`: written for the check alone and shown
 * read-only at `$HUD_GRADER_FILES`, they are never where the agent could
 * read them first or plant a file of its own in their place.
 *
 * @param target the workspace (its `exec`)
 * @param command a bash command line, or an argv
 * @throws {TypeError} for an empty command
 * @throws {RangeError} for a non-positive timeout or output bound
 * @throws {Error} `Cannot run bash grader "name": ...` when the command cannot
 *   be run at all (the workspace is gone, exit 127 or 126, killed by the
 *   sandbox's limits): not a score, a failure to grade
 * @throws the signal's reason when `signal` aborts
 *
 * @example
 * ```ts
 * import { bashGrader, combine, type ExecTarget } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * // Any exec(argv) will do; a workspace handle is the usual one.
 * const here: ExecTarget = {
 *   async exec(argv) {
 *     const out = await new Deno.Command(argv[0], { args: argv.slice(1) }).output();
 *     const decode = (b: Uint8Array) => new TextDecoder().decode(b);
 *     return {
 *       code: out.code, signal: out.signal, stdout: decode(out.stdout),
 *       stderr: decode(out.stderr), timedOut: false, durationMs: 0,
 *     };
 *   },
 * };
 * const grade = await combine([
 *   bashGrader(here, "test 2 -gt 1 && echo ok", { name: "compare" }),
 *   bashGrader(here, ["false"], { name: "false", weight: -0.5 }),
 * ]);
 * assert.equal(grade.score, 1);
 * assert.equal(grade.info.breakdown[0].info?.stdout, "ok\n");
 * assert.equal(grade.info.breakdown[1].info?.exit_code, 1);
 * ```
 */
export async function bashGrader(
  target: ExecTarget,
  command: string | readonly string[],
  options: BashGraderOptions = {},
): Promise<SubScore> {
  const name = options.name ?? "bash";
  const argv = typeof command === "string" ? ["bash", "-lc", command] : [...command];
  if ((typeof command === "string" ? command.trim() : argv[0] ?? "") === "") {
    throw new TypeError(`Cannot run bash grader "${name}": the command is empty`);
  }
  refuseRenamed(`run bash grader "${name}"`, options, { timeoutMs: "timeout" });
  const timeout = options.timeout ?? 600_000;
  if (!(timeout > 0)) {
    throw new RangeError(`Cannot run bash grader "${name}": timeout ${timeout} must be > 0`);
  }
  const maxOutput = options.maxOutput ?? 16_384;
  if (!(maxOutput > 0)) {
    throw new RangeError(`Cannot run bash grader "${name}": maxOutput ${maxOutput} must be > 0`);
  }
  options.signal?.throwIfAborted();
  const exec: WorkspaceExecOptions = { timeout };
  if (options.cwd !== undefined) exec.cwd = options.cwd;
  if (options.env !== undefined) exec.env = options.env;
  if (options.stdin !== undefined) exec.stdin = options.stdin;
  if (options.files !== undefined) exec.files = options.files;
  if (options.signal !== undefined) exec.signal = options.signal;
  let result: WorkspaceExecResult;
  try {
    result = await target.exec(argv, exec);
  } catch (err) {
    if (options.signal?.aborted) throw options.signal.reason;
    throw new Error(`Cannot run bash grader "${name}": ${errorMessage(err)}`, {
      cause: err,
    });
  }
  const cannot = cannotRun(result);
  if (cannot !== null) throw new Error(`Cannot run bash grader "${name}": ${cannot}`);
  const passed = result.code === 0 && !result.timedOut;
  return {
    name,
    value: passed ? 1 : 0,
    weight: options.weight ?? 1,
    info: {
      command: typeof command === "string" ? command : argv,
      ...(options.files === undefined ? {} : { files: Object.keys(options.files) }),
      exit_code: result.code,
      signal: result.signal,
      timed_out: result.timedOut,
      duration_ms: Math.round(result.durationMs),
      stdout: tail(result.stdout, maxOutput),
      stderr: tail(result.stderr, maxOutput),
    },
  };
}
