// Real SSH clients against startSshServer(): OpenSSH's sftp and scp (SFTP
// and legacy -O), ssh -t with a terminal resized under it, paramiko,
// asyncssh, Dropbear's dbclient, PuTTY's pscp and psftp. Each is skipped
// where not installed (.ci/run installs them).

import { test } from "../_test.ts";
import { ASYNCSSH, DROPBEAR, OPENSSH_CLIENT, PARAMIKO, PUTTY, SCRIPT } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { bigData, CIPHERS, run, sha256Hex, startTestServer, type TestServer } from "./_util.ts";

const SYSTEM_PYTHON = "/usr/bin/python3";

function sftpArgs(s: TestServer): string[] {
  return [...s.sshOptions, "-P", String(s.port)];
}

async function fingerprint(publicKey: string): Promise<string> {
  const r = await run("ssh-keygen", ["-lf", "-"], { stdin: publicKey });
  return r.stdout.split(" ")[1];
}

test({
  name: "startSshServer() serves OpenSSH's sftp and scp",
  needs: [OPENSSH_CLIENT],
  fn: async (t) => {
    await using s = await startTestServer();
    const remote = "agent@127.0.0.1";

    await t.step("sftp -b: put, get, ls, rename, rm, mkdir, symlink", async () => {
      await Deno.writeTextFile(`${s.root}/there.txt`, "from server\n");
      await Deno.writeTextFile(`${s.home}/here.txt`, "from client\n");
      await Deno.writeTextFile(
        `${s.home}/batch`,
        [
          `put ${s.home}/here.txt up.txt`,
          `get there.txt ${s.home}/got.txt`,
          "mkdir d",
          "rename up.txt d/moved.txt",
          "symlink d/moved.txt link",
          "ls -l d",
          "rm there.txt",
          "ls",
        ].join("\n") + "\n",
      );
      const r = await run("sftp", [...sftpArgs(s), "-b", `${s.home}/batch`, remote]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(await Deno.readTextFile(`${s.home}/got.txt`), "from server\n");
      assert.equal(await Deno.readTextFile(`${s.root}/d/moved.txt`), "from client\n");
      assert.equal(await Deno.readLink(`${s.root}/link`), "d/moved.txt");
      assert.equal(await Deno.readTextFile(`${s.root}/link`), "from client\n");
      await assert.rejects(Deno.stat(`${s.root}/there.txt`), Deno.errors.NotFound);
      assert.match(r.stdout, /^-rw\S+ .* moved\.txt$/m);
      assert.match(r.stdout, /^sftp> ls\n(d\s+link\s*|link\s+d\s*)\n/m);
    });

    await t.step("sftp -b: a failing command fails the batch", async () => {
      await Deno.writeTextFile(`${s.home}/bad`, "get /etc/passwd\n");
      const r = await run("sftp", [...sftpArgs(s), "-b", `${s.home}/bad`, remote]);
      assert.notEqual(r.code, 0);
      assert.match(r.stderr, /not found|denied/i);
      await assert.rejects(Deno.stat(`${s.root}/passwd`), Deno.errors.NotFound);
    });

    await t.step("scp (SFTP mode) moves 64 MiB intact both ways", async () => {
      const data = bigData(64 * 1024 * 1024);
      const digest = await sha256Hex(data);
      await Deno.writeFile(`${s.home}/big.bin`, data);
      let r = await run("scp", [...sftpArgs(s), `${s.home}/big.bin`, `${remote}:big.bin`]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(await sha256Hex(await Deno.readFile(`${s.root}/big.bin`)), digest);
      r = await run("scp", [...sftpArgs(s), `${remote}:big.bin`, `${s.home}/back.bin`]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(await sha256Hex(await Deno.readFile(`${s.home}/back.bin`)), digest);
    });

    await t.step("scp -O (legacy protocol) both ways", async () => {
      const data = bigData(4 * 1024 * 1024);
      await Deno.writeFile(`${s.home}/o.bin`, data);
      let r = await run("scp", ["-O", ...sftpArgs(s), `${s.home}/o.bin`, `${remote}:o.bin`]);
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(await Deno.readFile(`${s.root}/o.bin`), data);
      r = await run("scp", ["-O", ...sftpArgs(s), `${remote}:o.bin`, `${s.home}/o2.bin`]);
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(await Deno.readFile(`${s.home}/o2.bin`), data);
    });

    await t.step("scp refuses to write outside the root", async () => {
      const r = await run("scp", [...sftpArgs(s), `${s.home}/here.txt`, `${remote}:/tmp/x`]);
      assert.notEqual(r.code, 0);
    });
    assert.deepEqual(s.errors, []);
  },
});

// Runs a program on a terminal of 24x80, waits for "ready", resizes the
// terminal to 40x132 (so ssh sends window-change), and prints all output.
const PTY_DRIVER = String.raw`
import fcntl, os, pty, select, struct, sys, termios, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
def size(rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
size(24, 80)
out = b""
resized = False
end = time.time() + 20
while time.time() < end:
    r, _, _ = select.select([fd], [], [], 0.2)
    if r:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    if not resized and b"ready" in out:
        size(40, 132)
        resized = True
os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
`;

test({
  name: "startSshServer() gives ssh -t a terminal that follows a resize",
  needs: [OPENSSH_CLIENT, SCRIPT],
  fn: async () => {
    await using s = await startTestServer();
    const command = "trap 'stty size; exit 0' WINCH; stty size; echo ready; " +
      "for i in $(seq 100); do sleep 0.1; done; echo no-resize";
    const r = await run(SYSTEM_PYTHON, [
      "-c",
      PTY_DRIVER,
      "ssh",
      ...s.sshOptions,
      "-t",
      "-p",
      String(s.port),
      "agent@127.0.0.1",
      command,
    ], { timeout: 30_000 });
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.split(/\r?\n/).map((l) => l.trim()).filter((l) => /^\d+ \d+$/.test(l));
    assert.deepEqual(lines, ["24 80", "40 132"], r.stdout);
  },
});

test({
  name: "startSshServer() serves paramiko's SFTPClient and exec",
  needs: [PARAMIKO],
  fn: async () => {
    await using s = await startTestServer();
    await Deno.writeTextFile(`${s.root}/remote.txt`, "remote\n");
    const data = bigData(8 * 1024 * 1024);
    await Deno.writeFile(`${s.home}/up.bin`, data);
    const script = String.raw`
import sys, paramiko
port, key, known, home = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
c = paramiko.SSHClient()
c.load_host_keys(known)
c.set_missing_host_key_policy(paramiko.RejectPolicy())
c.connect("127.0.0.1", port=port, username="agent", key_filename=key,
          look_for_keys=False, allow_agent=False, timeout=10)
_, out, _ = c.exec_command("echo via-exec")
print(out.read().decode().strip())
sftp = c.open_sftp()
sftp.put(home + "/up.bin", "up.bin")
sftp.get("remote.txt", home + "/remote.txt")
print(",".join(sorted(sftp.listdir("."))))
print(sftp.stat("up.bin").st_size)
c.close()
`;
    const r = await run(SYSTEM_PYTHON, [
      "-c",
      script,
      String(s.port),
      s.keyPath,
      s.knownHosts,
      s.home,
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split("\n"), [
      "via-exec",
      "remote.txt,up.bin",
      String(data.length),
    ]);
    assert.equal(await sha256Hex(await Deno.readFile(`${s.root}/up.bin`)), await sha256Hex(data));
    assert.equal(await Deno.readTextFile(`${s.home}/remote.txt`), "remote\n");
    assert.deepEqual(s.errors, []);
  },
});

test({
  name: "startSshServer() serves asyncssh's run and start_sftp_client",
  needs: [ASYNCSSH],
  fn: async () => {
    await using s = await startTestServer();
    await Deno.writeTextFile(`${s.root}/remote.txt`, "remote\n");
    const data = bigData(8 * 1024 * 1024);
    await Deno.writeFile(`${s.home}/up.bin`, data);
    const script = String.raw`
import asyncio, sys, warnings
warnings.simplefilter("ignore")
import asyncssh
port, key, known, home = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
async def main():
    async with asyncssh.connect("127.0.0.1", port, username="agent", client_keys=[key],
                                known_hosts=known, agent_path=None) as conn:
        r = await conn.run("echo via-run; exit 3")
        print(r.stdout.strip(), r.exit_status)
        async with conn.start_sftp_client() as sftp:
            await sftp.put(home + "/up.bin", "up.bin")
            await sftp.get("remote.txt", home + "/remote.txt")
            print(",".join(sorted(n for n in await sftp.listdir(".") if n not in (".", ".."))))
            await sftp.rename("up.bin", "moved.bin")
            print((await sftp.stat("moved.bin")).size)
asyncio.run(main())
`;
    const r = await run(SYSTEM_PYTHON, [
      "-c",
      script,
      String(s.port),
      s.keyPath,
      s.knownHosts,
      s.home,
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split("\n"), [
      "via-run 3",
      "remote.txt,up.bin",
      String(data.length),
    ]);
    assert.equal(
      await sha256Hex(await Deno.readFile(`${s.root}/moved.bin`)),
      await sha256Hex(data),
    );
    assert.equal(await Deno.readTextFile(`${s.home}/remote.txt`), "remote\n");
    assert.deepEqual(s.errors, []);
  },
});

test({
  name: "startSshServer() serves Dropbear's dbclient with each cipher it offers",
  needs: [DROPBEAR],
  fn: async () => {
    await using s = await startTestServer({ ciphers: CIPHERS });
    const env = { HOME: s.home, PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin" };
    const key = `${s.home}/key.dropbear`;
    const conv = await run("dropbearconvert", ["openssh", "dropbear", s.keyPath, key], { env });
    assert.equal(conv.code, 0, conv.stderr);
    const fp = await fingerprint(s.host.publicKey);
    for (const cipher of ["chacha20-poly1305@openssh.com", "aes128-ctr", "aes256-ctr"]) {
      // -y accepts the host key; the fingerprint it prints is checked below.
      const r = await run("dbclient", [
        "-y",
        "-i",
        key,
        "-p",
        String(s.port),
        "-c",
        cipher,
        "agent@127.0.0.1",
        "echo $((6*7)); cat",
      ], { env, stdin: "piped in\n" });
      assert.equal(r.code, 0, `${cipher}: ${r.stderr}`);
      assert.equal(r.stdout, "42\npiped in\n", cipher);
      assert.ok(r.stderr.includes(fp), `${cipher}: host key fingerprint ${fp} not in ${r.stderr}`);
    }
  },
});

test({
  name: "startSshServer() has OpenSSH's ssh pick chacha20-poly1305, aes128-ctr when it is left out",
  needs: [OPENSSH_CLIENT],
  fn: async (t) => {
    // ssh -v names what it negotiated; a 1 MiB round trip checks it works.
    const negotiate = async (s: TestServer) => {
      const data = "0123456789abcdef\n".repeat(65536);
      const r = await run(
        "ssh",
        [...s.sshOptions, "-v", "-p", String(s.port), "agent@127.0.0.1", "cat"],
        { stdin: data },
      );
      assert.equal(r.code, 0, r.stderr);
      assert.ok(r.stdout === data, `1 MiB through cat came back as ${r.stdout.length} bytes`);
      return /server->client cipher: (\S+) MAC: (\S+)/.exec(r.stderr)?.slice(1).join(" ");
    };
    await t.step("by default: chacha20-poly1305, its first choice", async () => {
      await using s = await startTestServer();
      assert.equal(await negotiate(s), "chacha20-poly1305@openssh.com <implicit>");
    });
    await t.step("without chacha20-poly1305: aes128-ctr with hmac-sha2-256-etm", async () => {
      await using s = await startTestServer({
        ciphers: CIPHERS.filter((c) => !c.startsWith("chacha20")),
      });
      assert.equal(await negotiate(s), "aes128-ctr hmac-sha2-256-etm@openssh.com");
    });
  },
});

test({
  name: "startSshServer() serves PuTTY's pscp (SFTP and SCP) and psftp",
  needs: [PUTTY],
  fn: async () => {
    await using s = await startTestServer();
    const env = { HOME: s.home, PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin" };
    const ppk = `${s.home}/key.ppk`;
    const conv = await run("puttygen", [s.keyPath, "-O", "private", "-o", ppk], { env });
    assert.equal(conv.code, 0, conv.stderr);
    const common = ["-batch", "-hostkey", await fingerprint(s.host.publicKey), "-i", ppk];
    const data = bigData(4 * 1024 * 1024);
    await Deno.writeFile(`${s.home}/up.bin`, data);
    for (const mode of ["-sftp", "-scp"]) {
      const up = await run("pscp", [
        ...common,
        mode,
        "-P",
        String(s.port),
        `${s.home}/up.bin`,
        `agent@127.0.0.1:up${mode}.bin`,
      ], { env });
      assert.equal(up.code, 0, `${mode}: ${up.stderr}`);
      assert.deepEqual(await Deno.readFile(`${s.root}/up${mode}.bin`), data);
      const down = await run("pscp", [
        ...common,
        mode,
        "-P",
        String(s.port),
        `agent@127.0.0.1:up${mode}.bin`,
        `${s.home}/down${mode}.bin`,
      ], { env });
      assert.equal(down.code, 0, `${mode}: ${down.stderr}`);
      assert.deepEqual(await Deno.readFile(`${s.home}/down${mode}.bin`), data);
    }
    await Deno.writeTextFile(
      `${s.home}/batch`,
      `mkdir pd\nput ${s.home}/up.bin pd/p.bin\nren pd/p.bin pd/q.bin\nls pd\n`,
    );
    const r = await run("psftp", [
      ...common,
      "-P",
      String(s.port),
      "-b",
      `${s.home}/batch`,
      "agent@127.0.0.1",
    ], { env });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, / q\.bin$/m);
    assert.deepEqual(await Deno.readFile(`${s.root}/pd/q.bin`), data);
    assert.deepEqual(s.errors, []);
  },
});
