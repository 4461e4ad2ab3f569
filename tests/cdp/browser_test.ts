// addBrowser(): the browser runs in a sandbox and is reached only through
// the authenticated tunnel. Each test reproduces an observation of issues 22
// (point 3) and 23 (point 1) against real Chromium, driven the way an agent
// drives it: through connect()'s forwarder.

import { test, withCounterparts } from "../_test.ts";
import { CHROMIUM, ROOT_USER, SANDBOX, UNSHARE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { type CdpClient, CdpError, type CdpSession } from "../../cdp/mod.ts";
import { connect } from "../../client.ts";
import { Environment } from "../../env.ts";
import { functionAgent, rollout, type Run } from "../../eval/mod.ts";
import { LocalRuntime } from "../../runtime/mod.ts";
import { bind } from "../../server.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addBrowser, addWorkspace } from "../../workspace/mod.ts";

const ROOT = Deno.uid() === 0;
const NOBODY = 65534;

/** Live processes whose command line contains `marker`. */
function processesWith(marker: string): number[] {
  const out: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const cmdline = Deno.readTextFileSync(`/proc/${entry.name}/cmdline`);
      const stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
      const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
      if (cmdline.includes(marker) && state !== "Z") out.push(Number(entry.name));
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

/** Chromium's main (browser) process: the marked one that is Chromium and no child type. */
function browserProcess(marker: string): number {
  const found = processesWith(marker).filter((pid) => {
    try {
      const comm = Deno.readTextFileSync(`/proc/${pid}/comm`).trim();
      const cmdline = Deno.readTextFileSync(`/proc/${pid}/cmdline`);
      return comm === "chromium" && !cmdline.includes("--type=");
    } catch {
      return false;
    }
  });
  assert.equal(found.length, 1, `expected one browser process with the marker, got ${found}`);
  return found[0];
}

/** `root` and every live process below it. */
function processTree(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry.name)]);
    } catch {
      // exited meanwhile
    }
  }
  const out: number[] = [];
  const todo = [root];
  while (todo.length > 0) {
    const pid = todo.pop()!;
    out.push(pid);
    todo.push(...(children.get(pid) ?? []));
  }
  return out;
}

/** Socket inodes that `pid` holds. */
function socketInodes(pid: number): Set<string> {
  const out = new Set<string>();
  try {
    for (const fd of Deno.readDirSync(`/proc/${pid}/fd`)) {
      try {
        const m = /^socket:\[(\d+)\]$/.exec(Deno.readLinkSync(`/proc/${pid}/fd/${fd.name}`));
        if (m) out.add(m[1]);
      } catch {
        // closed meanwhile
      }
    }
  } catch {
    // exited meanwhile
  }
  return out;
}

/** Listening TCP sockets in the network namespace that `/proc/<pid>/net` shows: inode → port. */
function tcpListeners(pid: number | "self"): Map<string, number> {
  const out = new Map<string, number>();
  for (const file of ["tcp", "tcp6"]) {
    let text: string;
    try {
      text = Deno.readTextFileSync(`/proc/${pid}/net/${file}`);
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10 || f[3] !== "0A") continue; // 0A: LISTEN
      out.set(f[9], parseInt(f[1].split(":")[1], 16));
    }
  }
  return out;
}

/** Ports that any of `pids` listens on, in this host's network namespace and in their own. */
function listeningPorts(pids: number[]): { host: number[]; own: number[] } {
  const host = tcpListeners("self");
  const result = { host: new Set<number>(), own: new Set<number>() };
  for (const pid of pids) {
    const own = tcpListeners(pid);
    for (const inode of socketInodes(pid)) {
      if (host.has(inode)) result.host.add(host.get(inode)!);
      if (own.has(inode)) result.own.add(own.get(inode)!);
    }
  }
  return { host: [...result.host], own: [...result.own] };
}

function uidOf(pid: number): number {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  return Number(/^Uid:\s+(\d+)/m.exec(status)![1]);
}

/** The process's state letter (`S`, `R`, `T` for stopped...). */
function stateOf(pid: number): string {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
}

/** The process's cgroups, as this host names them. */
function cgroupOf(pid: number | "self"): string {
  return Deno.readTextFileSync(`/proc/${pid}/cgroup`);
}

/** Bytes of the tmpfs at /dev/shm that `pid` sees, or null when it has no size. */
function shmSize(pid: number): number | null {
  for (const line of Deno.readTextFileSync(`/proc/${pid}/mountinfo`).split("\n")) {
    const f = line.split(" ");
    if (f[4] !== "/dev/shm") continue;
    const size = /(?:^|,)size=(\d+)k/.exec(line.slice(line.indexOf(" - ")));
    return size === null ? null : Number(size[1]) * 1024;
  }
  throw new Error(`no /dev/shm for ${pid}`);
}

/** A page's text after navigating to `url`, or null when the navigation failed. */
async function load(page: CdpSession, url: string, signal: AbortSignal): Promise<string | null> {
  try {
    await page.navigate(url, { signal });
  } catch (error) {
    if (error instanceof CdpError && error.kind === "protocol") return null;
    throw error;
  }
  return await page.evaluate<string>("document.body ? document.body.innerText : ''", { signal });
}

/**
 * Sets the download directory to `dir` and clicks a download link of
 * `name` in `page`; resolves with the final state Chromium reported
 * ("completed", "canceled", or "none" when it reported nothing in time).
 */
async function download(
  cdp: CdpClient,
  page: CdpSession,
  dir: string,
  name: string,
  content: string,
  signal: AbortSignal,
): Promise<string> {
  await cdp.send("Browser.setDownloadBehavior", {
    behavior: "allow",
    downloadPath: dir,
    eventsEnabled: true,
  }, { signal });
  const wait = AbortSignal.any([signal, AbortSignal.timeout(15_000)]);
  const done = cdp.waitFor(
    "Browser.downloadProgress",
    (p) => p.state === "completed" || p.state === "canceled",
    { signal: wait },
  ).then((p) => String(p.state), () => "none");
  await page.evaluate(
    `(() => { const a = document.createElement("a");
      a.href = URL.createObjectURL(new Blob([${JSON.stringify(content)}]));
      a.download = ${JSON.stringify(name)}; document.body.appendChild(a); a.click(); })()`,
    { signal },
  );
  return await done;
}

function servePage(title: string): Deno.HttpServer<Deno.NetAddr> {
  return Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    () =>
      new Response(`<!doctype html><title>${title}</title><p>${title}</p>`, {
        headers: { "content-type": "text/html; charset=utf-8" },
      }),
  );
}

/** A directory outside /tmp (which the sandbox replaces), visible to the browser's view. */
async function visibleDir(): Promise<string> {
  const dir = await Deno.makeTempDir({ dir: "/var/tmp", prefix: "hud-browser-test-" });
  await Deno.chmod(dir, 0o755);
  return dir;
}

test("addBrowser() keeps the browser in a sandbox, reached only through the tunnel", {
  needs: [CHROMIUM, SANDBOX],
}, async (t) => {
  const signal = AbortSignal.timeout(200_000);
  const marker = crypto.randomUUID();
  // Shown to the browser (writable), as root's; one its uid owns; one not shown.
  const shown = await visibleDir();
  const drop = await visibleDir();
  if (ROOT) await Deno.chown(drop, NOBODY, NOBODY);
  const hidden = await visibleDir();
  const root = await Deno.makeTempDir({ prefix: "hud-browser-root-" });
  const listed = servePage("listed");
  const unlisted = servePage("unlisted");
  const env = new Environment("web");
  const errors: string[] = [];
  addWorkspace(env, root, { trackFiles: false });
  addBrowser(env, {
    args: [`--hud-test-marker=${marker}`],
    hostPorts: () => [listed.addr.port],
    writable: [shown, drop],
    onError: (e) => errors.push(String(e)),
  });
  try {
    await env.start();
    const browserPid = browserProcess(marker);
    const tree = processTree(browserPid);

    await t.step("no TCP listener: the DevTools endpoint is a pipe", () => {
      const cmdline = Deno.readTextFileSync(`/proc/${browserPid}/cmdline`).split("\0");
      assert.ok(cmdline.includes("--remote-debugging-pipe"));
      assert.ok(!cmdline.some((a) => a.startsWith("--remote-debugging-port")));
      // Only the relay for hostPorts listens, inside the browser's own network namespace.
      assert.deepEqual(listeningPorts(tree), { host: [], own: [listed.addr.port] });
    });

    await t.step("Chromium runs in namespaces of its own, not as root", () => {
      for (const ns of ["net", "pid", "mnt"]) {
        assert.notEqual(
          Deno.readLinkSync(`/proc/${browserPid}/ns/${ns}`),
          Deno.readLinkSync(`/proc/self/ns/${ns}`),
          `the browser shares this process's ${ns} namespace`,
        );
      }
      if (ROOT) assert.equal(uidOf(browserPid), NOBODY);
      assert.doesNotMatch(Deno.readTextFileSync(`/proc/${browserPid}/environ`), /HUD_|TOKEN/);
    });

    await t.step("in a cgroup of its own, with a /dev/shm of limits.tmpSize (1 GiB)", () => {
      assert.equal(shmSize(browserPid), 1024 ** 3);
      if (errors.some((e) => /memory is not limited/.test(e))) return; // no cgroup here
      assert.match(cgroupOf(browserPid), /hud-browser-/);
      assert.notEqual(cgroupOf(browserPid), cgroupOf("self"));
    });

    await using server = bind(env);

    await t.step(withCounterparts({
      name:
        "another uid finds no listener of ours that speaks CDP, and no tunnel without the token",
      fn: async () => {
        const ours = [Deno.pid, ...processTree(browserPid)];
        const ports = listeningPorts(ours).host;
        assert.ok(ports.includes(server.addr.port));
        const home = await Deno.makeTempDir({ prefix: "hud-browser-other-" });
        try {
          await Deno.chown(home, NOBODY, NOBODY);
          const script = `const [ports, control] = JSON.parse(Deno.args[0]);
const found = [];
for (const port of ports) {
  try {
    const r = await fetch("http://127.0.0.1:" + port + "/json/version", { signal: AbortSignal.timeout(5000) });
    if ((await r.text()).includes("webSocketDebuggerUrl")) found.push(port);
  } catch { /* not HTTP */ }
}
const c = await Deno.connect({ hostname: "127.0.0.1", port: control });
await c.write(new TextEncoder().encode(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tunnel.open", params: { capability: "browser" } }) + "\\n"));
const buf = new Uint8Array(4096);
const n = await c.read(buf);
c.close();
console.log(JSON.stringify({ found, tunnel: new TextDecoder().decode(buf.subarray(0, n ?? 0)) }));`;
          const out = await new Deno.Command("setpriv", {
            args: [
              `--reuid=${NOBODY}`,
              `--regid=${NOBODY}`,
              "--clear-groups",
              Deno.execPath(),
              "eval",
              "--no-config",
              script,
              JSON.stringify([ports, server.addr.port]),
            ],
            clearEnv: true,
            env: { PATH: "/usr/bin:/bin", HOME: home, DENO_DIR: `${home}/deno`, NO_COLOR: "1" },
            stdout: "piped",
            stderr: "piped",
            signal,
          }).output();
          const text = new TextDecoder().decode(out.stdout);
          assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
          const { found, tunnel } = JSON.parse(text) as { found: number[]; tunnel: string };
          assert.deepEqual(found, [], "a port of ours answered /json/version to another uid");
          assert.match(tunnel, /"error"/);
          assert.doesNotMatch(tunnel, /"result"/);
        } finally {
          await Deno.remove(home, { recursive: true });
        }
      },
    }, [ROOT_USER]));

    await using client = await connect(server, { readyTimeout: 30_000 });
    await using cdp = await client.open("browser", { signal });
    await using page = await cdp.newPage("about:blank", { signal });

    await t.step(withCounterparts({
      name: "file:// of a 0600 root file fails (a 0644 one beside it loads)",
      fn: async () => {
        const secret = `secret-${crypto.randomUUID()}`;
        await Deno.writeTextFile(`${shown}/secret.txt`, secret, { mode: 0o600 });
        await Deno.writeTextFile(`${shown}/public.txt`, "public", { mode: 0o644 });
        assert.equal(await load(page, `file://${shown}/public.txt`, signal), "public");
        const text = await load(page, `file://${shown}/secret.txt`, signal);
        assert.equal(text, null, `the browser read ${text}`);
      },
    }, [ROOT_USER]));

    await t.step("file:// of a directory the sandbox does not show fails", async () => {
      await Deno.writeTextFile(`${hidden}/public.txt`, "public", { mode: 0o644 });
      assert.equal(await load(page, `file://${hidden}/public.txt`, signal), null);
      assert.equal(await load(page, "file:///root/", signal), null);
    });

    await t.step(
      "file:// of the workspace's key directory fails: the host's /tmp is not there",
      async () => {
        const keyPath = env.capability("shell")!.params.client_key_path as string;
        assert.ok(keyPath.startsWith("/tmp/"), keyPath);
        assert.equal(await load(page, `file://${keyPath}`, signal), null);
        const listing = await load(page, "file:///tmp/", signal);
        assert.doesNotMatch(listing ?? "", /hud-ssh-/);
      },
    );

    await t.step("a download lands in a writable directory, never in a root-only one", async () => {
      assert.equal(await load(page, `http://127.0.0.1:${listed.addr.port}/`, signal), "listed");
      const state = await download(cdp, page, drop, "ok.txt", "downloaded", signal);
      assert.equal(state, "completed");
      assert.equal(await Deno.readTextFile(`${drop}/ok.txt`), "downloaded");
      if (!ROOT) return;
      const rootOnly = `${shown}/root-only`;
      await Deno.mkdir(rootOnly, { mode: 0o700 });
      const denied = await download(cdp, page, rootOnly, "cron-job", "* * * * * root id", signal);
      assert.notEqual(denied, "completed");
      assert.deepEqual([...Deno.readDirSync(rootOnly)], []);
    });

    await t.step(
      "with network off, 127.0.0.1 is unreachable but for hostPorts and data: URLs",
      async () => {
        assert.equal(await load(page, `http://127.0.0.1:${unlisted.addr.port}/`, signal), null);
        assert.equal(await load(page, `http://127.0.0.1:${server.addr.port}/`, signal), null);
        assert.equal(await load(page, `http://127.0.0.1:${listed.addr.port}/`, signal), "listed");
        assert.equal(await load(page, "data:text/html,<p>inline</p>", signal), "inline");
      },
    );

    await t.step(
      "two clients through the forwarder at once: navigate, evaluate, screenshot",
      async () => {
        await using other = await client.open("browser", { signal });
        await using page2 = await other.newPage("about:blank", { signal });
        // Both clients number their commands from 1: the relay keeps them apart.
        const [a, b] = await Promise.all([
          load(page, "data:text/html,<title>a</title><p>first</p>", signal),
          load(page2, "data:text/html,<title>b</title><p>second</p>", signal),
        ]);
        assert.deepEqual([a, b], ["first", "second"]);
        const titles = await Promise.all(
          Array.from(
            { length: 20 },
            (_, i) => (i % 2 === 0 ? page : page2).evaluate<string>("document.title", { signal }),
          ),
        );
        assert.deepEqual(titles, Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? "a" : "b")));
        const [png, png2] = await Promise.all([
          page.screenshot({ signal }),
          page2.screenshot({ signal }),
        ]);
        for (const p of [png, png2]) {
          assert.deepEqual([...p.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
        }
        // A client cannot drive another client's session.
        await assert.rejects(
          other.send("Runtime.evaluate", { expression: "1" }, {
            sessionId: page.sessionId,
            signal,
          }),
          (e: unknown) => e instanceof CdpError && e.code === -32001,
        );
      },
    );
  } finally {
    await env.stop();
    await listed.shutdown();
    await unlisted.shutdown();
    for (const dir of [shown, drop, hidden, root]) await Deno.remove(dir, { recursive: true });
  }
  assert.deepEqual(processesWith(marker), [], "the browser outlived env.stop()");
  assert.equal(env.capability("browser"), undefined);
});

test("addBrowser({ workspace }) runs Chromium in the workspace's sandbox, as the agent", {
  needs: [CHROMIUM, SANDBOX],
}, async (t) => {
  const signal = AbortSignal.timeout(200_000);
  const marker = crypto.randomUUID();
  const root = await Deno.makeTempDir({ prefix: "hud-browser-root-" });
  const hidden = await visibleDir();
  const listed = servePage("listed");
  const unlisted = servePage("unlisted");
  const env = new Environment("web");
  const workspace = addWorkspace(env, root, { trackFiles: false });
  addBrowser(env, {
    workspace,
    args: [`--hud-test-marker=${marker}`],
    hostPorts: () => [listed.addr.port],
  });
  try {
    await env.start();
    const browserPid = browserProcess(marker);
    await using server = bind(env);
    await using client = await connect(server, { readyTimeout: 30_000 });
    await using cdp = await client.open("browser", { signal });
    await using page = await cdp.newPage("about:blank", { signal });
    await using shell = SshClient.fromBinding(env.capability("shell")!);

    await t.step("as the workspace's uid, in its cgroup, with its /dev/shm", async () => {
      if (ROOT) assert.equal(uidOf(browserPid), workspace.uid);
      for (const ns of ["net", "pid", "mnt"]) {
        assert.notEqual(
          Deno.readLinkSync(`/proc/${browserPid}/ns/${ns}`),
          Deno.readLinkSync(`/proc/self/ns/${ns}`),
        );
      }
      const tmpSize = workspace.limits!.tmpSize;
      if (tmpSize !== null) assert.equal(shmSize(browserPid), tmpSize);
      if (workspace.limits!.memory === null) return;
      // A process the workspace starts for the agent shares the browser's cgroup.
      const other = await workspace.spawn(["sleep", "60"]);
      try {
        let sleeper: number | undefined;
        for (let i = 0; i < 500 && sleeper === undefined; i++) {
          sleeper = processTree(other.pid).find((pid) => {
            try {
              return Deno.readTextFileSync(`/proc/${pid}/comm`).trim() === "sleep";
            } catch {
              return false;
            }
          });
          if (sleeper === undefined) await new Promise((r) => setTimeout(r, 10));
        }
        assert.ok(sleeper !== undefined, "the spawned sleep never showed");
        assert.equal(cgroupOf(browserPid), cgroupOf(sleeper));
        assert.notEqual(cgroupOf(browserPid), cgroupOf("self"));
      } finally {
        Deno.kill(-other.pid, "SIGKILL");
        await other.stdin.close().catch(() => {});
        await other.output();
      }
    });

    await t.step("file:// shows what the agent sees: the root, not the host's /tmp", async () => {
      assert.equal((await shell.exec("printf 'in the root' > note.txt")).code, 0);
      assert.equal(await load(page, `file://${root}/note.txt`, signal), "in the root");
      const keyDir = await Deno.makeTempDir({ prefix: "hud-ssh-" });
      try {
        await Deno.writeTextFile(`${keyDir}/id`, "key", { mode: 0o644 });
        await Deno.chmod(keyDir, 0o755);
        assert.equal(await load(page, `file://${keyDir}/id`, signal), null);
      } finally {
        await Deno.remove(keyDir, { recursive: true });
      }
      await Deno.writeTextFile(`${hidden}/public.txt`, "public", { mode: 0o644 });
      assert.equal(await load(page, `file://${hidden}/public.txt`, signal), null);
    });

    await t.step(
      "a download into the root is the agent's file, which its shell reads",
      async () => {
        assert.equal(await load(page, `http://127.0.0.1:${listed.addr.port}/`, signal), "listed");
        const state = await download(cdp, page, root, "got.txt", "downloaded", signal);
        assert.equal(state, "completed");
        const r = await shell.exec("cat got.txt");
        assert.equal(new TextDecoder().decode(r.stdout), "downloaded");
        if (ROOT) assert.equal((await Deno.stat(`${root}/got.txt`)).uid, workspace.uid);
      },
    );

    await t.step("the workspace's network policy: 127.0.0.1 only through hostPorts", async () => {
      assert.equal(await load(page, `http://127.0.0.1:${unlisted.addr.port}/`, signal), null);
      assert.equal(await load(page, `http://127.0.0.1:${server.addr.port}/`, signal), null);
      assert.equal(await load(page, `http://127.0.0.1:${listed.addr.port}/`, signal), "listed");
    });

    await t.step("stopped while the workspace grades, answering again after", async () => {
      {
        await using _grading = await workspace.grading();
        assert.equal(stateOf(browserPid), "T");
      }
      assert.equal(await page.evaluate<number>("6 * 7", { signal }), 42);
    });
  } finally {
    await env.stop();
    await listed.shutdown();
    await unlisted.shutdown();
    for (const dir of [root, hidden]) await Deno.remove(dir, { recursive: true });
  }
  assert.deepEqual(processesWith(marker), [], "the browser outlived env.stop()");
  assert.equal(env.capability("browser"), undefined);
});

test('addBrowser({ workspace }) with the workspace\'s isolation "unshare" and "none"', {
  needs: [CHROMIUM],
}, async (t) => {
  const signal = AbortSignal.timeout(200_000);
  const listed = servePage("listed");
  const unlisted = servePage("unlisted");
  try {
    for (const isolation of ["unshare", "none"] as const) {
      await t.step(withCounterparts({
        name: isolation,
        fn: async () => {
          const marker = crypto.randomUUID();
          const root = await Deno.makeTempDir({ prefix: "hud-browser-root-" });
          const env = new Environment("web");
          const workspace = addWorkspace(env, root, { trackFiles: false, isolation });
          addBrowser(env, {
            workspace,
            args: [`--hud-test-marker=${marker}`],
            hostPorts: [listed.addr.port],
          });
          try {
            await env.start();
            const browserPid = browserProcess(marker);
            if (ROOT) assert.equal(uidOf(browserPid), workspace.uid);
            await using server = bind(env);
            await using client = await connect(server, { readyTimeout: 30_000 });
            await using cdp = await client.open("browser", { signal });
            await using page = await cdp.newPage("about:blank", { signal });
            assert.equal(
              await load(page, `http://127.0.0.1:${listed.addr.port}/`, signal),
              "listed",
            );
            // Unconfined, the browser has this host's network, as the workspace's commands do.
            assert.equal(
              await load(page, `http://127.0.0.1:${unlisted.addr.port}/`, signal),
              isolation === "none" ? "unlisted" : null,
            );
          } finally {
            await env.stop();
            await Deno.remove(root, { recursive: true });
          }
          assert.deepEqual(processesWith(marker), []);
        },
      }, isolation === "unshare" ? [UNSHARE] : []));
    }
  } finally {
    await listed.shutdown();
    await unlisted.shutdown();
  }
});

test("addBrowser() shows an executable that lies outside the system's directories", {
  needs: [CHROMIUM, SANDBOX],
}, async () => {
  const signal = AbortSignal.timeout(100_000);
  const marker = crypto.randomUUID();
  // An install under /var (which the sandbox replaces), as Playwright's under ~/.cache.
  const install = await visibleDir();
  const root = await Deno.makeTempDir({ prefix: "hud-browser-root-" });
  await Deno.writeTextFile(`${install}/chrome`, '#!/bin/sh\nexec chromium "$@"\n', {
    mode: 0o755,
  });
  const env = new Environment("web");
  const workspace = addWorkspace(env, root, { trackFiles: false });
  addBrowser(env, {
    workspace,
    executable: `${install}/chrome`,
    args: [`--hud-test-marker=${marker}`],
  });
  try {
    await env.start();
    await using server = bind(env);
    await using client = await connect(server, { readyTimeout: 30_000 });
    await using cdp = await client.open("browser", { signal });
    await using page = await cdp.newPage("about:blank", { signal });
    assert.equal(await load(page, "data:text/html,<p>inline</p>", signal), "inline");
  } finally {
    await env.stop();
    for (const dir of [install, root]) await Deno.remove(dir, { recursive: true });
  }
  assert.deepEqual(processesWith(marker), []);
});

test(
  "addBrowser({ workspace }) leaves the sandbox's settings to the workspace, and waits for its start",
  { needs: [CHROMIUM] },
  async () => {
    const env = new Environment("web");
    const workspace = addWorkspace(env, "/nonexistent/root");
    for (const key of ["network", "isolation", "uid", "writable", "limits"] as const) {
      const value = { network: true, isolation: "bwrap", uid: 1000, writable: [], limits: {} }[key];
      assert.throws(() => addBrowser(env, { workspace, [key]: value }), {
        name: "TypeError",
        message: new RegExp(
          `^Cannot add browser: "${key}" is the workspace's when workspace is given`,
        ),
      });
    }
    assert.throws(
      () => addBrowser(env, { workspace: {} as unknown as typeof workspace }),
      { name: "TypeError", message: /workspace must be what addWorkspace returned/ },
    );
    // A browser on another environment, whose start does not start this workspace.
    const other = new Environment("other");
    addBrowser(other, { workspace });
    await assert.rejects(other.start(), {
      message:
        /^Cannot start browser: workspace "shell" is not started \(add the browser after addWorkspace/,
    });
    await other.stop();
  },
);

test("addBrowser({ network: true }) reaches this host's 127.0.0.1, still with no listener", {
  needs: [CHROMIUM, SANDBOX],
}, async () => {
  const signal = AbortSignal.timeout(100_000);
  const marker = crypto.randomUUID();
  const site = servePage("host");
  const env = new Environment("web");
  addBrowser(env, { network: true, args: [`--hud-test-marker=${marker}`] });
  try {
    await env.start();
    const browserPid = browserProcess(marker);
    assert.equal(
      Deno.readLinkSync(`/proc/${browserPid}/ns/net`),
      Deno.readLinkSync("/proc/self/ns/net"),
    );
    assert.deepEqual(listeningPorts(processTree(browserPid)).host, []);
    await using server = bind(env);
    await using client = await connect(server, { readyTimeout: 30_000 });
    await using cdp = await client.open("browser", { signal });
    await using page = await cdp.newPage("about:blank", { signal });
    assert.equal(await load(page, `http://127.0.0.1:${site.addr.port}/`, signal), "host");
  } finally {
    await env.stop();
    await site.shutdown();
  }
  assert.deepEqual(processesWith(marker), []);
});

test('addBrowser({ isolation: "unshare" }) holds too: a loopback of its own, hostPorts only', {
  needs: [CHROMIUM, UNSHARE],
}, async () => {
  const signal = AbortSignal.timeout(100_000);
  const marker = crypto.randomUUID();
  const listed = servePage("listed");
  const unlisted = servePage("unlisted");
  const env = new Environment("web");
  addBrowser(env, {
    isolation: "unshare",
    args: [`--hud-test-marker=${marker}`],
    hostPorts: [listed.addr.port],
  });
  try {
    await env.start();
    const browserPid = browserProcess(marker);
    assert.notEqual(
      Deno.readLinkSync(`/proc/${browserPid}/ns/net`),
      Deno.readLinkSync("/proc/self/ns/net"),
    );
    assert.deepEqual(listeningPorts(processTree(browserPid)), {
      host: [],
      own: [listed.addr.port],
    });
    if (ROOT) assert.equal(uidOf(browserPid), NOBODY);
    await using server = bind(env);
    await using client = await connect(server, { readyTimeout: 30_000 });
    await using cdp = await client.open("browser", { signal });
    await using page = await cdp.newPage("about:blank", { signal });
    assert.equal(await load(page, `http://127.0.0.1:${listed.addr.port}/`, signal), "listed");
    assert.equal(await load(page, `http://127.0.0.1:${unlisted.addr.port}/`, signal), null);
  } finally {
    await env.stop();
    await listed.shutdown();
    await unlisted.shutdown();
  }
  assert.deepEqual(processesWith(marker), []);
});

/**
 * An environment that serves a page with a code and publishes a browser
 * that may reach it: the agent must read the code through the browser.
 */
function vaultEnv(marker: string): Environment {
  const env = new Environment("vault", { version: "1.0.0" });
  let site: Deno.HttpServer<Deno.NetAddr> | null = null;
  let code = "";
  env.initialize(() => {
    code = String(100_000 + Math.floor(Math.random() * 900_000));
    site = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      () =>
        new Response(
          `<!doctype html><title>vault</title><p>The code is <b id="code">${code}</b></p>`,
          { headers: { "content-type": "text/html; charset=utf-8" } },
        ),
    );
  });
  env.shutdown(async () => {
    await site?.shutdown();
    site = null;
  });
  addBrowser(env, { args: [`--hud-test-marker=${marker}`], hostPorts: () => [site!.addr.port] });
  env.template({ id: "read_code" }, async function* () {
    const answer = yield `Open http://127.0.0.1:${site!.addr.port}/ in the browser ` +
      "and answer with the code on the page.";
    yield String(answer).trim() === code ? 1 : 0;
  });
  return env;
}

test("addBrowser(): an agent reads the environment's page through the browser and scores 1", {
  needs: [CHROMIUM, SANDBOX],
}, async () => {
  const marker = crypto.randomUUID();
  const env = vaultEnv(marker);
  const agent = functionAgent(async (prompt, run: Run, { signal }) => {
    await using cdp = await run.client.open("cdp", { signal });
    await using page = await cdp.newPage("about:blank", { signal });
    const url = /http:\/\/\S+\//.exec(String(prompt))![0];
    await page.navigate(url, { signal });
    return await page.evaluate<string>("document.getElementById('code').textContent", {
      signal,
    });
  });
  const run = await rollout(
    { env: "vault", id: "read_code", args: {}, slug: "read_code" },
    agent,
    { runtime: new LocalRuntime(env), rolloutTimeout: 90_000, fileTracking: false },
  );
  assert.deepEqual(run.trace.errors, []);
  assert.equal(run.reward, 1);
  assert.deepEqual(processesWith(marker), [], "the browser outlived the rollout");
});

test(
  "addBrowser(): the browser dies with this process",
  { needs: [CHROMIUM, SANDBOX] },
  async () => {
    const marker = crypto.randomUUID();
    const script = `import { addBrowser } from ${
      JSON.stringify(import.meta.resolve("../../workspace/mod.ts"))
    };
import { Environment } from ${JSON.stringify(import.meta.resolve("../../env.ts"))};
const env = new Environment("web");
addBrowser(env, { args: ["--hud-test-marker=${marker}"] });
await env.start();
for (const entry of Deno.readDirSync("/proc")) {
  try {
    const args = Deno.readTextFileSync("/proc/" + entry.name + "/cmdline").split("\\0");
    const dir = args.find((a) => a.startsWith("--user-data-dir="));
    if (args.includes("--hud-test-marker=${marker}") && dir) {
      console.log(dir.slice("--user-data-dir=".length));
      break;
    }
  } catch { /* not a process */ }
}
Deno.exit(0); // no env.stop()`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(90_000),
    }).output();
    const profile = new TextDecoder().decode(out.stdout).trim();
    assert.match(profile, /\/hud-browser-[^/]+\/profile$/, new TextDecoder().decode(out.stderr));
    for (let i = 0; i < 500 && processesWith(marker).length > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.deepEqual(processesWith(marker), []);
    // The browser's directory is left behind in this case. Its last writes
    // (a dying renderer's) may land while it is removed: try again, bounded.
    const dir = profile.slice(0, -"/profile".length);
    for (let i = 0;; i++) {
      try {
        await Deno.remove(dir, { recursive: true });
        break;
      } catch (err) {
        if (i >= 50 || err instanceof Deno.errors.NotFound) throw err;
        await new Promise((r) => setTimeout(r, 20));
      }
    }
  },
);

test("addBrowser() reports a missing executable in one line", async () => {
  const env = new Environment("nobrowser");
  addBrowser(env, { executable: "/nonexistent/chromium" });
  await assert.rejects(env.start(), { message: /"\/nonexistent\/chromium" is not installed/ });
  await env.stop();
});

test("addBrowser() refuses a writable directory that is not there, in one line", {
  needs: [CHROMIUM],
}, async () => {
  const env = new Environment("nodir");
  addBrowser(env, { writable: ["/nonexistent/dir"] });
  await assert.rejects(env.start(), {
    name: "TypeError",
    message: /^Cannot start browser: writable "\/nonexistent\/dir" is not an absolute path/,
  });
  await env.stop();
});

test("addBrowser() checks its options when added", () => {
  const env = new Environment("bad");
  assert.throws(() => addBrowser(env, { hostPorts: [80] }), RangeError);
  assert.throws(() => addBrowser(env, { uid: 0 }), RangeError);
  assert.throws(
    () => addBrowser(env, { isolation: "vm" as unknown as "none" }),
    { name: "RangeError", message: /unknown isolation "vm"/ },
  );
});
