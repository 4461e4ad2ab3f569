// SFTP in a workspace: served from inside the sandbox, as the sandbox's
// user, so it acts on the agent's files with no more privilege than the
// agent's commands have. Each test plays an agent that tries otherwise.

import { test } from "../_test.ts";
import { OPENSSH_CLIENT, ROOT_USER, SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { SshClient, SshFileError } from "../../ssh/mod.ts";
import { addWorkspace, type WorkspaceOptions } from "../../workspace/workspace.ts";
import { bigData, opensshOptions, run, sha256Hex } from "../ssh/_util.ts";

interface Ws {
  env: Environment;
  root: string;
  shell: SshClient;
  port: number;
  /** OpenSSH options: our known_hosts and the workspace's key. */
  openssh: string[];
  scratch: string;
}

async function withWorkspace(
  options: WorkspaceOptions,
  fn: (ws: Ws) => Promise<void>,
): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "ws-sftp-" });
  const scratch = await Deno.makeTempDir({ prefix: "ws-sftp-client-" });
  const env = new Environment("sftp-test");
  addWorkspace(env, root, { trackFiles: false, ...options });
  await env.start();
  try {
    const cap = env.capability("shell")!;
    const port = Number(new URL(cap.url).port);
    await Deno.writeTextFile(
      `${scratch}/known_hosts`,
      `[127.0.0.1]:${port} ${cap.params.host_pubkey}\n`,
    );
    await using shell = SshClient.fromBinding(cap);
    await fn({
      env,
      root,
      shell,
      port,
      openssh: opensshOptions(`${scratch}/known_hosts`, cap.params.client_key_path as string),
      scratch,
    });
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
    await Deno.remove(scratch, { recursive: true });
  }
}

test({
  name: "addWorkspace() SFTP cannot set owners or setuid/setgid bits",
  needs: [SANDBOX, ROOT_USER, OPENSSH_CLIENT],
  fn: async () => {
    await withWorkspace({}, async ({ root, shell, port, openssh, scratch }) => {
      // A file the agent made: its own, as the sandbox's user.
      assert.equal((await shell.exec("cp /bin/true mine; chmod 755 mine; id -u")).code, 0);
      const agentUid = (await Deno.stat(`${root}/mine`)).uid;
      assert.notEqual(agentUid, 0);
      await Deno.writeTextFile(
        `${scratch}/batch`,
        [
          "-chown 0 mine",
          "-chgrp 0 mine",
          "-chmod 4755 mine",
          "-chmod 2755 mine",
          "put /bin/true up",
        ]
          .join("\n") + "\n",
      );
      const r = await run("sftp", [
        ...openssh,
        "-P",
        String(port),
        "-b",
        `${scratch}/batch`,
        "agent@127.0.0.1",
      ]);
      assert.equal(r.code, 0, r.stderr);
      const mine = await Deno.stat(`${root}/mine`);
      assert.equal(mine.uid, agentUid, "owner changed");
      assert.equal(mine.gid !== 0, true, "group changed to 0");
      assert.equal((mine.mode ?? 0) & 0o6000, 0, `mode ${(mine.mode ?? 0).toString(8)}`);
      // What SFTP creates belongs to the agent too, not to this process.
      assert.equal((await Deno.stat(`${root}/up`)).uid, agentUid);
      await assert.rejects(
        shell.writeFile("/etc/hud-sftp-test", "x"),
        SshFileError,
        "wrote into /etc",
      );
    });
  },
});

test({
  name: "addWorkspace() SFTP cannot be raced out of the agent's reach by a symlink swap",
  needs: [SANDBOX, ROOT_USER],
  fn: async () => {
    // A root-only secret where the sandbox can see it, and a name the
    // agent's directory also holds (a decoy): the agent swaps the
    // directory for a link to /etc while SFTP reads and creates through it.
    const name = `hud-sftp-race-${crypto.randomUUID().slice(0, 8)}`;
    const secret = `/etc/${name}`;
    await Deno.writeTextFile(secret, "SECRET\n", { mode: 0o600 });
    try {
      await withWorkspace({}, async ({ shell }) => {
        const stop = new AbortController();
        const swap = shell.exec(
          `mkdir dreal && echo decoy > dreal/${name} && ln -s /etc dlink && ` +
            "while :; do mv -T dreal d; mv -T d dreal; mv -T dlink d; mv -T d dlink; done",
          { signal: stop.signal },
        ).catch(() => null);
        const seen = new Set<string>();
        try {
          // Reads and creates eight at a time, until the secret shows, or
          // 1,200 attempts have passed and one read the decoy (the race was
          // live): on the in-process server a file appeared in /etc within
          // the first few dozen. On a busy machine (other test files beside
          // this one) the swap can starve the reads, so up to 4,800 attempts
          // or 30 s.
          const deadline = Date.now() + 30_000;
          const enough = (i: number) => i >= 150 && seen.has("decoy");
          for (
            let i = 0;
            i < 600 && Date.now() < deadline && !seen.has("SECRET") && !enough(i);
            i++
          ) {
            await Promise.all(Array.from({ length: 8 }, async (_, j) => {
              try {
                seen.add((await shell.readText(`d/${name}`)).trim());
              } catch (err) {
                seen.add(err instanceof SshFileError ? `error ${err.code}` : String(err));
              }
              await shell.writeText(`d/created-${i}-${j}`, "x").catch(() => {});
            }));
          }
        } finally {
          stop.abort();
          await swap;
        }
        assert.ok(!seen.has("SECRET"), `read the root-only secret: ${[...seen].join(", ")}`);
        assert.ok(seen.has("decoy"), `the race never read the decoy: ${[...seen].join(", ")}`);
        const created = [...Deno.readDirSync("/etc")].filter((e) => e.name.startsWith("created-"));
        for (const e of created) await Deno.remove(`/etc/${e.name}`);
        assert.deepEqual(created.map((e) => e.name), [], "created files in /etc");
      });
    } finally {
      await Deno.remove(secret);
    }
  },
});

test({
  name: "addWorkspace() serves OpenSSH's sftp and scp, and SshClient's files, from the sandbox",
  needs: [SANDBOX, OPENSSH_CLIENT],
  fn: async () => {
    await withWorkspace({}, async ({ root, shell, port, openssh, scratch }) => {
      const data = bigData(4 * 1024 * 1024);
      await Deno.writeFile(`${scratch}/big.bin`, data);
      let r = await run("scp", [
        ...openssh,
        "-P",
        String(port),
        `${scratch}/big.bin`,
        "agent@127.0.0.1:big.bin",
      ]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(await sha256Hex(await Deno.readFile(`${root}/big.bin`)), await sha256Hex(data));
      r = await run("scp", [
        ...openssh,
        "-P",
        String(port),
        "agent@127.0.0.1:big.bin",
        `${scratch}/back.bin`,
      ]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(
        await sha256Hex(await Deno.readFile(`${scratch}/back.bin`)),
        await sha256Hex(data),
      );
      await Deno.writeTextFile(`${scratch}/batch`, "mkdir d\nrename big.bin d/moved.bin\nls d\n");
      r = await run("sftp", [
        ...openssh,
        "-P",
        String(port),
        "-b",
        `${scratch}/batch`,
        "agent@127.0.0.1",
      ]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /moved\.bin/);
      await shell.writeText("d/note.txt", "hello");
      assert.equal(await shell.readText(`${root}/d/note.txt`), "hello");
      assert.deepEqual((await shell.listDir("d")).map((e) => e.name), ["moved.bin", "note.txt"]);
      // The sandbox's HOME is the agent's too.
      const home = (await shell.exec('printf %s "$HOME"')).stdoutText;
      await shell.writeText(`${home}/in-home.txt`, "h");
      assert.equal((await shell.exec("cat ~/in-home.txt")).stdoutText, "h");
    });
  },
});

test("addWorkspace() has the sandboxed SFTP server in its module graph (an image built from the graph holds it)", async () => {
  const robolab = new URL("../../examples/robolab.ts", import.meta.url).pathname;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", robolab],
    stdout: "piped",
    stderr: "null",
  }).output();
  const modules = (JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string }[];
  }).modules.map((m) => m.specifier);
  for (const file of ["ssh/_sftp_main.ts", "ssh/_sftp.ts", "ssh/_wire.ts"]) {
    assert.ok(modules.some((s) => s.endsWith(`/${file}`)), `${file} is not in the graph`);
  }
});
