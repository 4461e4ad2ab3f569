// SFTP: SshClient's file methods against startSshServer(), the fallback to
// commands where SFTP is off, and malformed SFTP input against the server.

import { test } from "../_test.ts";
import { FIND, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { SshClient, SshCommandError, SshFileError } from "../../ssh/mod.ts";
import { ClientConnection } from "../../ssh/_connection.ts";
import { Ed25519Signer, parsePrivateKey, parsePublicKey } from "../../ssh/_keys.ts";
import { FX, FXP } from "../../ssh/_sftp_wire.ts";
import { SshReader, SshWriter } from "../../ssh/_wire.ts";
import { bigData, have, run, sha256Hex, startTestServer, type TestServer } from "./_util.ts";

function clientOf(s: TestServer): Promise<SshClient> {
  return SshClient.connect({
    port: s.port,
    hostPublicKey: s.host.publicKey,
    privateKey: s.key.privateKey,
  });
}

test("SshClient file methods use SFTP against startSshServer()", async (t) => {
  await using s = await startTestServer();
  await using client = await clientOf(s);

  await t.step("writes and reads 64 MiB intact both ways", async () => {
    const data = bigData(64 * 1024 * 1024);
    await client.writeFile("big.bin", data);
    const local = await Deno.readFile(`${s.root}/big.bin`);
    assert.equal(local.length, data.length);
    assert.equal(await sha256Hex(local), await sha256Hex(data));
    const back = await client.readFile("big.bin");
    assert.equal(back.length, data.length);
    assert.equal(await sha256Hex(back), await sha256Hex(data));
  });

  await t.step("is binary-safe and needs no quoting", async () => {
    const bytes = new Uint8Array(256).map((_, i) => i);
    const name = 'it\'s a $(file) `x` "q".bin';
    await client.writeFile(name, bytes);
    assert.deepEqual(await Deno.readFile(`${s.root}/${name}`), bytes);
    assert.deepEqual(await client.readFile(name), bytes);
    await client.writeFile("empty", new Uint8Array(0));
    assert.equal((await client.readFile("empty")).length, 0);
  });

  await t.step("writes from a stream", async () => {
    const parts = ["a".repeat(100_000), "b".repeat(3), "c".repeat(70_000)];
    const stream = ReadableStream.from(parts.map((p) => new TextEncoder().encode(p)));
    await client.writeFile("streamed.txt", stream);
    assert.equal(await Deno.readTextFile(`${s.root}/streamed.txt`), parts.join(""));
  });

  await t.step("lists, stats, renames and removes", async () => {
    await Deno.mkdir(`${s.root}/dir`);
    await Deno.symlink("big.bin", `${s.root}/link`);
    const list = await client.listDir(".");
    const byName = new Map(list.map((e) => [e.name, e]));
    assert.deepEqual(list.map((e) => e.name), [...byName.keys()].sort());
    assert.equal(byName.get("dir")?.isDirectory, true);
    assert.equal(byName.get("big.bin")?.isFile, true);
    assert.equal(byName.get("link")?.isSymlink, true);
    const st = await client.stat("big.bin");
    assert.equal(st.size, 64 * 1024 * 1024);
    assert.equal(st.isFile, true);
    assert.ok(st.mtime !== null);
    assert.equal((await client.stat("link", { followSymlinks: false })).isSymlink, true);
    await client.writeText("a.txt", "A");
    await client.writeText("b.txt", "B");
    await client.rename("a.txt", "b.txt"); // replaces
    assert.equal(await client.readText("b.txt"), "A");
    await client.remove("b.txt");
    await client.remove("dir");
    await assert.rejects(
      client.stat("b.txt"),
      (e: Error) => e instanceof SshFileError && e.code === 2,
    );
    await assert.rejects(client.stat("dir"), SshFileError);
  });

  await t.step("refuses paths outside the root", async () => {
    await Deno.symlink("/etc", `${s.root}/etc-link`);
    for (const path of ["/etc/passwd", "../x", "etc-link/passwd", `${s.root}/../x`]) {
      await assert.rejects(
        client.readFile(path),
        (e: Error) => e instanceof SshFileError && e.code === FX.PERMISSION_DENIED,
        path,
      );
    }
    await assert.rejects(client.writeFile("etc-link/evil", "x"), SshFileError);
    await assert.rejects(client.listDir("etc-link"), SshFileError);
    await assert.rejects(client.listDir("/"), SshFileError);
  });

  await t.step("reports a missing file", async () => {
    await assert.rejects(
      client.readFile("missing.txt"),
      (e: Error) => e instanceof SshFileError && e.code === 2 && /missing\.txt/.test(e.message),
    );
  });

  assert.deepEqual(s.errors, []);
});

test("startSshServer() accepts paths through a link to its root", async () => {
  await using s = await startTestServer({ viaLink: true });
  await using client = await clientOf(s);
  const pwd = `${s.home}/root-link`; // the commands' working directory
  await client.writeText(`${pwd}/via.txt`, "via link");
  assert.equal(await Deno.readTextFile(`${s.root}/via.txt`), "via link");
  assert.deepEqual((await client.listDir(pwd)).map((e) => e.name), ["via.txt"]);
  await assert.rejects(
    client.readFile(`${s.home}/id_ed25519`),
    (e: Error) => e instanceof SshFileError && e.code === FX.PERMISSION_DENIED,
  );
});

test(
  "SshClient file methods fall back to commands where SFTP is off",
  { needs: [FIND] },
  async () => {
    await using s = await startTestServer({ sftp: false });
    await using client = await clientOf(s);
    const bytes = new Uint8Array(1000).map((_, i) => i * 7);
    await client.writeFile("x y.bin", bytes);
    assert.deepEqual(await Deno.readFile(`${s.root}/x y.bin`), bytes);
    assert.deepEqual(await client.readFile("x y.bin"), bytes);
    assert.deepEqual((await client.listDir(".")).map((e) => [e.name, e.isFile]), [[
      "x y.bin",
      true,
    ]]);
    assert.equal((await client.stat("x y.bin")).size, 1000);
    await client.rename("x y.bin", "z.bin");
    await client.remove("z.bin");
    assert.deepEqual(await client.listDir("."), []);
    await assert.rejects(client.readText("missing.txt"), SshCommandError);
  },
);

/** A raw SFTP channel for sending arbitrary packets. */
async function rawSftp(s: TestServer) {
  const tcp = await Deno.connect({ hostname: "127.0.0.1", port: s.port });
  const conn = new ClientConnection(
    tcp,
    { hostPublicKey: s.host.publicKey },
    parsePublicKey(s.host.publicKey).blob,
  );
  await conn.login("agent", await Ed25519Signer.fromParsed(parsePrivateKey(s.key.privateKey)));
  let buf = new Uint8Array(0);
  let waiter: (() => void) | null = null;
  let closed = false;
  const channel = await conn.mux.open("session", {
    onData(data) {
      const next = new Uint8Array(buf.length + data.length);
      next.set(buf);
      next.set(data, buf.length);
      buf = next;
      channel.consumed(data.length);
      waiter?.();
    },
    onEof() {},
    onClose() {
      closed = true;
      waiter?.();
    },
    onRequest: () => false,
  });
  assert.ok(await channel.request("subsystem", true, (w) => w.string("sftp")));
  const next = async (): Promise<{ type: number; r: SshReader } | null> => {
    const end = Date.now() + 5000;
    while (true) {
      if (buf.length >= 4) {
        const len = new DataView(buf.buffer, buf.byteOffset).getUint32(0);
        if (buf.length >= 4 + len) {
          const msg = buf.slice(4, 4 + len);
          buf = buf.slice(4 + len);
          return { type: msg[0], r: new SshReader(msg, 1) };
        }
      }
      if (closed) return null;
      assert.ok(Date.now() < end, "waited 5 s for an SFTP reply");
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 100);
        waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  };
  const send = (body: Uint8Array, length = body.length) => {
    const msg = new Uint8Array(4 + body.length);
    new DataView(msg.buffer).setUint32(0, length);
    msg.set(body, 4);
    return channel.write(msg);
  };
  const status = async (id: number) => {
    const rep = await next();
    assert.ok(rep !== null, "the session ended instead of answering");
    assert.equal(rep.type, FXP.STATUS);
    assert.equal(rep.r.uint32(), id);
    return rep.r.uint32();
  };
  return {
    conn,
    channel,
    next,
    send,
    status,
    get closed() {
      return closed;
    },
    async [Symbol.asyncDispose]() {
      channel.close();
      conn.transport.close();
      await conn.transport.wait();
    },
  };
}

test("startSshServer() answers malformed SFTP with a status", async (t) => {
  await using s = await startTestServer();
  await Deno.writeTextFile(`${s.root}/f.txt`, "content");
  await Deno.symlink("/etc", `${s.root}/out`);
  await using sftp = await rawSftp(s);
  const w = () => new SshWriter(64);
  await sftp.send(w().byte(FXP.INIT).uint32(3).bytes());
  const version = await sftp.next();
  assert.equal(version?.type, FXP.VERSION);
  assert.equal(version?.r.uint32(), 3);

  await t.step("an unknown handle", async () => {
    await sftp.send(w().byte(FXP.READ).uint32(1).string("nope").uint64(0n).uint32(10).bytes());
    assert.equal(await sftp.status(1), FX.FAILURE);
    await sftp.send(w().byte(FXP.CLOSE).uint32(2).string("").bytes());
    assert.equal(await sftp.status(2), FX.FAILURE);
  });

  await t.step("an unknown request type", async () => {
    await sftp.send(w().byte(99).uint32(3).bytes());
    assert.equal(await sftp.status(3), FX.OP_UNSUPPORTED);
  });

  await t.step("a truncated request", async () => {
    await sftp.send(w().byte(FXP.OPEN).uint32(4).uint32(1000).bytes());
    assert.equal(await sftp.status(4), FX.BAD_MESSAGE);
  });

  await t.step("path tricks", async () => {
    let id = 10;
    for (const path of ["../../etc/passwd", "/etc/passwd", "out/passwd", `${s.root}/../x`]) {
      await sftp.send(w().byte(FXP.OPEN).uint32(++id).string(path).uint32(1).uint32(0).bytes());
      assert.equal(await sftp.status(id), FX.PERMISSION_DENIED, path);
    }
    await sftp.send(w().byte(FXP.OPEN).uint32(++id).string("out/x").uint32(0x1a).uint32(0).bytes());
    assert.equal(await sftp.status(id), FX.PERMISSION_DENIED);
    await sftp.send(w().byte(FXP.OPENDIR).uint32(++id).string("out").bytes());
    assert.equal(await sftp.status(id), FX.PERMISSION_DENIED);
    await sftp.send(w().byte(FXP.REALPATH).uint32(++id).string("..").bytes());
    assert.equal(await sftp.status(id), FX.PERMISSION_DENIED);
    await sftp.send(w().byte(FXP.RENAME).uint32(++id).string("f.txt").string("out/f").bytes());
    assert.equal(await sftp.status(id), FX.PERMISSION_DENIED);
    // A link whose target is outside may be made, but not followed.
    await sftp.send(w().byte(FXP.SYMLINK).uint32(++id).string("/etc/passwd").string("pw").bytes());
    assert.equal(await sftp.status(id), FX.OK);
    await sftp.send(w().byte(FXP.STAT).uint32(++id).string("pw").bytes());
    assert.equal(await sftp.status(id), FX.PERMISSION_DENIED);
    // A dangling link must not let O_CREAT write through it.
    await Deno.symlink(`${s.home}/escaped`, `${s.root}/dangling`);
    await sftp.send(
      w().byte(FXP.OPEN).uint32(++id).string("dangling").uint32(0x1a).uint32(0).bytes(),
    );
    assert.equal(await sftp.status(id), FX.PERMISSION_DENIED);
    await assert.rejects(Deno.lstat(`${s.home}/escaped`), Deno.errors.NotFound);
  });

  await t.step("then still serves a good request", async () => {
    await sftp.send(w().byte(FXP.STAT).uint32(50).string("f.txt").bytes());
    const rep = await sftp.next();
    assert.equal(rep?.type, FXP.ATTRS);
  });

  await t.step("a bad length ends only this session", async () => {
    await sftp.send(new Uint8Array([FXP.STAT]), 0x7fffffff);
    assert.equal(await sftp.status(0), FX.BAD_MESSAGE);
    assert.equal(await sftp.next(), null);
    await using client = await clientOf(s);
    assert.equal(await client.readText("f.txt"), "content");
  });
  assert.deepEqual(s.errors, []);
});

test("startSshServer() SFTP changes no owner and sets no setuid or setgid bit", {
  needs: [ROOT_USER],
}, async () => {
  await using s = await startTestServer();
  const file = `${s.root}/prog`;
  await Deno.writeTextFile(file, "#!/bin/sh\n", { mode: 0o755 });
  await Deno.chown(file, 65534, 65534);
  await using sftp = await rawSftp(s);
  const w = () => new SshWriter(64);
  await sftp.send(w().byte(FXP.INIT).uint32(3).bytes());
  assert.equal((await sftp.next())?.type, FXP.VERSION);
  const setstat = (id: number, attrs: (w: SshWriter) => SshWriter) =>
    sftp.send(attrs(w().byte(FXP.SETSTAT).uint32(id).string("prog")).bytes());
  await setstat(1, (w) => w.uint32(2).uint32(0).uint32(0)); // UIDGID 0:0
  assert.equal(await sftp.status(1), FX.PERMISSION_DENIED);
  await setstat(2, (w) => w.uint32(2).uint32(65534).uint32(65534)); // unchanged: fine
  assert.equal(await sftp.status(2), FX.OK);
  await setstat(3, (w) => w.uint32(4).uint32(0o106755)); // PERMISSIONS with setuid, setgid
  assert.equal(await sftp.status(3), FX.OK);
  await sftp.send(
    w().byte(FXP.MKDIR).uint32(4).string("d").uint32(4).uint32(0o6777).bytes(),
  );
  assert.equal(await sftp.status(4), FX.OK);
  const info = await Deno.stat(file);
  assert.deepEqual([info.uid, info.gid, (info.mode! & 0o7777).toString(8)], [65534, 65534, "755"]);
  assert.equal(((await Deno.stat(`${s.root}/d`)).mode! & 0o7000).toString(8), "0");
});

test("startSshServer() sftpCommand serves SFTP from a program on stdio (ssh/_sftp_main.ts)", async () => {
  const main = new URL("../../ssh/_sftp_main.ts", import.meta.url).pathname;
  await using s = await startTestServer({
    sftpCommand: [
      Deno.execPath(),
      "run",
      "--no-config",
      "--no-lock",
      "--allow-read",
      "--allow-write",
      "--allow-run=stat",
      main,
    ],
  });
  await using client = await clientOf(s);
  const data = bigData(8 * 1024 * 1024);
  await client.writeFile("big.bin", data);
  assert.equal(await sha256Hex(await Deno.readFile(`${s.root}/big.bin`)), await sha256Hex(data));
  assert.equal(await sha256Hex(await client.readFile("big.bin")), await sha256Hex(data));
  await client.writeText("a.txt", "A");
  assert.deepEqual((await client.listDir(".")).map((e) => e.name), ["a.txt", "big.bin"]);
  // Rooted at "/": what it may reach is what its process may.
  assert.equal((await client.stat("/etc")).isDirectory, true);
  if (have("sftp")) {
    await Deno.writeTextFile(`${s.home}/batch`, "mkdir sub\nrename a.txt sub/b.txt\nls sub\ndf\n");
    const r = await run("sftp", [
      ...s.sshOptions,
      "-P",
      String(s.port),
      "-b",
      `${s.home}/batch`,
      "agent@127.0.0.1",
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /b\.txt/);
  }
  assert.deepEqual(s.errors, []);
});
