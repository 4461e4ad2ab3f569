// The machine-wide lock of the swarm test. Its swarm (namespaces sw1-sw3,
// the bridge brswarm, /run/docker-sw*.sock) has fixed names, so two runs at
// once tear down each other's nodes. The lock is flock(1) on a file, held by
// a child that keeps it while its stdin is open: when the test process ends,
// however it ends, the pipe closes and the lock goes with it.

import { waitingFor } from "../_deadline.ts";

/** The lock every swarm test run takes before it brings up its nodes. */
export const SWARM_LOCK = "/run/hud-swarm.lock";

/** A held lock; releasing it (or disposing) is idempotent. */
export interface HeldLock extends AsyncDisposable {
  /** The locked file. */
  readonly path: string;
  /** Lets the lock go and waits for its holder to exit. */
  release(): Promise<void>;
}

/**
 * Waits for the lock at `path` (within the running test's deadline, or `ms`)
 * and holds it until released. Throws naming the lock when it is not had in
 * time, after ending the waiting child.
 */
export async function holdSwarmLock(
  path: string = SWARM_LOCK,
  options: { ms?: number } = {},
): Promise<HeldLock> {
  const child = new Deno.Command("flock", {
    args: ["--exclusive", path, "sh", "-c", "echo held; exec cat >/dev/null"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stdin = child.stdin.getWriter();
  const stderr = new Response(child.stderr).text();
  let held = false;
  let released: Promise<void> | null = null;
  const release = () =>
    released ??= (async () => {
      // Held: the holder ends when its stdin closes. Still waiting: flock
      // sits in flock(2) and must be told.
      await stdin.close().catch(() => {});
      if (!held) {
        try {
          child.kill("SIGTERM");
        } catch {
          // already gone
        }
      }
      await child.status;
      await stderr;
    })();
  const first = (async () => {
    let text = "";
    for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
      text += chunk;
      if (text.includes("\n")) break; // leaves the stream cancelled: nothing more comes
    }
    return text.trim();
  })();
  try {
    const line = await waitingFor(
      `the machine-wide swarm lock ${path} (another swarm test holds it)`,
      first,
      { ms: options.ms, onTimeout: () => void release() },
    );
    if (line !== "held") {
      await release();
      throw new Error(
        `Cannot take the swarm lock ${path}: flock said ${JSON.stringify(await stderr)}`,
      );
    }
    held = true;
  } catch (err) {
    await release();
    await first.catch(() => {});
    throw err;
  }
  return { path, release, [Symbol.asyncDispose]: release };
}
