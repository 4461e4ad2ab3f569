import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  controlAddress,
  dialableAddress,
  formatControlUrl,
  parseControlUrl,
  portLine,
  readAnnouncement,
  redactAnnouncement,
  SERVE_PORT_VAR,
  SERVE_TOKEN_VAR,
  shownControlUrl,
  tokenLine,
} from "../../_internal/auth.ts";

const ROOT = new URL("../../", import.meta.url);
const TOKEN = "s3cr/t:@%x".padEnd(40, "z");

test("controlAddress() keeps the token readable and out of what is printed", () => {
  const address = controlAddress("127.0.0.1", 8765, TOKEN);
  assert.equal(address.token, TOKEN);
  assert.deepEqual(address, { hostname: "127.0.0.1", port: 8765, token: TOKEN });
  assert.deepEqual({ ...address }, { hostname: "127.0.0.1", port: 8765, token: TOKEN });
  for (
    const shown of [
      Deno.inspect(address),
      Deno.inspect({ placed: { address } }, { depth: 5 }),
      JSON.stringify(address),
      JSON.stringify({ address }),
    ]
  ) {
    assert.ok(!shown.includes(TOKEN), shown);
    assert.match(shown, /\*\*\*/);
  }
  assert.ok(Object.isFrozen(address));
  assert.deepEqual(controlAddress("::1", 9), { hostname: "::1", port: 9 });
});

test("formatControlUrl() and parseControlUrl() read each other back", () => {
  for (
    const address of [
      controlAddress("127.0.0.1", 8765, TOKEN),
      controlAddress("::1", 9, "t".repeat(64)),
      controlAddress("pod-7.example", 65535),
    ]
  ) {
    const url = formatControlUrl(address);
    assert.deepEqual(parseControlUrl(url), address, url);
  }
  assert.equal(formatControlUrl(controlAddress("::1", 9)), "tcp://[::1]:9");
  assert.equal(
    shownControlUrl(controlAddress("::1", 9, TOKEN)),
    "tcp://[::1]:9",
    "the shown url has no token",
  );
});

test("dialableAddress() reaches a wildcard listener on loopback", () => {
  const addr = (hostname: string): Deno.NetAddr => ({ transport: "tcp", hostname, port: 7 });
  assert.deepEqual(dialableAddress(addr("0.0.0.0")), { hostname: "127.0.0.1", port: 7 });
  assert.deepEqual(dialableAddress(addr("::"), "k"), { hostname: "::1", port: 7, token: "k" });
  assert.deepEqual(dialableAddress(addr("10.0.0.5")), { hostname: "10.0.0.5", port: 7 });
});

test("readAnnouncement() reads the lines serve prints, and redactAnnouncement() hides the token", () => {
  assert.equal(portLine(8765), "HUD_SERVE_PORT=8765");
  assert.equal(tokenLine("abc"), "HUD_SERVE_TOKEN=abc");
  assert.deepEqual(readAnnouncement(portLine(8765)), { port: 8765 });
  assert.deepEqual(readAnnouncement(tokenLine(TOKEN)), { token: TOKEN });
  for (const other of ["HUD_SERVE_PORT=", "HUD_SERVE_PORT=12x", "Serving x", "HUD_SERVE_TOKEN="]) {
    assert.equal(readAnnouncement(other), null, other);
  }
  assert.equal(redactAnnouncement(tokenLine(TOKEN)), "HUD_SERVE_TOKEN=***");
  assert.equal(redactAnnouncement(portLine(1)), "HUD_SERVE_PORT=1");
});

/** Library files: everything but tests, benchmarks and examples. */
async function libraryFiles(dir = ""): Promise<string[]> {
  const out: string[] = [];
  for await (const entry of Deno.readDir(new URL(dir || ".", ROOT))) {
    const path = dir + entry.name;
    if (entry.isDirectory) {
      if (["tests", "bench", "examples", ".git", ".ci", "node_modules"].includes(entry.name)) {
        continue;
      }
      out.push(...await libraryFiles(`${path}/`));
    } else if (path.endsWith(".ts")) {
      out.push(path);
    }
  }
  return out.sort();
}

/** Code without its comments (docs may name the variables; code spells them once). */
function code(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/(^|[^:"'`\\])\/\/.*$/gm, "$1");
}

/**
 * Files that still spell a name in code, owned by another branch this
 * round; each entry must still be needed (the test says when one is not).
 */
const REMAINING: Record<string, readonly string[]> = {
  // Its help text names the variable; cli/image.ts is the eval/CLI branch's.
  "cli/image.ts": [SERVE_TOKEN_VAR],
};

test("HUD_SERVE_TOKEN and HUD_SERVE_PORT are spelled in one library module", async () => {
  const found: string[] = [];
  const stale: string[] = [];
  for (const path of await libraryFiles()) {
    if (path === "_internal/auth.ts") continue;
    const text = code(await Deno.readTextFile(new URL(path, ROOT)));
    for (const name of [SERVE_TOKEN_VAR, SERVE_PORT_VAR]) {
      const has = text.includes(name);
      const allowed = REMAINING[path]?.includes(name) ?? false;
      if (has && !allowed) found.push(`${path}: ${name} (use _internal/auth.ts)`);
      if (!has && allowed) stale.push(`${path}: ${name}`);
    }
  }
  assert.deepEqual(found, []);
  assert.deepEqual(stale, [], "these are gone: remove them from REMAINING");
});
