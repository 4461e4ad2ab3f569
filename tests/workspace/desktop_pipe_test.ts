// The desktop's pipe (workspace/_desktop_pipe.ts) reads what the supervisor
// writes; the supervisor runs as the agent's user, and a program on the
// desktop (a terminal the agent types into) can write to its stdout through
// /proc. Whatever it writes, this side ends the pipe in one line and every
// waiting program call returns, nothing hangs, nothing malformed gets through.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { DesktopPipe } from "../../workspace/_desktop_pipe.ts";
import { FRAME } from "../../workspace/_desktop_main.ts";

function frame(type: number, id: number, payload: Uint8Array | string = ""): Uint8Array {
  const body = typeof payload === "string" ? new TextEncoder().encode(payload) : payload;
  const out = new Uint8Array(9 + body.length);
  const v = new DataView(out.buffer);
  v.setUint8(0, type);
  v.setUint32(1, id);
  v.setUint32(5, body.length);
  out.set(body, 9);
  return out;
}

function join(frames: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(frames.reduce((n, f) => n + f.length, 0));
  let at = 0;
  for (const f of frames) {
    out.set(f, at);
    at += f.length;
  }
  return out;
}

/**
 * A stand-in supervisor: writes `first` to its stdout, waits for a frame on
 * its stdin (the test's request), writes `then` and waits for stdin to
 * close. Disposing of it kills it and removes its files.
 */
function hostile(
  first: Uint8Array[],
  then: Uint8Array[] = [],
): { child: Deno.ChildProcess } & AsyncDisposable {
  const dir = Deno.makeTempDirSync({ prefix: "hud-pipe-test-" });
  Deno.writeFileSync(`${dir}/first`, join(first));
  Deno.writeFileSync(`${dir}/then`, join(then));
  const script = `
    const dir = Deno.args[0];
    const r = Deno.stdin.readable.getReader();
    const w = Deno.stdout.writable.getWriter();
    await w.write(await Deno.readFile(dir + "/first"));
    await r.read();
    await w.write(await Deno.readFile(dir + "/then"));
    while (!(await r.read()).done);
  `;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", "--no-config", "-q", script, dir],
    stdin: "piped",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  return {
    child,
    async [Symbol.asyncDispose]() {
      child.kill("SIGKILL");
      await child.status;
      await Deno.remove(dir, { recursive: true });
    },
  };
}

async function afterRun(frames: Uint8Array[]): Promise<{ exit: unknown; dead: string | null }> {
  await using supervisor = hostile([frame(FRAME.READY, 0, '{"display":1}')], frames);
  const pipe = new DesktopPipe(supervisor.child, 1 << 20);
  try {
    await pipe.ready;
    const { exit } = pipe.run({ argv: ["xterm"], capture: true });
    const result = await exit;
    await pipe.finished.catch(() => {});
    return { exit: result, dead: pipe.dead };
  } finally {
    await pipe.close();
  }
}

test("DesktopPipe ends in one line on what a hostile supervisor writes, and no call hangs", async (t) => {
  const cases: [string, Uint8Array[], RegExp][] = [
    [
      "a frame past 16 MiB",
      [new Uint8Array([FRAME.DATA, 0, 0, 0, 1, 0x01, 0x10, 0, 0])],
      /^the desktop's pipe broke: a frame of 17825792 bytes$/,
    ],
    [
      "an exit that is not JSON",
      [frame(FRAME.EXIT, 1, "{")],
      /^the desktop's pipe broke: a malformed exit frame$/,
    ],
    [
      "an exit with more output than the supervisor keeps",
      [frame(FRAME.EXIT, 1, JSON.stringify({ code: 0, stdout: "x".repeat(1024 * 1024 + 1) }))],
      /^the desktop's pipe broke: a malformed exit frame$/,
    ],
    [
      "an exit whose code is a string",
      [frame(FRAME.EXIT, 1, '{"code":"0","stdout":"pressed\\n"}')],
      /^the desktop's pipe broke: a malformed exit frame$/,
    ],
    [
      "an exit whose output is not a string",
      [frame(FRAME.EXIT, 1, '{"code":0,"stdout":{"length":1}}')],
      /^the desktop's pipe broke: a malformed exit frame$/,
    ],
    [
      "an exit that is an array",
      [frame(FRAME.EXIT, 1, "[0]")],
      /^the desktop's pipe broke: a malformed exit frame$/,
    ],
    [
      "a second READY naming another display",
      [frame(FRAME.READY, 0, '{"display":"x"}')],
      /^the desktop's pipe broke: a malformed ready frame$/,
    ],
    [
      "a frame of a type it does not know",
      [frame(42, 1, "")],
      /^the desktop's pipe broke: a frame of unknown type 42$/,
    ],
  ];
  for (const [name, frames, reason] of cases) {
    await t.step(name, async () => {
      const { exit, dead } = await afterRun(frames);
      assert.match(String(dead), reason);
      assert.deepEqual(exit, { error: dead });
    });
  }
});

test("DesktopPipe refuses a READY whose display is not a display number", async () => {
  for (const ready of ['{"display":"0; rm -rf /"}', '{"display":-1}', '{"display":1.5}', "null"]) {
    await using supervisor = hostile([frame(FRAME.READY, 0, ready)]);
    const pipe = new DesktopPipe(supervisor.child, 1 << 20);
    try {
      await assert.rejects(
        pipe.ready,
        /^Error: the desktop's pipe broke: a malformed ready frame$/,
      );
    } finally {
      await pipe.close();
    }
  }
});
