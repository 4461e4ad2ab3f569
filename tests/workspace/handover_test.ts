// Root's files in a workspace are handed to the agent's uid before each of
// its commands; the hand-over (a find(1) as root in the sandbox) is skipped
// where the workspace has seen that nothing of root's can be new. Checked
// here: that the hint never misses what root makes (in a directory seen a
// moment before, deep down, as a directory or a link), and that a workspace
// still hands over what its environment writes between two commands.

import { test } from "../_test.ts";
import { BWRAP, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace } from "../../workspace/workspace.ts";
import { HandOverHint } from "../../workspace/_handover.ts";

const AGENT = 20_001;

/** A tree of the agent's: root/, root/a/, root/a/b/, root/a/b/f. */
async function agentTree(): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "ws-handover-" });
  await Deno.mkdir(`${root}/a/b`, { recursive: true });
  await Deno.writeTextFile(`${root}/a/b/f`, "f\n");
  for (const p of [root, `${root}/a`, `${root}/a/b`, `${root}/a/b/f`]) {
    await Deno.chown(p, AGENT, AGENT);
  }
  return root;
}

test({
  name: "HandOverHint says when root may have made something to hand over, at once and deep down",
  needs: [ROOT_USER],
}, async () => {
  const root = await agentTree();
  try {
    const hint = new HandOverHint([root]);
    assert.equal(hint.needed(), false, "nothing of root's");
    assert.equal(hint.needed(), false, "nothing new");
    // Within the same millisecond as the look before: still seen.
    Deno.writeTextFileSync(`${root}/a/b/new`, "root's\n");
    assert.equal(hint.needed(), true, "a file root made deep down");
    assert.equal(hint.needed(), true, "still root's: asked again");
    Deno.chownSync(`${root}/a/b/new`, AGENT, AGENT);
    assert.equal(hint.needed(), false, "handed over");
    Deno.mkdirSync(`${root}/a/d`);
    assert.equal(hint.needed(), true, "a directory root made");
    Deno.chownSync(`${root}/a/d`, AGENT, AGENT);
    assert.equal(hint.needed(), false);
    Deno.symlinkSync("b", `${root}/a/link`);
    assert.equal(hint.needed(), true, "a link root made");
    Deno.removeSync(`${root}/a/link`);
    assert.equal(hint.needed(), false, "gone");
    // A file of two links is never handed over (one may be outside the root).
    Deno.writeTextFileSync(`${root}/outside-link`, "x");
    Deno.chownSync(`${root}/outside-link`, AGENT, AGENT);
    assert.equal(hint.needed(), false);
    const other = await Deno.makeTempDir({ prefix: "ws-handover-other-" });
    try {
      Deno.writeTextFileSync(`${other}/root-file`, "root's\n");
      Deno.linkSync(`${other}/root-file`, `${root}/a/two-links`);
      assert.equal(hint.needed(), false, "a file of two links");
      Deno.removeSync(`${root}/a/two-links`);
    } finally {
      await Deno.remove(other, { recursive: true });
    }
    // A renamed-in directory of root's, holding a file of root's.
    Deno.mkdirSync(`${root}/staged/inner`, { recursive: true });
    Deno.chownSync(`${root}/staged`, AGENT, AGENT);
    Deno.chownSync(`${root}/staged/inner`, AGENT, AGENT);
    assert.equal(hint.needed(), false);
    Deno.writeTextFileSync(`${root}/staged/inner/x`, "root's\n");
    assert.equal(hint.needed(), true, "a file root made in a directory it moved in");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test({
  name: "HandOverHint answers yes for trees of more directories than it keeps",
  needs: [ROOT_USER],
}, async () => {
  const root = await agentTree();
  try {
    for (let i = 0; i < 300; i++) {
      Deno.mkdirSync(`${root}/d${i}`);
      Deno.chownSync(`${root}/d${i}`, AGENT, AGENT);
    }
    const hint = new HandOverHint([root]);
    assert.equal(hint.needed(), true);
    assert.equal(hint.needed(), true);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test({
  name: "addWorkspace() hands over what the environment writes between two commands of the agent",
  needs: [BWRAP, ROOT_USER],
}, async () => {
  const root = await Deno.makeTempDir({ prefix: "ws-handover-" });
  const env = new Environment("handover-test");
  addWorkspace(env, root, { trackFiles: false });
  await env.start();
  try {
    await using shell = SshClient.fromBinding(env.capability("shell")!);
    const sh = async (command: string) => {
      const r = await shell.exec(command, { timeout: 20_000 });
      assert.equal(r.code, 0, r.stderrText);
      return r.stdoutText;
    };
    await sh("mkdir -p sub/deep && echo 1 > sub/deep/mine");
    for (let i = 0; i < 3; i++) await sh("true");
    // Root (this process) writes, the agent's next command edits.
    await Deno.writeTextFile(`${root}/sub/deep/task-${0}.txt`, "task\n");
    assert.equal(
      await sh("echo agent >> sub/deep/task-0.txt && cat sub/deep/task-0.txt"),
      "task\nagent\n",
    );
    for (let i = 1; i < 4; i++) {
      await Deno.mkdir(`${root}/sub/made-${i}`);
      await Deno.writeTextFile(`${root}/sub/made-${i}/task.txt`, "task\n");
      assert.equal(
        await sh(
          `echo agent >> sub/made-${i}/task.txt && touch sub/made-${i}/new && cat sub/made-${i}/task.txt`,
        ),
        "task\nagent\n",
      );
    }
    const uid = Number((await sh("id -u")).trim());
    for await (const e of Deno.readDir(`${root}/sub`)) {
      assert.equal((await Deno.lstat(`${root}/sub/${e.name}`)).uid, uid, e.name);
    }
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
});
