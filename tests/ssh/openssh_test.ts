// OpenSSH's ssh client against our server, logging in with the key the
// workspace publishes.

import { test } from "../_test.ts";
import { OPENSSH_CLIENT, SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { generateSshKeyPair } from "../../ssh/mod.ts";
import { addWorkspace } from "../../workspace/workspace.ts";
import { bigData, CIPHERS, MACS, runSsh, sha256Hex } from "./_util.ts";

test(
  "addWorkspace() serves OpenSSH's ssh client",
  { needs: [SANDBOX, OPENSSH_CLIENT] },
  async (t) => {
    const root = await Deno.makeTempDir({ prefix: "ws-openssh-" });
    const home = await Deno.makeTempDir({ prefix: "ws-home-" });
    const env = new Environment("openssh-test");
    // A bare HOME keeps the login shell quick and predictable.
    addWorkspace(env, root, { env: { HOME: home, WS_VAR: "from-workspace" } });
    Deno.env.set("HUD_SSH_TEST_SECRET", "leak");
    await env.start();
    try {
      const cap = env.capability("shell")!;
      assert.equal(cap.protocol, "ssh/2");
      const port = Number(new URL(cap.url).port);
      const keyPath = cap.params.client_key_path as string;
      const knownHosts = `${home}/known_hosts`;
      await Deno.writeTextFile(knownHosts, `[127.0.0.1]:${port} ${cap.params.host_pubkey}\n`);
      const ssh = { port, key: keyPath, knownHosts };

      await t.step("runs a command with its exit code and stderr apart", async () => {
        const r = await runSsh(ssh, ["echo out; echo err >&2; pwd; exit 7"]);
        assert.equal(r.code, 7);
        assert.equal(new TextDecoder().decode(r.stdout), `out\n${root}\n`);
        assert.equal(r.stderr, "err\n");
      });

      await t.step("gives a clean environment plus the workspace's", async () => {
        const r = await runSsh(ssh, ["-o", "SetEnv=SENT=by-client", "env"]);
        const text = new TextDecoder().decode(r.stdout);
        assert.match(text, /^WS_VAR=from-workspace$/m);
        assert.match(text, /^SENT=by-client$/m);
        assert.match(text, /^PATH=/m);
        assert.doesNotMatch(text, /HUD_SSH_TEST_SECRET/);
      });

      await t.step("pipes stdin in", async () => {
        const r = await runSsh(ssh, ["tr a-z A-Z"], "hello stdin\n");
        assert.equal(r.code, 0);
        assert.equal(new TextDecoder().decode(r.stdout), "HELLO STDIN\n");
      });

      await t.step("streams 16 MiB of output intact, and 16 MiB of input", async () => {
        const data = bigData();
        await Deno.writeFile(`${root}/big.bin`, data);
        const out = await runSsh(ssh, ["cat big.bin"]);
        assert.equal(out.code, 0);
        assert.equal(out.stdout.length, data.length);
        assert.equal(await sha256Hex(out.stdout), await sha256Hex(data));
        const inn = await runSsh(ssh, ["sha256sum"], data);
        assert.equal(new TextDecoder().decode(inn.stdout).slice(0, 64), await sha256Hex(data));
      });

      await t.step("rekeys mid-stream with RekeyLimit=1M", async () => {
        const data = bigData(8 * 1024 * 1024);
        const r = await runSsh(ssh, ["-o", "RekeyLimit=1M", "cat"], data);
        assert.equal(r.code, 0);
        assert.equal(await sha256Hex(r.stdout), await sha256Hex(data));
      });

      await t.step("runs 20 commands in parallel", async () => {
        const runs = await Promise.all(
          Array.from({ length: 20 }, (_, i) => runSsh(ssh, [`echo ${i}; exit ${i}`])),
        );
        runs.forEach((r, i) => {
          assert.equal(r.code, i);
          assert.equal(new TextDecoder().decode(r.stdout), `${i}\n`);
        });
      });

      await t.step("works with each cipher and MAC forced", async () => {
        const data = bigData(1024 * 1024);
        // The workspace offers what startSshServer() does by default: no
        // chacha20-poly1305 (clients_test.ts forces it through OpenSSH).
        for (const cipher of CIPHERS.filter((c) => !c.startsWith("chacha20"))) {
          for (const mac of MACS) {
            const r = await runSsh(ssh, ["-c", cipher, "-m", mac, "cat; echo done >&2"], data);
            assert.equal(r.code, 0, `${cipher} ${mac}: ${r.stderr}`);
            assert.equal(r.stderr, "done\n");
            assert.equal(await sha256Hex(r.stdout), await sha256Hex(data), `${cipher} ${mac}`);
          }
        }
      });

      await t.step("answers keepalives", async () => {
        const r = await runSsh(ssh, [
          "-o",
          "ServerAliveInterval=1",
          "-o",
          "ServerAliveCountMax=2",
          "sleep 3; echo alive",
        ]);
        assert.equal(r.code, 0, r.stderr);
        assert.equal(new TextDecoder().decode(r.stdout), "alive\n");
      });

      await t.step("runs a shell without a terminal", async () => {
        const sh = await runSsh(ssh, ["-T", ""], "echo from-shell; exit 3\n");
        assert.equal(sh.code, 3);
        assert.equal(new TextDecoder().decode(sh.stdout), "from-shell\n");
      });

      await t.step("gives a terminal when asked", async () => {
        const tty = await runSsh(ssh, ["-tt", "tty; echo $TERM; exit 4"]);
        assert.equal(tty.code, 4, tty.stderr);
        const lines = new TextDecoder().decode(tty.stdout).split(/\r?\n/);
        assert.match(lines[0], /^\/dev\/pts\/\d+$/);
        assert.ok(lines[1].length > 0);
      });

      await t.step("copies files both ways with scp's legacy protocol", async () => {
        const scp = (args: string[]) =>
          new Deno.Command("scp", {
            args: [
              "-O",
              "-o",
              "StrictHostKeyChecking=yes",
              "-o",
              `UserKnownHostsFile=${knownHosts}`,
              "-o",
              "BatchMode=yes",
              "-F",
              "/dev/null",
              "-i",
              keyPath,
              "-P",
              String(port),
              ...args,
            ],
            stdin: "null",
            stdout: "piped",
            stderr: "piped",
          }).output();
        const data = bigData(256 * 1024);
        await Deno.writeFile(`${home}/up.bin`, data);
        const up = await scp([`${home}/up.bin`, "agent@127.0.0.1:up.bin"]);
        assert.equal(up.code, 0, new TextDecoder().decode(up.stderr));
        assert.equal(await sha256Hex(await Deno.readFile(`${root}/up.bin`)), await sha256Hex(data));
        const down = await scp(["agent@127.0.0.1:up.bin", `${home}/down.bin`]);
        assert.equal(down.code, 0, new TextDecoder().decode(down.stderr));
        assert.equal(
          await sha256Hex(await Deno.readFile(`${home}/down.bin`)),
          await sha256Hex(data),
        );
      });

      await t.step("refuses a wrong key and a wrong user", async () => {
        const other = await generateSshKeyPair();
        const otherPath = `${home}/other_key`;
        await Deno.writeTextFile(otherPath, other.privateKey, { mode: 0o600 });
        const r = await runSsh({ ...ssh, key: otherPath }, ["echo should-not-run"]);
        assert.equal(r.code, 255);
        assert.match(r.stderr, /Permission denied/);
        const u = await runSsh({ ...ssh, user: "root" }, ["echo should-not-run"]);
        assert.equal(u.code, 255);
        assert.equal(u.stdout.length, 0);
      });
    } finally {
      Deno.env.delete("HUD_SSH_TEST_SECRET");
      await env.stop();
      await Deno.remove(root, { recursive: true });
      await Deno.remove(home, { recursive: true });
    }
  },
);
