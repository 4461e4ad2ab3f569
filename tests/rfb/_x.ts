// Real X and VNC servers for the tests, from Debian: TigerVNC's Xvnc, or
// Xvfb with x11vnc, on a unix socket in a temporary directory (no TCP
// port), plus the X tools that check what the client did (xdotool, import,
// compare) and a Tk window that logs the keys and clicks it receives.
// A test names the programs it needs with `needs: [desktop([...])]`
// (tests/_counterparts.ts): missing ones skip it, naming them and their
// packages; with HUD_REQUIRE_DESKTOP=1 or HUD_REQUIRE_ALL=1 (set by .ci/run,
// which installs them) they fail it.

import type { Environment, TaskRow } from "../../env.ts";
import { integer } from "../../schema.ts";
import type { Desktop } from "../../workspace/mod.ts";
import { findProgram } from "../../workspace/_sandbox.ts";
import { type Counterpart, counterpart } from "../_counterparts.ts";

/** Debian packages by the program the tests look for. */
const PACKAGES: Record<string, string> = {
  Xvnc: "tigervnc-standalone-server",
  vncpasswd: "tigervnc-tools",
  Xvfb: "xvfb",
  x11vnc: "x11vnc",
  xdotool: "xdotool",
  import: "imagemagick",
  compare: "imagemagick",
  xwd: "x11-apps",
  xrandr: "x11-xserver-utils",
  tkinter: "python3-tk",
  chromium: "chromium",
};

function pythonHasTk(): boolean {
  try {
    return new Deno.Command("/usr/bin/python3", {
      args: ["-c", "import tkinter"],
      stdout: "null",
      stderr: "null",
    }).outputSync().success;
  } catch {
    return false;
  }
}

/** The programs among `needs` that are not installed, as "program (package)". */
export function missing(needs: readonly string[]): string[] {
  return needs.filter((n) => n === "tkinter" ? !pythonHasTk() : findProgram(n) === null)
    .map((n) => `${n} (apt-get install ${PACKAGES[n] ?? n})`);
}

/**
 * The desktop programs `needs` as one counterpart, "desktop": a test that
 * needs it is skipped where one is missing, naming each with its package,
 * and fails instead under HUD_REQUIRE_DESKTOP=1 or HUD_REQUIRE_ALL=1.
 */
export function desktop(needs: readonly string[]): Counterpart {
  const packages = [...new Set(needs.map((n) => PACKAGES[n] ?? n))].join(" ");
  return counterpart("desktop", `apt-get install ${packages}`, () => {
    const gone = missing(needs);
    return gone.length === 0 ? null : `${gone.join(", ")} not installed`;
  });
}

/** A VNC server the test started. */
export interface TestServer extends AsyncDisposable {
  kind: "tigervnc" | "x11vnc";
  /** `:N`. */
  display: string;
  /** The VNC server's unix socket. */
  socket: string;
  /** Runs an X program on the display to its end. */
  x(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }>;
  /** Starts an X program on the display; stopped at dispose. */
  spawn(argv: string[]): Deno.ChildProcess;
  dir: string;
}

async function firstLine(stream: ReadableStream<Uint8Array>): Promise<string> {
  let text = "";
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
  }
  reader.cancel().catch(() => {});
  return text.trim();
}

async function waitForSocket(path: string, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    try {
      (await Deno.connect({ transport: "unix", path })).close();
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 25));
    }
  }
  throw new Error(`${what} made no socket at ${path}`);
}

/** Starts a VNC server on a unix socket, `width`×`height`×24, optionally with a VNC password. */
export async function startServer(
  kind: "tigervnc" | "x11vnc",
  options: { width?: number; height?: number; password?: string } = {},
): Promise<TestServer> {
  const dir = await Deno.makeTempDir({ prefix: "hud-rfb-test-" });
  const socket = `${dir}/rfb.sock`;
  const width = options.width ?? 640;
  const height = options.height ?? 480;
  const children: Deno.ChildProcess[] = [];
  const stop = async () => {
    for (const c of children.toReversed()) {
      try {
        c.kill("SIGKILL");
      } catch {
        // gone
      }
      await c.status;
    }
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  try {
    let security = ["-SecurityTypes", "None"];
    if (kind === "tigervnc" && options.password !== undefined) {
      const out = await new Deno.Command("vncpasswd", {
        args: ["-f"],
        stdin: "piped",
        stdout: "piped",
      }).spawn();
      const w = out.stdin.getWriter();
      await w.write(new TextEncoder().encode(`${options.password}\n`));
      await w.close();
      await Deno.writeFile(`${dir}/passwd`, (await out.output()).stdout, { mode: 0o600 });
      security = ["-SecurityTypes", "VncAuth", "-PasswordFile", `${dir}/passwd`];
    }
    const x = new Deno.Command(kind === "tigervnc" ? "Xvnc" : "Xvfb", {
      args: kind === "tigervnc"
        ? [
          "-displayfd",
          "1",
          "-geometry",
          `${width}x${height}`,
          "-depth",
          "24",
          "-rfbunixpath",
          socket,
          "-rfbport",
          "-1",
          "-nolisten",
          "tcp",
          ...security,
        ]
        : ["-displayfd", "1", "-screen", "0", `${width}x${height}x24`, "-nolisten", "tcp"],
      stdin: "null",
      stdout: "piped",
      stderr: "null",
    }).spawn();
    children.push(x);
    const display = `:${await firstLine(x.stdout)}`;
    if (kind === "x11vnc") {
      const vnc = new Deno.Command("x11vnc", {
        args: [
          "-display",
          display,
          "-unixsock",
          socket,
          "-rfbport",
          "0",
          "-listen",
          "127.0.0.1",
          "-no6",
          "-forever",
          "-shared",
          "-norc",
          "-noncache",
          "-quiet",
          ...(options.password === undefined ? ["-nopw"] : ["-passwd", options.password]),
        ],
        stdin: "null",
        stdout: "null",
        stderr: "null",
      }).spawn();
      children.push(vnc);
    }
    await waitForSocket(socket, kind);
    const env = { DISPLAY: display, PATH: "/usr/bin:/bin", HOME: dir };
    return {
      kind,
      display,
      socket,
      dir,
      async x(argv) {
        const out = await new Deno.Command(argv[0], {
          args: argv.slice(1),
          env,
          clearEnv: true,
          stdout: "piped",
          stderr: "piped",
        }).output();
        const decode = (b: Uint8Array) => new TextDecoder().decode(b);
        return { code: out.code, stdout: decode(out.stdout), stderr: decode(out.stderr) };
      },
      spawn(argv) {
        const child = new Deno.Command(argv[0], {
          args: argv.slice(1),
          env,
          clearEnv: true,
          stdin: "null",
          stdout: "null",
          stderr: "null",
        }).spawn();
        children.push(child);
        return child;
      },
      [Symbol.asyncDispose]: stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * A Tk window (Debian's python3-tk) at (0, 0), `w`×`h`, that appends to
 * `log` one line per key pressed (`key <keysym>`), button pressed (`button
 * <n> <x> <y>`) and motion with the first button held (`drag <x> <y>`), and
 * `ready` once it shows.
 */
export const KEY_LOGGER = `
import sys, tkinter as tk
log = open(sys.argv[1], "a", buffering=1)
root = tk.Tk()
root.geometry(sys.argv[2] + "+0+0")
root.title("keylog")
root.configure(background="#204060")
root.bind("<KeyPress>", lambda e: log.write("key %s\\n" % e.keysym))
root.bind("<ButtonPress>", lambda e: log.write("button %d %d %d\\n" % (e.num, e.x_root, e.y_root)))
root.bind("<B1-Motion>", lambda e: log.write("drag %d %d\\n" % (e.x_root, e.y_root)))
def ready():
    root.focus_force()
    log.write("ready\\n")
root.after(200, ready)
root.mainloop()
`;

/** Waits until `path` holds a line matching `pattern`; returns all its lines. */
export async function waitForLog(path: string, pattern: RegExp, ms = 15_000): Promise<string[]> {
  const end = Date.now() + ms;
  for (;;) {
    const lines = (await Deno.readTextFile(path).catch(() => "")).split("\n").filter(Boolean);
    if (lines.some((l) => pattern.test(l))) return lines;
    if (Date.now() > end) {
      throw new Error(
        `no line matching ${pattern} in ${path} within ${ms} ms: ${lines.join(" | ")}`,
      );
    }
    await new Promise((r) => setTimeout(r, 25));
  }
}

// A Tk window with one button at (x, y); it writes "shown" once it is up,
// then what it saw: "pressed" when the button is clicked, "missed X Y" for a
// click elsewhere. It writes to the file named by its first argument in the
// desktop's own directory (where $XAUTHORITY is), which the agent's shell,
// in a sandbox of its own, does not see; it is run with `python3 -I`, so that
// modules the agent leaves in the root or in HOME are not imported.
export const BUTTON_APP = `
import os, sys, tkinter as tk
out = open(os.path.join(os.path.dirname(os.environ["XAUTHORITY"]), sys.argv[1]), "w", buffering=1)
x, y = int(sys.argv[2]), int(sys.argv[3])
root = tk.Tk()
root.geometry("%dx%d+0+0" % (root.winfo_screenwidth(), root.winfo_screenheight()))
root.configure(background="#ffffff")
button = tk.Button(root, text="OK", bg="#00c000", activebackground="#00c000", relief="flat",
                   command=lambda: out.write("pressed\\n"))
button.place(x=x, y=y, width=80, height=40)
root.bind("<Button-1>", lambda e: out.write("missed %d %d\\n" % (e.x_root, e.y_root)) if e.widget is root else None)
root.after(300, lambda: out.write("shown\\n"))
root.mainloop()
`;

/** What the button program wrote in the desktop's own directory, read on the desktop. */
async function seenBy(desktop: Desktop, name: string): Promise<string> {
  const r = await desktop.exec(
    ["/bin/sh", "-c", 'cat "$(dirname "$XAUTHORITY")/$1" 2>/dev/null; true', "sh", name],
    { timeout: 10_000 },
  );
  return r.stdout;
}

/** The centre of the pixels of `rgb` in a frame, or null when there are none. */
export function findColour(
  frame: { width: number; height: number; rgba: Uint8Array },
  rgb: number[],
): { x: number; y: number } | null {
  let n = 0, sx = 0, sy = 0;
  for (let y = 0; y < frame.height; y++) {
    for (let x = 0; x < frame.width; x++) {
      const i = (y * frame.width + x) * 4;
      if (
        frame.rgba[i] === rgb[0] && frame.rgba[i + 1] === rgb[1] && frame.rgba[i + 2] === rgb[2]
      ) {
        n++;
        sx += x;
        sy += y;
      }
    }
  }
  return n === 0 ? null : { x: Math.round(sx / n), y: Math.round(sy / n) };
}

/**
 * The template "press": the Tk button at a place that depends on the seed,
 * anywhere on the desktop; the prompt once it shows; 1 when the program saw
 * its button pressed, else 0. What it saw is read on the desktop (in the
 * workspace's sandbox, as the agent's user) before the workspace grades, and
 * kept in `seen` by seed.
 */
export function buttonTask(
  env: Environment,
  desktop: Desktop,
  seen: Map<number, string> = new Map(),
): (args: { seed: number }) => TaskRow {
  return env.template(
    { id: "press", args: { seed: integer() } },
    async function* ({ seed }) {
      const x = 20 + (seed * 7919) % (desktop.width - 120);
      const y = 20 + (seed * 104729) % (desktop.height - 80);
      // A name of its own: a file an earlier rollout left is never read as this one's.
      const name = `seen-${seed}-${crypto.randomUUID()}`;
      const app = await desktop.run([
        "/usr/bin/python3",
        "-I",
        "-c",
        BUTTON_APP,
        name,
        `${x}`,
        `${y}`,
      ]);
      try {
        for (let i = 0; i < 200 && !(await seenBy(desktop, name)).includes("shown"); i++) {
          await new Promise((r) => setTimeout(r, 50));
        }
        yield "Click the green OK button on the screen, then answer done.";
        const text = await seenBy(desktop, name);
        seen.set(seed, text);
        yield text.split("\n").includes("pressed") ? 1 : 0;
      } finally {
        await app.kill("SIGKILL");
        await app.status.catch(() => {});
      }
    },
  );
}
