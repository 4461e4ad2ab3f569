// A real browser VNC client against a desktop (issue 40): noVNC (installed
// from npm for this test only) in headless Chromium, through the same
// binding an agent gets (the HUD client's forwarder), as a person would
// watch the desktop. noVNC speaks RFB over a WebSocket, so the test serves
// the page and a small WebSocket-to-TCP bridge (what websockify does) to
// the forwarder. The picture noVNC draws is the one our client takes, and a
// click on noVNC's canvas moves the desktop's pointer.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { launchChromium } from "../../cdp/_chromium.ts";
import { connect } from "../../client.ts";
import { parseHostPort } from "../../capability.ts";
import { Environment } from "../../env.ts";
import { bind } from "../../server.ts";
import { addDesktop, addWorkspace } from "../../workspace/mod.ts";
import { desktop } from "../rfb/_x.ts";
import { NPM, SANDBOX } from "../_counterparts.ts";

const NEEDS = ["Xvnc", "xdotool", "chromium"];

const PAGE = `<!doctype html>
<html><head><style>html, body { margin: 0; padding: 0; background: #000; }</style></head>
<body><div id="screen" style="width: 800px; height: 600px"></div>
<script type="module">
import RFB from "/novnc/core/rfb.js";
const rfb = new RFB(document.getElementById("screen"), "ws://" + location.host + "/websockify");
rfb.addEventListener("connect", () => { window.connected = true; });
rfb.addEventListener("disconnect", (e) => { window.disconnected = JSON.stringify(e.detail); });
rfb.addEventListener("desktopname", (e) => { window.desktopName = e.detail.name; });
window.rfb = rfb;
</script></body></html>`;

const TYPES: Record<string, string> = { js: "text/javascript", html: "text/html" };

/** Serves the page, noVNC's files, and a WebSocket bridge to `target` (host:port). */
function servePage(novnc: string, target: { hostname: string; port: number }) {
  const bridges = new Set<Promise<void>>();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const url = new URL(req.url);
    if (url.pathname === "/") {
      return new Response(PAGE, { headers: { "content-type": "text/html" } });
    }
    if (url.pathname === "/websockify") {
      const { socket, response } = Deno.upgradeWebSocket(req);
      socket.binaryType = "arraybuffer";
      // Handlers first: the socket opens, and noVNC may send, before the TCP side is up.
      const opened = new Promise<void>((resolve) => socket.onopen = () => resolve());
      const ended = new Promise<void>((resolve) => socket.onclose = () => resolve());
      const early: Uint8Array[] = [];
      let conn: Deno.Conn | null = null;
      socket.onmessage = (e) => {
        const bytes = new Uint8Array(e.data as ArrayBuffer);
        if (conn === null) early.push(bytes);
        else conn.write(bytes).catch(() => socket.close());
      };
      const bridge = (async () => {
        const c = await Deno.connect(target);
        ended.then(() => {
          try {
            c.close();
          } catch {
            // closed
          }
        });
        for (const bytes of early) await c.write(bytes);
        conn = c;
        await opened;
        const buf = new Uint8Array(64 * 1024);
        try {
          for (let n; (n = await c.read(buf)) !== null;) socket.send(buf.slice(0, n));
        } catch {
          // closed
        }
        if (socket.readyState === WebSocket.OPEN) socket.close();
        await ended;
      })();
      bridges.add(bridge);
      return response;
    }
    if (url.pathname.startsWith("/novnc/") && !url.pathname.includes("..")) {
      const path = `${novnc}/${url.pathname.slice("/novnc/".length)}`;
      const body = await Deno.readFile(path).catch(() => null);
      if (body === null) return new Response("not found", { status: 404 });
      const ext = path.slice(path.lastIndexOf(".") + 1);
      return new Response(body, {
        headers: { "content-type": TYPES[ext] ?? "application/octet-stream" },
      });
    }
    return new Response("not found", { status: 404 });
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}/`,
    async close() {
      await server.shutdown();
      await Promise.allSettled([...bridges]);
    },
  };
}

test({
  name: "noVNC in headless Chromium shows the desktop through the binding an agent gets",
  needs: [desktop(NEEDS), SANDBOX, NPM],
  async fn() {
    const signal = AbortSignal.timeout(150_000);
    const modules = await Deno.makeTempDir({ prefix: "hud-novnc-" });
    const root = await Deno.makeTempDir({ prefix: "hud-novnc-root-" });
    const env = new Environment("watch");
    const workspace = addWorkspace(env, root, { trackFiles: false });
    const desktop = addDesktop(env, { workspace, width: 800, height: 600 });
    let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
    let page: ReturnType<typeof servePage> | null = null;
    try {
      await Deno.writeTextFile(`${modules}/package.json`, '{"private":true}');
      const install = await new Deno.Command("npm", {
        args: ["install", "--no-audit", "--no-fund", "--prefer-offline", "@novnc/novnc@1"],
        cwd: modules,
        stdout: "piped",
        stderr: "piped",
        signal,
      }).output();
      assert.ok(
        install.success,
        `npm install @novnc/novnc: ${new TextDecoder().decode(install.stderr)}`,
      );
      await env.start();
      await desktop.exec(["xsetroot", "-solid", "#446688"]);
      await desktop.run(["xlogo", "-geometry", "300x200+100+100"]);
      await using server = bind(env);
      await using client = await connect(server, { readyTimeout: 30_000 });
      const binding = client.binding("screen");
      const target = parseHostPort(binding.url)!;
      page = servePage(`${modules}/node_modules/@novnc/novnc`, {
        hostname: target.hostname,
        port: target.port!,
      });
      await using vnc = await client.open("screen");
      await vnc.settle({ quiet: 500, timeout: 10_000 });
      const ours = await vnc.frame();

      browser = await launchChromium({ signal });
      await using cdp = browser.connect();
      await using tab = await cdp.newPage("about:blank", { signal });
      await tab.navigate(page.url, { signal });
      // noVNC connects and draws; its canvas's pixels become ours.
      const sample = `(() => {
        const c = document.querySelector("canvas");
        if (!window.connected || !c || c.width !== 800) return null;
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        const out = [];
        for (let y = 5; y < 600; y += 37) for (let x = 3; x < 800; x += 41) {
          const i = (y * 800 + x) * 4;
          out.push([x, y, d[i], d[i + 1], d[i + 2]]);
        }
        return out;
      })()`;
      const expected = [];
      for (let y = 5; y < 600; y += 37) {
        for (let x = 3; x < 800; x += 41) {
          const i = (y * 800 + x) * 4;
          expected.push([x, y, ours.rgba[i], ours.rgba[i + 1], ours.rgba[i + 2]]);
        }
      }
      let seen: number[][] | null = null;
      for (let i = 0; i < 200; i++) {
        seen = await tab.evaluate<number[][] | null>(sample, { signal });
        if (seen !== null && JSON.stringify(seen) === JSON.stringify(expected)) break;
        const gone = await tab.evaluate<string | undefined>("window.disconnected", { signal });
        assert.equal(gone, undefined, `noVNC disconnected: ${gone}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.deepEqual(seen, expected);
      assert.ok(
        new Set(expected.map((p) => p.slice(2).join())).size > 1,
        "a blank screen proves nothing",
      );
      assert.equal(await tab.evaluate<string>("window.desktopName", { signal }), "hud");

      // A person's click on noVNC's canvas reaches the desktop.
      for (const type of ["mouseMoved", "mousePressed", "mouseReleased"]) {
        await tab.send("Input.dispatchMouseEvent", {
          type,
          x: 456,
          y: 234,
          button: type === "mouseMoved" ? "none" : "left",
          clickCount: 1,
        }, { signal });
      }
      let where = "";
      for (let i = 0; i < 100 && !where.startsWith("x:456 y:234 "); i++) {
        where = (await desktop.exec(["xdotool", "getmouselocation"])).stdout;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.match(where, /^x:456 y:234 /);
      await tab.evaluate("window.rfb.disconnect()", { signal });
    } finally {
      await browser?.close();
      await page?.close();
      await env.stop();
      await Deno.remove(modules, { recursive: true });
      await Deno.remove(root, { recursive: true });
    }
  },
});
