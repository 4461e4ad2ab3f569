// Screenshots over RFB (issue 40): latency and bytes on the wire of
// `RfbClient.screenshot()` at 1280x800, for a full frame (a fresh
// connection's first picture) and after a small change (a 64x64 square that
// changes colour between pictures), against TigerVNC's Xvnc and x11vnc on
// Xvfb, with the encodings the client asks for by default (ZRLE, CopyRect,
// Raw; the server picks among them) and with Raw alone, on two screens: a
// desktop of a few X programs on a flat background ("ui") and a
// photo-like one (ImageMagick's plasma fractal as the background,
// "photo"). Then the same through a desktop in the workspace's sandbox and
// the HUD tunnel (the supervisor's pipe and the control port's forwarder),
// which is what an agent pays.
//
//   deno run -A bench/rfb.ts [--runs=10]
//
// Prints one JSON line per case, then a table: medians (and the 90th
// percentile) of the milliseconds a screenshot takes (the round trip, the
// decoding, the PNG), the bytes read from the server for it, and the PNG's
// size. The raw frame is 1280 x 800 x 4 = 4,096,000 bytes.

import { RfbClient, type RfbEncodingName } from "../rfb/mod.ts";
import { encodePng } from "../rfb/_png.ts";
import { KEY_LOGGER, missing, startServer, type TestServer } from "../tests/rfb/_x.ts";
import { Environment } from "../env.ts";
import { bind } from "../server.ts";
import { connect } from "../client.ts";
import { addDesktop, addWorkspace, type Desktop } from "../workspace/mod.ts";

const arg = (name: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
const RUNS = Number(arg("runs") ?? 10);
const WIDTH = 1280;
const HEIGHT = 800;

// A 64x64 square that changes colour every 150 ms: the "small change".
const FLIPPER = `
import tkinter as tk
root = tk.Tk()
root.geometry("64x64+600+400")
colours = ["#c03030", "#30c030"]
state = [0]
def flip():
    state[0] ^= 1
    root.configure(background=colours[state[0]])
    root.after(150, flip)
flip()
root.mainloop()
`;

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

interface Case {
  server: string;
  scene: string;
  encodings: string;
  kind: "full frame" | "small change";
  ms: number[];
  bytes: number[];
  png: number[];
}

function report(c: Case): Record<string, unknown> {
  const line = {
    server: c.server,
    scene: c.scene,
    encodings: c.encodings,
    kind: c.kind,
    runs: c.ms.length,
    median_ms: Math.round(quantile(c.ms, 0.5) * 10) / 10,
    p90_ms: Math.round(quantile(c.ms, 0.9) * 10) / 10,
    median_bytes: quantile(c.bytes, 0.5),
    median_png_bytes: quantile(c.png, 0.5),
  };
  console.log(JSON.stringify(line));
  return line;
}

/** Fills the screen with the scene and starts the flipper; `x` runs an X program to its end. */
async function scene(
  name: string,
  x: (argv: string[]) => Promise<unknown>,
  spawn: (argv: string[]) => Promise<unknown>,
  dir: string,
): Promise<void> {
  if (name === "photo") {
    await x(["convert", "-size", `${WIDTH}x${HEIGHT}`, "plasma:fractal", `${dir}/plasma.png`]);
    await x(["display", "-window", "root", `${dir}/plasma.png`]);
  } else {
    await x(["xsetroot", "-solid", "#3a6ea5"]);
    await spawn(["xlogo", "-geometry", "300x300+40+40"]);
    await spawn(["xclock", "-geometry", "200x200+900+60"]);
    await spawn(["xeyes", "-geometry", "240x160+900+500"]);
    await Deno.writeTextFile(`${dir}/log.py`, KEY_LOGGER);
    await spawn(["/usr/bin/python3", `${dir}/log.py`, `${dir}/log.txt`, "400x300+380+60"]);
  }
  await Deno.writeTextFile(`${dir}/flip.py`, FLIPPER);
  await spawn(["/usr/bin/python3", `${dir}/flip.py`]);
  await new Promise((r) => setTimeout(r, 1500));
}

/** Times screenshots over `open()`: fresh connections, then one connection's later pictures. */
async function measure(
  labels: { server: string; scene: string; encodings: string },
  open: () => Promise<RfbClient>,
): Promise<Case[]> {
  const full: Case = { ...labels, kind: "full frame", ms: [], bytes: [], png: [] };
  const small: Case = { ...labels, kind: "small change", ms: [], bytes: [], png: [] };
  for (let i = 0; i < RUNS; i++) {
    await using vnc = await open();
    const before = vnc.bytesRead;
    const t0 = performance.now();
    const png = await vnc.screenshot();
    full.ms.push(performance.now() - t0);
    full.bytes.push(vnc.bytesRead - before);
    full.png.push(png.length);
  }
  await using vnc = await open();
  await vnc.screenshot();
  for (let i = 0; i < RUNS; i++) {
    await new Promise((r) => setTimeout(r, 200)); // the square changed since the last picture
    const before = vnc.bytesRead;
    const t0 = performance.now();
    const png = await vnc.screenshot();
    small.ms.push(performance.now() - t0);
    small.bytes.push(vnc.bytesRead - before);
    small.png.push(png.length);
  }
  return [full, small];
}

const ENCODINGS: Record<string, RfbEncodingName[]> = {
  "zrle (default)": ["zrle", "copyrect", "raw"],
  "raw": ["raw"],
};

const lines: Record<string, unknown>[] = [];
console.log(JSON.stringify({ load: Deno.loadavg(), runs: RUNS, size: `${WIDTH}x${HEIGHT}` }));
for (const server of ["tigervnc", "x11vnc"] as const) {
  const needs = server === "tigervnc" ? ["Xvnc"] : ["Xvfb", "x11vnc"];
  if (missing([...needs, "tkinter", "import"]).length > 0) {
    console.log(JSON.stringify({ server, skipped: missing([...needs, "tkinter", "import"]) }));
    continue;
  }
  for (const name of ["ui", "photo"]) {
    let s: TestServer | null = null;
    try {
      s = await startServer(server, { width: WIDTH, height: HEIGHT });
      const srv = s;
      await scene(name, (argv) => srv.x(argv), (argv) => Promise.resolve(srv.spawn(argv)), srv.dir);
      for (const [label, encodings] of Object.entries(ENCODINGS)) {
        const cases = await measure(
          { server, scene: name, encodings: label },
          () => RfbClient.connect({ path: srv.socket, encodings }),
        );
        lines.push(...cases.map(report));
      }
      // The PNG alone, for the share of a screenshot it takes.
      await using vnc = await RfbClient.connect({ path: srv.socket });
      const frame = await vnc.frame();
      const times: number[] = [];
      for (let i = 0; i < RUNS; i++) {
        const t0 = performance.now();
        await encodePng(frame.rgba, frame.width, frame.height);
        times.push(performance.now() - t0);
      }
      console.log(
        JSON.stringify({
          server,
          scene: name,
          png_encode_median_ms: Math.round(quantile(times, 0.5) * 10) / 10,
        }),
      );
    } finally {
      await s?.[Symbol.asyncDispose]();
    }
  }
}

// Through the sandbox's pipe and the HUD tunnel, as an agent gets it.
if (missing(["Xvnc", "tkinter"]).length === 0) {
  const root = await Deno.makeTempDir({ prefix: "hud-bench-rfb-" });
  const env = new Environment("bench");
  const workspace = addWorkspace(env, root, { trackFiles: false });
  const desktop: Desktop = addDesktop(env, { workspace, width: WIDTH, height: HEIGHT });
  try {
    await env.start();
    await scene("ui", (argv) => desktop.exec(argv), (argv) => desktop.run(argv), root);
    await using server = bind(env);
    await using client = await connect(server);
    const cases = await measure(
      { server: "tigervnc, sandbox + tunnel", scene: "ui", encodings: "zrle (default)" },
      () => client.open("screen"),
    );
    lines.push(...cases.map(report));
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
}

console.log(JSON.stringify({ load: Deno.loadavg() }));
console.log(
  "\n| server | screen | encodings | screenshot | median ms (p90) | bytes read | PNG bytes |",
);
console.log("| --- | --- | --- | --- | --- | --- | --- |");
for (const l of lines) {
  console.log(
    `| ${l.server} | ${l.scene} | ${l.encodings} | ${l.kind} | ${l.median_ms} (${l.p90_ms}) | ${
      Number(l.median_bytes).toLocaleString("en")
    } | ${Number(l.median_png_bytes).toLocaleString("en")} |`,
  );
}
