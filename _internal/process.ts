// Process-group helpers shared by the command agent, the subprocess runtime
// and the SSH server.

import { settleWithin } from "./async.ts";

/**
 * Signals the process group led by `pid` (a child started detached leads
 * its own); on Windows, which has no groups, the process alone. Returns
 * `false` when there is nothing left to signal.
 */
export function signalGroup(pid: number, signal: Deno.Signal): boolean {
  try {
    Deno.kill(Deno.build.os === "windows" ? pid : -pid, signal);
    return true;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return false; // already gone
    throw err;
  }
}

/** {@linkcode signalGroup} that never throws: teardown is often fire-and-forget. */
export function trySignalGroup(pid: number, signal: Deno.Signal): boolean {
  try {
    return signalGroup(pid, signal);
  } catch {
    return false;
  }
}

/**
 * Ends a process group: SIGTERM, then SIGKILL after `grace` ms if `exited`
 * has not settled by then. Resolves once the leader has exited.
 */
export async function killProcessGroup(
  pid: number,
  grace: number,
  exited: Promise<unknown>,
): Promise<void> {
  if (!trySignalGroup(pid, "SIGTERM")) {
    await exited.catch(() => {});
    return;
  }
  const exitedInTime = await settleWithin(exited, grace);
  // Kill what is left of the group either way: the leader may be gone while
  // its children linger.
  trySignalGroup(pid, "SIGKILL");
  if (!exitedInTime) await exited.catch(() => {});
}
