// A cleaner for what this process leaves when it dies without cleaning up
// (SIGKILL, a signal nobody handles): a bash script started in a session of
// its own (a Ctrl-C at the terminal does not reach it) that waits for this
// process to end, then runs. The snapshot store's (`_layers.ts`) and the
// workspaces' scratch directories' (`_scratch.ts`) use it.

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

function startTime(): string {
  const stat = Deno.readTextFileSync("/proc/self/stat");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
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
    watcher = new Deno.Command("bash", {
      args: [
        "--noprofile",
        "--norc",
        "-c",
        WAIT + script,
        name,
        String(Deno.pid),
        startTime(),
        ...args,
      ],
      clearEnv: true,
      env: { PATH: DEFAULT_PATH },
      stdin: "null",
      stdout: "null",
      stderr: "null",
      detached: true,
    }).spawn();
  } catch (err) {
    throw new Error(`Cannot start the ${name} watcher: ${errorMessage(err)}`);
  }
  watcher.unref();
  return watcher;
}
