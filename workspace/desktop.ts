/**
 * The `screen` capability: {@linkcode addDesktop} gives an environment an X
 * desktop served over VNC (RFB), for agents that use a computer the way a
 * person does. The X server and the VNC server (TigerVNC's Xvnc, or Xvfb
 * with x11vnc, from Debian) run in a workspace's sandbox as the agent's
 * user (`workspace`), or in a sandbox of their own made the same way, under
 * a supervisor that this process reaches only through a pipe. The `rfb/3.8`
 * binding is attached to the environment, so only the control server's
 * authenticated `tunnel.open` reaches it. The {@linkcode Desktop} handle
 * starts programs on the display, as the agent's user, and reads the screen
 * for grading.
 *
 * @module
 */

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import type { ExitStatus } from "../_internal/exit.ts";
import { splice } from "../_internal/io.ts";
import { errorMessage } from "../_internal/util.ts";
import { RfbClient, type RfbOptions } from "../rfb/client.ts";
import {
  checkIsolation,
  chooseSandbox,
  findProgram,
  spawnInSandbox,
  systemShows,
} from "./_sandbox.ts";
import {
  checkLimits,
  resolveLimits,
  type WorkspaceCgroup,
  type WorkspaceLimits,
} from "./_limits.ts";
import { type DesktopMainConfig, FRAME, SUPERVISOR_SOURCE } from "./_desktop_main.ts";
import { DesktopPipe, type PipeExit } from "./_desktop_pipe.ts";
import { killTrees, treePids } from "./_processes.ts";
import type { Workspace, WorkspaceIsolation } from "./workspace.ts";

/** The uid (and gid) the desktop runs as in a sandbox of its own, when this process is root. */
const NOBODY = 65534;

/** The supervisor's private directory inside a sandbox (its own /tmp). */
const SANDBOX_DIR = "/tmp/hud-desktop";

/** Bytes a VNC connection may leave unread, either way, before it is closed. */
const MAX_QUEUE = 32 * 1024 * 1024;

/** The VNC server: TigerVNC's Xvnc, or Xvfb with x11vnc. */
export type DesktopServer = "tigervnc" | "x11vnc";

/** Options for {@linkcode addDesktop}. */
export interface DesktopOptions {
  /**
   * Capability name.
   * @default "screen"
   */
  name?: string;
  /**
   * Width of the screen in pixels.
   * @default 1280
   */
  width?: number;
  /**
   * Height of the screen in pixels.
   * @default 800
   */
  height?: number;
  /**
   * Bits per pixel of the X screen: 16 or 24.
   * @default 24
   */
  depth?: 16 | 24;
  /**
   * The VNC server: "tigervnc" (Xvnc, from `tigervnc-standalone-server`),
   * "x11vnc" (Xvfb and x11vnc, from `xvfb` and `x11vnc`), or "auto" for the
   * first of them installed here.
   * @default "auto"
   */
  server?: DesktopServer | "auto";
  /**
   * The workspace whose sandbox the desktop runs in, through
   * `workspace.spawn()`: the agent's uid, view of the file system (the root
   * writable), network policy, cgroup and limits; stopped while the
   * workspace grades and killed when it stops. Add the desktop after the
   * workspace, to the same environment. `network`, `isolation`, `uid`,
   * `gid`, `writable` and `limits` are then the workspace's.
   * @default a sandbox of the desktop's own
   */
  workspace?: Workspace;
  /**
   * Whether programs on the desktop keep this host's network.
   * @default false
   */
  network?: boolean;
  /**
   * Directories programs on the desktop may write, at their own paths; they
   * must be writable by its uid.
   * @default []
   */
  writable?: readonly string[];
  /**
   * How the desktop is isolated, as for the workspace: "auto" takes
   * bubblewrap, else util-linux `unshare`, and refuses to start when
   * neither works here; "none" runs it unconfined and reports one warning
   * line through `onError`.
   * @default "auto"
   */
  isolation?: WorkspaceIsolation;
  /**
   * Uid the desktop runs as when this process is root (not 0).
   * @default 65534 (nobody)
   */
  uid?: number;
  /**
   * Gid the desktop runs as when this process is root.
   * @default 65534 (nogroup)
   */
  gid?: number;
  /**
   * Limits on memory, processes and disk, as a workspace's.
   * @default { memory: 4 GiB, processes: 1024, tmpSize: 1 GiB, fileSize: 4 GiB }
   */
  limits?: WorkspaceLimits;
  /**
   * How long the desktop may take to start, in ms.
   * @default 30_000
   */
  startTimeout?: number;
  /**
   * Called with what goes wrong while no caller waits: the warning for
   * `isolation: "none"`, and one line for each limit not in force here.
   * @default ignores them
   */
  onError?: (error: unknown) => void;
}

/** Options for {@linkcode Desktop.run}. */
export interface DesktopRunOptions {
  /**
   * Variables on top of the desktop's (PATH, HOME, USER, LANG, the
   * workspace's `env`, DISPLAY and XAUTHORITY).
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * Working directory, in the sandbox's view.
   * @default the workspace's root (the desktop's own directory without a workspace)
   */
  cwd?: string;
}

/** Options for {@linkcode Desktop.exec}. */
export interface DesktopExecOptions extends DesktopRunOptions {
  /**
   * Milliseconds after which the program is killed.
   * @default 60_000
   */
  timeout?: number;
  /** Kills the program when aborted. */
  signal?: AbortSignal;
}

/** What {@linkcode Desktop.exec} returns. */
export interface DesktopExecResult extends ExitStatus {
  /** Standard output (its first MiB). */
  stdout: string;
  /** Standard error (its first MiB). */
  stderr: string;
  /** Whether `timeout` ran out (the program was killed). */
  timedOut: boolean;
}

/** A program started with {@linkcode Desktop.run}. */
export interface DesktopProgram {
  /**
   * How it ended; rejects when it could not start (not installed, say).
   */
  readonly status: Promise<ExitStatus>;
  /**
   * Sends it a signal.
   * @param signal the signal @default "SIGTERM"
   */
  kill(signal?: Deno.Signal): Promise<void>;
}

/** The handle {@linkcode addDesktop} returns. */
export interface Desktop {
  /** The capability name. */
  readonly name: string;
  /** The screen's width in pixels. */
  readonly width: number;
  /** The screen's height in pixels. */
  readonly height: number;
  /** The VNC server in use, once started; null before. */
  readonly server: DesktopServer | null;
  /** The X display's number inside the desktop's sandbox, once started; null before. */
  readonly display: number | null;
  /**
   * Starts a program on the desktop, as the agent's user, in its sandbox
   * (the workspace's root writable): an application for the task. It runs
   * until it exits, is killed, or the desktop stops.
   * @throws {Error} when the desktop is not started
   * @throws {TypeError} for a bad `argv`
   */
  run(argv: readonly string[], options?: DesktopRunOptions): Promise<DesktopProgram>;
  /**
   * Runs a program on the desktop to its end and returns its output: a
   * check of the screen's state (`xdotool getactivewindow getwindowname`,
   * `xwd`). With `workspace`, the desktop is stopped while the workspace
   * grades: read it before `workspace.exec()` or `grading()`.
   * @throws {Error} when the desktop is not started
   */
  exec(argv: readonly string[], options?: DesktopExecOptions): Promise<DesktopExecResult>;
  /**
   * A VNC client of the desktop for this process (no tunnel): screenshots
   * and input for the environment's own code.
   * @throws {Error} when the desktop is not started
   */
  open(options?: RfbOptions): Promise<RfbClient>;
}

/** What the workspace decides when `workspace` is given. */
const WORKSPACE_OWNS = ["network", "isolation", "uid", "gid", "writable", "limits"] as const;

type Spawner = (argv: string[], env: Record<string, string>) => Promise<Deno.ChildProcess>;

/** Where the supervisor runs, made at start and undone at stop. */
interface Placement {
  /** The supervisor's directory as it sees it. */
  dir: string;
  spawn: Spawner;
  /** Host directories to remove at stop. */
  dirs: string[];
  cgroup: WorkspaceCgroup | null;
  /** Whether the desktop has a network namespace of its own. */
  ownNetwork: boolean;
}

function checkArgv(what: string, argv: readonly string[]): void {
  if (
    !Array.isArray(argv) || argv.length === 0 ||
    argv.some((a) => typeof a !== "string") || argv[0] === ""
  ) {
    throw new TypeError(`Cannot ${what} on the desktop: argv must be a non-empty array of strings`);
  }
}

/** The server to use and the absolute paths of its programs. */
function chooseServer(wanted: DesktopServer | "auto"): {
  server: DesktopServer;
  programs: DesktopMainConfig["programs"];
} {
  const xvnc = findProgram("Xvnc");
  const xvfb = findProgram("Xvfb");
  const x11vnc = findProgram("x11vnc");
  if ((wanted === "auto" || wanted === "tigervnc") && xvnc !== null) {
    return { server: "tigervnc", programs: { xvnc } };
  }
  if ((wanted === "auto" || wanted === "x11vnc") && xvfb !== null && x11vnc !== null) {
    return { server: "x11vnc", programs: { xvfb, x11vnc } };
  }
  const missing = wanted === "tigervnc"
    ? '"Xvnc" is not installed (apt-get install tigervnc-standalone-server)'
    : wanted === "x11vnc"
    ? `${xvfb === null ? '"Xvfb"' : '"x11vnc"'} is not installed (apt-get install xvfb x11vnc)`
    : "no VNC server is installed (apt-get install tigervnc-standalone-server, or xvfb and x11vnc)";
  throw new TypeError(`Cannot start desktop: ${missing}`);
}

/** The deno that runs the supervisor, and what the sandbox must show of it. */
async function supervisorDeno(): Promise<{ deno: string; mounts: string[] }> {
  // `deno eval` needs a deno: a `deno compile` binary is none.
  const deno = Deno.build.standalone ? findProgram("deno") : Deno.execPath();
  if (deno === null) {
    throw new TypeError(
      'Cannot start desktop: it needs "deno" on PATH (this program is a compiled binary)',
    );
  }
  const real = await Deno.realPath(deno);
  return { deno: real, mounts: systemShows(real) ? [] : [real] };
}

/** Makes a host directory for the desktop, 0700, owned by `uid` (when root). */
async function desktopDir(uid: number | null, gid: number | null): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "hud-desktop-" });
  if (Deno.uid() === 0 && uid !== null && uid !== 0) await Deno.chown(dir, uid, gid);
  return dir;
}

async function inWorkspace(workspace: Workspace, mounts: string[], p: Placement): Promise<void> {
  const isolation = workspace.isolation;
  if (isolation === null) {
    throw new Error(
      `Cannot start desktop: workspace "${workspace.name}" is not started (add the desktop after addWorkspace, to the same environment)`,
    );
  }
  p.ownNetwork = isolation !== "none" && !workspace.network;
  if (isolation === "none") {
    p.dir = await desktopDir(workspace.uid, null);
    p.dirs.push(p.dir);
  } else {
    p.dir = SANDBOX_DIR;
  }
  p.spawn = (argv, env) => workspace.spawn(argv, { env, mounts });
}

async function onItsOwn(
  name: string,
  options: DesktopOptions,
  mounts: string[],
  p: Placement,
): Promise<void> {
  const user = Deno.uid() === 0 ? { uid: options.uid ?? NOBODY, gid: options.gid ?? NOBODY } : null;
  const own = await desktopDir(user?.uid ?? null, user?.gid ?? null);
  p.dirs.push(own);
  const limits = resolveLimits(options.limits, `hud-desktop-${Deno.pid}`, false);
  p.cgroup = limits.cgroup;
  for (const line of limits.notInForce) options.onError?.(new Error(`Desktop "${name}": ${line}`));
  const sandbox = await chooseSandbox(
    options.isolation ?? "auto",
    {
      writable: [own],
      mounts: [
        ...mounts.map((m) => ({ src: m, dest: m })),
        ...(options.writable ?? []).map((dir) => ({ src: dir, dest: dir, writable: true })),
      ],
      network: options.network ?? false,
      user,
      limits: {
        tmpSize: limits.inForce.tmpSize,
        fileSize: limits.inForce.fileSize,
        processes: null,
      },
      cgroups: limits.cgroup?.procs ?? [],
    },
    own,
    { what: "desktop", runs: "the X server" },
  );
  if (sandbox.isolation === "none") {
    options.onError?.(
      new Error(
        `Desktop "${name}" runs without a sandbox (isolation: "none"): its programs see this host's files and network`,
      ),
    );
  }
  p.dir = sandbox.isolation === "none" ? own : SANDBOX_DIR;
  p.ownNetwork = sandbox.isolation !== "none" && !sandbox.network;
  p.spawn = (argv, env) =>
    Promise.resolve(
      spawnInSandbox(argv, {
        cwd: own,
        env: { PATH: "/usr/local/bin:/usr/bin:/bin", HOME: own, LANG: "C.UTF-8", ...env },
        sandbox,
      }),
    );
}

/** Reads the supervisor's stderr, keeping its last lines for errors. */
function stderrTail(child: Deno.ChildProcess): () => string {
  const lines: string[] = [];
  (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      lines.push(...chunk.split("\n").filter((l) => l.trim() !== ""));
      lines.splice(0, Math.max(0, lines.length - 10));
    }
  })().catch(() => {});
  return () => lines.join(" / ");
}

function checkOptions(options: DesktopOptions): void {
  const name = options.name ?? "screen";
  if (typeof name !== "string" || name === "") {
    throw new TypeError("Cannot add desktop: name must be a non-empty string");
  }
  for (const [key, max] of [["width", 8192], ["height", 8192]] as const) {
    const v = options[key];
    if (v !== undefined && !(Number.isInteger(v) && v >= 64 && v <= max)) {
      throw new RangeError(`Cannot add desktop: invalid ${key} "${v}" (64 to ${max})`);
    }
  }
  if (options.depth !== undefined && options.depth !== 16 && options.depth !== 24) {
    throw new RangeError(`Cannot add desktop: invalid depth "${options.depth}" (16 or 24)`);
  }
  const server = options.server ?? "auto";
  if (!["auto", "tigervnc", "x11vnc"].includes(server)) {
    throw new RangeError(
      `Cannot add desktop: unknown server "${server}" (use "auto", "tigervnc" or "x11vnc")`,
    );
  }
  const workspace = options.workspace;
  if (workspace !== undefined) {
    if (typeof workspace?.spawn !== "function") {
      throw new TypeError("Cannot add desktop: workspace must be what addWorkspace returned");
    }
    for (const key of WORKSPACE_OWNS) {
      if (options[key] !== undefined) {
        throw new TypeError(
          `Cannot add desktop: "${key}" is the workspace's when workspace is given (set it on addWorkspace, or leave workspace out)`,
        );
      }
    }
  }
  checkIsolation("add desktop", options.isolation ?? "auto");
  for (const key of ["uid", "gid"] as const) {
    const id = options[key];
    if (id !== undefined && !(Number.isInteger(id) && id > 0 && id < 2 ** 32 - 1)) {
      throw new RangeError(`Cannot add desktop: invalid ${key} "${id}" (use one other than 0)`);
    }
  }
  checkLimits("add desktop", options.limits);
}

/** A running desktop: the supervisor's process and its pipe. */
interface Running {
  child: Deno.ChildProcess;
  pipe: DesktopPipe;
  placement: Placement;
  server: DesktopServer;
  display: number;
}

async function undo(p: Placement): Promise<void> {
  await p.cgroup?.remove();
  for (const d of p.dirs) await Deno.remove(d, { recursive: true }).catch(() => {});
}

async function stopRunning(r: Running): Promise<void> {
  await r.pipe.close();
  // The supervisor leads its process group (and, sandboxed, a PID
  // namespace, whose processes the kernel kills once its init is gone):
  // wait until none of them is left, so that a stopped desktop is gone.
  const pids = treePids([r.child.pid]);
  killTrees([r.child.pid]);
  await r.child.status;
  await r.pipe.finished;
  for (let i = 0; i < 500 && treePids(pids).length > 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  await undo(r.placement);
}

/** Waits for the supervisor's READY, bounded; the error names the supervisor's last words. */
async function awaitReady(
  name: string,
  pipe: DesktopPipe,
  tail: () => string,
  timeout: number,
): Promise<number> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const ready = await Promise.race([
      pipe.ready,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`not up within ${timeout} ms`)), timeout);
      }),
    ]);
    return ready.display;
  } catch (err) {
    const more = tail();
    throw new Error(
      `Cannot start desktop "${name}": ${errorMessage(err)}${more ? ` (${more})` : ""}`,
    );
  } finally {
    clearTimeout(timer);
  }
}

async function start(name: string, options: DesktopOptions): Promise<Running> {
  const { server, programs } = chooseServer(options.server ?? "auto");
  const { deno, mounts } = await supervisorDeno();
  const p: Placement = {
    dir: "",
    spawn: () => Promise.reject(new Error("unplaced")),
    dirs: [],
    cgroup: null,
    ownNetwork: false,
  };
  let child: Deno.ChildProcess | null = null;
  let pipe: DesktopPipe | null = null;
  try {
    if (options.workspace !== undefined) await inWorkspace(options.workspace, mounts, p);
    else await onItsOwn(name, options, mounts, p);
    if (server === "x11vnc" && !p.ownNetwork) {
      throw new TypeError(
        "Cannot start desktop: x11vnc always listens on a TCP port besides its socket, and this desktop shares this host's network (network: true, or isolation \"none\"); install TigerVNC (apt-get install tigervnc-standalone-server), or keep the desktop's network off",
      );
    }
    const config: DesktopMainConfig = {
      server,
      programs,
      width: options.width ?? 1280,
      height: options.height ?? 800,
      depth: options.depth ?? 24,
      dir: p.dir,
      maxQueue: MAX_QUEUE,
      maxOutput: 1024 * 1024,
      frames: FRAME,
    };
    child = await p.spawn(
      [deno, "eval", "--no-config", "-q", SUPERVISOR_SOURCE, JSON.stringify(config)],
      { DENO_DIR: `${p.dir}/deno`, DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
    );
    const tail = stderrTail(child);
    pipe = new DesktopPipe(child, MAX_QUEUE);
    const display = await awaitReady(name, pipe, tail, options.startTimeout ?? 30_000);
    return { child, pipe, placement: p, server, display };
  } catch (err) {
    if (child !== null && pipe !== null) {
      await stopRunning({ child, pipe, placement: p, server, display: 0 });
    } else await undo(p);
    throw err;
  }
}

class DesktopHandle implements Desktop {
  readonly #name: string;
  readonly #width: number;
  readonly #height: number;
  running: Running | null = null;

  constructor(name: string, width: number, height: number) {
    this.#name = name;
    this.#width = width;
    this.#height = height;
  }

  get name(): string {
    return this.#name;
  }
  get width(): number {
    return this.#width;
  }
  get height(): number {
    return this.#height;
  }
  get server(): DesktopServer | null {
    return this.running?.server ?? null;
  }
  get display(): number | null {
    return this.running?.display ?? null;
  }

  #pipe(what: string): DesktopPipe {
    const r = this.running;
    if (r === null) throw new Error(`Cannot ${what} on desktop "${this.#name}": it is not started`);
    if (r.pipe.dead !== null) {
      throw new Error(`Cannot ${what} on desktop "${this.#name}": ${r.pipe.dead}`);
    }
    return r.pipe;
  }

  // deno-lint-ignore require-await
  async run(argv: readonly string[], options: DesktopRunOptions = {}): Promise<DesktopProgram> {
    checkArgv("run a program", argv);
    const pipe = this.#pipe("run a program");
    const { id, exit } = pipe.run({ argv: [...argv], env: options.env, cwd: options.cwd });
    const status = exit.then((e) => toStatus(this.#name, argv, e));
    status.catch(() => {});
    return { status, kill: (signal: Deno.Signal = "SIGTERM") => pipe.kill(id, signal) };
  }

  async exec(
    argv: readonly string[],
    options: DesktopExecOptions = {},
  ): Promise<DesktopExecResult> {
    checkArgv("run a program", argv);
    const pipe = this.#pipe("run a program");
    const timeout = options.timeout ?? 60_000;
    const { id, exit } = pipe.run({
      argv: [...argv],
      env: options.env,
      cwd: options.cwd,
      capture: true,
    });
    let timedOut = false;
    const kill = () => pipe.kill(id, "SIGKILL");
    const timer = setTimeout(() => {
      timedOut = true;
      kill();
    }, timeout);
    options.signal?.addEventListener("abort", kill, { once: true });
    try {
      const e = await exit;
      const status = toStatus(this.#name, argv, e);
      return { ...(await status), stdout: e.stdout ?? "", stderr: e.stderr ?? "", timedOut };
    } finally {
      clearTimeout(timer);
      options.signal?.removeEventListener("abort", kill);
    }
  }

  async open(options: RfbOptions = {}): Promise<RfbClient> {
    return await RfbClient.over(this.#pipe("open a VNC client").open(), options);
  }
}

function toStatus(name: string, argv: readonly string[], e: PipeExit): Promise<ExitStatus> {
  if (e.error !== undefined) {
    return Promise.reject(
      new Error(`Cannot run "${argv[0]}" on desktop "${name}": ${e.error}`),
    );
  }
  return Promise.resolve({ code: e.code ?? null, signal: e.signal ?? null });
}

/**
 * Adds a desktop to `env`: an initialize hook that starts an X server and a
 * VNC server in a sandbox (the `workspace`'s, or one of its own) and
 * attaches its `rfb/3.8` capability, and a shutdown hook that kills it and
 * removes its files. Clients reach it through their forwarders
 * (`HudClient.open("rfb")`), never directly.
 *
 * @example A desktop in the workspace's sandbox with a program on it
 * ```ts ignore
 * import { addDesktop, addWorkspace } from "./mod.ts";
 * import { Environment } from "../env.ts";
 *
 * const env = new Environment("desk");
 * const workspace = addWorkspace(env, "/srv/task");
 * const desktop = addDesktop(env, { workspace, width: 1024, height: 768 });
 * env.template({ id: "open" }, async function* () {
 *   await desktop.run(["xterm"]);
 *   yield "Type `date` in the terminal";
 *   await using vnc = await desktop.open();
 *   await Deno.writeFile("/tmp/seen.png", await vnc.screenshot());
 *   yield 1;
 * });
 * ```
 *
 * @param env the environment to add it to
 * @param options size, server, the workspace, or a sandbox of its own
 * @returns the handle that runs programs on it and reads it
 * @throws {TypeError} when an option has the wrong type, or is the workspace's to decide
 * @throws {RangeError} for a size, depth, server, isolation, uid, gid or limit out of range
 */
export function addDesktop(env: Environment, options: DesktopOptions = {}): Desktop {
  checkOptions(options);
  const name = options.name ?? "screen";
  const handle = new DesktopHandle(name, options.width ?? 1280, options.height ?? 800);
  env.initialize(async () => {
    const running = await start(name, options);
    handle.running = running;
    env.addCapability(
      Capability.rfb({ name, url: "rfb://127.0.0.1:0", display: running.display }),
      { attach: (conn, head) => splice(conn, running.pipe.open(), head) },
    );
  });
  env.shutdown(async () => {
    const running = handle.running;
    handle.running = null;
    if (running === null) return;
    env.removeCapability(name);
    await stopRunning(running);
  });
  return handle;
}
