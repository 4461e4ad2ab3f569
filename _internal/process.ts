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

/**
 * Live (not zombie) process ids whose process group is `pgid`, read from
 * `/proc` (Linux only: elsewhere, an empty list).
 */
export function liveGroupMembers(pgid: number): number[] {
  if (Deno.build.os !== "linux") return [];
  const found: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    let stat: string;
    try {
      stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
    } catch {
      continue; // exited meanwhile
    }
    // pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
    const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(pgrp) === pgid && state !== "Z" && state !== "X") found.push(Number(entry.name));
  }
  return found;
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

/**
 * Whether a process with this id runs on this machine (`/proc`, Linux):
 * the cleanup of killed runs (`hud gc`) asks it of the pid in an owner label.
 */
export function processAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    return Deno.statSync(`/proc/${pid}`).isDirectory;
  } catch {
    return false;
  }
}
