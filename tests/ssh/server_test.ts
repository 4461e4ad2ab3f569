// Our client against our server: the interop matrix, host-key and key
// refusal, killing commands, reconnecting, and malformed input.

import { test } from "../_test.ts";
import { SCRIPT } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  generateSshKeyPair,
  SshAuthError,
  SshClient,
  SshError,
  SshFileError,
  SshHostKeyError,
  type SshKeyPair,
  sshPublicKeyOf,
} from "../../ssh/mod.ts";
import { type SshSpawner, type SshSpawnOptions, startSshServer } from "../../ssh/server.ts";
import { ClientConnection } from "../../ssh/_connection.ts";
import { Ed25519Signer, parsePrivateKey, parsePublicKey } from "../../ssh/_keys.ts";
import { MSG } from "../../ssh/_transport.ts";
import { SshWriter } from "../../ssh/_wire.ts";
import { bigData, CIPHERS, MACS, sha256Hex, TcpProxy, waitGone } from "./_util.ts";

interface Fixture extends AsyncDisposable {
  root: string;
  host: SshKeyPair;
  key: SshKeyPair;
  port: number;
  options(port?: number): {
    port: number;
    hostPublicKey: string;
    privateKey: string;
  };
}

async function fixture(
  serverOptions: { rekeyLimit?: number; ciphers?: readonly string[]; spawn?: SshSpawner } = {},
): Promise<Fixture> {
  const root = await Deno.makeTempDir({ prefix: "ssh-server-test-" });
  const host = await generateSshKeyPair();
  const key = await generateSshKeyPair();
  const errors: unknown[] = [];
  const server = startSshServer({
    hostKey: host.privateKey,
    authorizedKeys: [key.publicKey],
    cwd: root,
    env: { HOME: root },
    user: "agent",
    onError: (e) => errors.push(e),
    // Every cipher.
    ciphers: [
      "aes128-gcm@openssh.com",
      "aes256-gcm@openssh.com",
      "chacha20-poly1305@openssh.com",
      "aes128-ctr",
      "aes256-ctr",
    ],
    ...serverOptions,
  });
  return {
    root,
    host,
    key,
    port: server.addr.port,
    options: (port = server.addr.port) => ({
      port,
      hostPublicKey: host.publicKey,
      privateKey: key.privateKey,
    }),
    async [Symbol.asyncDispose]() {
      await server.shutdown();
      await Deno.remove(root, { recursive: true });
      assert.deepEqual(errors, []);
    },
  };
}

/**
 * Runs `argv` as the default spawner does, but hands the server stdout and
 * stderr as plain streams (not byte streams, so no BYOB reads), with chunks
 * split at odd sizes.
 */
function plainStreamSpawner(argv: readonly string[], o: SshSpawnOptions): Deno.ChildProcess {
  const child = new Deno.Command(argv[0], {
    args: argv.slice(1),
    cwd: o.cwd,
    env: o.env,
    clearEnv: true,
    detached: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const resplit = () =>
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        for (let i = 0; i < chunk.length; i += 5000) controller.enqueue(chunk.slice(i, i + 5000));
      },
    });
  const stdout = child.stdout.pipeThrough(resplit());
  const stderr = child.stderr.pipeThrough(resplit());
  return new Proxy(child, {
    get(target, key) {
      if (key === "stdout") return stdout;
      if (key === "stderr") return stderr;
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** Reads the pids a command printed on its first line. */
async function firstLine(stream: ReadableStream<Uint8Array>): Promise<string> {
  const reader = stream.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  return text.split("\n")[0];
}

test("SshClient and startSshServer() interoperate", async (t) => {
  await using f = await fixture({ rekeyLimit: 1024 * 1024 });
  await using client = await SshClient.connect(f.options());

  await t.step("runs commands in the root with exit codes and stderr apart", async () => {
    const r = await client.exec("pwd; echo err >&2; exit 3");
    assert.equal(r.code, 3);
    assert.equal(r.stdoutText, `${f.root}\n`);
    assert.equal(r.stderrText, "err\n");
    assert.equal(r.success, false);
  });

  await t.step("sets env requests", async () => {
    const r = await client.exec("echo $A-$B", { env: { A: "1", B: "two" } });
    assert.equal(r.stdoutText, "1-two\n");
  });

  await t.step("moves 16 MiB each way intact across rekeys", async () => {
    const data = bigData();
    const r = await client.exec("cat", { stdin: data });
    assert.equal(r.stdout.length, data.length);
    assert.equal(await sha256Hex(r.stdout), await sha256Hex(data));
  });

  await t.step("streams output with flow control", async () => {
    await using proc = await client.spawn("head -c 8388608 /dev/zero");
    let total = 0;
    for await (const chunk of proc.stdout) {
      total += chunk.length;
      if (total < 1024 * 1024) await new Promise((r) => setTimeout(r, 1)); // a slow reader
    }
    assert.equal(total, 8388608);
    assert.equal((await proc.status).code, 0);
  });

  await t.step("runs 20 commands in parallel", async () => {
    const runs = await Promise.all(
      Array.from({ length: 20 }, (_, i) => client.exec(`echo ${i}; exit ${i}`)),
    );
    runs.forEach((r, i) => assert.equal(r.stdoutText, `${i}\n`));
    runs.forEach((r, i) => assert.equal(r.code, i));
  });

  await t.step("holds stdin back for a command that reads late", async () => {
    const r = await client.exec("sleep 0.3; wc -c", { stdin: new Uint8Array(8 * 1024 * 1024) });
    assert.equal(r.stdoutText.trim(), String(8 * 1024 * 1024));
  });

  await t.step("serves 20 connections at once", async () => {
    const runs = await Promise.all(Array.from({ length: 20 }, async (_, i) => {
      await using c = await SshClient.connect(f.options());
      return (await c.exec(`echo ${i}`)).stdoutText;
    }));
    runs.forEach((out, i) => assert.equal(out, `${i}\n`));
  });

  await t.step("works with each cipher and MAC forced", async () => {
    const data = bigData(256 * 1024);
    for (const cipher of CIPHERS) {
      for (const mac of MACS) {
        await using c = await SshClient.connect({ ...f.options(), ciphers: [cipher], macs: [mac] });
        const r = await c.exec("cat", { stdin: data });
        assert.equal(await sha256Hex(r.stdout), await sha256Hex(data), `${cipher} ${mac}`);
      }
    }
  });

  await t.step("reads, writes and lists files", async () => {
    await client.writeText("a b.txt", "it's\n");
    await Deno.mkdir(`${f.root}/dir`);
    assert.equal(await client.readText("a b.txt"), "it's\n");
    assert.equal(await Deno.readTextFile(`${f.root}/a b.txt`), "it's\n");
    const names = (await client.listDir(".")).map((e) => e.name);
    assert.deepEqual(names, ["a b.txt", "dir"]);
    await assert.rejects(
      client.readText("missing.txt"),
      (e: Error) => e instanceof SshFileError && e.code === 2 && /missing\.txt/.test(e.message),
    );
  });

  await t.step("refuses a host key mismatch", async () => {
    const other = await generateSshKeyPair();
    await assert.rejects(
      SshClient.connect({ ...f.options(), hostPublicKey: other.publicKey }),
      SshHostKeyError,
    );
  });

  await t.step("is refused with an unknown key or user", async () => {
    const other = await generateSshKeyPair();
    await assert.rejects(
      SshClient.connect({ ...f.options(), privateKey: other.privateKey }),
      SshAuthError,
    );
    await assert.rejects(SshClient.connect({ ...f.options(), user: "root" }), SshAuthError);
  });

  await t.step("kills a cancelled command's process group", async () => {
    const ac = new AbortController();
    const proc = await client.spawn("sleep 60 & echo $$ $!; wait", { signal: ac.signal });
    const pids = (await firstLine(proc.stdout)).split(" ").map(Number);
    assert.equal(pids.length, 2);
    ac.abort();
    await assert.rejects(proc.status, (e: Error) => e.name === "AbortError");
    for (const pid of pids) assert.ok(await waitGone(pid), `pid ${pid} survived`);
    await proc[Symbol.asyncDispose]();
  });

  await t.step("times a command out and kills it", async () => {
    await assert.rejects(
      client.exec("sleep 30", { timeout: 200 }),
      (e: Error) => e.name === "TimeoutError",
    );
  });

  await t.step("reports a command killed by a signal", async () => {
    const r = await client.exec("kill -KILL $$");
    // As Deno and the workspace name it (SSH sends "KILL"); no exit code.
    assert.equal(r.signal, "SIGKILL");
    assert.equal(r.code, null);
    assert.equal(r.success, false);
  });
});

test("startSshServer() kills process groups when a connection drops", async (t) => {
  await using f = await fixture();

  await t.step("on a clean disconnect", async () => {
    const c = await SshClient.connect(f.options());
    const proc = await c.spawn("sleep 60 & echo $$ $!; wait");
    const pids = (await firstLine(proc.stdout)).split(" ").map(Number);
    await c.close();
    await proc.status.catch(() => {});
    for (const pid of pids) assert.ok(await waitGone(pid), `pid ${pid} survived`);
  });

  await t.step("on a dropped TCP connection, and the client reconnects", async () => {
    await using proxy = new TcpProxy(f.port);
    await using c = new SshClient(f.options(proxy.port));
    const proc = await c.spawn("sleep 60 & echo $$ $!; wait");
    const pids = (await firstLine(proc.stdout)).split(" ").map(Number);
    proxy.cut();
    await assert.rejects(proc.status, SshError);
    for (const pid of pids) assert.ok(await waitGone(pid), `pid ${pid} survived`);
    assert.equal(c.connected, false);
    const r = await c.exec("echo again");
    assert.equal(r.stdoutText, "again\n");
    assert.equal(c.connected, true);
  });
});

/** Reads one unencrypted packet's payload from a raw socket. */
async function readPlainPacket(conn: Deno.Conn, buffered: Uint8Array[]): Promise<Uint8Array> {
  const need = async (n: number) => {
    let have = buffered.reduce((a, b) => a + b.length, 0);
    while (have < n) {
      const buf = new Uint8Array(4096);
      const got = await conn.read(buf);
      if (got === null) throw new Error("eof");
      buffered.push(buf.subarray(0, got));
      have += got;
    }
    const all = new Uint8Array(have);
    let off = 0;
    for (const b of buffered) {
      all.set(b, off);
      off += b.length;
    }
    buffered.length = 0;
    buffered.push(all);
    return all;
  };
  const head = await need(4);
  const len = new DataView(head.buffer).getUint32(0);
  const all = await need(4 + len);
  buffered[0] = all.subarray(4 + len);
  const pad = all[4];
  return all.slice(5, 4 + len - pad);
}

async function readLine(conn: Deno.Conn, buffered: Uint8Array[]): Promise<string> {
  let text = "";
  const buf = new Uint8Array(1);
  while (!text.endsWith("\n")) {
    if ((await conn.read(buf)) === null) break;
    text += String.fromCharCode(buf[0]);
  }
  buffered.length = 0;
  return text;
}

async function drainToEof(conn: Deno.Conn): Promise<string> {
  const buf = new Uint8Array(4096);
  let text = "";
  try {
    while (true) {
      const n = await conn.read(buf);
      if (n === null) break;
      text += new TextDecoder().decode(buf.subarray(0, n));
    }
  } catch {
    // reset counts as closed
  }
  return text;
}

async function rawConnection(f: Fixture): Promise<ClientConnection> {
  const tcp = await Deno.connect({ hostname: "127.0.0.1", port: f.port });
  return new ClientConnection(
    tcp,
    { hostPublicKey: f.host.publicKey },
    parsePublicKey(f.host.publicKey).blob,
  );
}

test("startSshServer() ends only the connection that sends bad input", async (t) => {
  await using f = await fixture();
  // A connection with a live command that must survive everything below.
  await using bystander = await SshClient.connect(f.options());
  const live = await bystander.spawn("cat");
  const liveIn = live.stdin.getWriter();

  const disconnectReason = async (conn: ClientConnection) => {
    const err = await conn.transport.closed;
    await conn.transport.wait();
    return err instanceof SshError ? err.reason : -1;
  };

  await t.step("garbage before the banner", async () => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: f.port });
    await conn.write(new TextEncoder().encode("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    const text = await drainToEof(conn);
    conn.close();
    assert.match(text, /^SSH-2\.0-\S+\r\n/);
    assert.match(text, /Invalid SSH identification string/);
  });

  await t.step("an oversized packet after the banner", async () => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: f.port });
    const buffered: Uint8Array[] = [];
    assert.match(await readLine(conn, buffered), /^SSH-2\.0-/);
    await conn.write(new TextEncoder().encode("SSH-2.0-bad\r\n"));
    await conn.write(new Uint8Array([0x7f, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8]));
    const kexinit = await readPlainPacket(conn, buffered);
    assert.equal(kexinit[0], MSG.KEXINIT);
    const disconnect = await readPlainPacket(conn, buffered);
    assert.equal(disconnect[0], MSG.DISCONNECT);
    assert.equal(new DataView(disconnect.buffer).getUint32(1), 2);
    await drainToEof(conn);
    conn.close();
  });

  await t.step("a truncated packet", async () => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: f.port });
    await conn.write(new TextEncoder().encode("SSH-2.0-bad\r\n"));
    await conn.write(new Uint8Array([0, 0, 1, 0, 5, 20, 1, 2]));
    await conn.closeWrite();
    await drainToEof(conn);
    conn.close();
  });

  await t.step("a KEXINIT with nothing in common", async () => {
    const conn = await rawConnection(f);
    const tcp = conn.transport;
    // Drive the handshake with a cipher the server does not have.
    const bad = new ClientConnection(
      await Deno.connect({ hostname: "127.0.0.1", port: f.port }),
      { hostPublicKey: f.host.publicKey, ciphers: ["3des-cbc"] },
      parsePublicKey(f.host.publicKey).blob,
    );
    await assert.rejects(
      bad.transport.handshake(),
      (e: Error) =>
        e instanceof SshError &&
        /no common cipher algorithm \(client offers "3des-cbc", server offers "aes128-gcm@openssh\.com,/
          .test(e.message),
    );
    assert.equal(await disconnectReason(bad), 3);
    tcp.close();
    await tcp.wait();
  });

  await t.step("a MAC or tag failure", async () => {
    for (
      const cipher of ["aes128-gcm@openssh.com", "aes128-ctr", "chacha20-poly1305@openssh.com"]
    ) {
      await using proxy = new TcpProxy(f.port, { flipAt: 4000 });
      await using c = await SshClient.connect({ ...f.options(proxy.port), ciphers: [cipher] });
      await assert.rejects(c.exec("cat", { stdin: new Uint8Array(20000) }), SshError);
      assert.equal(c.connected, false);
    }
  });

  const answersUnimplemented = async (conn: ClientConnection) => {
    conn.transport.post(new Uint8Array([200, 1, 2, 3]));
    const end = Date.now() + 5000;
    while (conn.transport.peerUnimplemented.length === 0 && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(conn.transport.peerUnimplemented.length, 1, "waited for UNIMPLEMENTED");
    assert.equal(conn.transport.isClosed, false);
  };

  await t.step("an unknown message before login: UNIMPLEMENTED, and it goes on", async () => {
    const conn = await rawConnection(f);
    await conn.transport.handshake();
    await answersUnimplemented(conn);
    conn.transport.close();
    await conn.transport.wait();
  });

  await t.step("a channel message before login", async () => {
    const conn = await rawConnection(f);
    await conn.transport.handshake();
    conn.transport.post(
      new SshWriter().byte(MSG.CHANNEL_OPEN).string("session").uint32(0).uint32(1 << 20)
        .uint32(32768).bytes(),
    );
    assert.equal(await disconnectReason(conn), 2);
  });

  const signer = await Ed25519Signer.fromParsed(parsePrivateKey(f.key.privateKey));
  assert.equal(sshPublicKeyOf(f.key.privateKey), f.key.publicKey);

  await t.step("an unknown message after login: UNIMPLEMENTED, and it goes on", async () => {
    const conn = await rawConnection(f);
    await conn.login("agent", signer);
    await answersUnimplemented(conn);
    const ch = await conn.mux.open("session", {
      onData() {},
      onEof() {},
      onClose() {},
      onRequest: () => false,
    });
    ch.close();
    await ch.closed;
    conn.transport.close();
    await conn.transport.wait();
  });

  await t.step("an unexpected channel id", async () => {
    const conn = await rawConnection(f);
    await conn.login("agent", signer);
    conn.transport.post(new SshWriter().byte(MSG.CHANNEL_DATA).uint32(77).string("x").bytes());
    assert.equal(await disconnectReason(conn), 2);
  });

  await t.step("a truncated message", async () => {
    const conn = await rawConnection(f);
    await conn.login("agent", signer);
    conn.transport.post(new Uint8Array([MSG.CHANNEL_OPEN, 0, 0, 0, 50, 1]));
    assert.equal(await disconnectReason(conn), 2);
  });

  await t.step("too many failed logins", async () => {
    const other = await Ed25519Signer.fromParsed(
      parsePrivateKey((await generateSshKeyPair()).privateKey),
    );
    const conn = await rawConnection(f);
    await conn.transport.handshake();
    conn.transport.post(new SshWriter().byte(MSG.SERVICE_REQUEST).string("ssh-userauth").bytes());
    const sid = conn.transport.sessionId;
    for (let i = 0; i < 8; i++) {
      const signed = new SshWriter().string(sid).byte(MSG.USERAUTH_REQUEST).string("agent")
        .string("ssh-connection").string("publickey").boolean(true).string("ssh-ed25519")
        .string(other.blob).bytes().slice();
      const sig = await other.sign(signed);
      conn.transport.post(
        new SshWriter().raw(signed.subarray(4 + sid.length)).string(sig).bytes().slice(),
      );
    }
    assert.equal(await disconnectReason(conn), 14);
  });

  await t.step("random bytes after the banner, fifty times", async () => {
    let seed = 12345;
    const random = () => (seed = (seed * 1103515245 + 12345) >>> 0) & 0xff;
    await Promise.all(Array.from({ length: 50 }, async (_, i) => {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: f.port });
      const junk = Uint8Array.from({ length: 64 + i * 16 }, random);
      await conn.write(new TextEncoder().encode("SSH-2.0-fuzz\r\n"));
      await conn.write(junk).catch(() => {});
      await conn.closeWrite().catch(() => {});
      await drainToEof(conn);
      conn.close();
    }));
  });

  await t.step("then a healthy connection still works, and so does the bystander", async () => {
    await using c = await SshClient.connect(f.options());
    assert.equal((await c.exec("echo fine")).stdoutText, "fine\n");
    await liveIn.write(new TextEncoder().encode("still here\n"));
    await liveIn.close();
    const reader = live.stdout.getReader();
    let text = "";
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    assert.equal(text, "still here\n");
    assert.equal((await live.status).code, 0);
  });
});

test("startSshServer() drops a connection that does not log in in time", async () => {
  const host = await generateSshKeyPair();
  await using server = startSshServer({
    hostKey: host.privateKey,
    authorizedKeys: [],
    loginGraceTime: 200,
  });
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
  const started = Date.now();
  const text = await drainToEof(conn);
  conn.close();
  assert.match(text, /^SSH-2\.0-/);
  assert.ok(Date.now() - started < 5000);
});

test("SshClient.connect() honours an aborted signal", async () => {
  await using f = await fixture();
  await assert.rejects(
    SshClient.connect({ ...f.options(), signal: AbortSignal.abort() }),
    (e: Error) => e.name === "AbortError",
  );
});

test("SshClient gives up after three connection attempts", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  listener.close(); // nothing listens there now
  const host = await generateSshKeyPair();
  const key = await generateSshKeyPair();
  const started = Date.now();
  await assert.rejects(
    SshClient.connect({ port, hostPublicKey: host.publicKey, privateKey: key.privateKey }),
    (e: Error) => e instanceof SshError && /three times/.test(e.message),
  );
  // Two backoff pauses (100 ms and 400 ms) lie between the three tries.
  assert.ok(Date.now() - started >= 500);
});

test("SshClient reports a failed negotiation at once, naming both lists", async () => {
  await using f = await fixture();
  await assert.rejects(
    SshClient.connect({ ...f.options(), ciphers: ["3des-cbc"] }),
    (e: Error) =>
      e instanceof SshError && e.reason === 3 && !/three times/.test(e.message) &&
      /client offers "3des-cbc", server offers "[^"]*chacha20-poly1305@openssh\.com/.test(
        e.message,
      ),
  );
});

test("startSshServer() sends a spawner's plain (not byte) streams intact", async () => {
  await using f = await fixture({ spawn: plainStreamSpawner });
  await using client = await SshClient.connect(f.options());
  const data = bigData(3 * 1024 * 1024 + 4).subarray(3); // not a whole number of packets
  const r = await client.exec("cat; echo err >&2", { stdin: data });
  assert.equal(r.stdout.length, data.length);
  assert.equal(await sha256Hex(r.stdout), await sha256Hex(data));
  assert.equal(r.stderrText, "err\n");
});

test("startSshServer() offers chacha20-poly1305 first, and checks cipher names", async () => {
  await using f = await fixture({ ciphers: undefined });
  await assert.rejects(
    SshClient.connect({ ...f.options(), ciphers: ["aes192-ctr"] }),
    (e: Error) =>
      e instanceof SshError &&
      /server offers "chacha20-poly1305@openssh\.com,aes128-gcm@openssh\.com,aes256-gcm@openssh\.com,aes128-ctr,aes256-ctr"/
        .test(e.message),
  );
  await using client = await SshClient.connect({
    ...f.options(),
    ciphers: ["chacha20-poly1305@openssh.com"],
  });
  assert.equal(new TextDecoder().decode((await client.exec("echo hi")).stdout), "hi\n");
  const host = await generateSshKeyPair();
  assert.throws(
    () => startSshServer({ hostKey: host.privateKey, authorizedKeys: [], ciphers: ["3des-cbc"] }),
    /^RangeError: Cannot start SSH server: unknown cipher "3des-cbc" \(known: /,
  );
  assert.throws(
    () => startSshServer({ hostKey: host.privateKey, authorizedKeys: [], ciphers: [] }),
    TypeError,
  );
});

test("SshClient.spawn() with a pty, resized while it runs", { needs: [SCRIPT] }, async () => {
  await using f = await fixture();
  await using client = await SshClient.connect(f.options());
  await using proc = await client.spawn(
    "trap 'stty size; exit 0' WINCH; stty size; echo ready; " +
      "for i in $(seq 100); do sleep 0.1; done; echo no-resize",
    { pty: { cols: 100, rows: 30 } },
  );
  proc.stderr.cancel();
  const reader = proc.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  let resized = false;
  const deadline = Date.now() + 15_000;
  while (Date.now() < deadline) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
    if (!resized && text.includes("ready")) {
      proc.resize(120, 50);
      resized = true;
    }
  }
  reader.releaseLock();
  assert.equal((await proc.status).code, 0, text);
  const sizes = text.split(/\r?\n/).map((l) => l.trim()).filter((l) => /^\d+ \d+$/.test(l));
  assert.deepEqual(sizes, ["30 100", "50 120"], text);
  await assert.rejects(
    client.spawn("true", { pty: { cols: 0, rows: 10 } }),
    RangeError,
  );
});
