// The handle `addWorkspace` returns, over its lifecycle: start() makes an
// episode (`_episode.ts`) and publishes it, stop() ends it; in between,
// commands start on the agent's side through spawn() and the SSH server,
// held while a grading phase (`_gate.ts`) runs its commands (`_grade.ts`).

import type { Environment } from "../env.ts";
import { readEnv } from "../_internal/util.ts";
import type { SshSpawnOptions } from "../ssh/server.ts";
import { DEFAULT_PATH, spawnInSandbox } from "./_sandbox.ts";
import type { WorkspaceLimitsInForce } from "./_limits.ts";
import { SFTP_MARKER } from "./_sftp.ts";
import type { WorkspaceConfig } from "./_config.ts";
import {
  type Episode,
  type HeldUid,
  newEpisode,
  prepareSandbox,
  publishShell,
  publishTracker,
  releaseEpisode,
} from "./_episode.ts";
import { AgentGate } from "./_gate.ts";
import {
  checkArgv,
  discardGrading,
  gradeCommand,
  prepareGrading,
  runGradeCommand,
} from "./_grade.ts";
import { SpareSandbox, type WaitingSandbox } from "./_waiting.ts";
import {
  checkSnapshot,
  noteRootOwner,
  openSnapshotRoot,
  sharedRootOwner,
  snapshotMethod,
  type WorkspaceSnapshot,
} from "./_snapshot.ts";
import type {
  Workspace,
  WorkspaceExecOptions,
  WorkspaceExecResult,
  WorkspaceGrading,
  WorkspaceIsolation,
  WorkspaceSpawnOptions,
} from "./_types.ts";

/**
 * How long after an agent's command ends the next one's sandbox is
 * started: an agent's next command comes after its model's turn, tens of
 * milliseconds at least; one that comes sooner starts its own.
 */
const REFILL_DELAY = 25;

/** A workspace of one environment, started and stopped with it. */
export class WorkspaceHandle implements Workspace {
  readonly #env: Environment;
  readonly #config: WorkspaceConfig;
  #episode: Episode | null = null;
  /** The agent's processes, and the gate grading closes on them. */
  readonly #agent = new AgentGate();
  /** Grading commands running. */
  readonly #graders = new Set<number>();
  /** The uid the last episode leased, taken again when free. */
  #held: HeldUid | null = null;
  /** The snapshots this workspace took that are not removed. */
  readonly #snapshots = new Set<WorkspaceSnapshot>();
  /** Snapshots, restores and stops, one at a time. */
  #rootOps: Promise<unknown> = Promise.resolve();

  constructor(env: Environment, config: WorkspaceConfig) {
    this.#env = env;
    this.#config = config;
  }

  get name(): string {
    return this.#config.name;
  }

  get root(): string {
    return this.#config.root;
  }

  get isolation(): Exclude<WorkspaceIsolation, "auto"> | null {
    return this.#episode?.sandbox.isolation ?? null;
  }

  get network(): boolean {
    return this.#config.network;
  }

  get uid(): number | null {
    const e = this.#episode;
    if (e === null || Deno.uid() !== 0) return null;
    return e.user?.uid ?? 0;
  }

  get limits(): WorkspaceLimitsInForce | null {
    return this.#episode === null ? null : { ...this.#episode.limits };
  }

  #report(message: string): void {
    this.#config.onError(new Error(`Workspace "${this.#config.name}": ${message}`));
  }

  /** Makes an episode and publishes its capabilities; undoes what it made if a step fails. */
  async start(): Promise<void> {
    const root = this.#config.root;
    const info = await Deno.stat(root).catch(() => null);
    if (info === null || !info.isDirectory) {
      throw new TypeError(`Cannot start workspace: root "${root}" is not a directory`);
    }
    const ep = await newEpisode();
    try {
      await this.#prepare(ep);
      // Complete enough for commands: the SSH server may get a login at once.
      this.#episode = ep;
      this.#prestart(ep);
      ep.sftp?.warm(ep.sandbox.isolation);
      await publishShell(this.#env, this.#config, ep, (argv, o) => this.#spawnAgent(argv, o));
      if (this.#config.trackFiles) await publishTracker(this.#env, this.#config, ep);
    } catch (err) {
      this.#episode = null;
      await this.#teardown(ep);
      throw err;
    }
  }

  /** The sandbox and, with snapshots, the root mounted for them. */
  async #prepare(ep: Episode): Promise<void> {
    const { snapshots, from, root } = this.#config;
    const report = (message: string) => this.#report(message);
    if (snapshots === null && from === null) {
      await prepareSandbox(this.#config, ep, report, this.#held);
      this.#hold(ep);
      return;
    }
    const chosen = await snapshotMethod();
    const method = snapshots?.method === "copy" ? "copy" : chosen.method;
    if (snapshots?.method !== "copy" && chosen.why !== null) {
      report(`snapshots copy the whole root here: ${chosen.why}`);
    }
    // An overlay root's files may be a snapshot's too once an episode has
    // shown them: they keep their owner, which the overlay maps.
    const overlaid = method === "overlay" && from === null;
    const shared = overlaid ? await sharedRootOwner(root) : null;
    await prepareSandbox(this.#config, ep, report, this.#held, shared);
    this.#hold(ep);
    const owner = ep.user ?? (Deno.uid() === 0 ? { uid: 0, gid: 0 } : null);
    // Noted before the overlay hides the root's own inode.
    if (overlaid && shared === null && owner !== null) await noteRootOwner(root, owner);
    ep.root = await openSnapshotRoot(root, {
      owner,
      diskOwner: shared ?? owner,
      from,
      method,
    });
  }

  /** Notes the uid `ep` leased, its processes not known to have ended until its release says so. */
  #hold(ep: Episode): void {
    this.#held = ep.lease === null ? null : { uid: ep.lease.uid, gone: false };
  }

  /** Ends the episode: capabilities, servers, every process it started, its files. */
  async stop(): Promise<void> {
    const ep = this.#episode;
    this.#episode = null;
    if (ep === null) return;
    await this.#rootOps.catch(() => {});
    await this.#teardown(ep);
  }

  /** Starts the sandboxes of the agent's next command and the next grading command, ahead. */
  #prestart(ep: Episode): void {
    ep.spare = new SpareSandbox(ep.sandbox, this.#config.root);
    ep.spare.fill();
    ep.grading = prepareGrading(ep, this.#config.root).catch(() => null);
  }

  /** Discards what was started ahead (its views of the root may be stale). */
  async #discardPrestarted(ep: Episode): Promise<void> {
    const [spare, grading] = [ep.spare, ep.grading];
    ep.spare = ep.grading = null;
    await spare?.close();
    const prepared = await grading;
    if (prepared) await discardGrading(prepared);
  }

  async #teardown(ep: Episode): Promise<void> {
    if (ep.server !== null) this.#env.removeCapability(this.#config.name);
    try {
      if (ep.tracker !== null) {
        this.#env.removeCapability(ep.tracker.capability().name);
        await ep.tracker.shutdown();
      }
      if (ep.server !== null) await ep.server.shutdown();
    } finally {
      await this.#discardPrestarted(ep);
      // Whatever the sessions left: spawn() children, graders, stragglers.
      await this.#agent.killAll(this.#graders);
      try {
        await ep.root?.close();
      } finally {
        const gone = await releaseEpisode(ep);
        if (this.#held !== null && this.#held.uid === ep.lease?.uid) {
          this.#held = { uid: this.#held.uid, gone };
        }
      }
    }
  }

  /** The SSH server's spawner: agent-side, held while a grading phase runs. */
  #spawnAgent(
    argv: readonly string[],
    o: SshSpawnOptions,
    extra: readonly string[] = [],
  ): Deno.ChildProcess | Promise<Deno.ChildProcess> {
    if (this.#agent.held) return this.#agent.opened.then(() => this.#spawnAgent(argv, o, extra));
    const ep = this.#episode;
    if (ep === null) {
      throw new Error(`Cannot run in workspace "${this.#config.name}": it is stopped`);
    }
    const sftp = ep.sftp;
    const real = argv.length === 1 && argv[0] === SFTP_MARKER && sftp !== null
      ? sftp.argv(ep.sandbox.isolation)
      : argv;
    const waiting = extra.length === 0 ? ep.spare?.take() : null;
    if (waiting) return this.#runWaiting(ep, waiting, real, o);
    const sandbox = extra.length === 0 ? ep.sandbox : {
      ...ep.sandbox,
      mounts: [...(ep.sandbox.mounts ?? []), ...extra.map((p) => ({ src: p, dest: p }))],
    };
    const child = spawnInSandbox(real, { ...o, sandbox });
    this.#agent.track(child, this.#config.lifetime === "workspace");
    return child;
  }

  /**
   * Runs an agent's command in the sandbox started ahead; the next is
   * started a little after the command ends (its start would hold up the
   * command's output, and whatever runs next).
   */
  async #runWaiting(
    ep: Episode,
    waiting: WaitingSandbox,
    argv: readonly string[],
    o: SshSpawnOptions,
  ): Promise<Deno.ChildProcess> {
    // Counted before its words go: a grading phase that begins meanwhile stops it.
    this.#agent.track(waiting.child);
    let child: Deno.ChildProcess;
    try {
      child = await waiting.run(argv, o.cwd, o.env, ep.handOver?.needed() ?? true);
    } catch {
      // It exited meanwhile (or a word holds a NUL byte, which this refuses too).
      await waiting.discard();
      child = spawnInSandbox(argv, { ...o, sandbox: ep.sandbox });
      this.#agent.track(child);
    }
    child.status.then(() => ep.spare?.fillAfter(REFILL_DELAY), () => {});
    return child;
  }

  async spawn(
    argv: readonly string[],
    options: WorkspaceSpawnOptions = {},
  ): Promise<Deno.ChildProcess> {
    const name = this.#config.name;
    checkArgv("spawn in", name, argv);
    for (const p of options.mounts ?? []) {
      if (typeof p !== "string" || !p.startsWith("/")) {
        throw new TypeError(
          `Cannot spawn in workspace "${name}": mounts must be absolute paths, got "${p}"`,
        );
      }
    }
    while (this.#agent.held) await this.#agent.opened;
    const ep = this.#episode;
    if (ep === null) throw new Error(`Cannot spawn in workspace "${name}": it is not started`);
    return this.#spawnAgent(argv, {
      cwd: options.cwd ?? this.#config.root,
      env: {
        PATH: readEnv("PATH") ?? DEFAULT_PATH,
        LANG: readEnv("LANG") ?? "C.UTF-8",
        ...ep.commandEnv,
        ...options.env,
      },
    }, options.mounts ?? []);
  }

  async grading(): Promise<WorkspaceGrading> {
    const name = this.#config.name;
    if (this.#episode === null) {
      throw new Error(`Cannot grade in workspace "${name}": it is not started`);
    }
    let ended = false;
    const end = (): Promise<void> => {
      if (!ended) {
        ended = true;
        this.#agent.release();
      }
      return Promise.resolve();
    };
    await this.#agent.hold();
    return {
      exec: (argv, options) => {
        if (ended) {
          return Promise.reject(
            new Error(`Cannot grade in workspace "${name}": the grading phase ended`),
          );
        }
        return this.#gradeExec(argv, options ?? {});
      },
      end,
      [Symbol.asyncDispose]: end,
    };
  }

  async exec(
    argv: readonly string[],
    options: WorkspaceExecOptions = {},
  ): Promise<WorkspaceExecResult> {
    checkArgv("run in", this.#config.name, argv);
    await using phase = await this.grading();
    return await phase.exec(argv, options);
  }

  async #gradeExec(
    argv: readonly string[],
    options: WorkspaceExecOptions,
  ): Promise<WorkspaceExecResult> {
    const { name, root } = this.#config;
    const command = gradeCommand(name, root, argv, options);
    const ep = this.#episode;
    if (ep === null) throw new Error(`Cannot run in workspace "${name}": it is not started`);
    // Taken at once: a command that runs meanwhile makes its own.
    const pending = ep.grading;
    ep.grading = null;
    const prepared = await pending;
    return await runGradeCommand(ep, root, command, this.#graders, prepared ?? null);
  }

  /** Runs `op` on the started episode's root, after the root operations before it. */
  #onRoot<T>(verb: string, op: (ep: Episode) => Promise<T>): Promise<T> {
    const name = this.#config.name;
    if (this.#config.snapshots === null) {
      return Promise.reject(
        new Error(
          `Cannot ${verb} workspace "${name}": it was added without snapshots (set snapshots: true in addWorkspace's options)`,
        ),
      );
    }
    const run = this.#rootOps.catch(() => {}).then(() => {
      const ep = this.#episode;
      if (ep?.root == null) {
        throw new Error(`Cannot ${verb} workspace "${name}": it is not started`);
      }
      return op(ep);
    });
    this.#rootOps = run;
    return run;
  }

  snapshot(): Promise<WorkspaceSnapshot> {
    return this.#onRoot("snapshot", async (ep) => {
      const { name, snapshots: policy } = this.#config;
      if (this.#snapshots.size >= policy!.maxCount) {
        throw new Error(
          `Cannot snapshot workspace "${name}": ${
            policy!.maxCount
          } snapshots of it exist (snapshots.maxCount); remove some first`,
        );
      }
      let used = 0;
      for (const s of this.#snapshots) used += s.bytes;
      await this.#agent.hold();
      try {
        const snapshot = await ep.root!.snapshot({
          workspace: name,
          policy: policy!,
          used,
          onRemove: (s) => this.#snapshots.delete(s),
        });
        this.#snapshots.add(snapshot);
        return snapshot;
      } finally {
        this.#agent.release();
      }
    });
  }

  restore(snapshot: WorkspaceSnapshot): Promise<void> {
    try {
      checkSnapshot(`restore workspace "${this.#config.name}"`, snapshot);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.#onRoot("restore", async (ep) => {
      await this.#agent.hold();
      try {
        await this.#agent.kill();
        await this.#discardPrestarted(ep);
        await ep.root!.restore(snapshot);
      } finally {
        if (this.#episode === ep) this.#prestart(ep);
        this.#agent.release();
      }
    });
  }
}
