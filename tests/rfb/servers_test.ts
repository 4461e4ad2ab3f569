// RfbClient against Debian's VNC servers, TigerVNC's Xvnc and x11vnc on
// Xvfb, on unix sockets (issue 40): screenshots are pixel for pixel what
// ImageMagick's `import` and `xwd` read from the same X display, input
// arrives (xdotool's pointer, a Tk window that logs keys and clicks), VNC
// authentication works and fails in one line, and a resized desktop is
// followed. Through the tunnel and a sandbox: tests/workspace/desktop_test.ts.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { RfbClient, RfbError } from "../../rfb/mod.ts";
import { desktop, KEY_LOGGER, startServer, type TestServer, waitForLog } from "./_x.ts";

const NEEDS = {
  tigervnc: ["Xvnc", "vncpasswd", "xdotool", "import", "compare", "xwd", "xrandr", "tkinter"],
  x11vnc: ["Xvfb", "x11vnc", "xdotool", "import", "compare", "xwd", "tkinter"],
} as const;

/** Pixels that differ between two pictures, by ImageMagick's `compare -metric AE`. */
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

async function startLogger(server: TestServer, size = "400x300"): Promise<string> {
  const log = `${server.dir}/events.log`;
  await Deno.writeTextFile(`${server.dir}/keylog.py`, KEY_LOGGER);
  server.spawn(["/usr/bin/python3", `${server.dir}/keylog.py`, log, size]);
  await waitForLog(log, /^ready$/);
  return log;
}

/** The log's lines after `ready`, once `last` shows. */
async function events(log: string, last: RegExp): Promise<string[]> {
  const lines = await waitForLog(log, last);
  return lines.slice(lines.indexOf("ready") + 1);
}

for (const kind of ["tigervnc", "x11vnc"] as const) {
  const needs = [desktop(NEEDS[kind])];

  test({
    name: `RfbClient against ${kind}: screenshots are what import and xwd read from the display`,
    needs,
    async fn() {
      await using server = await startServer(kind, { width: 640, height: 480 });
      await server.x(["xsetroot", "-solid", "#336699"]);
      await startLogger(server, "300x200");
      server.spawn(["xlogo", "-geometry", "160x120+420+300"]);
      await using vnc = await RfbClient.connect({ path: server.socket });
      assert.deepEqual([vnc.width, vnc.height], [640, 480]);
      // The screen is still: one settle, then the pictures of both sides.
      await vnc.settle({ quiet: 500, timeout: 10_000 });
      const ours = `${server.dir}/vnc.png`;
      await Deno.writeFile(ours, await vnc.screenshot());
      assert.equal(
        (await server.x(["import", "-window", "root", `${server.dir}/import.png`])).code,
        0,
      );
      assert.equal(
        (await server.x(["xwd", "-root", "-silent", "-out", `${server.dir}/root.xwd`])).code,
        0,
      );
      assert.equal(await differingPixels(ours, `${server.dir}/import.png`), 0);
      assert.equal(await differingPixels(ours, `xwd:${server.dir}/root.xwd`), 0);
      // Not a blank frame that would match anything blank: the logo and the background differ.
      assert.ok((await differingPixels(ours, "xc:#336699[640x480]")) > 10_000);
      // A change after the first frame comes through an incremental update.
      await server.x(["xsetroot", "-solid", "#993333"]);
      await vnc.settle({ quiet: 500, timeout: 10_000 });
      await Deno.writeFile(ours, await vnc.screenshot());
      await server.x(["import", "-window", "root", `${server.dir}/import.png`]);
      assert.equal(await differingPixels(ours, `${server.dir}/import.png`), 0);
    },
  });

  test({
    name: `RfbClient against ${kind}: the pointer, clicks, drags, the wheel, keys and text arrive`,
    needs,
    async fn() {
      await using server = await startServer(kind, { width: 640, height: 480 });
      const log = await startLogger(server);
      await using vnc = await RfbClient.connect({ path: server.socket });

      await vnc.move({ x: 123, y: 45 });
      await vnc.settle({ quiet: 100 });
      const where = await server.x(["xdotool", "getmouselocation"]);
      assert.match(where.stdout, /^x:123 y:45 /);

      await vnc.click({ x: 50, y: 60 });
      await vnc.doubleClick({ x: 70, y: 80 });
      await vnc.click({ x: 90, y: 100 }, { button: "right" });
      await vnc.scroll({ x: 100, y: 100 }, { dy: 1 });
      await vnc.scroll({ x: 100, y: 100 }, { dy: -1 });
      await vnc.drag({ x: 10, y: 10 }, { x: 200, y: 150 }, { steps: 5 });
      const pointer = await events(log, /^button 1 10 10$/);
      await waitForLog(log, /^drag 200 150$/);
      assert.deepEqual(pointer.slice(0, 7), [
        "button 1 50 60",
        "button 1 70 80",
        "button 1 70 80",
        "button 3 90 100",
        "button 5 100 100",
        "button 4 100 100",
        "button 1 10 10",
      ]);

      await vnc.move({ x: 200, y: 200 }); // over the window, which has the focus
      await vnc.type("Hi!");
      await vnc.key("ctrl+a");
      await vnc.key("Return");
      await vnc.key("F5");
      const keys = (await events(log, /^key F5$/)).filter((l) => l.startsWith("key "));
      assert.deepEqual(
        keys.filter((k) => !/Shift_L/.test(k)),
        ["key H", "key i", "key exclam", "key Control_L", "key a", "key Return", "key F5"],
      );
    },
  });

  test({
    name: `RfbClient against ${kind}: VNC authentication, and a wrong password in one line`,
    needs,
    async fn() {
      await using server = await startServer(kind, { password: "s3cret" });
      await using vnc = await RfbClient.connect({ path: server.socket, password: "s3cret" });
      assert.equal(vnc.width, 640);
      assert.ok((await vnc.screenshot()).length > 100);
      const wrong = RfbClient.connect({ path: server.socket, password: "wrong" });
      await assert.rejects(wrong, (err: unknown) => {
        assert.ok(err instanceof RfbError);
        assert.equal(err.kind, "auth");
        assert.match(err.message, /^Cannot connect to the VNC server: it refused the password/);
        assert.doesNotMatch(err.message, /\n/);
        return true;
      });
      await assert.rejects(RfbClient.connect({ path: server.socket }), /asks for a VNC password/);
    },
  });
}

test({
  name: "RfbClient against tigervnc: a desktop resized with xrandr (DesktopSize) is followed",
  needs: [desktop(NEEDS.tigervnc)],
  async fn() {
    await using server = await startServer("tigervnc", { width: 640, height: 480 });
    await using vnc = await RfbClient.connect({ path: server.socket });
    await vnc.screenshot();
    assert.equal((await server.x(["xrandr", "--fb", "800x600"])).code, 0);
    await vnc.settle({ quiet: 300 });
    assert.deepEqual([vnc.width, vnc.height], [800, 600]);
    const png = await vnc.screenshot();
    const view = new DataView(png.buffer, png.byteOffset);
    assert.deepEqual([view.getUint32(16), view.getUint32(20)], [800, 600]);
    await assert.rejects(vnc.click({ x: 800, y: 10 }), /off the 800x600 screen/);
    await vnc.click({ x: 799, y: 599 });
  },
});
