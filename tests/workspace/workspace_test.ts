import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Capability } from "../../capability.ts";
import { connect } from "../../client.ts";
import { Environment } from "../../env.ts";
import { bind } from "../../server.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace } from "../../workspace/workspace.ts";

test(
  "addWorkspace() publishes a shell and removes its keys at stop",
  { needs: [SANDBOX] },
  async () => {
    const root = await Deno.makeTempDir({ prefix: "ws-test-" });
    const env = new Environment("ws");
    addWorkspace(env, root, { env: { HOME: root, MARK: "set" }, name: "sh", user: "bot" });
    assert.equal(env.capability("sh"), undefined);
    await env.start();
    let keyPath = "";
    try {
      const cap = env.capability("sh")!;
      assert.equal(cap.protocol, "ssh/2");
      assert.match(cap.url, /^ssh:\/\/127\.0\.0\.1:\d+$/);
      assert.equal(cap.params.user, "bot");
      assert.equal(cap.params.cwd, root);
      assert.match(cap.params.isolation as string, /^(bwrap|unshare)$/);
      assert.match(cap.params.host_pubkey as string, /^ssh-ed25519 /);
      assert.match(cap.params.client_key as string, /BEGIN OPENSSH PRIVATE KEY/);
      keyPath = cap.params.client_key_path as string;
      assert.equal((await Deno.stat(keyPath)).mode! & 0o777, 0o600);
      await using shell = SshClient.fromBinding(cap);
      const r = await shell.exec("echo $MARK; pwd");
      assert.equal(r.stdoutText, `set\n${root}\n`);
      // A binding that only names the key file works when the caller allows it.
      const { client_key: _, ...params } = cap.params;
      const byPath = Capability.fromManifest({ ...cap.toManifest(), params });
      assert.throws(() => SshClient.fromBinding(byPath), /has no client_key .*allowKeyPath/);
      await using shell2 = SshClient.fromBinding(byPath, { allowKeyPath: true });
      assert.equal((await shell2.exec("echo ok")).stdoutText, "ok\n");
    } finally {
      await env.stop();
      await Deno.remove(root, { recursive: true });
    }
    assert.equal(env.capability("sh"), undefined);
    await assert.rejects(Deno.stat(keyPath), Deno.errors.NotFound);
  },
);

test("addWorkspace() rejects a root that is not a directory", async () => {
  const env = new Environment("ws");
  assert.throws(() => addWorkspace(env, ""), TypeError);
  addWorkspace(env, "/nonexistent/dir/for/test");
  await assert.rejects(env.start(), TypeError);
});

test("addWorkspace() serves its shell's tunnel in-process, with the bytes sent early", {
  needs: [SANDBOX],
}, async (t) => {
  const root = await Deno.makeTempDir({ prefix: "ws-attach-" });
  const env = new Environment("ws");
  addWorkspace(env, root, { writeKeyFile: false, trackFiles: false, env: { MARK: "tunnelled" } });
  await env.start();
  try {
    assert.ok(env.capabilityHandler("shell"), "the shell is attached to the environment");
    await using server = bind(env);
    await t.step("a login through the client's tunnel runs commands", async () => {
      await using client = await connect(server, { readyTimeout: 10_000 });
      await using shell = SshClient.fromBinding(client.binding("shell"));
      assert.equal((await shell.exec("echo $MARK")).stdoutText, "tunnelled\n");
    });
    await t.step("bytes that came with tunnel.open reach the SSH server", async () => {
      // The identification line rides in the same write as tunnel.open: the
      // SSH server answers a bad one in text, so it must have seen it.
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
      try {
        const open = JSON.stringify({
          jsonrpc: "2.0",
          id: 1,
          method: "tunnel.open",
          params: { capability: "shell", token: server.token },
        });
        await conn.write(new TextEncoder().encode(`${open}\nNOT-SSH\r\n`));
        // Bounded: the SSH server would close a silent peer after 10 s anyway.
        const timer = setTimeout(() => conn.close(), 10_000);
        let text = "";
        try {
          const buf = new Uint8Array(4096);
          while (!text.includes("Invalid SSH identification string")) {
            const n = await conn.read(buf);
            if (n === null) break;
            text += new TextDecoder().decode(buf.subarray(0, n));
          }
        } catch (err) {
          throw new Error(`no text reply to a bad identification line within 10 s: ${text}`, {
            cause: err,
          });
        } finally {
          clearTimeout(timer);
        }
        assert.match(text, /"result":\{"capability":"shell"\}/);
        assert.match(text, /Invalid SSH identification string/);
      } finally {
        try {
          conn.close();
        } catch { /* closed by the timer */ }
      }
    });
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
});

test("addWorkspace() logins through the tunnel never wait for anonymous TCP connections' slots", {
  needs: [SANDBOX],
}, async () => {
  const root = await Deno.makeTempDir({ prefix: "ws-slots-" });
  const env = new Environment("ws");
  addWorkspace(env, root, { writeKeyFile: false, trackFiles: false });
  await env.start();
  const idle: Deno.Conn[] = [];
  try {
    await using server = bind(env);
    await using client = await connect(server, { readyTimeout: 10_000 });
    // 256 connections that never log in, each past its version line (so
    // held for the 30 s login grace, not the 10 s version timeout).
    const port = Number(new URL(env.capability("shell")!.url).port);
    for (let i = 0; i < 256; i++) {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port });
      idle.push(conn);
      await conn.write(new TextEncoder().encode("SSH-2.0-idle\r\n")).catch(() => {});
    }
    const results = await Promise.allSettled(
      Array.from({ length: 5 }, async () => {
        await using shell = SshClient.fromBinding(client.binding("shell"), {
          connectTimeout: 10_000,
        });
        return (await shell.exec("echo in")).stdoutText;
      }),
    );
    assert.deepEqual(
      results.map((r) => r.status === "fulfilled" ? r.value : String(r.reason)),
      ["in\n", "in\n", "in\n", "in\n", "in\n"],
    );
  } finally {
    for (const c of idle) c.close();
    await env.stop();
    await Deno.remove(root, { recursive: true });
  }
});
