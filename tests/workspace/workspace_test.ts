import assert from "node:assert/strict";
import { Capability } from "../../capability.ts";
import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace } from "../../workspace/workspace.ts";

Deno.test("addWorkspace() publishes a shell and removes its keys at stop", async () => {
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
});

Deno.test("addWorkspace() rejects a root that is not a directory", async () => {
  const env = new Environment("ws");
  assert.throws(() => addWorkspace(env, ""), TypeError);
  addWorkspace(env, "/nonexistent/dir/for/test");
  await assert.rejects(env.start(), TypeError);
});
