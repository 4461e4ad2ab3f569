// Paths a workspace's commands cannot change (`protect`, Landlock): the
// attacks a Harbor agent would make on /logs/verifier and /tests, as root
// with Docker's capabilities and through a process it leaves running after
// its command ended (`lifetime: "workspace"`), each refused while this
// process (the verifier's side) still writes there; and the agent cannot
// read this process's memory or open its root, which root otherwise can.

import { test } from "../_test.ts";
import { LANDLOCK, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace, type WorkspaceOptions } from "../../workspace/workspace.ts";
import { landlockGrants } from "../../workspace/_landlock.ts";

/** A workspace whose root agent (capabilities kept) cannot change `<dir>/guard/{verifier,tests}`. */
async function withGuarded(
  options: WorkspaceOptions,
  fn: (shell: SshClient, dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "ws-protect-" });
  await Deno.mkdir(`${dir}/root`);
  await Deno.mkdir(`${dir}/guard/verifier`, { recursive: true });
  await Deno.writeTextFile(`${dir}/guard/verifier/reward.txt`, "0\n");
  await Deno.writeTextFile(`${dir}/guard/notes.txt`, "");
  const env = new Environment("protect-test");
  addWorkspace(env, `${dir}/root`, {
    trackFiles: false,
    isolation: "none",
    uid: 0,
    gid: 0,
    capabilities: "inherit",
    lifetime: "workspace",
    protect: [`${dir}/guard/verifier`, `${dir}/guard/tests`],
    ...options,
  });
  await env.start();
  try {
    await using shell = SshClient.fromBinding(env.capability("shell")!);
    await fn(shell, dir);
  } finally {
    await env.stop();
    await Deno.remove(dir, { recursive: true });
  }
}

/** Runs `cmd`; its exit code and output. */
async function run(shell: SshClient, cmd: string): Promise<{ code: number | null; out: string }> {
  const r = await shell.exec(cmd);
  return { code: r.code, out: r.stdoutText + r.stderrText };
}

test({
  name:
    "addWorkspace({ protect }) keeps a root agent's commands from changing a protected path in any way",
  needs: [ROOT_USER, LANDLOCK],
  fn: async () => {
    await withGuarded({}, async (shell, dir) => {
      const v = `${dir}/guard/verifier`;
      const attacks = [
        `echo 1 > ${v}/reward.txt`,
        `echo '{"reward": 1}' > ${v}/reward.json`,
        `: > ${v}/reward.txt`,
        `truncate -s 0 ${v}/reward.txt`,
        `rm -f ${v}/reward.txt && test ! -e ${v}/reward.txt`,
        `ln -s /etc/hostname ${v}/reward.json`,
        `ln ${dir}/guard/notes.txt ${v}/reward.json`,
        `mkfifo ${v}/reward.json`,
        `mkdir ${v}/sub`,
        `mv ${v} ${dir}/guard/old && mkdir ${v}`,
        `mv ${dir}/guard ${dir}/guard2`,
        `mkdir ${dir}/guard/tests`,
        `chmod 777 ${v}/reward.txt && test -w ${v}/reward.txt && echo 1 > ${v}/reward.txt`,
        `python3 -c "import os; os.rename('${v}/reward.txt', '${dir}/x')"`,
      ];
      for (const attack of attacks) {
        const r = await run(shell, attack);
        assert.notEqual(r.code, 0, `${attack} succeeded`);
      }
      // Nothing changed; this process (the verifier's side) still writes there.
      assert.equal(await Deno.readTextFile(`${v}/reward.txt`), "0\n");
      assert.deepEqual([...Deno.readDirSync(v)].map((e) => e.name), ["reward.txt"]);
      await Deno.writeTextFile(`${v}/reward.txt`, "0.5\n");
      // The rest stays the agent's: its root, an existing file on the way, /dev.
      const ok = await run(
        shell,
        `echo 42 > answer.txt && echo note > ${dir}/guard/notes.txt && ` +
          // /dev is the agent's too (/dev/shm, where Python's multiprocessing makes its files).
          "t=$(mktemp -p /dev/shm) && rm $t && echo x > /dev/null",
      );
      assert.equal(ok.code, 0, ok.out);
      assert.equal(await Deno.readTextFile(`${dir}/root/answer.txt`), "42\n");
      // Only entries directly in a directory on the way cannot be made.
      const made = await run(shell, `touch ${dir}/guard/new`);
      assert.notEqual(made.code, 0);
    });
  },
});

test({
  name:
    "addWorkspace({ protect }) holds for a process the agent left running, in a session of its own, after its command ended",
  needs: [ROOT_USER, LANDLOCK],
  fn: async () => {
    await withGuarded({}, async (shell, dir) => {
      const v = `${dir}/guard/verifier`;
      const script = `${dir}/root/leftover.sh`;
      await Deno.writeTextFile(
        script,
        `for i in $(seq 1 100); do echo 1 > ${v}/reward.txt 2>/dev/null && echo wrote > ${dir}/root/wrote; sleep 0.02; done; echo done > ${dir}/root/done\n`,
      );
      const r = await run(shell, `setsid sh ${script} > /dev/null 2>&1 < /dev/null & echo $!`);
      assert.equal(r.code, 0, r.out);
      // It runs on after its command (lifetime "workspace"), as under docker exec.
      const deadline = Date.now() + 10_000;
      while (Date.now() < deadline) {
        try {
          await Deno.stat(`${dir}/root/done`);
          break;
        } catch {
          await new Promise((r) => setTimeout(r, 50));
        }
      }
      assert.equal(await Deno.readTextFile(`${dir}/root/done`), "done\n");
      await assert.rejects(Deno.stat(`${dir}/root/wrote`), Deno.errors.NotFound);
      assert.equal(await Deno.readTextFile(`${v}/reward.txt`), "0\n");
    });
  },
});

test({
  name:
    "addWorkspace({ protect }) keeps root's commands from reading this process's memory and files through /proc",
  needs: [ROOT_USER, LANDLOCK],
  fn: async () => {
    const probe = `(exec 3< /proc/${Deno.pid}/mem) 2>/dev/null && echo mem; ` +
      `ls /proc/${Deno.pid}/root/ > /dev/null 2>&1 && echo root; echo done`;
    // Unprotected, root opens them (same uid, its capabilities kept)...
    await withGuarded({ protect: [] }, async (shell) => {
      assert.equal((await run(shell, probe)).out, "mem\nroot\ndone\n");
    });
    // ...protected, it does not (its environment stays readable: SECURITY.md).
    await withGuarded({}, async (shell) => {
      assert.equal((await run(shell, probe)).out, "done\n");
    });
  },
});

test("addWorkspace() refuses protect in one line: a relative path, or a sandbox", () => {
  const env = new Environment("protect-bad");
  assert.throws(
    () => addWorkspace(env, "/tmp", { isolation: "none", protect: ["logs"] }),
    /^TypeError: Cannot add workspace: Cannot protect "logs": give an absolute path/,
  );
  assert.throws(
    () => addWorkspace(env, "/tmp", { isolation: "none", protect: ["/a/../b"] }),
    /Cannot protect "\/a\/\.\.\/b"/,
  );
  assert.throws(
    () => addWorkspace(env, "/tmp", { protect: ["/logs"] }),
    /^RangeError: Cannot add workspace: protect needs isolation "none"/,
  );
});

test("landlockGrants() grants every sibling on the way to each protected path, and nothing under it", () => {
  const tree: Record<string, string[]> = {
    "/": ["bin", "logs", "tests", "tmp", "file"],
    "/logs": ["agent", "verifier", "x.txt"],
  };
  const fs = {
    names: (d: string) => {
      if (!(d in tree)) throw new Deno.errors.NotFound(d);
      return tree[d];
    },
    isDirectory: (p: string) => !p.endsWith(".txt") && p !== "/file",
    realPath: (p: string) => p,
  };
  assert.deepEqual(landlockGrants(["/logs/verifier", "/tests/"], fs), [
    { path: "/bin", directory: true },
    { path: "/file", directory: false },
    { path: "/tmp", directory: true },
    { path: "/logs/agent", directory: true },
    { path: "/logs/x.txt", directory: false },
  ]);
  // Links: none to a protected path, to a directory on the way or to nowhere; one elsewhere is
  // granted where it leads.
  const links: Record<string, string | null> = {
    "/bin": "/usr/bin",
    "/tmp": "/logs/verifier/x",
    "/file": "/",
    "/logs/agent": null,
  };
  assert.deepEqual(
    landlockGrants(["/logs/verifier", "/tests"], {
      ...fs,
      realPath: (p) => p in links ? links[p] : p,
    }).map((g) => g.path),
    ["/bin", "/logs/x.txt"],
  );
  // A protected path whose parent is not there yet: only / is on the way.
  assert.deepEqual(landlockGrants(["/nowhere/p"], fs).map((g) => g.path), [
    "/bin",
    "/file",
    "/logs",
    "/tests",
    "/tmp",
  ]);
});
