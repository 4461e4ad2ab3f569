/**
 * The `browser` capability: {@linkcode addBrowser} gives an environment a
 * headless Chromium that runs in a sandbox like the workspace's (its own
 * view of the file system, no network unless asked, an unprivileged uid)
 * and is driven over `--remote-debugging-pipe`: it has no port and no
 * socket. Its `cdp/1.3` binding is attached to the environment, so only the
 * control server's authenticated `tunnel.open` reaches it; there the
 * server speaks enough HTTP and WebSocket for CDP clients (`CdpClient`,
 * Playwright's `connectOverCDP`, Puppeteer's `connect`), each with its own
 * browser session over the one pipe.
 *
 * @module
 */

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { type ChromiumProcess, launchChromium } from "../cdp/_chromium.ts";
import { chooseSandbox, findProgram, spawnInSandbox } from "./_sandbox.ts";
import type { WorkspaceIsolation } from "./workspace.ts";

/** The uid (and gid) Chromium runs as when this process is root: `nobody`. */
const NOBODY = 65534;

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
   * The Chromium executable (a path, or a name looked up on PATH).
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
   * Whether the browser keeps this host's network (every service on its
   * 127.0.0.1 included). Off, it has a network namespace of its own: pages
   * load from `data:` URLs, from servers started inside the sandbox, and
   * from `hostPorts`.
   * @default false
   */
  network?: boolean;
  /**
   * Ports of this host's 127.0.0.1 that pages may reach while `network` is
   * off, at the same address: `http://127.0.0.1:8080/` in the browser is
   * 127.0.0.1:8080 here. For pages the environment serves. A function is
   * called when the browser starts, after the initialize hooks added before
   * this one, so it can name a server that an earlier hook started on port 0.
   * Ports below 1024 cannot be listened on in the sandbox.
   * @default []
   */
  hostPorts?: readonly number[] | (() => readonly number[]);
  /**
   * Directories the browser may write besides its own: pass the
   * workspace's root so that downloads (`Browser.setDownloadBehavior` with a
   * path inside it) reach the agent's shell and the grader.
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
   * Called with what goes wrong while no caller waits (the warning for
   * `isolation: "none"`).
   * @default ignores them
   */
  onError?: (error: unknown) => void;
}

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

/**
 * Adds a headless Chromium to `env`: an initialize hook that starts it in a
 * sandbox and attaches its `cdp/1.3` capability, and a shutdown hook that
 * kills it and removes its profile. Clients reach it through their
 * forwarders (`HudClient.open("cdp")`), never directly.
 *
 * @example Publish a browser and drive it through the control port
 * ```ts ignore
 * import { addBrowser } from "./browser.ts";
 * import { Environment } from "../env.ts";
 * import { bind } from "../server.ts";
 * import { connect } from "../client.ts";
 *
 * const env = new Environment("web");
 * addBrowser(env);
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
 * @param options name, executable, flags, network, sandbox
 * @throws {TypeError} when an option has the wrong type
 * @throws {RangeError} when `isolation`, `uid`, `gid` or a port is out of range
 */
export function addBrowser(env: Environment, options: BrowserOptions = {}): void {
  const name = options.name ?? "browser";
  if (typeof name !== "string" || name === "") {
    throw new TypeError("Cannot add browser: name must be a non-empty string");
  }
  if (options.args !== undefined && !Array.isArray(options.args)) {
    throw new TypeError("Cannot add browser: args must be an array of strings");
  }
  if (options.writable !== undefined && !Array.isArray(options.writable)) {
    throw new TypeError("Cannot add browser: writable must be an array of directories");
  }
  const wanted = options.isolation ?? "auto";
  if (!["auto", "bwrap", "unshare", "none"].includes(wanted)) {
    throw new RangeError(
      `Cannot add browser: unknown isolation "${wanted}" (use "auto", "bwrap", "unshare" or "none")`,
    );
  }
  checkId("uid", options.uid);
  checkId("gid", options.gid);
  if (typeof options.hostPorts !== "function" && options.hostPorts !== undefined) {
    checkPorts(options.hostPorts);
  }
  let browser: ChromiumProcess | null = null;
  let dir: string | null = null;

  env.initialize(async () => {
    const wantedExecutable = options.executable ?? "chromium";
    const executable = executablePath(wantedExecutable);
    if (executable === null) {
      throw new TypeError(
        `Cannot start browser: "${wantedExecutable}" is not installed (apt-get install chromium, or pass executable)`,
      );
    }
    const network = options.network ?? false;
    const hostPorts = network ? [] : checkPorts(
      typeof options.hostPorts === "function" ? options.hostPorts() : options.hostPorts ?? [],
    );
    // The relay for hostPorts is `deno eval`: a `deno compile` binary is no deno.
    const deno = Deno.build.standalone ? findProgram("deno") : Deno.execPath();
    if (hostPorts.length > 0 && deno === null) {
      throw new TypeError(
        'Cannot start browser: hostPorts needs "deno" on PATH (this program is a compiled binary)',
      );
    }
    for (const path of options.writable ?? []) {
      const info = await Deno.stat(path).catch(() => null);
      if (info === null || !info.isDirectory || !path.startsWith("/")) {
        throw new TypeError(
          `Cannot start browser: writable "${path}" is not an absolute path to a directory`,
        );
      }
    }
    const user = Deno.uid() === 0
      ? { uid: options.uid ?? NOBODY, gid: options.gid ?? NOBODY }
      : null;
    const own = await Deno.makeTempDir({ prefix: "hud-browser-" });
    dir = own;
    try {
      if (user !== null) await Deno.chown(own, user.uid, user.gid);
      // The author's directories are mounts, not `writable`: the sandbox
      // hands root's files in `writable` to the sandbox's uid, which suits
      // the browser's own directory only.
      const sandbox = await chooseSandbox(
        wanted,
        {
          writable: [own],
          mounts: (options.writable ?? []).map((dir) => ({ src: dir, dest: dir, writable: true })),
          network,
          user,
        },
        own,
        { what: "browser", runs: "Chromium" },
      );
      if (sandbox.isolation === "none") {
        options.onError?.(
          new Error(
            `Browser "${name}" runs Chromium without a sandbox (isolation: "none"): it sees this host's files and network`,
          ),
        );
      }
      const kind = `${sandbox.isolation}:${user?.uid ?? Deno.uid()}`;
      browser = await launchChromium({
        executable,
        args: options.args,
        dir: own,
        hostPorts: sandbox.isolation === "none" ? [] : hostPorts,
        deno: deno ?? undefined,
        chromiumSandbox: noChromiumSandbox.has(kind) ? false : undefined,
        spawn: (argv, childEnv) => spawnInSandbox(argv, { cwd: own, env: childEnv, sandbox }),
        signal: AbortSignal.timeout(options.startTimeout ?? 30_000),
      });
      if (!browser.chromiumSandbox) noChromiumSandbox.add(kind);
    } catch (err) {
      dir = null;
      await Deno.remove(own, { recursive: true }).catch(() => {});
      throw err;
    }
    const b = browser;
    env.addCapability(
      Capability.cdp({ name, url: `ws://127.0.0.1:0${b.path}` }),
      { attach: (conn, head) => b.attach(conn, head) },
    );
  });

  env.shutdown(async () => {
    const b = browser;
    const d = dir;
    browser = null;
    dir = null;
    try {
      if (b !== null) {
        env.removeCapability(name);
        await b.close();
      }
    } finally {
      if (d !== null) await Deno.remove(d, { recursive: true }).catch(() => {});
    }
  });
}
