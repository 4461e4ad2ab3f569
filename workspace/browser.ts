/**
 * The `browser` capability: {@linkcode addBrowser} gives an environment a
 * headless Chromium driven over `--remote-debugging-pipe`: it has no port
 * and no socket. It runs in a workspace's sandbox (`workspace`: the agent's
 * uid, view of the file system, network policy, cgroup and limits; stopped
 * while grading, killed at stop), or in a sandbox of its own made the same
 * way. Its `cdp/1.3` binding is attached to the environment, so only the
 * control server's authenticated `tunnel.open` reaches it; there the
 * server speaks enough HTTP and WebSocket for CDP clients (`CdpClient`,
 * Playwright's `connectOverCDP`, Puppeteer's `connect`), each with its own
 * browser session over the one pipe.
 *
 * @module
 */

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { type ChromiumProcess, type ChromiumSpawner, launchChromium } from "../cdp/_chromium.ts";
import {
  checkIsolation,
  chooseSandbox,
  findProgram,
  type SandboxMount,
  spawnInSandbox,
  systemShows,
} from "./_sandbox.ts";
import {
  checkLimits,
  resolveLimits,
  type WorkspaceCgroup,
  type WorkspaceLimits,
} from "./_limits.ts";
import type { Workspace, WorkspaceIsolation } from "./_types.ts";

/** The uid (and gid) Chromium runs as when this process is root: `nobody`. */
const NOBODY = 65534;

/** The browser's own directory inside a workspace's sandbox (its private /tmp). */
const SANDBOX_DIR = "/tmp/hud-browser";

/**
 * Sandboxes (mechanism and uid) under which Chromium's own sandbox would
 * not start: later starts skip the failing try (under `unshare`, a whole
 * Chromium start).
 */
const noChromiumSandbox = new Set<string>();

/** Options for {@linkcode addBrowser}. */
export interface BrowserOptions {
  /**
   * Capability name.
   * @default "browser"
   */
  name?: string;
  /**
   * The Chromium executable (a path, or a name looked up on PATH). Outside
   * the system's directories (/usr...), its directory is shown read-only.
   * @default "chromium"
   */
  executable?: string;
  /**
   * Flags added to the defaults (headless, no GPU, no background
   * networking, `--remote-debugging-pipe`, a fresh profile).
   * @default []
   */
  args?: readonly string[];
  /**
   * How long the browser may take to start, in ms.
   * @default 30_000
   */
  startTimeout?: number;
  /**
   * The workspace whose sandbox Chromium runs in, through
   * `workspace.spawn()`: the agent's uid, view of the file system (the root
   * writable: downloads there reach the agent's shell and the grader),
   * network policy, cgroup and limits. It is stopped while the workspace
   * grades and killed when the workspace stops. Add the browser after the
   * workspace, to the same environment. `network`, `isolation`, `uid`,
   * `gid`, `writable` and `limits` are then the workspace's.
   * @default a sandbox of the browser's own
   */
  workspace?: Workspace;
  /**
   * Whether the browser keeps this host's network (every service on its
   * 127.0.0.1 included). Off, it has a network namespace of its own: pages
   * load from `data:` URLs, from servers started inside the sandbox, and
   * from `hostPorts`.
   * @default false
   */
  network?: boolean;
  /**
   * Ports of this host's 127.0.0.1 that pages may reach while the network
   * is off, at the same address: `http://127.0.0.1:8080/` in the browser is
   * 127.0.0.1:8080 here. For pages the environment serves. A function is
   * called when the browser starts, after the initialize hooks added before
   * this one, so it can name a server that an earlier hook started on port 0.
   * Ports below 1024 cannot be listened on in the sandbox.
   * @default []
   */
  hostPorts?: readonly number[] | (() => readonly number[]);
  /**
   * Directories the browser may write besides its own (downloads), shown
   * at their own paths; they must be writable by its uid.
   * @default []
   */
  writable?: readonly string[];
  /**
   * How the browser is isolated, as for the workspace: "auto" takes
   * bubblewrap, else util-linux `unshare`, and refuses to start when
   * neither works here; "none" runs it unconfined and reports one warning
   * line through `onError`.
   * @default "auto"
   */
  isolation?: WorkspaceIsolation;
  /**
   * Uid Chromium runs as when this process is root (0 is refused: Chromium
   * as root cannot keep its own sandbox).
   * @default 65534 (nobody)
   */
  uid?: number;
  /**
   * Gid Chromium runs as when this process is root.
   * @default 65534 (nogroup)
   */
  gid?: number;
  /**
   * Limits on memory, processes and disk, as a workspace's (a cgroup of the
   * browser's own; /tmp and /dev/shm tmpfs of `tmpSize` each).
   * @default { memory: 4 GiB, processes: 1024, tmpSize: 1 GiB, fileSize: 4 GiB }
   */
  limits?: WorkspaceLimits;
  /**
   * Called with what goes wrong while no caller waits: the warning for
   * `isolation: "none"`, and one line for each limit not in force here.
   * @default ignores them
   */
  onError?: (error: unknown) => void;
}

/** What the workspace decides when `workspace` is given. */
const WORKSPACE_OWNS = ["network", "isolation", "uid", "gid", "writable", "limits"] as const;

/**
 * The absolute path of `name` (a path, or a command looked up on this
 * process's PATH: the sandbox's PATH may not hold it), or null when it is
 * not an executable file.
 */
function executablePath(name: string): string | null {
  if (!name.includes("/")) return findProgram(name);
  const path = name.startsWith("/") ? name : `${Deno.cwd()}/${name}`;
  try {
    const info = Deno.statSync(path);
    return info.isFile && ((info.mode ?? 0o111) & 0o111) !== 0 ? path : null;
  } catch {
    return null;
  }
}

/**
 * The host paths Chromium needs shown besides the system's directories:
 * the directory of its executable and the deno binary of the port relay,
 * where they lie elsewhere (an install under /opt, a deno under ~/.deno).
 */
async function programMounts(executable: string, deno: string | null): Promise<string[]> {
  const out = new Set<string>();
  const real = await Deno.realPath(executable);
  if (!systemShows(real)) out.add(real.slice(0, real.lastIndexOf("/")) || "/");
  if (deno !== null) {
    const realDeno = await Deno.realPath(deno);
    if (!systemShows(realDeno)) out.add(realDeno);
  }
  return [...out];
}

function checkPorts(ports: unknown): number[] {
  if (!Array.isArray(ports)) {
    throw new TypeError("Cannot start browser: hostPorts must be an array of port numbers");
  }
  for (const port of ports) {
    if (!Number.isInteger(port) || port < 1024 || port > 65535) {
      throw new RangeError(
        `Cannot start browser: host port "${port}" is not between 1024 and 65535`,
      );
    }
  }
  return [...new Set(ports as number[])];
}

function checkId(what: string, id: number | undefined): void {
  if (id !== undefined && !(Number.isInteger(id) && id > 0 && id < 2 ** 32 - 1)) {
    throw new RangeError(`Cannot add browser: invalid ${what} "${id}" (use a uid other than 0)`);
  }
}

/** Where Chromium runs, made at start and undone at stop. */
interface Placement {
  /** The browser's directory as Chromium sees it. */
  dir: string;
  /** The directory for the port relay's sockets, on this host, if any. */
  portsDir?: string;
  spawn: ChromiumSpawner;
  /** Mechanism and uid, for the memo of Chromium's own sandbox. */
  kind: string;
  /** Whether Chromium has a network namespace of its own (`hostPorts` apply). */
  ownNetwork: boolean;
  /** Host directories to remove at stop. */
  dirs: string[];
  cgroup: WorkspaceCgroup | null;
}

/** Makes a host directory for the browser, 0700, owned by `uid` (when root). */
async function browserDir(prefix: string, uid: number | null, gid: number | null) {
  const dir = await Deno.makeTempDir({ prefix });
  if (Deno.uid() === 0 && uid !== null && uid !== 0) await Deno.chown(dir, uid, gid);
  return dir;
}

/** In `workspace`'s sandbox, through its `spawn()`. */
async function inWorkspace(
  workspace: Workspace,
  mounts: string[],
  hostPorts: readonly number[],
  placement: Placement,
): Promise<void> {
  const isolation = workspace.isolation;
  if (isolation === null) {
    throw new Error(
      `Cannot start browser: workspace "${workspace.name}" is not started (add the browser after addWorkspace, to the same environment)`,
    );
  }
  const uid = workspace.uid;
  placement.kind = `${isolation}:${uid ?? Deno.uid()}`;
  placement.ownNetwork = isolation !== "none" && !workspace.network;
  if (isolation === "none") {
    // No private /tmp: a directory of its own on this host.
    placement.dir = await browserDir("hud-browser-", uid, null);
    placement.dirs.push(placement.dir);
  } else {
    placement.dir = SANDBOX_DIR;
    if (placement.ownNetwork && hostPorts.length > 0) {
      // Read-only in the sandbox, which does for connecting to its sockets.
      placement.portsDir = await browserDir("hud-browser-ports-", uid, null);
      placement.dirs.push(placement.portsDir);
      mounts = [...mounts, placement.portsDir];
    }
  }
  placement.spawn = (argv, env) => workspace.spawn(argv, { cwd: "/", env, mounts });
}

/** In a sandbox of the browser's own. */
async function onItsOwn(
  config: BrowserConfig,
  mounts: string[],
  placement: Placement,
): Promise<void> {
  const user = Deno.uid() === 0 ? { uid: config.uid, gid: config.gid } : null;
  const own = await browserDir("hud-browser-", user?.uid ?? null, user?.gid ?? null);
  placement.dir = own;
  placement.dirs.push(own);
  // 65534 is shared by every browser: RLIMIT_NPROC would count them all.
  const limits = resolveLimits(config.limits, `hud-browser-${Deno.pid}`, false);
  placement.cgroup = limits.cgroup;
  for (const line of limits.notInForce) {
    config.onError(new Error(`Browser "${config.name}": ${line}`));
  }
  // The author's directories are mounts, not `writable`: the sandbox hands
  // root's files in `writable` to the sandbox's uid, which suits the
  // browser's own directory only.
  const sandbox = await chooseSandbox(
    config.isolation,
    {
      writable: [own],
      mounts: [
        ...mounts.map((p): SandboxMount => ({ src: p, dest: p })),
        ...config.writable.map((dir): SandboxMount => ({ src: dir, dest: dir, writable: true })),
      ],
      network: config.network,
      user,
      limits: {
        tmpSize: limits.inForce.tmpSize,
        fileSize: limits.inForce.fileSize,
        processes: null,
      },
      cgroups: limits.cgroup?.procs ?? [],
    },
    own,
    { what: "browser", runs: "Chromium" },
  );
  if (sandbox.isolation === "none") {
    config.onError(
      new Error(
        `Browser "${config.name}" runs Chromium without a sandbox (isolation: "none"): it sees this host's files and network`,
      ),
    );
  }
  placement.kind = `${sandbox.isolation}:${user?.uid ?? Deno.uid()}`;
  placement.ownNetwork = sandbox.isolation !== "none" && !config.network;
  placement.spawn = (argv, env) => spawnInSandbox(argv, { cwd: own, env, sandbox });
}

/** {@linkcode BrowserOptions} checked, with every default applied. */
interface BrowserConfig {
  readonly name: string;
  readonly executable: string;
  readonly args: readonly string[] | undefined;
  readonly startTimeout: number;
  readonly workspace: Workspace | undefined;
  readonly network: boolean;
  /** Checked when given as a list; a function's list is checked at each start. */
  readonly hostPorts: readonly number[] | (() => readonly number[]);
  readonly writable: readonly string[];
  readonly isolation: WorkspaceIsolation;
  /** When this process is root. */
  readonly uid: number;
  readonly gid: number;
  readonly limits: WorkspaceLimits | undefined;
  readonly onError: (error: unknown) => void;
}

/**
 * Checks `options` (what can be checked before a start) and applies the defaults.
 * @throws {TypeError} when an option has the wrong type, or is the workspace's to decide
 * @throws {RangeError} when `isolation`, `uid`, `gid`, a limit or a port is out of range
 */
function browserConfig(options: BrowserOptions): BrowserConfig {
  const name = options.name ?? "browser";
  if (typeof name !== "string" || name === "") {
    throw new TypeError("Cannot add browser: name must be a non-empty string");
  }
  if (options.args !== undefined && !Array.isArray(options.args)) {
    throw new TypeError("Cannot add browser: args must be an array of strings");
  }
  if (options.workspace !== undefined) checkWorkspace(options);
  if (options.writable !== undefined && !Array.isArray(options.writable)) {
    throw new TypeError("Cannot add browser: writable must be an array of directories");
  }
  const isolation = options.isolation ?? "auto";
  checkIsolation("add browser", isolation);
  checkId("uid", options.uid);
  checkId("gid", options.gid);
  checkLimits("add browser", options.limits);
  const hostPorts = options.hostPorts ?? [];
  if (typeof hostPorts !== "function") checkPorts(hostPorts);
  return {
    name,
    executable: options.executable ?? "chromium",
    args: options.args,
    startTimeout: options.startTimeout ?? 30_000,
    workspace: options.workspace,
    network: options.network ?? false,
    hostPorts,
    writable: options.writable ?? [],
    isolation,
    uid: options.uid ?? NOBODY,
    gid: options.gid ?? NOBODY,
    limits: options.limits,
    onError: options.onError ?? (() => {}),
  };
}

/** @throws {TypeError} unless `workspace` is a workspace handle and nothing it decides is set */
function checkWorkspace(options: BrowserOptions): void {
  if (typeof options.workspace?.spawn !== "function") {
    throw new TypeError("Cannot add browser: workspace must be what addWorkspace returned");
  }
  for (const key of WORKSPACE_OWNS) {
    if (options[key] !== undefined) {
      throw new TypeError(
        `Cannot add browser: "${key}" is the workspace's when workspace is given (set it on addWorkspace, or leave workspace out)`,
      );
    }
  }
}

/** What a start needs from this host: Chromium, the relay's deno and the ports it relays. */
interface Programs {
  executable: string;
  deno: string | null;
  hostPorts: readonly number[];
}

/**
 * Finds Chromium (and deno, for the relay of `hostPorts`) and checks the
 * ports and the writable directories as they are at this start.
 * @throws {TypeError} naming what is missing and the way out
 */
async function programs(config: BrowserConfig): Promise<Programs> {
  const executable = executablePath(config.executable);
  if (executable === null) {
    throw new TypeError(
      `Cannot start browser: "${config.executable}" is not installed (apt-get install chromium, or pass executable)`,
    );
  }
  const hostPorts = checkPorts(
    typeof config.hostPorts === "function" ? config.hostPorts() : config.hostPorts,
  );
  // The relay for hostPorts is `deno eval`: a `deno compile` binary is no deno.
  const deno = hostPorts.length === 0
    ? null
    : Deno.build.standalone
    ? findProgram("deno")
    : Deno.execPath();
  if (hostPorts.length > 0 && deno === null) {
    throw new TypeError(
      'Cannot start browser: hostPorts needs "deno" on PATH (this program is a compiled binary)',
    );
  }
  for (const path of config.writable) {
    const info = await Deno.stat(path).catch(() => null);
    if (info === null || !info.isDirectory || !path.startsWith("/")) {
      throw new TypeError(
        `Cannot start browser: writable "${path}" is not an absolute path to a directory`,
      );
    }
  }
  return { executable, deno, hostPorts };
}

/** Removes what a placement made on this host. */
async function undo(p: Placement): Promise<void> {
  await p.cgroup?.remove();
  for (const d of p.dirs) await Deno.remove(d, { recursive: true }).catch(() => {});
}

/** One browser of an environment, started and stopped with it. */
class BrowserHandle {
  readonly #env: Environment;
  readonly #config: BrowserConfig;
  #browser: ChromiumProcess | null = null;
  #placed: Placement | null = null;

  constructor(env: Environment, config: BrowserConfig) {
    this.#env = env;
    this.#config = config;
  }

  /** Places Chromium (in the workspace's sandbox or its own), starts it, attaches it. */
  async start(): Promise<void> {
    const config = this.#config;
    const { executable, deno, hostPorts } = await programs(config);
    const mounts = await programMounts(executable, deno);
    const p: Placement = {
      dir: "",
      spawn: () => Promise.reject(new Error("unplaced")),
      kind: "",
      ownNetwork: false,
      dirs: [],
      cgroup: null,
    };
    this.#placed = p;
    let browser: ChromiumProcess;
    try {
      if (config.workspace !== undefined) {
        await inWorkspace(config.workspace, mounts, hostPorts, p);
      } else {
        await onItsOwn(config, mounts, p);
      }
      browser = this.#browser = await launchChromium({
        executable,
        args: config.args,
        dir: p.dir,
        portsDir: p.portsDir,
        // Without a namespace of its own the browser has this host's 127.0.0.1 already.
        hostPorts: p.ownNetwork ? hostPorts : [],
        deno: deno ?? undefined,
        chromiumSandbox: noChromiumSandbox.has(p.kind) ? false : undefined,
        spawn: p.spawn,
        signal: AbortSignal.timeout(config.startTimeout),
      });
      if (!browser.chromiumSandbox) noChromiumSandbox.add(p.kind);
    } catch (err) {
      this.#placed = null;
      await undo(p);
      throw err;
    }
    this.#env.addCapability(
      Capability.cdp({ name: config.name, url: `ws://127.0.0.1:0${browser.path}` }),
      { attach: (conn, head) => browser.attach(conn, head) },
    );
  }

  /** Detaches and kills the browser and removes its files. */
  async stop(): Promise<void> {
    const b = this.#browser;
    const p = this.#placed;
    this.#browser = null;
    this.#placed = null;
    try {
      if (b !== null) {
        this.#env.removeCapability(this.#config.name);
        await b.close();
      }
    } finally {
      if (p !== null) await undo(p);
    }
  }
}

/**
 * Adds a headless Chromium to `env`: an initialize hook that starts it in a
 * sandbox (the `workspace`'s, or one of its own) and attaches its `cdp/1.3`
 * capability, and a shutdown hook that kills it and removes its files.
 * Clients reach it through their forwarders (`HudClient.open("cdp")`),
 * never directly.
 *
 * @example Publish a browser in the workspace's sandbox and drive it through the control port
 * ```ts ignore
 * import { addBrowser, addWorkspace } from "./mod.ts";
 * import { Environment } from "../env.ts";
 * import { bind } from "../server.ts";
 * import { connect } from "../client.ts";
 *
 * const env = new Environment("web");
 * const workspace = addWorkspace(env, "/srv/task");
 * addBrowser(env, { workspace });
 * await env.start();
 * try {
 *   await using server = bind(env);
 *   await using client = await connect(server);
 *   await using cdp = await client.open("browser");
 *   const { product } = await cdp.send<{ product: string }>("Browser.getVersion");
 *   console.log(product);
 * } finally {
 *   await env.stop();
 * }
 * ```
 *
 * @param env the environment to add it to
 * @param options name, executable, flags, the workspace, or network and sandbox of its own
 * @throws {TypeError} when an option has the wrong type, or is the workspace's to decide
 * @throws {RangeError} when `isolation`, `uid`, `gid`, a limit or a port is out of range
 */
export function addBrowser(env: Environment, options: BrowserOptions = {}): void {
  const browser = new BrowserHandle(env, browserConfig(options));
  env.initialize(() => browser.start());
  env.shutdown(() => browser.stop());
}
