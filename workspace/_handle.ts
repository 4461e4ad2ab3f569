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
  newEpisode,
  prepareSandbox,
  publishShell,
  publishTracker,
  releaseEpisode,
} from "./_episode.ts";
import { AgentGate } from "./_gate.ts";
import { checkArgv, gradeCommand, runGradeCommand } from "./_grade.ts";
import type {
  Workspace,
  WorkspaceExecOptions,
  WorkspaceExecResult,
  WorkspaceGrading,
  WorkspaceIsolation,
  WorkspaceSpawnOptions,
} from "./_types.ts";

/** A workspace of one environment, started and stopped with it. */
export class WorkspaceHandle implements Workspace {
  readonly #env: Environment;
  readonly #config: WorkspaceConfig;
  #episode: Episode | null = null;
  /** The agent's processes, and the gate grading closes on them. */
  readonly #agent = new AgentGate();
  /** Grading commands running. */
  readonly #graders = new Set<number>();

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
      await prepareSandbox(this.#config, ep, (message) => this.#report(message));
      // Complete enough for commands: the SSH server may get a login at once.
      this.#episode = ep;
      ep.sftp?.warm(ep.sandbox.isolation);
      await publishShell(this.#env, this.#config, ep, (argv, o) => this.#spawnAgent(argv, o));
      if (this.#config.trackFiles) await publishTracker(this.#env, this.#config, ep);
    } catch (err) {
      this.#episode = null;
      await this.#teardown(ep);
      throw err;
    }
  }

  /** Ends the episode: capabilities, servers, every process it started, its files. */
  async stop(): Promise<void> {
    const ep = this.#episode;
    this.#episode = null;
    if (ep === null) return;
    await this.#teardown(ep);
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
      // Whatever the sessions left: spawn() children, graders, stragglers.
      await this.#agent.killAll(this.#graders);
      await releaseEpisode(ep);
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
    const sandbox = extra.length === 0 ? ep.sandbox : {
      ...ep.sandbox,
      mounts: [...(ep.sandbox.mounts ?? []), ...extra.map((p) => ({ src: p, dest: p }))],
    };
    const child = spawnInSandbox(real, { ...o, sandbox });
    this.#agent.track(child, this.#config.lifetime === "workspace");
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
    return await runGradeCommand(ep, root, command, this.#graders);
  }
}
