// What an agent's commands can reach in a workspace: the sandbox's promises,
// checked for each mechanism this machine has.

import { test, withCounterparts } from "../_test.ts";
import { BWRAP, CURL, ROOT_USER, SANDBOX, UNSHARE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { connect } from "../../client.ts";
import { Environment } from "../../env.ts";
import { bind } from "../../server.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace, type Workspace, type WorkspaceOptions } from "../../workspace/workspace.ts";

const IS_ROOT = Deno.uid() === 0;
const DEFAULT_PATH_FOR_TESTS = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** Starts a workspace on a fresh root; `run` gets a logged-in client. */
async function withWorkspace(
  options: WorkspaceOptions,
  run: (shell: SshClient, root: string, env: Environment, workspace: Workspace) => Promise<void>,
): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "ws-sandbox-" });
  const env = new Environment("sandbox-test");
  const workspace = addWorkspace(env, root, { trackFiles: false, ...options });
  await env.start();
  try {
    await using shell = SshClient.fromBinding(env.capability("shell")!);
    await run(shell, root, env, workspace);
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
}

async function sh(shell: SshClient, command: string): Promise<string> {
  const r = await shell.exec(command, { timeout: 20_000 });
  return r.stdoutText;
}

/** The mechanism's counterpart: the one each test of a mechanism needs. */
const MECHANISM = { bwrap: BWRAP, unshare: UNSHARE } as const;

for (const isolation of ["bwrap", "unshare"] as const) {
  test(`addWorkspace() isolation "${isolation}" confines commands`, {
    needs: [MECHANISM[isolation]],
  }, async (t) => {
    const secret = `hud-secret-${crypto.randomUUID()}`;
    Deno.env.set("HUD_SANDBOX_TEST_SECRET", secret);
    const outside = await Deno.makeTempDir({ prefix: "ws-outside-" });
    await Deno.chmod(outside, 0o777);
    try {
      await withWorkspace({ isolation }, async (shell, root, env, workspace) => {
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
          // The test runner is `deno test`; none of its processes shows (the
          // sandbox's own command line names the deno it shows SFTP).
          assert.doesNotMatch(out, /deno test/, out);
          assert.doesNotMatch(await sh(shell, "ps -e -o args="), /deno test/);
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

        await t.step(withCounterparts({
          name: "runs as a uid of its own, with the root's files its own",
          fn: async () => {
            const uid = workspace.uid!;
            assert.ok(uid >= 59000 && uid <= 59999, `uid ${uid}`);
            assert.equal(await sh(shell, "id -u; id -g; id -G"), `${uid}\n${uid}\n${uid}\n`);
            // Named, as scp, git and whoami need.
            assert.equal(await sh(shell, "whoami; id -gn"), "agent\nagent\n");
            await Deno.writeTextFile(`${root}/given`, "x");
            await Deno.chown(`${root}/given`, uid, uid);
            assert.equal(await sh(shell, "echo y >> given && cat given"), "xy\n");
            assert.equal(
              await sh(shell, "cat /root/.profile /etc/shadow 2>/dev/null; echo $?"),
              "1\n",
            );
          },
        }, [ROOT_USER]));

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
          assert.equal(ran, `${workspace.uid ?? Deno.uid()}\n`, "who ran the planted files");
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

test("addWorkspace() runs nothing one episode plants in HOME in the next", {
  needs: [SANDBOX],
}, async () => {
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

test('addWorkspace() isolation "none" says so in the binding and in one warning', async () => {
  const warnings: string[] = [];
  await withWorkspace(
    { isolation: "none", onError: (e) => warnings.push(String(e)) },
    async (shell, _root, env) => {
      assert.equal(env.capability("shell")!.params.isolation, "none");
      assert.equal(await sh(shell, "echo ok"), "ok\n");
    },
  );
  // Said once; where this machine cannot have a limit (no writable cgroup in a
  // container), the workspace says that too, apart.
  const unconfined = warnings.filter((w) => /without a sandbox \(isolation: "none"\)/.test(w));
  assert.equal(unconfined.length, 1, JSON.stringify(warnings));
  const rest = warnings.filter((w) => !unconfined.includes(w));
  assert.ok(rest.every((w) => /is not limited: /.test(w)), JSON.stringify(rest));
});

test("addWorkspace() network: true keeps the host's loopback", {
  needs: [BWRAP],
}, async () => {
  await withWorkspace({ network: true }, async (shell, _root, env) => {
    const port = new URL(env.capability("shell")!.url).port;
    const out = await sh(shell, `(echo > /dev/tcp/127.0.0.1/${port}) 2>/dev/null && echo reached`);
    assert.equal(out, "reached\n");
  });
});

test("addWorkspace() uid: 0 keeps root, without capabilities", {
  needs: [ROOT_USER, BWRAP],
}, async () => {
  await withWorkspace({ uid: 0 }, async (shell) => {
    const out = await sh(shell, "id -u; grep CapEff /proc/self/status; touch /etc/x 2>&1 || :");
    assert.match(out, /^0\nCapEff:\s+0+\n.*Read-only file system/s);
  });
});

test("addWorkspace() gives the agent no file outside the root through a hard link", {
  needs: [ROOT_USER, BWRAP],
}, async () => {
  // A root-owned file outside, hard-linked into the root before the
  // workspace starts (the sandbox refuses to make such a link): neither the
  // start nor a command's hand-over of root's files may give it away.
  const outside = await Deno.makeTempDir({ prefix: "ws-outside-" });
  await Deno.writeTextFile(`${outside}/config`, "root's\n", { mode: 0o644 });
  try {
    await withWorkspace({}, async (shell, root, _env, workspace) => {
      await Deno.link(`${outside}/config`, `${root}/config`);
      await Deno.writeTextFile(`${root}/added`, "added\n");
      const out = await sh(shell, "stat -c '%n %u' added config; echo x >> config || echo refused");
      assert.equal(out, `added ${workspace.uid}\nconfig 0\nrefused\n`);
    });
    const restarted = new Environment("sandbox-test");
    const root = await Deno.makeTempDir({ prefix: "ws-sandbox-" });
    await Deno.link(`${outside}/config`, `${root}/config`);
    addWorkspace(restarted, root, { trackFiles: false });
    await restarted.start();
    await restarted.stop();
    await Deno.remove(root, { recursive: true });
    const info = await Deno.stat(`${outside}/config`);
    assert.deepEqual([info.uid, info.gid], [0, 0]);
    assert.equal(await Deno.readTextFile(`${outside}/config`), "root's\n");
  } finally {
    await Deno.remove(outside, { recursive: true });
  }
});

test("addWorkspace() refuses to start when no sandbox works", async () => {
  // An empty PATH hides bwrap and unshare from the probe, in a process of its
  // own: this process's other test files (deno test --parallel) keep theirs.
  const empty = await Deno.makeTempDir({ prefix: "ws-nopath-" });
  try {
    const url = (path: string) => JSON.stringify(new URL(path, import.meta.url).href);
    const script = [
      `import { Environment } from ${url("../../env.ts")};`,
      `import { addWorkspace } from ${url("../../workspace/mod.ts")};`,
      `const env = new Environment("refuses");`,
      `addWorkspace(env, ${JSON.stringify(empty)}, { trackFiles: false, uid: 0 });`,
      `await env.start().then(() => console.log("started"), (e) => console.log(e.message));`,
      `await env.stop();`,
    ].join("\n");
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", "--no-lock", script],
      env: { PATH: empty, NO_COLOR: "1" },
      stdin: "null",
      signal: AbortSignal.timeout(30_000),
    }).output();
    const text = new TextDecoder();
    assert.match(
      text.decode(out.stdout),
      /no sandbox works here .*isolation: "none"/,
      text.decode(out.stderr),
    );
  } finally {
    await Deno.remove(empty, { recursive: true });
  }
  assert.throws(
    () => addWorkspace(new Environment("x"), "/tmp", { isolation: "jail" as "none" }),
    RangeError,
  );
});

for (const isolation of ["bwrap", "unshare"] as const) {
  test(
    `addWorkspace() isolation "${isolation}" reaches no host unix socket and shows its own /sys`,
    { needs: [ROOT_USER, CURL, MECHANISM[isolation]] },
    async () => {
      // A root-owned, world-writable socket outside /tmp (as /run/docker.sock
      // or a database's would be), answering anyone who connects.
      const dir = await Deno.makeTempDir({ dir: "/var/tmp", prefix: "hud-sock-" });
      await Deno.chmod(dir, 0o755);
      const path = `${dir}/open.sock`;
      const listener = Deno.listen({ transport: "unix", path });
      await Deno.chmod(path, 0o666);
      let reached = 0;
      const serving = (async () => {
        for await (const conn of listener) {
          reached++;
          // curl sends its request first; answering before reading it loses the answer.
          await conn.read(new Uint8Array(4096)).catch(() => null);
          await conn.write(
            new TextEncoder().encode("HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nreached"),
          ).catch(() => {});
          conn.close();
        }
      })();
      try {
        // Control: the host reaches it.
        const host = await new Deno.Command("curl", {
          args: ["-s", "-m", "5", "--unix-socket", path, "http://x/"],
        }).output();
        assert.equal(new TextDecoder().decode(host.stdout), "reached");
        await withWorkspace({ isolation }, async (shell) => {
          const out = await sh(
            shell,
            `curl -s -m 5 --unix-socket ${path} http://x/; echo; ` +
              "for s in /run/docker.sock /var/run/docker.sock /run/dbus/system_bus_socket; do " +
              '[ -e "$s" ] && echo "sees $s"; done; ' +
              'ls /sys/fs/cgroup /sys/class/net 2>/dev/null | head -n 3; echo "mounts $(wc -l < /proc/mounts)"; echo done',
          );
          assert.doesNotMatch(out, /reached|sees |cgroup|eth|lo\n/, out);
          assert.match(out, /done\n$/);
        });
        assert.equal(reached, 1, "only the host's own connection came");
      } finally {
        listener.close();
        await serving.catch(() => {});
        await Deno.remove(dir, { recursive: true });
      }
    },
  );
}

test("addWorkspace() limits processes, memory, /tmp and file size per workspace", {
  needs: [ROOT_USER, BWRAP],
}, async (t) => {
  const MiB = 1024 * 1024;
  const limits = { processes: 64, memory: 256 * MiB, tmpSize: 32 * MiB, fileSize: 16 * MiB };
  await withWorkspace({ limits }, async (shell) => {
    await t.step("processes", async () => {
      // python, not bash: bash retries a failed fork for 15 s.
      const out = await sh(
        shell,
        `python3 -c '
import os, time
n = 0
try:
    for i in range(100):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)'`,
      );
      assert.ok(Number(out) < 64, `started ${out.trim()} of 100 under a limit of 64`);
    });
    await t.step("/tmp", async () => {
      const out = await sh(shell, "head -c 48M /dev/zero > /tmp/big 2>/dev/null; du -m /tmp/big");
      assert.ok(parseInt(out) <= 32, `/tmp holds ${out.trim()} MiB under a size of 32`);
    });
    await t.step("file size", async () => {
      const r = await shell.exec("head -c 24M /dev/zero > ~/big; stat -c %s ~/big", {
        timeout: 20_000,
      });
      assert.ok(Number(r.stdoutText) <= 16 * MiB, `a file of ${r.stdoutText.trim()} bytes`);
    });
    await t.step("memory", async () => {
      const r = await shell.exec(`python3 -c 'b = b"x" * (512 << 20); print("allocated")'`, {
        timeout: 20_000,
      });
      assert.doesNotMatch(r.stdoutText, /allocated/);
    });
  });
});

test(
  "addWorkspace() a fork bomb or a 20 GiB write in one workspace leaves the server and the others answering",
  { needs: [ROOT_USER, BWRAP] },
  async (t) => {
    const roots = [
      await Deno.makeTempDir({ prefix: "ws-bomb-" }),
      await Deno.makeTempDir({ prefix: "ws-other-" }),
    ];
    const envs = roots.map((_, i) => new Environment(`episode-${i}`));
    const workspaces = envs.map((env, i) => addWorkspace(env, roots[i], { trackFiles: false }));
    await Promise.all(envs.map((env) => env.start()));
    try {
      const [a, b] = workspaces;
      assert.notEqual(a.uid, b.uid, "each workspace has a uid of its own");
      await using server = bind(envs[0]);
      await using shellA = SshClient.fromBinding(envs[0].capability("shell")!);
      await using shellB = SshClient.fromBinding(envs[1].capability("shell")!);
      const answering = async () => {
        assert.equal(await sh(shellB, "echo ok"), "ok\n", "the other workspace answers");
        await using client = await connect(server, { readyTimeout: 20_000 });
        assert.equal(client.manifest.env.name, "episode-0", "the control server answers");
        assert.deepEqual(await client.listTasks(), []);
      };

      await t.step("a fork bomb", async () => {
        const bomb = shellA.exec("b() { b | b & }; b; sleep 60", { timeout: 5000 }).catch((e) => e);
        await new Promise((r) => setTimeout(r, 2000));
        await answering();
        await bomb;
        // Once the killed bomb's processes are reaped (a moment for a thousand).
        let back = "";
        for (let i = 0; i < 40 && back !== "back\n"; i++) {
          back = await sh(shellA, "echo back");
          if (back !== "back\n") await new Promise((r) => setTimeout(r, 500));
        }
        assert.equal(back, "back\n", "the bombed workspace recovers");
      });

      await t.step("a 20 GiB write into /tmp", async () => {
        const out = await sh(
          shellA,
          "head -c 20G /dev/zero > /tmp/big; echo status $?; du -m /tmp/big | cut -f1",
        );
        const [status, mib] = out.trim().split("\n");
        assert.notEqual(status, "status 0");
        assert.ok(Number(mib) <= 1024, `/tmp took ${mib} MiB`);
        await answering();
      });
    } finally {
      await Promise.all(envs.map((env) => env.stop()));
      for (const root of roots) await Deno.remove(root, { recursive: true });
    }
  },
);

/** A user that is not root, for running a workspace's server as one. */
const OTHER_UID = 58777;

/** Runs tests/fixtures/workspace_probe.ts under `wrapper` (argv before deno). */
async function probe(
  wrapper: string[],
  root: string,
  command: string,
  env: Record<string, string>,
): Promise<{ stdout?: string; error?: string }> {
  const fixture = new URL("../fixtures/workspace_probe.ts", import.meta.url).pathname;
  const out = await new Deno.Command(wrapper[0], {
    args: [...wrapper.slice(1), Deno.execPath(), "run", "-A", "--no-lock", fixture, root, command],
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(120_000),
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  assert.equal(out.code, 0, text + new TextDecoder().decode(out.stderr));
  return JSON.parse(text.split("\n").pop()!);
}

test("addWorkspace() run by an ordinary user reaches none of that user's own sockets", {
  needs: [ROOT_USER, BWRAP, CURL],
}, async () => {
  // The server's user holds a 0600 socket outside /tmp (as D-Bus, systemd
  // --user or ssh-agent would); the agent's commands run as that user too.
  const dir = await Deno.makeTempDir({ dir: "/var/tmp", prefix: "hud-usersock-" });
  const home = await Deno.makeTempDir({ prefix: "hud-user-home-" });
  const root = await Deno.makeTempDir({ prefix: "ws-user-" });
  for (const d of [dir, home, root]) await Deno.chown(d, OTHER_UID, OTHER_UID);
  await Deno.chmod(dir, 0o700);
  const path = `${dir}/agent.sock`;
  const listener = Deno.listen({ transport: "unix", path });
  await Deno.chown(path, OTHER_UID, OTHER_UID);
  await Deno.chmod(path, 0o600);
  let reached = 0;
  const serving = (async () => {
    for await (const conn of listener) {
      reached++;
      conn.close();
    }
  })();
  try {
    const r = await probe(
      ["setpriv", `--reuid=${OTHER_UID}`, `--regid=${OTHER_UID}`, "--clear-groups"],
      root,
      `curl -s -m 5 --unix-socket ${path} http://x/; echo "curl $?"; id -u`,
      { PATH: DEFAULT_PATH_FOR_TESTS, HOME: home, DENO_DIR: `${home}/deno` },
    );
    assert.equal(r.error, undefined, r.error);
    assert.match(r.stdout!, new RegExp(`^curl [1-9]\\d*\\n${OTHER_UID}\\n$`), r.stdout);
    assert.equal(reached, 0, "the sandbox connected to the user's socket");
  } finally {
    listener.close();
    await serving.catch(() => {});
    for (const d of [dir, home, root]) await Deno.remove(d, { recursive: true });
  }
});

test("addWorkspace() without user namespaces refuses in one line that names the way out", {
  needs: [ROOT_USER, UNSHARE],
}, async () => {
  // A user namespace that may make exactly one more, spent on the one this
  // probe runs in as an ordinary user: bwrap and unshare can make none.
  const root = await Deno.makeTempDir({ prefix: "ws-nouserns-" });
  try {
    const r = await probe(
      [
        "unshare",
        "--user",
        "--map-root-user",
        "--",
        "sh",
        "-c",
        `echo 1 > /proc/sys/user/max_user_namespaces && exec unshare --user --map-user=${OTHER_UID} --map-group=${OTHER_UID} -- "$@"`,
        "hud-nouserns",
      ],
      root,
      "true",
      {
        PATH: DEFAULT_PATH_FOR_TESTS,
        HOME: Deno.env.get("HOME")!,
        DENO_DIR: Deno.env.get("DENO_DIR")!,
      },
    );
    assert.equal(r.stdout, undefined);
    assert.match(
      r.error!,
      /^Cannot start workspace: no sandbox works here: this user may not create user namespaces \(.*\); run as root, allow unprivileged user namespaces .*, or set isolation: "none" to run commands unconfined$/,
    );
    assert.doesNotMatch(r.error!, /\n/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test(
  "chooseSandbox() as root where user namespaces are refused (a container) says so, not 'install bubblewrap'",
  {
    needs: [ROOT_USER, UNSHARE],
  },
  async () => {
    // Root in a user namespace that may make none (as root in a container whose
    // seccomp profile refuses them): the mechanisms installed all fail.
    const dir = await Deno.makeTempDir({ prefix: "ws-rootnouserns-" });
    const sandbox = new URL("../../workspace/_sandbox.ts", import.meta.url).href;
    const script = `import { chooseSandbox } from ${JSON.stringify(sandbox)};
const dir = Deno.args[0];
const base = { writable: [dir], network: false, user: null };
await chooseSandbox("auto", base, dir, { what: "workspace", runs: "commands" }).then(
  () => console.log("made one"),
  (e) => console.log(e.message),
);`;
    try {
      const out = await new Deno.Command("unshare", {
        args: [
          "--user",
          "--map-root-user",
          "--",
          "sh",
          "-c",
          'echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --bounding-set -sys_admin -- "$@"',
          "hud-rootnouserns",
          Deno.execPath(),
          "eval",
          "--no-lock",
          script,
          dir,
        ],
        env: { PATH: DEFAULT_PATH_FOR_TESTS, NO_COLOR: "1" },
        stdout: "piped",
        stderr: "piped",
        signal: AbortSignal.timeout(60_000),
      }).output();
      const said = new TextDecoder().decode(out.stdout).trim();
      assert.equal(out.code, 0, said + new TextDecoder().decode(out.stderr));
      assert.match(
        said,
        /^Cannot start workspace: no sandbox works here: user namespaces are not allowed here \(bwrap: .*; unshare: .*\); run it where they are \(.*ContainerRuntime.*seccomp profile.*\), or set isolation: "none" to run commands unconfined$/,
      );
      assert.doesNotMatch(said, /install bubblewrap/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

test(
  "chooseSandbox() probes each shape of sandbox once: a later one of the same shape is not run again",
  {
    needs: [BWRAP],
  },
  async () => {
    const { chooseSandbox } = await import("../../workspace/_sandbox.ts");
    const subject = { what: "workspace", runs: "commands" };
    const dir = await Deno.makeTempDir({ prefix: "ws-probe-" });
    const other = await Deno.makeTempDir({ prefix: "ws-probe-other-" });
    // A shape of its own (a mount no other test makes), so that no other
    // file's sandbox was probed for it first.
    const dest = `/run/hud-probe-${crypto.randomUUID()}`;
    const base = (w: string) => ({
      writable: [w],
      mounts: [{ src: w, dest }],
      network: false,
      user: null,
    });
    try {
      const first = await chooseSandbox("bwrap", base(dir), dir, subject);
      assert.equal(first.isolation, "bwrap");
      // A probe now would fail: its working directory is gone. Another
      // episode's paths, same shape: the mechanism is known, nothing runs.
      await Deno.remove(other);
      const again = await chooseSandbox("bwrap", base(other), other, subject);
      assert.equal(again.isolation, "bwrap");
      assert.deepEqual(again.writable, [other]);
      // Sandboxes of a new shape starting at once share one probe: the first's.
      const shape = (w: string) => ({ ...base(w), mounts: [{ src: w, dest: `${dest}-wave` }] });
      const wave = await Promise.all([
        chooseSandbox("bwrap", shape(dir), dir, subject),
        ...Array.from({ length: 4 }, () => chooseSandbox("bwrap", shape(other), other, subject)),
      ]);
      assert.deepEqual(wave.map((c) => c.isolation), Array(5).fill("bwrap"));
      // Another shape (one more mount) is probed, and fails here.
      const more = {
        ...base(other),
        mounts: [...base(other).mounts, { src: dir, dest: `${dest}-2` }],
      };
      await assert.rejects(chooseSandbox("bwrap", more, other, subject), /no sandbox works here/);
    } finally {
      await Deno.remove(dir, { recursive: true });
      await Deno.remove(other, { recursive: true }).catch(() => {});
    }
  },
);

test("findProgram() looks again where a program it found is gone, and finds it where it is now", async () => {
  const a = await Deno.makeTempDir({ prefix: "ws-path-a-" });
  const b = await Deno.makeTempDir({ prefix: "ws-path-b-" });
  // In a process of its own: PATH is this process's, read by other test files.
  const sandbox = JSON.stringify(new URL("../../workspace/_sandbox.ts", import.meta.url).href);
  const script = `import { findProgram } from ${sandbox};
const [a, b] = Deno.args;
Deno.env.set("PATH", a + ":" + b + ":/usr/bin:/bin");
const make = (p) => Deno.writeTextFileSync(p, "#!/bin/sh\\n", { mode: 0o755 });
const seen = [];
make(b + "/hud-prog");
seen.push(findProgram("hud-prog"), findProgram("hud-prog"));
Deno.removeSync(b + "/hud-prog");
seen.push(findProgram("hud-prog"));
make(a + "/hud-prog");
seen.push(findProgram("hud-prog"));
Deno.writeTextFileSync(a + "/hud-prog", "x", { mode: 0o644 });
Deno.chmodSync(a + "/hud-prog", 0o644);
seen.push(findProgram("hud-prog"));
console.log(JSON.stringify(seen));`;
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", "--no-lock", script, a, b],
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(30_000),
    }).output();
    const text = new TextDecoder();
    assert.equal(out.code, 0, text.decode(out.stderr));
    assert.deepEqual(JSON.parse(text.decode(out.stdout)), [
      `${b}/hud-prog`,
      `${b}/hud-prog`,
      null,
      `${a}/hud-prog`,
      null,
    ]);
  } finally {
    await Deno.remove(a, { recursive: true });
    await Deno.remove(b, { recursive: true });
  }
});
