// `hud serve --no-auth` listens on loopback only: the host is checked with
// the one loopback test (_internal/net.ts isLoopback) as given, and bind()
// checks the address it resolves to.

import { test } from "../_test.ts";
import { MOUNT_NAMESPACE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { ChildProcess, waitFor } from "../_helpers.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const BASIC = decodeURIComponent(new URL("../fixtures/basic_env.ts", import.meta.url).pathname);

/** Runs `hud serve --no-auth --host HOST` in this process until it announces its port. */
async function serveNoAuth(
  host: string,
): Promise<{ code: number; port: string | null; err: string }> {
  const controller = new AbortController();
  let out = "";
  let err = "";
  let ended = false;
  const serving = main(["serve", BASIC, "--port", "0", "--no-auth", "--host", host], {
    stdout: (text) => out += text,
    stderr: (text) => err += text,
    signal: controller.signal,
  }).finally(() => ended = true);
  try {
    await waitFor(() => /HUD_SERVE_PORT=\d+\n/.test(out) || ended, 20_000);
  } finally {
    controller.abort();
  }
  const code = await serving;
  return { code, port: /HUD_SERVE_PORT=(\d+)\n/.exec(out)?.[1] ?? null, err };
}

function canListen(hostname: string): boolean {
  try {
    Deno.listen({ hostname, port: 0 }).close();
    return true;
  } catch {
    return false;
  }
}

test("hud serve --no-auth serves on every loopback address, by name or address", async (t) => {
  const hosts = ["127.0.0.1", "127.0.0.2", "localhost"];
  // An IPv4-mapped loopback address is loopback too (the old regex refused it).
  if (canListen("::ffff:127.0.0.1")) hosts.push("::ffff:127.0.0.1");
  if (canListen("::1")) hosts.push("::1");
  for (const host of hosts) {
    await t.step(host, async () => {
      const { code, port, err } = await serveNoAuth(host);
      assert.equal(code, 0, err);
      assert.ok(port, `served on ${host}`);
    });
  }
});

test("hud serve --no-auth refuses an address that is not loopback before binding", async () => {
  let err = "";
  const code = await main(["serve", BASIC, "--no-auth", "--host", "0.0.0.0"], {
    stdout: () => {},
    stderr: (text) => err += text,
  });
  assert.equal(code, 2);
  assert.match(err, /^error: --no-auth on "0\.0\.0\.0".*--insecure-listen/);
});

test({
  name: "hud serve --no-auth refuses a *.localhost name that resolves to every interface",
  // A hosts file of its own needs a mount namespace: root only.
  needs: [MOUNT_NAMESPACE],
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "hud-hosts-" });
    try {
      const hosts = `${dir}/hosts`;
      await Deno.writeTextFile(hosts, "127.0.0.1 localhost\n0.0.0.0 evil.localhost\n");
      const script = 'mount --bind "$1" /etc/hosts && shift && exec "$@"';
      await using child = new ChildProcess("unshare", {
        args: [
          "--mount",
          "--propagation",
          "private",
          "sh",
          "-c",
          script,
          "sh",
          hosts,
          Deno.execPath(),
          "run",
          "-A",
          CLI,
          "serve",
          BASIC,
          "--port",
          "0",
          "--no-auth",
          "--host",
          "evil.localhost",
        ],
      });
      await waitFor(() => child.status !== null || /HUD_SERVE_PORT=/.test(child.stdout), 60_000);
      assert.doesNotMatch(child.stdout, /HUD_SERVE_PORT=/, child.describe());
      assert.equal(child.status?.code, 1, child.describe());
      assert.match(child.stderr, /"evil\.localhost", which resolves to 0\.0\.0\.0/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
