// What the SSH server and client refuse: connections that never log in,
// overlong version lines, and key files an environment names.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Capability } from "../../capability.ts";
import { generateSshKeyPair, SshClient } from "../../ssh/mod.ts";
import { startSshServer } from "../../ssh/server.ts";

const encoder = new TextEncoder();

/** Reads until EOF or `signal`; what came, and whether EOF came. */
async function readAll(
  conn: Deno.Conn,
  signal: AbortSignal,
): Promise<{ bytes: Uint8Array; eof: boolean }> {
  const chunks: Uint8Array[] = [];
  const buf = new Uint8Array(4096);
  const aborted = new Promise<null>((resolve) =>
    signal.addEventListener("abort", () => resolve(null), { once: true })
  );
  let eof = false;
  let read: Promise<number | null> | null = null;
  while (!signal.aborted) {
    read ??= conn.read(buf).catch(() => null);
    const n = await Promise.race([read, aborted]);
    if (signal.aborted) break;
    read = null;
    if (n === null) {
      eof = true;
      break;
    }
    chunks.push(buf.slice(0, n));
  }
  if (!eof) {
    conn.close(); // ends the pending read
    await read;
  }
  const bytes = new Uint8Array(chunks.reduce((a, c) => a + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  return { bytes, eof };
}

/** Bytes up to and including the first LF (the server's banner). */
function bannerLength(bytes: Uint8Array): number {
  return bytes.indexOf(10) + 1;
}

test("startSshServer() refuses a version line over 255 bytes, however it is split", async (t) => {
  const host = await generateSshKeyPair();
  await using server = startSshServer({ hostKey: host.privateKey, authorizedKeys: [] });
  const line = (total: number) => encoder.encode(`SSH-2.0-${"x".repeat(total - 10)}\r\n`);

  for (
    const [total, split, refused] of [
      [255, 0, false],
      [255, 1, false],
      [256, 0, true],
      [256, 1, true],
      [256, 7, true],
      [300, 0, true],
    ] as const
  ) {
    await t.step(
      `${total} bytes in ${split === 0 ? "one write" : `${split}-byte writes`}`,
      async () => {
        const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
        const bytes = line(total);
        assert.equal(bytes.length, total);
        try {
          if (split === 0) await conn.write(bytes);
          else {
            for (let i = 0; i < bytes.length; i += split) {
              await conn.write(bytes.subarray(i, i + split));
            }
          }
        } catch {
          // The server may close while we still write: that is a refusal.
        }
        // Accepted: the server answers with its KEXINIT and waits for ours.
        // Refused: it closes after its banner.
        const got = await readAll(conn, AbortSignal.timeout(refused ? 5000 : 1000));
        if (!got.eof) {
          assert.equal(refused, false, "the server did not close the connection within 5 s");
        } else {
          conn.close();
          assert.equal(refused, true, "the server closed an acceptable connection");
        }
        const after = got.bytes.length - bannerLength(got.bytes);
        assert.equal(after > 0, !refused, `${after} bytes after the banner`);
      },
    );
  }
});

test("startSshServer() closes a connection that sends no version line in time", async () => {
  const host = await generateSshKeyPair();
  await using server = startSshServer({
    hostKey: host.privateKey,
    authorizedKeys: [],
    versionTimeout: 300,
  });
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  const got = await readAll(conn, AbortSignal.timeout(10_000));
  assert.ok(got.eof, "the server kept a silent connection for 10 s (versionTimeout 300 ms)");
  conn.close();
  assert.throws(
    () => startSshServer({ hostKey: host.privateKey, authorizedKeys: [], versionTimeout: 0 }),
    RangeError,
  );
});

test("startSshServer() caps connections that have not logged in", async (t) => {
  const host = await generateSshKeyPair();
  const key = await generateSshKeyPair();
  const root = await Deno.makeTempDir({ prefix: "ssh-limits-" });
  const silent: Deno.Conn[] = [];
  try {
    await t.step("drops every new one past `start` at rate 100", async () => {
      await using server = startSshServer({
        hostKey: host.privateKey,
        authorizedKeys: [key.publicKey],
        cwd: root,
        maxStartups: { start: 2, rate: 100, full: 10 },
      });
      const options = {
        port: server.addr.port,
        hostPublicKey: host.publicKey,
        privateKey: key.privateKey,
      };
      // A logged-in client does not count.
      await using client = await SshClient.connect(options);
      const banner = async (conn: Deno.Conn) => {
        const buf = new Uint8Array(64);
        let timer: ReturnType<typeof setTimeout> | undefined;
        const n = await Promise.race([
          conn.read(buf),
          new Promise<null>((r) => timer = setTimeout(() => r(null), 5000)),
        ]);
        clearTimeout(timer);
        return n !== null && n > 0;
      };
      for (let i = 0; i < 2; i++) {
        const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
        silent.push(conn);
        assert.ok(await banner(conn), `silent connection ${i} got no banner`);
      }
      const third = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
      const got = await readAll(third, AbortSignal.timeout(5000));
      third.close();
      assert.deepEqual(got, { bytes: new Uint8Array(), eof: true });
      assert.equal((await client.exec("echo in")).stdoutText, "in\n");
      for (const c of silent.splice(0)) c.close();
    });

    await t.step("256 silent connections do not lock a client out", async () => {
      await using server = startSshServer({
        hostKey: host.privateKey,
        authorizedKeys: [key.publicKey],
        cwd: root,
        versionTimeout: 1000,
      });
      for (let i = 0; i < 256; i++) {
        silent.push(await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port }));
      }
      const deadline = AbortSignal.timeout(15_000);
      let lastError: unknown = null;
      let out = "";
      while (!deadline.aborted && out === "") {
        try {
          await using client = await SshClient.connect({
            port: server.addr.port,
            hostPublicKey: host.publicKey,
            privateKey: key.privateKey,
            signal: deadline,
            connectTimeout: 3000,
          });
          out = (await client.exec("echo in")).stdoutText;
        } catch (err) {
          lastError = err;
        }
      }
      assert.equal(out, "in\n", `no login within 15 s of 256 silent connections: ${lastError}`);
      for (const c of silent.splice(0)) c.close();
    });
  } finally {
    for (const c of silent) c.close();
    await Deno.remove(root, { recursive: true });
  }
  assert.throws(
    () =>
      startSshServer({
        hostKey: host.privateKey,
        authorizedKeys: [],
        maxStartups: { start: 20, rate: 30, full: 10 },
      }),
    /invalid maxStartups "20:30:10"/,
  );
});

test("SshClient.fromBinding() ignores client_key_path unless allowed", async () => {
  const host = await generateSshKeyPair();
  const key = await generateSshKeyPair();
  const other = await generateSshKeyPair();
  const root = await Deno.makeTempDir({ prefix: "ssh-binding-" });
  // The file a hostile binding names holds a key the server accepts: using
  // it would log in. The inline key is one the server refuses.
  const keyFile = `${root}/id_ed25519`;
  await Deno.writeTextFile(keyFile, key.privateKey, { mode: 0o600 });
  await using server = startSshServer({
    hostKey: host.privateKey,
    authorizedKeys: [key.publicKey],
    cwd: root,
  });
  const binding = (clientKey?: string) =>
    Capability.ssh({
      url: `ssh://127.0.0.1:${server.addr.port}`,
      hostPublicKey: host.publicKey,
      clientKey,
      clientKeyPath: keyFile,
    });
  try {
    assert.throws(() => SshClient.fromBinding(binding()), /has no client_key/);
    {
      await using shell = SshClient.fromBinding(binding(other.privateKey));
      await assert.rejects(shell.exec("true"), (e: Error) => e.name === "SshAuthError");
    }
    await using allowed = SshClient.fromBinding(binding(), { allowKeyPath: true });
    assert.equal((await allowed.exec("echo in")).stdoutText, "in\n");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
