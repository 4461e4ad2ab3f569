// Shared by the cluster tests (kubernetes_test.ts, slurm_test.ts): the
// bring-up scripts in .ci/engine/, whether a cluster can run here, and
// killing a node as a host crash would (every process in its namespace).

import { delay } from "../../_internal/async.ts";

export const ENGINE_DIR: string = new URL("../../.ci/engine/", import.meta.url).pathname;

export function which(bin: string): boolean {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    try {
      if (Deno.statSync(`${dir}/${bin}`).isFile) return true;
    } catch {
      // not here
    }
  }
  return false;
}

export function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Runs a script of .ci/engine; throws with its output's end when it fails. */
export async function sh(script: string, env: Record<string, string>, ms: number): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [`${ENGINE_DIR}${script}`],
    env,
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(ms),
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (!out.success) throw new Error(`${script} failed (code ${out.code}): ${text.slice(-2000)}`);
  return text;
}

/** PIDs of the processes in network namespace `ns`. */
export function namespacePids(ns: string): number[] {
  const want = `net:[${Deno.statSync(`/run/netns/${ns}`).ino}]`;
  const pids: number[] = [];
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      if (Deno.readLinkSync(`/proc/${e.name}/ns/net`) === want) pids.push(Number(e.name));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

/** Kills a node as a host crash would: everything running in its namespace. */
export async function crashNode(ns: string): Promise<number> {
  let killed = 0;
  // Twice: a daemon may fork while the first round runs.
  for (let round = 0; round < 2; round++) {
    for (const pid of namespacePids(ns)) {
      try {
        Deno.kill(pid, "SIGKILL");
        killed++;
      } catch {
        // already gone
      }
    }
    await delay(100);
  }
  return killed;
}
