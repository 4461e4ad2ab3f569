// Our client against OpenSSH's sshd, started on a loopback port with its own
// config and keys.

import { test } from "../_test.ts";
import { DROPBEAR, MOUNT_NAMESPACE, SSHD } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { generateSshKeyPair, SshClient, SshFileError, SshHostKeyError } from "../../ssh/mod.ts";
import { bigData, CIPHERS, MACS, sha256Hex, startDropbear, startSshd } from "./_util.ts";

test({
  name: "SshClient talks to OpenSSH's sshd",
  needs: [SSHD],
  async fn(t) {
    await using sshd = await startSshd("RekeyLimit 1M");
    const base = {
      port: sshd.port,
      user: sshd.user,
      hostPublicKey: sshd.host.publicKey,
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
      assert.equal(r.signal, "SIGTERM");
      assert.equal(r.code, null);
    });

    await t.step("refuses the wrong host key", async () => {
      const other = await generateSshKeyPair();
      await assert.rejects(
        SshClient.connect({ ...base, hostPublicKey: other.publicKey }),
        SshHostKeyError,
      );
    });
  },
});

/** SshClient's file methods, checked against the local file system. */
async function fileRoundTrip(client: SshClient, dir: string, label: string, size: number) {
  const data = bigData(size);
  await client.writeFile(`${dir}/f.bin`, data);
  assert.equal(
    await sha256Hex(await Deno.readFile(`${dir}/f.bin`)),
    await sha256Hex(data),
    `${label}: write`,
  );
  const back = await client.readFile(`${dir}/f.bin`);
  assert.equal(await sha256Hex(back), await sha256Hex(data), `${label}: read`);
  assert.equal((await client.stat(`${dir}/f.bin`)).size, size, label);
  await client.rename(`${dir}/f.bin`, `${dir}/g.bin`);
  assert.deepEqual((await client.listDir(dir)).map((e) => [e.name, e.isFile]), [["g.bin", true]]);
  await client.remove(`${dir}/g.bin`);
  assert.deepEqual(await client.listDir(dir), [], label);
}

test({
  name: "SshClient moves files over SFTP with OpenSSH's sshd, each cipher",
  needs: [SSHD],
  async fn() {
    await using sshd = await startSshd("Subsystem sftp internal-sftp");
    const base = {
      port: sshd.port,
      user: sshd.user,
      hostPublicKey: sshd.host.publicKey,
      privateKey: sshd.client.privateKey,
    };
    const dir = `${sshd.dir}/sftp`;
    await Deno.mkdir(dir);
    {
      await using client = await SshClient.connect(base);
      await fileRoundTrip(client, dir, "default", 16 * 1024 * 1024);
      await assert.rejects(
        client.readFile(`${dir}/missing`),
        (e: Error) => e instanceof SshFileError && e.code === 2,
      );
    }
    for (const cipher of CIPHERS) {
      await using c = await SshClient.connect({ ...base, ciphers: [cipher] });
      await fileRoundTrip(c, dir, cipher, 300_000);
    }
  },
});

test({
  name: "SshClient talks to Dropbear's server, each cipher, SFTP included",
  needs: [DROPBEAR, MOUNT_NAMESPACE],
  async fn() {
    await using db = await startDropbear();
    const dir = await Deno.makeTempDir({ prefix: "dropbear-files-" });
    try {
      for (const cipher of ["chacha20-poly1305@openssh.com", "aes128-ctr", "aes256-ctr"]) {
        await using c = await SshClient.connect({
          port: db.port,
          user: db.user,
          hostPublicKey: db.host.publicKey,
          privateKey: db.client.privateKey,
          ciphers: [cipher],
        });
        const r = await c.exec("echo $((6*7)); cat >&2", { stdin: "err\n" });
        assert.equal(r.stdoutText, "42\n", cipher);
        // The login shell's rc files may add to stderr; ours comes last.
        assert.ok(r.stderrText.endsWith("err\n"), `${cipher}: ${r.stderrText}`);
        await fileRoundTrip(c, dir, cipher, 1024 * 1024);
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
