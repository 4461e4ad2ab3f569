// The uid a workspace's agent runs as (as root): leased from a range, never
// one a live process runs as, unless the caller knows every process that
// uid ran has ended (its episode's cgroup was emptied and removed), in which
// case the scan of every process is skipped for that uid alone.

import { test } from "../_test.ts";
import { BWRAP, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace } from "../../workspace/workspace.ts";
import { leaseUid } from "../../workspace/_limits.ts";

/** A range of uids of this file's own (the workspaces of other files use 59000-59999). */
const FIRST = 61_000;
const LAST = 61_002;

/** `sleep` running as `uid` until killed. */
function runningAs(uid: number): Deno.ChildProcess {
  return new Deno.Command("setpriv", {
    args: [`--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", "sleep", "30"],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
}

test({
  name:
    "leaseUid() passes over a uid a live process runs as, unless told that uid's processes have ended",
  needs: [ROOT_USER],
}, async () => {
  const sleeper = runningAs(FIRST);
  try {
    // Until the process shows in /proc.
    for (let i = 0; i < 100; i++) {
      const status = await Deno.readTextFile(`/proc/${sleeper.pid}/status`).catch(() => "");
      if (new RegExp(`^Uid:\\s+${FIRST}\\b`, "m").test(status)) break;
      await new Promise((r) => setTimeout(r, 10));
    }
    const a = await leaseUid(FIRST, LAST);
    assert.equal(a.uid, FIRST + 1, "took the uid of a live process");
    await a.release();
    const b = await leaseUid(FIRST, LAST, FIRST);
    assert.equal(b.uid, FIRST + 1, "preferred a uid of a live process");
    await b.release();
    // The caller's word that everything FIRST ran has ended: no scan for it.
    const c = await leaseUid(FIRST, LAST, FIRST, true);
    assert.equal(c.uid, FIRST);
    // Held: another lease takes the next one free.
    const d = await leaseUid(FIRST, LAST, FIRST, true);
    assert.equal(d.uid, FIRST + 1);
    await c.release();
    await d.release();
  } finally {
    sleeper.kill("SIGKILL");
    await sleeper.status;
  }
});

test({
  name: "addWorkspace() episodes take their uid again once its processes are gone",
  needs: [BWRAP, ROOT_USER],
}, async () => {
  const root = await Deno.makeTempDir({ prefix: "ws-lease-" });
  const env = new Environment("lease-test");
  const workspace = addWorkspace(env, root, { trackFiles: false, uidRange: [FIRST, LAST] });
  try {
    const uids: number[] = [];
    for (let i = 0; i < 3; i++) {
      await env.start();
      try {
        await using shell = SshClient.fromBinding(env.capability("shell")!);
        // Something left running: killed with the episode.
        const r = await shell.exec("(sleep 30 &) ; id -u", { timeout: 20_000 });
        assert.equal(r.code, 0, r.stderrText);
        uids.push(Number(r.stdoutText.trim()));
        assert.equal(workspace.uid, uids[i]);
      } finally {
        await env.stop();
      }
    }
    assert.deepEqual(uids, [uids[0], uids[0], uids[0]]);
    // None of them is left.
    for (const e of Deno.readDirSync("/proc")) {
      if (!/^\d+$/.test(e.name)) continue;
      const status = await Deno.readTextFile(`/proc/${e.name}/status`).catch(() => "");
      assert.doesNotMatch(status, new RegExp(`^Uid:\\s+${uids[0]}\\b`, "m"), `process ${e.name}`);
    }
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
