// addDesktop(): an X desktop over VNC in the workspace's sandbox, as the
// agent's user, reached only through the authenticated tunnel (issue 40).
// Against both of Debian's servers (TigerVNC's Xvnc; Xvfb with x11vnc):
// screenshots through the tunnel equal what `import` reads in the sandbox,
// input arrives, and the browser's security checks hold for the desktop
// (namespaces, uid, no host listener, another uid and a token-less tunnel
// refused, no host files, no way to the control port). A task with a Tk
// button at a random place scores 1 for an agent that finds it in the
// screenshot and clicks it, 0 for one that clicks elsewhere, and 0 for the
// agents that try to forge the press (through the workspace's shell,
// modules planted for the next rollout's program, the keyboard and the
// clipboard). A VNC client that never reads is cut off, the grader's not.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { parseHostPort } from "../../capability.ts";
import { connect } from "../../client.ts";
import { Environment } from "../../env.ts";
import { functionAgent, rollout } from "../../eval/mod.ts";
import { LocalRuntime } from "../../runtime/mod.ts";
import { bind } from "../../server.ts";
import { addDesktop, addWorkspace } from "../../workspace/mod.ts";
import type { RfbClient } from "../../rfb/mod.ts";
import type { SshClient } from "../../ssh/mod.ts";
import { buttonTask, desktop, findColour, KEY_LOGGER, waitForLog } from "../rfb/_x.ts";
import { SANDBOX } from "../_counterparts.ts";

const ROOT = Deno.uid() === 0;
const NOBODY = 65534;

const NEEDS = {
  tigervnc: ["Xvnc", "xdotool", "import", "compare", "tkinter"],
  x11vnc: ["Xvfb", "x11vnc", "xdotool", "import", "compare", "tkinter"],
} as const;

/** Processes whose command name is `comm` and that run as `uid`. */
function processesNamed(comm: string, uid: number | null): number[] {
  const out: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      if (Deno.readTextFileSync(`/proc/${entry.name}/comm`).trim() !== comm) continue;
      const status = Deno.readTextFileSync(`/proc/${entry.name}/status`);
      const u = Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
      if (uid === null || u === uid) out.push(Number(entry.name));
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

function stateOf(pid: number): string {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
}

/** Listening TCP ports of this host's network namespace held by `pids`. */
function hostListeners(pids: number[]): number[] {
  const listening = new Map<string, number>();
  for (const file of ["tcp", "tcp6"]) {
    const text = Deno.readTextFileSync(`/proc/self/net/${file}`);
    for (const line of text.split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length >= 10 && f[3] === "0A") listening.set(f[9], parseInt(f[1].split(":")[1], 16));
    }
  }
  const out: number[] = [];
  for (const pid of pids) {
    try {
      for (const fd of Deno.readDirSync(`/proc/${pid}/fd`)) {
        const m = /^socket:\[(\d+)\]$/.exec(Deno.readLinkSync(`/proc/${pid}/fd/${fd.name}`));
        if (m && listening.has(m[1])) out.push(listening.get(m[1])!);
      }
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

async function differingPixels(a: string, b: string): Promise<number> {
  const out = await new Deno.Command("compare", {
    args: ["-metric", "AE", a, b, "null:"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stderr).trim();
  const n = Number(text.split(" ")[0]);
  if (!Number.isFinite(n)) throw new Error(`compare said: ${text}`);
  return n;
}

for (const server of ["tigervnc", "x11vnc"] as const) {
  test({
    name:
      `addDesktop({ workspace, server: "${server}" }) runs in the workspace's sandbox as the agent, reached only through the tunnel`,
    needs: [desktop(NEEDS[server]), SANDBOX],
    async fn(t) {
      const root = await Deno.makeTempDir({ prefix: "hud-desktop-root-" });
      const env = new Environment("desk");
      const workspace = addWorkspace(env, root, { trackFiles: false });
      const desktop = addDesktop(env, { workspace, server, width: 800, height: 600 });
      const xName = server === "tigervnc" ? "Xvnc" : "Xvfb";
      // This workspace's X server, looked for again after the stop (by its
      // pid: by name and uid it could be another file's, as the uid is
      // leased again once this workspace stops).
      let xServer: number | null = null;
      try {
        await env.start();
        assert.equal(desktop.server, server);
        const uid = workspace.uid;
        const xs = processesNamed(xName, uid).filter((pid) =>
          Deno.readLinkSync(`/proc/${pid}/ns/mnt`) !== Deno.readLinkSync("/proc/self/ns/mnt")
        );
        assert.equal(xs.length, 1, `expected one sandboxed ${xName} of the workspace's uid`);
        const x = xs[0];
        xServer = x;

        await t.step(
          "as the workspace's uid, in namespaces of its own, with no host listener",
          () => {
            if (ROOT) {
              assert.equal(
                Number(/^Uid:\s+(\d+)/m.exec(Deno.readTextFileSync(`/proc/${x}/status`))![1]),
                uid,
              );
            }
            for (const ns of ["net", "pid", "mnt"]) {
              assert.notEqual(
                Deno.readLinkSync(`/proc/${x}/ns/${ns}`),
                Deno.readLinkSync(`/proc/self/ns/${ns}`),
              );
            }
            const desktopPids = processesNamed(xName, null).concat(processesNamed("x11vnc", null));
            assert.deepEqual(hostListeners(desktopPids), []);
            assert.doesNotMatch(Deno.readTextFileSync(`/proc/${x}/environ`), /HUD_|TOKEN/);
          },
        );

        await using srv = bind(env);
        await using client = await connect(srv, { readyTimeout: 30_000 });
        await using vnc = await client.open("screen");
        assert.deepEqual([vnc.width, vnc.height], [800, 600]);

        await t.step(
          "screenshots through the tunnel are what import reads in the sandbox",
          async () => {
            await desktop.exec(["xsetroot", "-solid", "#225588"]);
            const logo = await desktop.run(["xlogo", "-geometry", "200x150+500+300"]);
            await vnc.settle({ quiet: 500, timeout: 10_000 });
            const ours = await Deno.makeTempFile({ prefix: "hud-desktop-vnc-", suffix: ".png" });
            await Deno.writeFile(ours, await vnc.screenshot());
            const shot = await desktop.exec(["import", "-window", "root", `${root}/import.png`]);
            assert.equal(shot.code, 0, shot.stderr);
            try {
              assert.equal(await differingPixels(ours, `${root}/import.png`), 0);
              assert.ok((await differingPixels(ours, "xc:#225588[800x600]")) > 1000, "no logo");
            } finally {
              await Deno.remove(ours);
              await logo.kill();
            }
            assert.equal((await logo.status).signal, "SIGTERM");
          },
        );

        await t.step("input arrives: xdotool in the sandbox sees the pointer", async () => {
          await vnc.move({ x: 321, y: 123 });
          await vnc.settle({ quiet: 100 });
          const where = await desktop.exec(["xdotool", "getmouselocation"]);
          assert.match(where.stdout, /^x:321 y:123 /);
        });

        await t.step(
          "input arrives: a Tk window logs the clicks and keys sent through the tunnel",
          async () => {
            const log = `${root}/events.log`;
            const logger = await desktop.run([
              "/usr/bin/python3",
              "-I",
              "-c",
              KEY_LOGGER,
              log,
              "400x300",
            ]);
            try {
              await waitForLog(log, /^ready$/);
              await vnc.click({ x: 40, y: 30 });
              await vnc.type("aB");
              await vnc.key("ctrl+Return");
              const lines = await waitForLog(log, /^key Return$/);
              assert.deepEqual(lines.slice(lines.indexOf("ready") + 1), [
                "button 1 40 30",
                "key a",
                "key Shift_L",
                "key B",
                "key Control_L",
                "key Return",
              ]);
            } finally {
              await logger.kill("SIGKILL");
              await logger.status.catch(() => {});
            }
          },
        );

        await t.step(
          "programs on the desktop run as the agent, without this host's files or network",
          async () => {
            const keyPath = env.capability("shell")!.params.client_key_path as string;
            const probe = await desktop.exec([
              "bash",
              "-c",
              `id -u; cat ${keyPath} 2>&1 | head -c 0; test -e ${keyPath} && echo key-visible; ` +
              `env | grep -c -E 'HUD_|TOKEN'; ls /tmp/.X11-unix; ` +
              `(exec 3<>/dev/tcp/127.0.0.1/${srv.addr.port}) 2>/dev/null && echo control-reachable; true`,
            ]);
            const lines = probe.stdout.trim().split("\n");
            if (ROOT) assert.equal(lines[0], String(uid));
            assert.ok(!lines.includes("key-visible"), probe.stdout);
            assert.ok(!lines.includes("control-reachable"), probe.stdout);
            assert.ok(lines.includes("0"), probe.stdout); // no HUD_ or TOKEN variable
            assert.ok(lines.includes("X0") || lines.some((l) => /^X\d+$/.test(l)), probe.stdout);
          },
        );

        await t.step({
          name: "another uid reaches neither the desktop's sockets nor a tunnel without the token",
          ignore: !ROOT,
          fn: async () => {
            const home = await Deno.makeTempDir({ prefix: "hud-desktop-other-" });
            try {
              await Deno.chown(home, NOBODY, NOBODY);
              const script = `const [x, control] = JSON.parse(Deno.args[0]);
const reached = [];
for (const path of ["/proc/" + x + "/root/tmp/hud-desktop/rfb.sock", "/proc/" + x + "/root/tmp/.X11-unix/X0"]) {
  try { (await Deno.connect({ transport: "unix", path })).close(); reached.push(path); } catch { /* refused */ }
}
const c = await Deno.connect({ hostname: "127.0.0.1", port: control });
await c.write(new TextEncoder().encode(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tunnel.open", params: { capability: "screen" } }) + "\\n"));
const buf = new Uint8Array(4096);
const n = await c.read(buf);
c.close();
console.log(JSON.stringify({ reached, tunnel: new TextDecoder().decode(buf.subarray(0, n ?? 0)) }));`;
              const out = await new Deno.Command("setpriv", {
                args: [
                  `--reuid=${NOBODY}`,
                  `--regid=${NOBODY}`,
                  "--clear-groups",
                  Deno.execPath(),
                  "eval",
                  "--no-config",
                  script,
                  JSON.stringify([x, srv.addr.port]),
                ],
                clearEnv: true,
                env: { PATH: "/usr/bin:/bin", HOME: home, DENO_DIR: `${home}/deno`, NO_COLOR: "1" },
                stdout: "piped",
                stderr: "piped",
              }).output();
              assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
              const { reached, tunnel } = JSON.parse(new TextDecoder().decode(out.stdout));
              assert.deepEqual(reached, []);
              assert.match(tunnel, /"error"/);
              assert.doesNotMatch(tunnel, /"result"/);
            } finally {
              await Deno.remove(home, { recursive: true });
            }
          },
        });

        await t.step("stopped while the workspace grades, answering again after", async () => {
          {
            await using _grading = await workspace.grading();
            assert.equal(stateOf(x), "T");
          }
          assert.ok((await vnc.screenshot()).length > 100);
        });
      } finally {
        await env.stop();
        await Deno.remove(root, { recursive: true });
      }
      assert.equal(env.capability("screen"), undefined);
      assert.deepEqual(
        processesNamed(xName, null).filter((pid) => {
          if (pid !== xServer) return false;
          try {
            return stateOf(pid) !== "Z";
          } catch {
            return false;
          }
        }),
        [],
        "the X server outlived env.stop()",
      );
    },
  });
}

test({
  name:
    "a desktop task: an agent that finds the Tk button in the screenshot and clicks it scores 1, one that clicks elsewhere 0",
  needs: [desktop(NEEDS.tigervnc), SANDBOX],
  async fn() {
    const root = await Deno.makeTempDir({ prefix: "hud-desktop-task-" });
    const env = new Environment("buttons");
    const workspace = addWorkspace(env, root, { trackFiles: false });
    const desktop = addDesktop(env, { workspace, width: 1024, height: 768 });
    const seen = new Map<number, string>();
    const press = buttonTask(env, desktop, seen);
    const finder = functionAgent(async (_prompt, run) => {
      await using vnc = await run.client.open("screen");
      await vnc.settle({ quiet: 300 });
      const at = findColour(await vnc.frame(), [0, 0xc0, 0]);
      if (at === null) return "no button";
      await vnc.click(at);
      await vnc.settle({ quiet: 200 });
      return "done";
    });
    const elsewhere = functionAgent(async (_prompt, run) => {
      await using vnc = await run.client.open("screen");
      await vnc.click({ x: 3, y: 3 });
      await vnc.settle({ quiet: 200 });
      return "done";
    });
    try {
      const runtime = new LocalRuntime(env);
      for (const seed of [3, 11]) {
        const good = await rollout(press({ seed }), finder, { runtime, fileTracking: false });
        assert.equal(good.reward, 1, JSON.stringify(good.trace.errors));
        const bad = await rollout(press({ seed }), elsewhere, { runtime, fileTracking: false });
        assert.equal(bad.reward, 0, JSON.stringify(bad.trace.errors));
        assert.match(seen.get(seed)!, /^missed 3 3$/m, seen.get(seed));
      }
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

// What an agent that wants the reward without clicking the button could do
// with what it is given: the workspace's shell (its files, its HOME, its
// /tmp) and the desktop's keyboard and clipboard. Each gets 0.
// Imported instead of tkinter, it loads the real one and makes every
// Button press itself once shown: the program then writes "pressed" itself.
const PLANTED_TKINTER = `
import os, sys
sys.path = [p for p in sys.path if p not in ("", ".", os.getcwd())]
del sys.modules[__name__]
import tkinter
class Button(tkinter.Button):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.after(100, self.invoke)
tkinter.Button = Button
sys.modules[__name__] = tkinter
`;

test({
  name:
    "a desktop task: an agent cannot forge the button's press through the shell, planted Python modules, or the keyboard",
  needs: [desktop(NEEDS.tigervnc), SANDBOX],
  async fn(t) {
    const root = await Deno.makeTempDir({ prefix: "hud-desktop-attack-" });
    const env = new Environment("buttons");
    const workspace = addWorkspace(env, root, { trackFiles: false });
    const desktop = addDesktop(env, { workspace, width: 800, height: 600 });
    const seen = new Map<number, string>();
    const press = buttonTask(env, desktop, seen);
    const runtime = new LocalRuntime(env);
    const shellAgent = (script: string) =>
      functionAgent(async (_prompt, run, { signal }) => {
        await using shell = await run.client.open("shell", { signal }) as SshClient;
        const r = await shell.exec(script, { signal });
        assert.equal(r.code, 0, r.stderrText);
        return "done";
      });
    try {
      await t.step('writing "pressed" wherever the shell can: the root, HOME, /tmp', async () => {
        const forger = shellAgent(
          'for f in seen-*.txt; do echo pressed >> "$f"; done; ' +
            'for d in "$PWD" "$HOME" /tmp; do for n in seen seen-1.txt seen-1; do ' +
            'printf "shown\\npressed\\n" > "$d/$n"; done; done; ' +
            'find / -xdev -name "*seen*" -writable 2>/dev/null | while read -r f; do ' +
            'echo pressed >> "$f"; done; true',
        );
        const r = await rollout(press({ seed: 1 }), forger, { runtime, fileTracking: false });
        assert.equal(r.reward, 0, JSON.stringify(r.trace.errors));
        assert.equal(seen.get(1), "shown\n");
      });

      await t.step(
        "a tkinter.py and a .pth in the root and HOME, for the next rollout's program",
        async () => {
          const planter = shellAgent(
            `cat > tkinter.py <<'EOF'\n${PLANTED_TKINTER}\nEOF\n` +
              'site=$(python3 -c "import site; print(site.getusersitepackages())") && ' +
              'mkdir -p "$site" && cp tkinter.py "$site/" && ' +
              `echo 'import tkinter' > "$site/zz.pth" && cp tkinter.py "$HOME/"`,
          );
          const first = await rollout(press({ seed: 2 }), planter, {
            runtime,
            fileTracking: false,
          });
          assert.equal(first.reward, 0, JSON.stringify(first.trace.errors));
          assert.ok((await Deno.stat(`${root}/tkinter.py`)).isFile);
          const idle = functionAgent(() => "done");
          const next = await rollout(press({ seed: 2 }), idle, { runtime, fileTracking: false });
          assert.equal(next.reward, 0, JSON.stringify(next.trace.errors));
          assert.equal(seen.get(2), "shown\n");
        },
      );

      await t.step('typing "pressed", Return and the clipboard on the desktop', async () => {
        const typer = functionAgent(async (_prompt, run) => {
          await using vnc = await run.client.open("screen") as RfbClient;
          await vnc.sendCutText("pressed\n");
          await vnc.type("pressed\n");
          await vnc.key("ctrl+v");
          await vnc.key("Return");
          await vnc.settle({ quiet: 200 });
          return "pressed";
        });
        const r = await rollout(press({ seed: 4 }), typer, { runtime, fileTracking: false });
        assert.equal(r.reward, 0, JSON.stringify(r.trace.errors));
        assert.equal(seen.get(4), "shown\n");
      });
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

async function readExactly(conn: Deno.Conn, n: number): Promise<Uint8Array> {
  const out = new Uint8Array(n);
  for (let at = 0; at < n;) {
    const got = await conn.read(out.subarray(at));
    if (got === null) throw new Error(`the connection ended after ${at} of ${n} bytes`);
    at += got;
  }
  return out;
}

/**
 * An agent's VNC connection by hand: RFB 3.8 with security None and the
 * server's pixel format (Raw: 3 MiB a frame at 1024x768), then 40 requests
 * for the whole screen 25 ms apart (up to 120 MiB of frames), reading what
 * comes or not. Returns whether the connection was still open after them.
 */
async function askForFrames(hostname: string, port: number, reading: boolean): Promise<boolean> {
  using raw = await Deno.connect({ hostname, port });
  await readExactly(raw, 12);
  await raw.write(new TextEncoder().encode("RFB 003.008\n"));
  const [count] = await readExactly(raw, 1);
  assert.ok((await readExactly(raw, count)).includes(1), "no security type None");
  await raw.write(new Uint8Array([1]));
  assert.deepEqual(await readExactly(raw, 4), new Uint8Array(4));
  await raw.write(new Uint8Array([1]));
  const init = await readExactly(raw, 24);
  await readExactly(raw, new DataView(init.buffer).getUint32(20));
  let open = true;
  const drained = reading
    ? (async () => {
      const buf = new Uint8Array(1 << 20);
      let read = 0;
      while (open) {
        const n = await raw.read(buf).catch(() => null);
        if (n === null) open = false;
        else read += n;
      }
      return read;
    })()
    : Promise.resolve(0);
  const request = new Uint8Array([3, 0, 0, 0, 0, 0, 0x04, 0x00, 0x03, 0x00]);
  for (let i = 0; i < 40 && open; i++) {
    open = await raw.write(request).then(() => true, () => false);
    await new Promise((r) => setTimeout(r, 25));
  }
  if (!reading && open) {
    // Nothing read: the host's end is closed once 32 MiB wait for us.
    const buf = new Uint8Array(1 << 20);
    const deadline = Date.now() + 20_000;
    while (open && Date.now() < deadline) {
      open = await raw.read(buf).then((n) => n !== null, () => false);
    }
  }
  const stillOpen = open;
  open = false;
  raw.close();
  const read = await drained;
  if (reading) assert.ok(read > 32 * 1024 * 1024, `${read} bytes read: the server sent few frames`);
  return stillOpen;
}

test({
  name:
    "addDesktop(): a VNC client that asks for frames and never reads is cut off past 32 MiB, the grader's client unaffected",
  needs: [desktop(NEEDS.tigervnc), SANDBOX],
  async fn() {
    const env = new Environment("stall");
    const desktop = addDesktop(env, { server: "tigervnc", width: 1024, height: 768 });
    try {
      await env.start();
      await using srv = bind(env);
      await using client = await connect(srv, { readyTimeout: 30_000 });
      const { hostname, port } = parseHostPort(client.binding("screen").url)!;
      // One that reads every frame keeps its connection; one that reads none loses it.
      assert.equal(await askForFrames(hostname, port!, true), true);
      const stalled = askForFrames(hostname, port!, false);
      // Meanwhile the grader's client gets its screenshot.
      await using vnc = await desktop.open();
      assert.ok((await vnc.screenshot()).length > 0);
      assert.equal(await stalled, false);
    } finally {
      await env.stop();
    }
  },
});

test("addDesktop() refuses bad options in one line, before anything starts", () => {
  const env = new Environment("bad");
  assert.throws(
    () => addDesktop(env, { width: 10 }),
    /Cannot add desktop: invalid width "10" \(64 to 8192\)/,
  );
  assert.throws(() => addDesktop(env, { depth: 8 as 16 }), /invalid depth "8" \(16 or 24\)/);
  assert.throws(() => addDesktop(env, { server: "vnc" as "x11vnc" }), /unknown server "vnc"/);
  assert.throws(() => addDesktop(env, { uid: 0 }), /invalid uid "0"/);
  const root = "/nonexistent";
  const workspace = addWorkspace(env, root, { trackFiles: false });
  assert.throws(
    () => addDesktop(env, { workspace, network: true }),
    /"network" is the workspace's when workspace is given/,
  );
});

test({
  name: "addDesktop(): x11vnc is refused where the desktop shares this host's network",
  needs: [desktop(["Xvfb", "x11vnc"])],
  async fn() {
    const env = new Environment("net");
    addDesktop(env, { server: "x11vnc", network: true });
    await assert.rejects(env.start(), /x11vnc always listens on a TCP port besides its socket/);
    await env.stop();
  },
});

test("Desktop calls before start say so in one line", async () => {
  const env = new Environment("early");
  const desktop = addDesktop(env);
  await assert.rejects(
    desktop.run(["xterm"]),
    /Cannot run a program on desktop "screen": it is not started/,
  );
  await assert.rejects(
    desktop.open(),
    /Cannot open a VNC client on desktop "screen": it is not started/,
  );
});
