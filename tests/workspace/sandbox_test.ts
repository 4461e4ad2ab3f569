// What an agent's commands can reach in a workspace: the sandbox's promises,
// checked for each mechanism this machine has.

import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace, type WorkspaceOptions } from "../../workspace/workspace.ts";

const IS_ROOT = Deno.uid() === 0;

function installed(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

/** Starts a workspace on a fresh root; `run` gets a logged-in client. */
async function withWorkspace(
  options: WorkspaceOptions,
  run: (shell: SshClient, root: string, env: Environment) => Promise<void>,
): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "ws-sandbox-" });
  const env = new Environment("sandbox-test");
  addWorkspace(env, root, { trackFiles: false, ...options });
  await env.start();
  try {
    await using shell = SshClient.fromBinding(env.capability("shell")!);
    await run(shell, root, env);
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
}

async function sh(shell: SshClient, command: string): Promise<string> {
  const r = await shell.exec(command, { timeout: 20_000 });
  return r.stdoutText;
}

for (
  const isolation of [
    ...(installed("/usr/bin/bwrap") ? ["bwrap" as const] : []),
    ...(installed("/usr/bin/unshare") ? ["unshare" as const] : []),
  ]
) {
  Deno.test(`addWorkspace() isolation "${isolation}" confines commands`, async (t) => {
    const secret = `hud-secret-${crypto.randomUUID()}`;
    Deno.env.set("HUD_SANDBOX_TEST_SECRET", secret);
    const outside = await Deno.makeTempDir({ prefix: "ws-outside-" });
    await Deno.chmod(outside, 0o777);
    try {
      await withWorkspace({ isolation }, async (shell, root, env) => {
        assert.equal(env.capability("shell")!.params.isolation, isolation);

        await t.step("the server's environment stays unreadable", async () => {
          const out = await sh(
            shell,
            `cat /proc/${Deno.pid}/environ 2>/dev/null; tr '\\0' '\\n' </proc/$PPID/environ 2>/dev/null; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' <"$f"; done 2>/dev/null; echo done`,
          );
          assert.match(out, /done\n$/);
          assert.doesNotMatch(out, new RegExp(secret));
        });

        await t.step("the server's process is invisible", async () => {
          const out = await sh(
            shell,
            `for p in /proc/[0-9]*; do echo "$(basename $p) $(tr '\\0' ' ' <$p/cmdline)"; done 2>/dev/null; echo done`,
          );
          assert.match(out, /done\n$/);
          // The test runner is deno; none of its processes shows.
          assert.doesNotMatch(out, /deno/, out);
          assert.doesNotMatch(await sh(shell, "ps -e -o comm="), /deno/);
        });

        await t.step("writes reach only the root and HOME", async () => {
          const out = await sh(
            shell,
            [
              `touch ${outside}/x 2>/dev/null && echo outside`,
              "touch /etc/hud-sandbox-test 2>/dev/null && echo etc",
              "touch /tmp/hud-sandbox-private && echo tmp",
              "touch in-root && echo root",
              "touch ~/in-home && echo home",
              "echo done",
            ].join("; "),
          );
          assert.equal(out, "tmp\nroot\nhome\ndone\n");
          await assert.rejects(Deno.stat(`${outside}/x`), Deno.errors.NotFound);
          await assert.rejects(Deno.stat("/etc/hud-sandbox-test"), Deno.errors.NotFound);
          await assert.rejects(Deno.stat("/tmp/hud-sandbox-private"), Deno.errors.NotFound);
          assert.ok((await Deno.stat(`${root}/in-root`)).isFile);
        });

        if (IS_ROOT) {
          await t.step("runs as nobody, with the root's files its own", async () => {
            assert.equal(await sh(shell, "id -u; id -g; id -G"), "65534\n65534\n65534\n");
            await Deno.writeTextFile(`${root}/given`, "x");
            await Deno.chown(`${root}/given`, 65534, 65534);
            assert.equal(await sh(shell, "echo y >> given && cat given"), "xy\n");
            assert.equal(
              await sh(shell, "cat /root/.profile /etc/shadow 2>/dev/null; echo $?"),
              "1\n",
            );
          });
        }

        await t.step("client-sent variables reach only the command", async () => {
          // BASH_ENV, PATH and LD_PRELOAD from the client must not steer the
          // sandbox's own tools, which start as root.
          const log = `${root}/ran-as`;
          await sh(
            shell,
            `mkdir -p bin; for p in env chown setpriv bash mount; do printf '#!/bin/sh\\nid -u >> ${log}\\n' > bin/$p; chmod +x bin/$p; done; printf 'id -u >> ${log}\\n' > evil.sh`,
          );
          const r = await shell.exec("true", {
            timeout: 20_000,
            env: { BASH_ENV: `${root}/evil.sh`, PATH: `${root}/bin:/usr/bin:/bin` },
          });
          assert.equal(r.code, 0, r.stderrText);
          const ran = await Deno.readTextFile(log).catch(() => "");
          assert.equal(ran, `${IS_ROOT ? 65534 : Deno.uid()}\n`, "who ran the planted files");
        });

        await t.step("has no network by default", async () => {
          const port = new URL(env.capability("shell")!.url).port;
          const out = await sh(
            shell,
            `(echo > /dev/tcp/127.0.0.1/${port}) 2>/dev/null && echo reached; echo done`,
          );
          assert.equal(out, "done\n");
        });

        await t.step("killing a command ends what it started, even in a new session", async () => {
          const mark = String(900 + Math.floor(Math.random() * 99));
          await assert.rejects(
            shell.exec(`setsid sleep ${mark}.5 </dev/null >/dev/null 2>&1 & sleep ${mark}.5`, {
              timeout: 1000,
            }),
          );
          const alive = () =>
            [...Deno.readDirSync("/proc")].filter((e) => /^\d+$/.test(e.name)).some((e) => {
              try {
                return Deno.readTextFileSync(`/proc/${e.name}/cmdline`) === `sleep\0${mark}.5\0`;
              } catch {
                return false;
              }
            });
          const deadline = Date.now() + 5000;
          while (alive() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
          assert.equal(alive(), false, `"sleep ${mark}.5" still runs 5 s after the kill`);
        });
      });
    } finally {
      Deno.env.delete("HUD_SANDBOX_TEST_SECRET");
      await Deno.remove(outside, { recursive: true });
    }
  });
}

Deno.test("addWorkspace() runs nothing one episode plants in HOME in the next", async () => {
  // Point this process's HOME at a scratch directory: an unsandboxed server
  // would hand it to commands, and `bash -l` would run its profile.
  const scratch = await Deno.makeTempDir({ prefix: "ws-home-" });
  if (IS_ROOT) await Deno.chown(scratch, 65534, 65534);
  const saved = Deno.env.get("HOME");
  Deno.env.set("HOME", scratch);
  const plant =
    `for f in ~/.bash_profile ~/.bashrc ~/.profile; do echo 'echo PLANTED' >> "$f"; done; echo $HOME`;
  try {
    const homes: string[] = [];
    const root = await Deno.makeTempDir({ prefix: "ws-sandbox-" });
    const env = new Environment("episodes");
    addWorkspace(env, root, { trackFiles: false });
    for (let episode = 0; episode < 2; episode++) {
      await env.start();
      try {
        await using shell = SshClient.fromBinding(env.capability("shell")!);
        assert.equal(await sh(shell, "echo clean"), "clean\n", `episode ${episode}`);
        const shell2 = await shell.exec("echo clean", { timeout: 20_000 });
        assert.equal(shell2.stdoutText, "clean\n");
        homes.push((await sh(shell, plant)).trim());
        assert.equal(await sh(shell, "echo clean"), "clean\n", `episode ${episode} after planting`);
      } finally {
        await env.stop();
      }
    }
    await Deno.remove(root, { recursive: true });
    assert.notEqual(homes[0], scratch);
    assert.notEqual(homes[0], homes[1]);
    await assert.rejects(Deno.stat(homes[0]), Deno.errors.NotFound);
  } finally {
    if (saved === undefined) Deno.env.delete("HOME");
    else Deno.env.set("HOME", saved);
    await Deno.remove(scratch, { recursive: true });
  }
});

Deno.test('addWorkspace() isolation "none" says so in the binding and in one warning', async () => {
  const warnings: string[] = [];
  await withWorkspace(
    { isolation: "none", onError: (e) => warnings.push(String(e)) },
    async (shell, _root, env) => {
      assert.equal(env.capability("shell")!.params.isolation, "none");
      assert.equal(await sh(shell, "echo ok"), "ok\n");
    },
  );
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /without a sandbox \(isolation: "none"\)/);
});

Deno.test("addWorkspace() network: true keeps the host's loopback", {
  ignore: !installed("/usr/bin/bwrap"),
}, async () => {
  await withWorkspace({ network: true }, async (shell, _root, env) => {
    const port = new URL(env.capability("shell")!.url).port;
    const out = await sh(shell, `(echo > /dev/tcp/127.0.0.1/${port}) 2>/dev/null && echo reached`);
    assert.equal(out, "reached\n");
  });
});

Deno.test("addWorkspace() uid: 0 keeps root, without capabilities", {
  ignore: !IS_ROOT || !installed("/usr/bin/bwrap"),
}, async () => {
  await withWorkspace({ uid: 0 }, async (shell) => {
    const out = await sh(shell, "id -u; grep CapEff /proc/self/status; touch /etc/x 2>&1 || :");
    assert.match(out, /^0\nCapEff:\s+0+\n.*Read-only file system/s);
  });
});

Deno.test("addWorkspace() refuses to start when no sandbox works", async () => {
  // An empty PATH hides bwrap and unshare from the probe.
  const saved = Deno.env.get("PATH");
  const empty = await Deno.makeTempDir({ prefix: "ws-nopath-" });
  Deno.env.set("PATH", empty);
  try {
    const env = new Environment("refuses");
    addWorkspace(env, empty, { trackFiles: false, uid: 0 });
    await assert.rejects(env.start(), /no sandbox works here .*isolation: "none"/);
    await env.stop();
  } finally {
    if (saved !== undefined) Deno.env.set("PATH", saved);
    await Deno.remove(empty, { recursive: true });
  }
  assert.throws(
    () => addWorkspace(new Environment("x"), "/tmp", { isolation: "jail" as "none" }),
    RangeError,
  );
});
