// A cleaner for what this process leaves when it dies without cleaning up
// (SIGKILL, a signal nobody handles): a bash script started in a session of
// its own (a Ctrl-C at the terminal does not reach it) that waits for this
// process to end, then runs. The snapshot store's (`_layers.ts`) is this
// process's child, killed when the store closes; the workspaces' scratch
// directories' (`_scratch.ts`) is started once and left to run as an orphan
// of its own until this process ends (`watchExitDetached`).

import { errorMessage } from "../_internal/util.ts";
import { DEFAULT_PATH } from "./_sandbox.ts";

// Polls: the process may be any process, and a pid may be reused, so its
// start time is compared too.
const WAIT = `trap '' INT TERM HUP
pid=$1 start=$2
shift 2
alive() { [ "$(cut -d' ' -f22 "/proc/$pid/stat" 2>/dev/null)" = "$start" ]; }
while alive; do sleep 0.5; done
`;

/** Starts `$@` as an orphan (the launcher exits at once), SIGHUP ignored. */
const DETACH = `trap '' HUP INT TERM
"$@" </dev/null >/dev/null 2>&1 &
`;

function startTime(): string {
  const stat = Deno.readTextFileSync("/proc/self/stat");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
}

/** bash's arguments for `script`, waiting for this process to end first. */
function watcherArgv(script: string, name: string, args: readonly string[]): string[] {
  return [
    "--noprofile",
    "--norc",
    "-c",
    WAIT + script,
    name,
    String(Deno.pid),
    startTime(),
    ...args,
  ];
}

/** bash with `args` in a session of its own, with a fixed environment and no input or output. */
function watcherCommand(args: string[], stderr: "null" | "piped"): Deno.Command {
  return new Deno.Command("bash", {
    args,
    clearEnv: true,
    env: { PATH: DEFAULT_PATH },
    stdin: "null",
    stdout: "null",
    stderr,
    detached: true,
  });
}

/**
 * Starts `script` (bash, its arguments `$1`... as `args`) to run once this
 * process has ended; unref'd, so it keeps this process alive for nothing.
 * Kill it (and await its status) when there is nothing left for it to do.
 * @param name the watcher's `$0`, as `ps` shows it
 * @throws {Error} one line when bash cannot be started
 */
export function watchExit(
  script: string,
  name: string,
  args: readonly string[],
): Deno.ChildProcess {
  let watcher: Deno.ChildProcess;
  try {
    watcher = watcherCommand(watcherArgv(script, name, args), "null").spawn();
  } catch (err) {
    throw new Error(`Cannot start the ${name} watcher: ${errorMessage(err)}`);
  }
  watcher.unref();
  return watcher;
}

/**
 * Starts `script` as {@linkcode watchExit} does, but as an orphan: not this
 * process's child, so nothing of it stays open here (a test's sanitizers
 * see nothing), and it runs until this process ends. For a watcher that
 * lives as long as this process.
 * @throws {Error} one line when bash cannot be started
 */
export async function watchExitDetached(
  script: string,
  name: string,
  args: readonly string[],
): Promise<void> {
  let out: Deno.CommandOutput;
  try {
    const argv = ["bash", ...watcherArgv(script, name, args)];
    out = await watcherCommand(
      ["--noprofile", "--norc", "-c", DETACH, "hud-detach", ...argv],
      "piped",
    )
      .output();
  } catch (err) {
    throw new Error(`Cannot start the ${name} watcher: ${errorMessage(err)}`);
  }
  if (!out.success) {
    const why = new TextDecoder().decode(out.stderr).trim().split("\n").pop();
    throw new Error(`Cannot start the ${name} watcher: ${why || `exit status ${out.code}`}`);
  }
}
