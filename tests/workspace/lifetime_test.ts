// How long what a workspace command starts lives (`lifetime`), and which
// capabilities root's commands keep (`capabilities`): by default a command's
// background jobs die with its SSH channel and root's commands have none;
// `lifetime: "workspace"` leaves them running until the workspace stops,
// and `capabilities: "inherit"` gives root's commands this process's set,
// as `docker exec` does in a container (Harbor tasks, issue 35).

import { test } from "../_test.ts";
import { ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace, type WorkspaceOptions } from "../../workspace/workspace.ts";

function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return !/^\d+ \(.*\) [ZX] /.test(stat);
  } catch {
    return false;
  }
}

async function until(check: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (check()) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return check();
}

async function withShell(
  options: WorkspaceOptions,
  fn: (shell: SshClient, stop: () => Promise<void>) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "ws-life-" });
  const env = new Environment("lifetime-test");
  addWorkspace(env, dir, { trackFiles: false, isolation: "none", ...options });
  await env.start();
  let stopped = false;
  const stop = async () => {
    if (!stopped) await env.stop();
    stopped = true;
  };
  try {
    await using shell = SshClient.fromBinding(env.capability("shell")!);
    await fn(shell, stop);
  } finally {
    await stop();
    await Deno.remove(dir, { recursive: true });
  }
}

/** Starts `nohup sleep` in the background of one command; returns its pid. */
async function background(shell: SshClient): Promise<number> {
  const r = await shell.exec("nohup sleep 300 >/dev/null 2>&1 & echo $!");
  assert.equal(r.code, 0, r.stderrText);
  return Number(r.stdoutText.trim());
}

test("addWorkspace() kills a command's background jobs with its channel by default", async () => {
  await withShell({}, async (shell) => {
    const pid = await background(shell);
    assert.ok(await until(() => !alive(pid), 5_000), "the background job outlived its session");
  });
});

test(
  'addWorkspace({ lifetime: "workspace" }) leaves them running until the workspace stops',
  async () => {
    await withShell({ lifetime: "workspace" }, async (shell, stop) => {
      const pid = await background(shell);
      // Long after the command's channel closed, it still runs...
      await new Promise((r) => setTimeout(r, 300));
      assert.ok(alive(pid), "the background job died with its session");
      // ...and a second command sees it (a server the verifier queries, in Harbor's tasks).
      const seen = await shell.exec(`kill -0 ${pid} && echo running`);
      assert.equal(seen.stdoutText.trim(), "running");
      await stop();
      assert.ok(await until(() => !alive(pid), 5_000), "the workspace's stop left it running");
    });
  },
);

test("addWorkspace() refuses a lifetime or capabilities it does not know, and inherit in a sandbox", () => {
  const env = new Environment("lifetime-bad");
  assert.throws(
    () => addWorkspace(env, "/tmp", { lifetime: "forever" as "session" }),
    /^RangeError: Cannot add workspace: unknown lifetime "forever" \(use "session" or "workspace"\)$/,
  );
  assert.throws(
    () => addWorkspace(env, "/tmp", { capabilities: "all" as "none" }),
    /unknown capabilities "all"/,
  );
  assert.throws(
    () => addWorkspace(env, "/tmp", { capabilities: "inherit", isolation: "auto" }),
    /capabilities "inherit" needs isolation "none"/,
  );
});

test({
  name:
    "addWorkspace({ capabilities: \"inherit\" }) gives root's commands this process's capabilities",
  needs: [ROOT_USER],
  fn: async () => {
    const own = Deno.readTextFileSync("/proc/self/status").match(/^CapEff:\s+(\w+)$/m)![1];
    const capEff = "grep ^CapEff: /proc/self/status | cut -f2";
    await withShell({ uid: 0 }, async (shell) => {
      const r = await shell.exec(capEff);
      assert.equal(r.stdoutText.trim(), "0000000000000000");
    });
    await withShell({ uid: 0, capabilities: "inherit" }, async (shell) => {
      const r = await shell.exec(capEff);
      assert.equal(r.stdoutText.trim(), own);
    });
  },
});
