// The agent's side of a workspace: every process started for it (commands,
// SFTP servers, spawn() children) and the gate a grading phase closes on
// them. While a phase runs, each of their process trees is stopped
// (SIGSTOP) and new ones wait; the last phase to end lets them run again.

import { continueTrees, groupMembers, killTrees, stopTrees } from "./_processes.ts";

/** How long stopping the agent may take before what will not stop is killed. */
const FREEZE_TIMEOUT = 5000;

/** The agent's processes and the grading gate. */
export class AgentGate {
  /** Each process started for the agent, by pid, to when it exits. */
  readonly #exits = new Map<number, Promise<void>>();
  /**
   * The process groups of commands that exited whose processes may outlive
   * them (a workspace's lifetime "workspace"): killed at stop.
   */
  readonly #groups = new Set<number>();
  #phases = 0;
  #gate: Promise<void> = Promise.resolve();
  #openGate: () => void = () => {};
  #frozen: Promise<void> = Promise.resolve();

  /** Whether a grading phase holds the agent now. */
  get held(): boolean {
    return this.#phases > 0;
  }

  /** Resolves when the phases holding the agent now have ended. */
  get opened(): Promise<void> {
    return this.#gate;
  }

  /**
   * Counts `child` as the agent's until it exits; with `keepGroup`, its
   * process group (which it leads) stays counted after, until stop.
   */
  track(child: Deno.ChildProcess, keepGroup = false): void {
    const pid = child.pid;
    const exited = child.status.then(() => {}, () => {});
    this.#exits.set(pid, exited);
    if (keepGroup) this.#groups.add(pid);
    exited.then(() => this.#exits.delete(pid));
  }

  /**
   * Begins a grading phase; the first one stops every process of the
   * agent. Resolves once they are stopped (or killed, when they would not
   * stop in time).
   */
  async hold(): Promise<void> {
    this.#phases++;
    if (this.#phases === 1) {
      this.#gate = new Promise((resolve) => this.#openGate = resolve);
      this.#frozen = this.#freeze();
    }
    await this.#frozen;
  }

  /** Ends a grading phase; after the last one the agent's processes run again. */
  release(): void {
    if (--this.#phases === 0) {
      continueTrees(this.#roots());
      this.#openGate();
    }
  }

  /** The roots of the agent's trees: its live processes and what its kept groups hold. */
  #roots(): number[] {
    return [...this.#exits.keys(), ...groupMembers(this.#groups)];
  }

  async #freeze(): Promise<void> {
    if (await stopTrees(() => this.#roots(), FREEZE_TIMEOUT)) return;
    await this.#killAgent();
  }

  async #killAgent(others: Iterable<number> = []): Promise<void> {
    const agent = [...this.#exits];
    killTrees([...new Set([...agent.map(([pid]) => pid), ...this.#groups, ...others])]);
    this.#groups.clear();
    await Promise.all(agent.map(([, exited]) => exited));
  }

  /** Kills every process of the agent and waits for them to exit; the gate stays as it is. */
  async kill(): Promise<void> {
    await this.#killAgent();
  }

  /**
   * Kills every process of the agent, and `others` (grading commands),
   * waits for the agent's to exit, and opens the gate: nothing waits on a
   * workspace that is stopping.
   */
  async killAll(others: Iterable<number>): Promise<void> {
    await this.#killAgent(others);
    if (this.#phases > 0) this.#openGate();
  }
}
