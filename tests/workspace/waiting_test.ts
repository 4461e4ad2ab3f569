// Sandboxes started ahead of their command: the command gets exactly its
// own words, environment and input, and root's files are handed over when
// it arrives, not when the sandbox started.

import { test } from "../_test.ts";
import { BWRAP, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { SpareSandbox, WaitingSandbox } from "../../workspace/_waiting.ts";
import type { SandboxConfig } from "../../workspace/_sandbox.ts";

const IS_ROOT = Deno.uid() === 0;
/** A uid of the workspaces' range no test of this file's neighbours takes. */
const AGENT = { uid: 59_987, gid: 59_987 };

function config(dir: string): SandboxConfig {
  return {
    isolation: "bwrap",
    writable: [dir],
    network: false,
    user: IS_ROOT ? AGENT : null,
  };
}

/** Starts a waiting sandbox on `dir`, runs `argv` in it; its output. */
async function runOnce(
  dir: string,
  argv: string[],
  env: Record<string, string>,
  input = "",
): Promise<{ code: number; stdout: string; stderr: string }> {
  const waiting = WaitingSandbox.start(config(dir), dir);
  assert.ok(waiting !== null, "bwrap is installed");
  // Time for it to be made and wait: the command comes later, as an agent's does.
  await new Promise((r) => setTimeout(r, 100));
  assert.ok(waiting.ready);
  const child = await waiting.run(argv, dir, env);
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode(input));
  await writer.close();
  const out = await child.output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

test({
  name: "WaitingSandbox.run() gives the command exactly its environment, directory and input",
  needs: [BWRAP],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "ws-wait-" });
  await Deno.chmod(dir, 0o777);
  try {
    const env = { A: "1", PATH: "/usr/bin:/bin", TRICKY: "a b\nc=d" };
    const r = await runOnce(dir, ["env"], env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, "A=1\nPATH=/usr/bin:/bin\nTRICKY=a b\nc=d\n");
    await Deno.mkdir(`${dir}/sub`, { mode: 0o777 });
    const where = await runOnce(`${dir}`, ["sh", "-c", 'cd "$0"; pwd', "sub"], env);
    assert.equal(where.stdout, `${dir}/sub\n`);
    // Its input follows its words on the same pipe: none of it is eaten.
    const cat = await runOnce(dir, ["cat"], env, "line one\n\0binary\n");
    assert.equal(cat.stdout, "line one\n\0binary\n");
    // Arguments that look like options or hold newlines stay words.
    const words = await runOnce(dir, ["printf", "[%s]", "--", "-n", "x\ny", ""], env);
    assert.equal(words.stdout, "[--][-n][x\ny][]");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test({
  name: "WaitingSandbox.run() hands over root's files made after the sandbox started",
  needs: [BWRAP, ROOT_USER],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "ws-wait-" });
  try {
    const waiting = WaitingSandbox.start(config(dir), dir)!;
    await new Promise((r) => setTimeout(r, 200));
    // The environment adds a file while the sandbox waits.
    await Deno.writeTextFile(`${dir}/late.txt`, "late\n");
    const child = await waiting.run(
      ["sh", "-c", "id -u; echo agent >> late.txt && stat -c %u late.txt"],
      dir,
      { PATH: "/usr/bin:/bin" },
    );
    await child.stdin.close();
    const out = await child.output();
    const said = new TextDecoder().decode(out.stdout);
    assert.equal(said, `${AGENT.uid}\n${AGENT.uid}\n`, new TextDecoder().decode(out.stderr));
    assert.equal(await Deno.readTextFile(`${dir}/late.txt`), "late\nagent\n");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test({
  name: "WaitingSandbox refuses a NUL byte and a second command; discard() ends it",
  needs: [BWRAP],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "ws-wait-" });
  try {
    const waiting = WaitingSandbox.start(config(dir), dir)!;
    await assert.rejects(
      waiting.run(["echo", "a\0b"], dir, {}),
      (e) => e instanceof TypeError && /holds a NUL byte/.test(e.message),
    );
    await assert.rejects(waiting.run(["true"], dir, { X: "\0" }), TypeError);
    assert.ok(waiting.ready, "a refused command leaves it waiting");
    await waiting.discard();
    assert.equal(waiting.ready, false);
    assert.equal((await waiting.child.status).success, false);
    await assert.rejects(waiting.run(["true"], dir, {}), /it was used or exited/);

    const used = WaitingSandbox.start(config(dir), dir)!;
    const child = await used.run(["true"], dir, {});
    await child.stdin.close();
    assert.equal((await child.output()).code, 0);
    await assert.rejects(used.run(["true"], dir, {}), /it was used or exited/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test({
  name: "SpareSandbox hands out one waiting sandbox at a time, none after close()",
  needs: [BWRAP],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "ws-wait-" });
  const spare = new SpareSandbox(config(dir), dir);
  try {
    assert.equal(spare.take(), null, "none before fill()");
    spare.fill();
    const one = spare.take();
    assert.ok(one !== null && one.ready);
    assert.equal(spare.take(), null, "taken");
    spare.fill();
    await spare.close();
    assert.equal(spare.take(), null);
    spare.fill();
    assert.equal(spare.take(), null, "none after close()");
    await one.discard();
  } finally {
    await spare.close();
    await Deno.remove(dir, { recursive: true });
  }
});

test({
  name: "WaitingSandbox.start() makes none without a sandbox",
}, () => {
  assert.equal(
    WaitingSandbox.start({ isolation: "none", writable: [], network: true, user: null }, "/"),
    null,
  );
});
