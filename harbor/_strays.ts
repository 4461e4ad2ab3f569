// The processes of a Harbor task's container that were not there when the
// task started and belong to none of its sessions then: what the agent left
// running, however it left it. The workspace stops the agent's process trees
// and the process groups its commands left while the verifier runs; but in
// a Harbor container it runs without a sandbox of its own (the container is
// the sandbox, as in Harbor), so nothing reaps what an agent's command
// detaches: a job put in a process group of its own (`set -m`), or a
// session of its own, is reparented out of every tree the workspace knows,
// and would run on while the verifier runs, writing /logs/verifier.
//
// A process is the container's when it was running when the first step
// started (the server, the image's ENTRYPOINT and the services it started,
// matched by pid and start time), or belongs to a session one of those
// had: a service's later workers stay in its session, and no process can
// join a session it is not in. Every other one, that is neither this
// server nor a zombie, is stopped (SIGSTOP, which it cannot catch) before
// /logs/verifier is emptied and let go once the verifier is done.

import { continueTrees, killTrees, processTable, stopTrees } from "../workspace/_processes.ts";

/** How long stopping the strays may take before they are killed instead, in ms. */
const STOP_TIMEOUT = 5_000;

/** The container's processes when a task started; what is not among them is a stray. */
export class ProcessBaseline {
  readonly #known = new Set<string>();
  readonly #sessions = new Set<number>();

  /** Takes the baseline now (Linux; elsewhere nothing is ever a stray). */
  constructor() {
    if (Deno.build.os !== "linux") return;
    for (const [pid, p] of processTable()) {
      this.#known.add(`${pid}:${p.start}`);
      this.#sessions.add(p.session);
    }
  }

  /** The live processes that are neither the container's (see the module's comment) nor this one. */
  strays(): number[] {
    if (Deno.build.os !== "linux") return [];
    const out: number[] = [];
    for (const [pid, p] of processTable()) {
      if (pid === Deno.pid || p.state === "Z" || p.state === "X") continue;
      if (this.#known.has(`${pid}:${p.start}`) || this.#sessions.has(p.session)) continue;
      out.push(pid);
    }
    return out;
  }

  /**
   * Stops the strays (a stray that forks meanwhile is found by the next
   * scan), or kills them when they cannot all be stopped in time.
   * @returns what lets those stopped run again
   */
  async hold(): Promise<AsyncDisposable> {
    const held = new Set<number>();
    const stopped = await stopTrees(() => {
      for (const pid of this.strays()) held.add(pid);
      return held;
    }, STOP_TIMEOUT);
    if (!stopped) killTrees(held);
    return {
      [Symbol.asyncDispose]: () => {
        continueTrees(held);
        return Promise.resolve();
      },
    };
  }
}
