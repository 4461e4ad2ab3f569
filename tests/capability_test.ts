import { test } from "./_test.ts";
import assert from "node:assert/strict";
import { Capability, Environment } from "../mod.ts";
import { parseHostPort } from "../capability.ts";

test("Capability factories fill defaults and normalise urls", async (t) => {
  await t.step("ssh", () => {
    const c = Capability.ssh({
      url: "127.0.0.1",
      hostPublicKey: "ssh-ed25519 AAAA",
      cwd: "/w",
      isolation: "none",
    });
    assert.deepEqual(c.toManifest(), {
      name: "shell",
      protocol: "ssh/2",
      url: "ssh://127.0.0.1:22",
      params: {
        user: "agent",
        host_pubkey: "ssh-ed25519 AAAA",
        shell: "bash",
        cwd: "/w",
        isolation: "none",
      },
    });
    assert.equal(Capability.ssh({ url: "ssh://h:2222", hostPublicKey: "k" }).url, "ssh://h:2222");
    assert.throws(() => Capability.ssh({ url: "h", hostPublicKey: "" }), TypeError);
  });
  await t.step("cdp", () => {
    const c = Capability.cdp({ url: "127.0.0.1/devtools/browser/x", targetId: "T" });
    assert.equal(c.url, "ws://127.0.0.1:9222/devtools/browser/x");
    assert.deepEqual(c.params, { target_id: "T" });
    assert.equal(c.name, "browser");
  });
  await t.step("rfb", () => {
    const c = Capability.rfb({ url: "rfb://10.0.0.1", display: 2, password: "p" });
    assert.equal(c.url, "rfb://10.0.0.1:5902");
    assert.deepEqual(c.params, { display: 2, password: "p" });
    assert.throws(() => Capability.rfb({ url: "h", display: -1 }), RangeError);
  });
  await t.step("mcp", () => {
    assert.deepEqual(Capability.mcp({ url: "ws://h/mcp" }).toManifest(), {
      name: "tools",
      protocol: "mcp/2025-11-25",
      url: "ws://h:80/mcp",
      params: { transport: "websocket" },
    });
    const https = Capability.mcp({ url: "https://h/mcp", authToken: "t" });
    assert.equal(https.url, "https://h:443/mcp");
    assert.deepEqual(https.params, { transport: "streamable-http", auth_token: "t" });
    assert.equal(
      Capability.mcp({ url: "http://h:8000", transport: "sse" }).params.transport,
      "sse",
    );
    assert.throws(() => Capability.mcp({ url: "tcp://h:1" }), {
      name: "TypeError",
      message: /scheme/,
    });
    assert.throws(() => Capability.mcp({ url: "ws://h:1", transport: "sse" }), TypeError);
  });
  await t.step("openpi", () => {
    const c = Capability.openpi({ url: "robot.local", contract: { dof: 7 } });
    assert.equal(c.url, "ws://robot.local:9091");
    assert.equal(c.name, "robot");
  });
  await t.step("filetracking", () => {
    const c = Capability.filetracking({ url: "127.0.0.1:7000", root: "/w" });
    assert.equal(c.url, "tcp://127.0.0.1:7000");
    assert.deepEqual(c.params, { root: "/w", setup_diff: true });
    assert.throws(() => Capability.filetracking({ url: "127.0.0.1", root: "/w" }), /no port/);
  });
});

test("Capability.fromManifest() round-trips and validates", () => {
  const c = Capability.ssh({ url: "h:1", hostPublicKey: "k" });
  assert.deepEqual(
    Capability.fromManifest(JSON.parse(JSON.stringify(c))).toManifest(),
    c.toManifest(),
  );
  assert.throws(() => Capability.fromManifest({ name: "x", protocol: "p" }), {
    name: "TypeError",
    message: /"url"/,
  });
  assert.throws(() => Capability.fromManifest(null), TypeError);
  assert.throws(
    () => Capability.fromManifest({ name: "x", protocol: "p", url: "u", params: 3 }),
    TypeError,
  );
});

test("parseHostPort() reads host and port", () => {
  assert.deepEqual(parseHostPort("ssh://agent@127.0.0.1:22/x"), {
    hostname: "127.0.0.1",
    port: 22,
  });
  assert.deepEqual(parseHostPort("tcp://[::1]:80"), { hostname: "::1", port: 80 });
  assert.deepEqual(parseHostPort("ws://host"), { hostname: "host", port: null });
  assert.equal(parseHostPort("tcp://:80"), null);
  assert.equal(parseHostPort("tcp://h:99999"), null);
});

test("Environment.addCapability() replaces by name", () => {
  const env = new Environment("caps");
  env.addCapability(Capability.ssh({ url: "h:1", hostPublicKey: "k" }));
  env.addCapability(Capability.ssh({ url: "h:2", hostPublicKey: "k" }));
  assert.equal(env.capabilities.length, 1);
  assert.equal(env.capability("shell")!.url, "ssh://h:2");
  // deno-lint-ignore no-explicit-any
  assert.throws(() => env.addCapability({ name: "x" } as any), TypeError);
  assert.equal(env.removeCapability("shell"), true);
  assert.equal(env.capability("shell"), undefined);
});
