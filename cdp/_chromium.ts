// Launches headless Chromium in its own session and process group, for CDP
// (Linux). Private to cdp/: addBrowser() is the public face.

import { delay } from "../_internal/async.ts";
import { liveGroupMembers } from "../_internal/process.ts";

/** Default flags for a quiet, offline, headless Chromium. */
export const DEFAULT_CHROMIUM_ARGS: readonly string[] = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--remote-debugging-address=127.0.0.1",
  "--remote-debugging-port=0",
];

/** Options for {@linkcode launchChromium}. */
export interface LaunchOptions {
  /** Executable (default `chromium`). */
  executable?: string;
  /** Flags; `--user-data-dir` and the start URL are appended. */
  args?: readonly string[];
  /** Aborts startup (the browser is killed and the profile removed). */
  signal?: AbortSignal;
  /** Number of stderr lines kept for diagnostics (default 50). */
  stderrLines?: number;
  /**
   * Run Chromium under a tiny `sh` watchdog that SIGKILLs the whole process group when our
   * end of its stdin pipe closes, i.e. when this Deno process dies without calling `close()`
   * (crash, uncaught error, `Deno.exit`). Default `true`. Without it a detached browser
   * outlives Deno.
   */
  watchdog?: boolean;
}

// $0 = executable, "$@" = its args. Chromium gets /dev/null as stdin; the shell blocks reading
// the pipe from Deno and kills its own process group (== Chromium's) on EOF. If Chromium exits
// by itself the subshell kills the group too, so Deno sees the shell die.
const WATCHDOG_SCRIPT = '("$0" "$@" </dev/null; kill -KILL 0) & read -r _ignored; kill -KILL 0';

/** A running browser. Dispose it to kill the process group and remove the profile. */
export interface ChromiumProcess extends AsyncDisposable {
  /** Browser-level WebSocket URL (from `DevToolsActivePort`). */
  readonly wsUrl: string;
  /** Remote debugging port chosen by Chromium. */
  readonly port: number;
  /** Process-group/session id: the browser's PID, or the watchdog shell's PID. */
  readonly pid: number;
  /** Temporary profile directory (removed by `close`). */
  readonly userDataDir: string;
  /** Last stderr lines (Chromium is noisy: dbus errors etc.). */
  stderrTail(): string[];
  /** SIGKILLs the process group, waits until it is gone, removes the profile. Idempotent. */
  close(): Promise<void>;
}

const PORT_FILE_RE = /^(\d+)\r?\n(\/devtools\/browser\/\S+)/;

/** Parses `DevToolsActivePort` content; `undefined` if incomplete. */
export function parseDevToolsActivePort(
  text: string,
): { port: number; path: string } | undefined {
  const m = PORT_FILE_RE.exec(text);
  if (m === null) return undefined;
  const port = Number(m[1]);
  if (!Number.isInteger(port) || port <= 0 || port > 65535) return undefined;
  return { port, path: m[2] };
}

/**
 * Starts Chromium with `--remote-debugging-port=0` in a new session (`detached: true`, i.e.
 * setsid, so pid == pgid), waits for `<userDataDir>/DevToolsActivePort` and returns the
 * endpoint. `close()` kills the whole group (zygotes, renderers, GPU/utility processes);
 * the two `chrome_crashpad_handler` processes setsid themselves and exit on their own
 * within ~20 ms once the browser is gone.
 */
export async function launchChromium(options: LaunchOptions = {}): Promise<ChromiumProcess> {
  const { executable = "chromium", args = DEFAULT_CHROMIUM_ARGS, signal, watchdog = true } =
    options;
  const keep = options.stderrLines ?? 50;
  signal?.throwIfAborted();
  const userDataDir = await Deno.makeTempDir({ prefix: "cdp-profile-" });
  let child: Deno.ChildProcess;
  try {
    const browserArgs = [...args, `--user-data-dir=${userDataDir}`, "about:blank"];
    child = new Deno.Command(watchdog ? "sh" : executable, {
      args: watchdog ? ["-c", WATCHDOG_SCRIPT, executable, ...browserArgs] : browserArgs,
      stdin: watchdog ? "piped" : "null",
      stdout: "null",
      stderr: "piped",
      detached: true, // setsid(): pid == pgid == sid, so kill(-pid) reaches all children
    }).spawn();
  } catch (error) {
    await Deno.remove(userDataDir, { recursive: true });
    throw error;
  }
  const pid = child.pid;
  // Keep the pipe open (never write to it); closing it triggers the watchdog.
  const stdin = watchdog ? child.stdin.getWriter() : undefined;
  const tail: string[] = [];
  let listening: string | undefined;
  // Chromium must never block on a full stderr pipe: drain it until EOF.
  const drained = (async () => {
    let buf = "";
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      const lines = buf.split("\n");
      buf = lines.pop() ?? "";
      for (const line of lines) {
        const m = /DevTools listening on (ws:\/\/\S+)/.exec(line);
        if (m) listening = m[1];
        tail.push(line);
        if (tail.length > keep) tail.shift();
      }
    }
    if (buf) tail.push(buf);
  })().catch(() => {});
  let exited = false;
  const status = child.status.then((s) => {
    exited = true;
    return s;
  });

  let closing: Promise<void> | undefined;
  const close = () =>
    closing ??= (async () => {
      try {
        Deno.kill(-pid, "SIGKILL");
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) throw error; // ESRCH: already gone
      }
      await status;
      await stdin?.close().catch(() => {});
      await drained;
      // Children are reparented to PID 1 and may linger as zombies; only wait for live ones.
      for (let i = 0; i < 200 && liveGroupMembers(pid).length > 0; i++) await delay(10);
      for (let i = 0;; i++) {
        try {
          await Deno.remove(userDataDir, { recursive: true });
          break;
        } catch (error) {
          if (error instanceof Deno.errors.NotFound) break;
          if (i >= 20) throw error;
          await delay(50);
        }
      }
    })();

  try {
    const portFile = `${userDataDir}/DevToolsActivePort`;
    let parsed: { port: number; path: string } | undefined;
    while (parsed === undefined) {
      signal?.throwIfAborted();
      if (exited) {
        const s = await status;
        throw new TypeError(
          `Chromium exited early (code ${s.code}, signal ${s.signal}):\n${tail.join("\n")}`,
        );
      }
      try {
        parsed = parseDevToolsActivePort(await Deno.readTextFile(portFile));
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      }
      if (parsed === undefined) await delay(25);
    }
    const wsUrl = `ws://127.0.0.1:${parsed.port}${parsed.path}`;
    if (listening !== undefined && listening !== wsUrl) {
      throw new TypeError(`DevToolsActivePort (${wsUrl}) disagrees with stderr (${listening})`);
    }
    return {
      wsUrl,
      port: parsed.port,
      pid,
      userDataDir,
      stderrTail: () => [...tail],
      close,
      [Symbol.asyncDispose]: close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}
