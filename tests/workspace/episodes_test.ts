// What a workspace keeps from one episode to the next in one process: one
// watcher of its temporary directories and one staging of its SFTP server,
// made by the first episode; and what it leaves when the process ends: none
// of either, whether the process exits or is killed.

import { test } from "../_test.ts";
import { BWRAP } from "../_counterparts.ts";
import { firstLine } from "../_helpers.ts";
import assert from "node:assert/strict";

const CHILD = new URL("../fixtures/episodes_child.ts", import.meta.url).pathname;

interface Seen {
  names: string[];
  watchers: number[];
}

/** Runs the child in `mode` with a TMPDIR of its own; its first line, parsed, and the process. */
async function child(tmp: string, ...args: string[]) {
  const proc = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CHILD, ...args],
    env: { TMPDIR: tmp },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  return { proc, seen: JSON.parse((await firstLine(proc.stdout)) || "null") as Seen[] | null };
}

async function entries(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const e of Deno.readDir(dir)) names.push(e.name);
  return names.sort();
}

function alive(pid: number): boolean {
  try {
    return !Deno.readTextFileSync(`/proc/${pid}/stat`).includes(") Z ");
  } catch {
    return false;
  }
}

/** Waits (bounded: 5 s) until `done()` holds. */
async function until(done: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 50 && !(await done()); i++) await new Promise((r) => setTimeout(r, 100));
}

test({
  name:
    "Workspace episodes in one process share one SFTP staging and one watcher, and a normal exit leaves nothing",
  needs: [BWRAP],
}, async () => {
  const tmp = await Deno.makeTempDir({ prefix: "episodes-tmp-" });
  try {
    const { proc, seen } = await child(tmp, "run", "3");
    const status = await proc.status;
    const stderr = new TextDecoder().decode(await new Response(proc.stderr).arrayBuffer());
    await proc.stdout.cancel().catch(() => {});
    assert.ok(status.success, stderr);
    assert.ok(seen !== null && seen.length === 3, stderr);
    const sftp = seen.map((s) => s.names.filter((n) => n.startsWith("hud-sftp-")));
    assert.equal(sftp[0].length, 1, JSON.stringify(seen));
    assert.deepEqual(sftp[1], sftp[0], "the second episode staged the SFTP server again");
    assert.deepEqual(sftp[2], sftp[0], "the third episode staged the SFTP server again");
    const watchers = seen.map((s) => s.watchers);
    assert.equal(watchers[0].length, 1, JSON.stringify(seen));
    assert.deepEqual(watchers[1], watchers[0], "the second episode started another watcher");
    assert.deepEqual(watchers[2], watchers[0], "the third episode started another watcher");
    // Nothing in TMPDIR the moment it has exited: it removed them itself.
    assert.deepEqual(await entries(tmp), []);
    // The watcher saw it go, and went too.
    await until(() => !alive(watchers[0][0]));
    assert.equal(alive(watchers[0][0]), false, "the watcher outlived the process");
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});

test({
  name:
    "Workspace: after SIGKILL the watcher removes HOME, /etc files, the key and the SFTP staging",
  needs: [BWRAP],
}, async () => {
  const tmp = await Deno.makeTempDir({ prefix: "episodes-tmp-" });
  try {
    const { proc, seen } = await child(tmp, "hold");
    try {
      assert.ok(seen !== null, "the child printed nothing");
      assert.ok(seen[0].names.some((n) => n.startsWith("hud-sftp-")), JSON.stringify(seen));
      assert.ok(seen[0].names.some((n) => n.startsWith("hud-home-")), JSON.stringify(seen));
    } finally {
      proc.kill("SIGKILL");
      await proc.status;
      await proc.stdout.cancel().catch(() => {});
      await proc.stderr.cancel();
    }
    // The watcher polls twice a second. (The child's root is its own.)
    const ours = async () => (await entries(tmp)).filter((n) => n.startsWith("hud-"));
    await until(async () => (await ours()).length === 0);
    assert.deepEqual(await ours(), []);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});

test({
  name:
    "Workspace: a staging and list removed from TMPDIR meanwhile are made again for the next episode",
  needs: [BWRAP],
}, async () => {
  const tmp = await Deno.makeTempDir({ prefix: "episodes-tmp-" });
  try {
    const { proc, seen } = await child(tmp, "cleaned");
    const status = await proc.status;
    const stderr = new TextDecoder().decode(await new Response(proc.stderr).arrayBuffer());
    await proc.stdout.cancel().catch(() => {});
    assert.ok(status.success, stderr);
    assert.ok(seen !== null && seen.length === 2, stderr);
    // The second episode ran its command and SFTP (the child checks both), staged anew.
    const sftp = seen.map((s) => s.names.filter((n) => n.startsWith("hud-sftp-")));
    assert.equal(sftp[1].length, 1, JSON.stringify(seen));
    assert.notDeepEqual(sftp[1], sftp[0]);
    // A watcher for the new list (the first one waits on, for a list that is gone).
    assert.ok(seen[1].watchers.some((p) => !seen[0].watchers.includes(p)), JSON.stringify(seen));
    assert.deepEqual((await entries(tmp)).filter((n) => n.startsWith("hud-")), []);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});
