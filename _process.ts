// Process-group helpers shared by the command agent and the subprocess
// runtime.

function signalGroup(pid: number, signal: Deno.Signal): boolean {
  try {
    // A negative pid addresses the whole process group (the child was
    // started with setsid, so its pid is the group id).
    Deno.kill(-pid, signal);
    return true;
  } catch {
    return false; // already gone
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
  if (!signalGroup(pid, "SIGTERM")) {
    await exited.catch(() => {});
    return;
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(true), grace);
  });
  const done = await Promise.race([exited.then(() => false, () => false), timedOut]);
  clearTimeout(timer);
  // Kill what is left of the group either way: the leader may be gone while
  // its children linger.
  signalGroup(pid, "SIGKILL");
  if (done) await exited.catch(() => {});
}
