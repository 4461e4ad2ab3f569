// Our client against OpenSSH's sshd, started on a loopback port with its own
// config and keys.

import assert from "node:assert/strict";
import { generateSshKeyPair, SshClient, SshHostKeyError } from "../../ssh/mod.ts";
import { bigData, CIPHERS, HAVE_SSHD, MACS, sha256Hex, startSshd } from "./_util.ts";

Deno.test({
  name: "SshClient talks to OpenSSH's sshd",
  // Developers without sshd skip this; CI installs it, so there it must run.
  ignore: !HAVE_SSHD && Deno.env.get("CI") !== "true",
  async fn(t) {
    await using sshd = await startSshd("RekeyLimit 1M");
    const base = {
      port: sshd.port,
      user: sshd.user,
      hostPubkey: sshd.host.publicKey,
      privateKey: sshd.client.privateKey,
    };
    await using client = await SshClient.connect(base);

    await t.step("runs a command with its exit code and stderr apart", async () => {
      const r = await client.exec("echo out; echo err >&2; exit 7");
      assert.equal(r.code, 7);
      assert.equal(r.stdoutText, "out\n");
      assert.equal(r.stderrText, "err\n");
      assert.equal(r.signal, null);
    });

    await t.step("pipes stdin in", async () => {
      const r = await client.exec("tr a-z A-Z", { stdin: "hello stdin\n" });
      assert.equal(r.stdoutText, "HELLO STDIN\n");
    });

    await t.step("moves 16 MiB each way intact across server rekeys", async () => {
      const data = bigData();
      const path = `${sshd.dir}/big.bin`;
      await Deno.writeFile(path, data);
      const out = await client.exec(`cat ${path}`);
      assert.equal(out.stdout.length, data.length);
      assert.equal(await sha256Hex(out.stdout), await sha256Hex(data));
      const inn = await client.exec("sha256sum", { stdin: data });
      assert.equal(inn.stdoutText.slice(0, 64), await sha256Hex(data));
    });

    await t.step("rekeys itself after its own limit", async () => {
      await using c = await SshClient.connect({ ...base, rekeyLimit: 512 * 1024 });
      const data = bigData(4 * 1024 * 1024);
      const r = await c.exec("cat", { stdin: data });
      assert.equal(await sha256Hex(r.stdout), await sha256Hex(data));
    });

    await t.step("runs 20 commands in parallel on one connection", async () => {
      const runs = await Promise.all(
        Array.from({ length: 20 }, (_, i) => client.exec(`echo ${i}; exit ${i}`)),
      );
      runs.forEach((r, i) => {
        assert.equal(r.code, i);
        assert.equal(r.stdoutText, `${i}\n`);
      });
    });

    await t.step("works with each cipher and MAC forced", async () => {
      const data = bigData(512 * 1024);
      for (const cipher of CIPHERS) {
        for (const mac of MACS) {
          await using c = await SshClient.connect({ ...base, ciphers: [cipher], macs: [mac] });
          const r = await c.exec("cat; echo done >&2", { stdin: data });
          assert.equal(r.stderrText, "done\n", `${cipher} ${mac}`);
          assert.equal(await sha256Hex(r.stdout), await sha256Hex(data), `${cipher} ${mac}`);
        }
      }
    });

    await t.step("reads, writes and lists files", async () => {
      const dir = `${sshd.dir}/files`;
      await Deno.mkdir(dir);
      await client.writeText(`${dir}/a.txt`, "héllo\n");
      await Deno.mkdir(`${dir}/sub`);
      assert.equal(await client.readText(`${dir}/a.txt`), "héllo\n");
      const list = await client.listDir(dir);
      assert.deepEqual(list.map((e) => [e.name, e.isFile, e.isDirectory]), [
        ["a.txt", true, false],
        ["sub", false, true],
      ]);
    });

    await t.step("reports a signal death", async () => {
      const r = await client.exec("kill -TERM $$");
      assert.equal(r.signal, "TERM");
      assert.equal(r.code, -1);
    });

    await t.step("refuses the wrong host key", async () => {
      const other = await generateSshKeyPair();
      await assert.rejects(
        SshClient.connect({ ...base, hostPubkey: other.publicKey }),
        SshHostKeyError,
      );
    });
  },
});
