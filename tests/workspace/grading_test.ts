// Workspace.exec and grading(): checks run in the workspace's sandbox, as
// the agent's user, while the agent's processes are stopped, with files the
// agent never saw. The contract graders depend on (PLAN.md) is checked
// field by field.

import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import { waitingFor } from "../_deadline.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { bashGrader, combine } from "../../graders/mod.ts";
import { SshClient } from "../../ssh/mod.ts";
import {
  addWorkspace,
  type Workspace,
  type WorkspaceExecOptions,
} from "../../workspace/workspace.ts";
import { describeExit, type ExitStatus } from "../../_internal/exit.ts";

const IS_ROOT = Deno.uid() === 0;

async function withWorkspace(
  fn: (ws: Workspace, shell: SshClient, root: string) => Promise<void>,
): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "ws-grade-" });
  const env = new Environment("grading-test");
  const ws = addWorkspace(env, root, { trackFiles: false });
  await env.start();
  try {
    await using shell = SshClient.fromBinding(env.capability("shell")!);
    await fn(ws, shell, root);
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
}

test("Workspace.exec() runs a check in the sandbox and reports it per the contract", {
  needs: [SANDBOX],
}, async (t) => {
  await withWorkspace(async (ws, shell, root) => {
    await t.step("code, stdout, stderr, stdin, env, cwd", async () => {
      await Deno.mkdir(`${root}/sub`);
      const r = await ws.exec([
        "bash",
        "-c",
        'read x; echo "$x $MARK $(pwd)"; echo err >&2; exit 3',
      ], {
        cwd: `${root}/sub`,
        stdin: "in",
        env: { MARK: "m" },
        timeout: 20_000,
      });
      assert.deepEqual(
        {
          code: r.code,
          signal: r.signal,
          stdout: r.stdout,
          stderr: r.stderr,
          timedOut: r.timedOut,
        },
        { code: 3, signal: null, stdout: `in m ${root}/sub\n`, stderr: "err\n", timedOut: false },
      );
      assert.ok(typeof r.durationMs === "number" && r.durationMs >= 0);
    });

    await t.step("as the agent's user, in the agent's sandbox", async () => {
      const agent = (await shell.exec("id -u")).stdoutText.trim();
      const r = await ws.exec([
        "bash",
        "-c",
        "id -u; [ -e /run/docker.sock ] && echo host-socket; (echo > /dev/tcp/127.0.0.1/22) 2>/dev/null && echo net; echo done",
      ], { timeout: 20_000 });
      assert.equal(r.stdout, `${agent}\ndone\n`);
      if (IS_ROOT) assert.equal(agent, String(ws.uid));
    });

    await t.step("a timeout kills the whole command", async () => {
      const mark = String(800 + Math.floor(Math.random() * 99));
      const r = await ws.exec(["bash", "-c", `setsid sleep ${mark}.25 & sleep ${mark}.25`], {
        timeout: 500,
      });
      assert.equal(r.timedOut, true);
      assert.equal(r.code, null);
      assert.equal(r.signal, "SIGKILL");
      const alive = [...Deno.readDirSync("/proc")].some((e) => {
        try {
          return Deno.readTextFileSync(`/proc/${e.name}/cmdline`) === `sleep\0${mark}.25\0`;
        } catch {
          return false;
        }
      });
      assert.equal(alive, false);
    });

    await t.step("hidden files: read-only, only for this command", async () => {
      const r = await ws.exec([
        "bash",
        "-c",
        'cat "$HUD_GRADER_FILES/tests/t.txt"; echo x > "$HUD_GRADER_FILES/tests/t.txt" 2>/dev/null || echo read-only',
      ], { files: { "tests/t.txt": "hidden\n" }, timeout: 20_000 });
      assert.equal(r.stdout, "hidden\nread-only\n");
      const seen = await shell.exec("ls /grader 2>&1; ls -d /tmp/hud-grade-* 2>/dev/null | wc -l");
      assert.match(seen.stdoutText, /No such file or directory\n0\n$/);
    });

    await t.step("a fresh HOME, whatever the agent planted in its own", async () => {
      await shell.exec(
        "echo 'echo PLANTED' > ~/.bashrc; cp ~/.bashrc ~/.profile; mkdir -p ~/.config; echo x > ~/.config/mark",
      );
      const r = await ws.exec(["bash", "-lc", 'echo "$HOME"; ls -A "$HOME" | wc -l'], {
        timeout: 20_000,
      });
      const [home, count] = r.stdout.trim().split("\n");
      assert.notEqual(home, (await shell.exec("printf %s $HOME")).stdoutText);
      assert.equal(count, "0");
      assert.doesNotMatch(r.stdout, /PLANTED/);
    });

    await t.step("bad arguments", async () => {
      await assert.rejects(ws.exec([]), TypeError);
      await assert.rejects(ws.exec(["true"], { cwd: "/etc" }), RangeError);
      await assert.rejects(ws.exec(["true"], { files: { "../x": "y" } }), TypeError);
      await assert.rejects(ws.exec(["true"], { timeout: 0 }), RangeError);
      // The name before 0.1.0: refused, not ignored (a ten-minute default instead of 5 s).
      const old = { timeoutMs: 5000 } as WorkspaceExecOptions;
      await assert.rejects(ws.exec(["true"], old), {
        name: "TypeError",
        message: 'Cannot run in workspace "shell": option "timeoutMs" is now "timeout"',
      });
    });
  });
});

test("Workspace.exec() and SshClient.exec() say alike that a signal ended a command", async () => {
  // Unsandboxed, so that the command itself is killed: under bubblewrap or
  // unshare the sandbox's own process exits 137 for it, both ways alike.
  const root = await Deno.makeTempDir({ prefix: "ws-grade-" });
  const env = new Environment("grading-test");
  const ws = addWorkspace(env, root, { trackFiles: false, isolation: "none" });
  await env.start();
  try {
    await using shell = SshClient.fromBinding(env.capability("shell")!);
    const here = await ws.exec(["bash", "-c", "kill -KILL $$"], { timeout: 20_000 });
    const there = await shell.exec("kill -KILL $$");
    const exit = (s: ExitStatus) => ({ code: s.code, signal: s.signal, said: describeExit(s) });
    assert.deepEqual(exit(here), { code: null, signal: "SIGKILL", said: "signal SIGKILL" });
    assert.deepEqual(exit(there), exit(here));
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
});

test("Workspace.grading() stops the agent's processes: a lingering one cannot race the check", {
  needs: [SANDBOX],
}, async () => {
  await withWorkspace(async (ws, shell, root) => {
    // The agent leaves a loop rewriting the file the check reads.
    const stop = new AbortController();
    const loop = shell.exec("while :; do echo hacked > f; done", { signal: stop.signal })
      .catch(() => null);
    try {
      const deadline = Date.now() + 20_000;
      while (await Deno.readTextFile(`${root}/f`).catch(() => "") !== "hacked\n") {
        assert.ok(Date.now() < deadline, "the agent's loop never wrote");
        await new Promise((r) => setTimeout(r, 20));
      }
      {
        await using phase = await ws.grading();
        // A command the agent asks for now waits for the phase to end.
        const late = shell.exec("echo late > late.txt");
        late.catch(() => {}); // awaited below; a failed assertion must not leave it unhandled
        const r = await phase.exec(
          [
            "bash",
            "-c",
            'for i in $(seq 50); do echo good > f; sleep 0.01; [ "$(cat f)" = good ] || { echo raced; exit 1; }; done; ls',
          ],
          { timeout: 30_000 },
        );
        assert.equal(r.code, 0, r.stdout + r.stderr);
        assert.doesNotMatch(r.stdout, /late\.txt/);
        await phase.end();
        assert.equal((await late).code, 0);
      }
      // The agent runs again.
      assert.equal(await Deno.readTextFile(`${root}/late.txt`), "late\n");
      while (await Deno.readTextFile(`${root}/f`).catch(() => "") !== "hacked\n") {
        assert.ok(Date.now() < deadline, "the agent's loop did not resume");
        await new Promise((r) => setTimeout(r, 20));
      }
    } finally {
      stop.abort();
      await loop;
    }
  });
});

test("Workspace.exec(): an agent's command aborted while a check holds it settles, killed", {
  needs: [SANDBOX],
}, async () => {
  await withWorkspace(async (ws, shell, root) => {
    for (let i = 0; i < 3; i++) {
      // Asked for as the check starts: the workspace holds it until the check ends.
      const stop = new AbortController();
      const loop = shell.exec("while :; do date +%s%N > tick; sleep 0.01; done", {
        signal: stop.signal,
      }).then(() => "ended", (e) => e.name);
      await ws.exec(["true"], { timeout: 20_000 });
      stop.abort();
      // It hung here: the abort came while the exec request waited, and no abort event followed.
      assert.equal(await waitingFor("the aborted command", loop), "AbortError");
    }
    const tick = await Deno.readTextFile(`${root}/tick`).catch(() => "");
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(await Deno.readTextFile(`${root}/tick`).catch(() => ""), tick, "it still runs");
  });
});

test("Workspace.exec() refuses before start and after stop", { needs: [SANDBOX] }, async () => {
  const root = await Deno.makeTempDir({ prefix: "ws-grade-" });
  try {
    const env = new Environment("grading-test");
    const ws = addWorkspace(env, root, { trackFiles: false });
    await assert.rejects(ws.exec(["true"]), /Cannot grade in workspace "shell": it is not started/);
    assert.equal(ws.isolation, null);
    await env.start();
    assert.notEqual(ws.isolation, null);
    await env.stop();
    await assert.rejects(ws.exec(["true"]), /not started/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("Workspace is an ExecTarget: graders' bashGrader and combine run in its sandbox", {
  needs: [SANDBOX],
}, async () => {
  await withWorkspace(async (ws, shell) => {
    await shell.exec("echo 42 > answer.txt");
    // combine() runs its graders at once: each opens a grading phase.
    const grade = await combine([
      bashGrader(ws, 'test "$(cat answer.txt)" = 42', { name: "answer", timeout: 20_000 }),
      bashGrader(ws, ["bash", "-c", 'test "$(id -u)" = "$0"', String(ws.uid ?? Deno.uid())], {
        name: "uid",
        timeout: 20_000,
      }),
      bashGrader(ws, "touch /etc/x", { name: "escape", weight: -1, timeout: 20_000 }),
    ]);
    assert.equal(grade.score, 1, JSON.stringify(grade.info));
    assert.deepEqual(grade.subscores, { answer: 1, uid: 1, escape: 0 });
  });
});

test(
  "Workspace.spawn() starts a long-lived process on the agent's side: sandboxed, stopped while grading, killed at stop",
  { needs: [SANDBOX] },
  async () => {
    const extra = await Deno.makeTempDir({ prefix: "ws-spawn-extra-" });
    await Deno.writeTextFile(`${extra}/tool.txt`, "tool\n");
    await Deno.chmod(extra, 0o755);
    let pid = 0;
    try {
      await withWorkspace(async (ws, _shell, root) => {
        const child = await ws.spawn(
          [
            "bash",
            "-c",
            'cat "$1/tool.txt"; id -u; while :; do date +%s%N > tick; sleep 0.01; done',
            "x",
            extra,
          ],
          { mounts: [extra] },
        );
        pid = child.pid;
        const reader = child.stdout.getReader();
        let out = "";
        while (out.split("\n").length < 3) {
          const { value, done } = await reader.read();
          if (done) break;
          out += new TextDecoder().decode(value);
        }
        reader.releaseLock();
        assert.equal(out, `tool\n${ws.uid ?? Deno.uid()}\n`);
        const tick = () => Deno.readTextFile(`${root}/tick`).catch(() => "");
        await using phase = await ws.grading();
        const before = await tick();
        await new Promise((r) => setTimeout(r, 300));
        assert.equal(await tick(), before, "it ticked while the agent was stopped");
        await phase.end();
        const deadline = Date.now() + 10_000;
        while (await tick() === before) {
          assert.ok(Date.now() < deadline, "it did not resume");
          await new Promise((r) => setTimeout(r, 20));
        }
        await child.stdin.close().catch(() => {});
        child.stdout.cancel().catch(() => {});
        child.stderr.cancel().catch(() => {});
        // env.stop() kills it.
        void child.status;
      });
      let gone = false;
      try {
        Deno.kill(pid, "SIGCONT");
      } catch {
        gone = true;
      }
      assert.ok(gone, "still running after stop");
    } finally {
      await Deno.remove(extra, { recursive: true });
    }
  },
);

test(
  "bashGrader({ files }) brings hidden tests in for the check alone: an agent can neither read nor pre-plant them",
  {
    needs: [SANDBOX],
  },
  async (t) => {
    const marker = `hidden-${crypto.randomUUID()}`;
    // The hidden test: passes only for the right fix, and says so with a marker
    // the agent must never see.
    const hidden = {
      "tests/test_fix.sh": `# ${marker}\ngrep -qx fixed answer.txt && echo "${marker} passed"\n`,
    };
    const check = (ws: Workspace) =>
      bashGrader(ws, 'bash "$HUD_GRADER_FILES/tests/test_fix.sh"', {
        name: "hidden",
        files: hidden,
        timeout: 20_000,
      });
    await withWorkspace(async (ws, shell, root) => {
      await t.step("an agent that looks for them, and plants its own in their place", async () => {
        const looked = await shell.exec(
          [
            "ls -la /grader 2>&1",
            'echo "files=$HUD_GRADER_FILES"',
            "find / \\( -path /proc -o -path /sys -o -path /usr \\) -prune -o -name '*test_fix*' -print 2>/dev/null",
            // What a naive check would run, planted: in the root, in HOME's login files, on PATH.
            "mkdir -p tests bin && printf 'exit 0\\n' > tests/test_fix.sh",
            `printf 'export HUD_GRADER_FILES=${root}\\n' | tee -a ~/.profile ~/.bash_profile >/dev/null`,
            "printf '#!/bin/sh\\nexit 0\\n' > bin/bash && chmod +x bin/bash",
            "echo wrong > answer.txt",
          ].join("; "),
          { timeout: 20_000 },
        );
        assert.doesNotMatch(looked.stdoutText + looked.stderrText, new RegExp(marker));
        assert.match(
          looked.stdoutText,
          /^ls: cannot access '\/grader': No such file or directory$/m,
        );
        assert.match(looked.stdoutText, /^files=$/m);
        // A loop that would copy them out while the check runs (it is stopped meanwhile).
        const stop = new AbortController();
        const loop = shell.exec(
          'while :; do cp -r /grader "$HUD_GRADER_FILES" stolen 2>/dev/null; ls -d /grader* /tmp/hud-grade-* >> seen 2>/dev/null; sleep 0.01; done',
          { signal: stop.signal },
        ).catch(() => null);
        try {
          const s = await check(ws);
          assert.equal(s.value, 0, JSON.stringify(s.info));
          assert.deepEqual(s.info?.files, ["tests/test_fix.sh"]);
          assert.equal(s.info?.exit_code, 1, "the hidden test ran, not the planted one");
        } finally {
          stop.abort();
          await loop;
        }
        const left = await shell.exec(
          `cat stolen/* seen 2>/dev/null; grep -rl ${marker} . ~ 2>/dev/null`,
        );
        assert.doesNotMatch(
          left.stdoutText,
          new RegExp(marker),
          "the hidden test reached the agent",
        );
        await assert.rejects(Deno.stat(`${root}/stolen`), Deno.errors.NotFound);
      });
      await t.step("the right fix passes the hidden test", async () => {
        await shell.exec("rm -rf tests bin answer.txt && echo fixed > answer.txt");
        const s = await check(ws);
        assert.equal(s.value, 1, JSON.stringify(s.info));
        assert.match(String(s.info?.stdout), new RegExp(`^${marker} passed$`, "m"));
      });
    });
  },
);

test("Workspace.grading(): commands at once each get their own hidden files and HOME", {
  needs: [SANDBOX],
}, async () => {
  await withWorkspace(async (ws) => {
    await using phase = await ws.grading();
    // The first takes the grading sandbox made ahead; the other must not share it.
    const check = (mark: string) =>
      phase.exec([
        "bash",
        "-c",
        'ls "$HUD_GRADER_FILES"; ls -A "$HOME"; echo x > "$HOME/$MARK"; sleep 0.3; ls -A "$HOME"',
      ], { files: { [`${mark}.txt`]: mark }, env: { MARK: mark }, timeout: 20_000 });
    const [a, b] = await Promise.all([check("a"), check("b")]);
    assert.equal(a.stdout, "a.txt\na\n", a.stderr);
    assert.equal(b.stdout, "b.txt\nb\n", b.stderr);
  });
});
