/**
 * The `browser` capability: {@linkcode addBrowser} gives an environment a
 * headless Chromium, started when the environment starts (a fresh profile
 * directory, `--remote-debugging-port` on 127.0.0.1, its own process group)
 * and published as a `cdp/1.3` binding, reachable through a client's
 * forwarder like any other capability. At stop the whole process group is
 * killed and the profile removed.
 *
 * @module
 */

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { type ChromiumProcess, DEFAULT_CHROMIUM_ARGS, launchChromium } from "./_chromium.ts";

/** Options for {@linkcode addBrowser}. */
export interface BrowserOptions {
  /**
   * Capability name.
   * @default "browser"
   */
  name?: string;
  /**
   * The Chromium executable.
   * @default "chromium"
   */
  executable?: string;
  /**
   * Flags added to the defaults (headless, no sandbox, no GPU, no
   * background networking, debugging on 127.0.0.1 with a free port).
   * @default []
   */
  args?: readonly string[];
  /**
   * How long the browser may take to start, in ms.
   * @default 30_000
   */
  startTimeout?: number;
}

/** Whether `name` (a path, or a command looked up in PATH) is an executable file. */
async function isExecutable(name: string): Promise<boolean> {
  const candidates = name.includes("/")
    ? [name]
    : (Deno.env.get("PATH") ?? "").split(":").filter(Boolean).map((dir) => `${dir}/${name}`);
  for (const path of candidates) {
    const info = await Deno.stat(path).catch(() => null);
    if (info?.isFile && ((info.mode ?? 0o111) & 0o111) !== 0) return true;
  }
  return false;
}

/**
 * Adds a headless Chromium to `env`: an initialize hook that starts it and
 * publishes it as a `cdp/1.3` capability whose url is the browser's
 * DevTools WebSocket, and a shutdown hook that kills its process group and
 * removes its profile directory. A watchdog kills the browser too when this
 * process dies without stopping the environment.
 *
 * @example Publish a browser and drive it
 * ```ts ignore
 * import { addBrowser } from "./browser.ts";
 * import { Environment } from "../env.ts";
 * import { CdpClient } from "./client.ts";
 *
 * const env = new Environment("web");
 * addBrowser(env);
 * await env.start();
 * try {
 *   await using cdp = await CdpClient.fromBinding(env.capability("browser")!);
 *   const { product } = await cdp.send<{ product: string }>("Browser.getVersion");
 *   console.log(product);
 * } finally {
 *   await env.stop();
 * }
 * ```
 *
 * @param env the environment to add it to
 * @param options name, executable, extra flags
 * @throws {TypeError} when an option has the wrong type
 */
export function addBrowser(env: Environment, options: BrowserOptions = {}): void {
  const name = options.name ?? "browser";
  if (typeof name !== "string" || name === "") {
    throw new TypeError("Cannot add browser: name must be a non-empty string");
  }
  if (options.args !== undefined && !Array.isArray(options.args)) {
    throw new TypeError("Cannot add browser: args must be an array of strings");
  }
  let browser: ChromiumProcess | null = null;

  env.initialize(async () => {
    const executable = options.executable ?? "chromium";
    if (!(await isExecutable(executable))) {
      throw new TypeError(
        `Cannot start browser: "${executable}" is not installed (apt-get install chromium, or pass executable)`,
      );
    }
    browser = await launchChromium({
      executable,
      args: [...DEFAULT_CHROMIUM_ARGS, ...(options.args ?? [])],
      signal: AbortSignal.timeout(options.startTimeout ?? 30_000),
    });
    env.addCapability(Capability.cdp({ name, url: browser.wsUrl }));
  });

  env.shutdown(async () => {
    const b = browser;
    browser = null;
    if (b === null) return;
    env.removeCapability(name);
    await b.close();
  });
}
