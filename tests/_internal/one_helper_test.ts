// One helper for each piece of knowledge (STYLE.md): these scans fail when a
// second copy of host formatting, the loopback test, an accept loop or a
// JSON-RPC reply reader appears outside its helper in _internal/.

import { test } from "../_test.ts";
import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url);

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

const COPIES: { what: string; helper: string; pattern: RegExp }[] = [
  {
    what: "IPv6 brackets",
    helper: "_internal/net.ts",
    pattern: /includes\(":"\)\s*\?\s*`\[/,
  },
  {
    what: "a loopback test",
    helper: "_internal/net.ts",
    pattern: /127\\\.\\d|\["127\.0\.0\.1", "localhost"|=== "::1"/,
  },
  { what: "an accept loop", helper: "_internal/accept.ts", pattern: /\.accept\(\)/ },
  {
    what: "a JSON-RPC reply reader",
    helper: "_internal/rpc.ts",
    pattern: /function replyResult|reply\.id !== id/,
  },
];

/**
 * Copies that remain in files other branches own this round; each entry
 * must still be needed (the test says when one is not), so that the switch
 * to the helper also removes it here.
 */
const REMAINING: Record<string, readonly string[]> = {};

test("one helper each: host brackets, loopback, accept loops, JSON-RPC replies", async () => {
  const found: string[] = [];
  const stale: string[] = [];
  for (const path of await libraryFiles()) {
    const text = await Deno.readTextFile(new URL(path, ROOT));
    for (const { what, helper, pattern } of COPIES) {
      if (path === helper) continue;
      const has = pattern.test(text);
      const allowed = REMAINING[path]?.includes(what) ?? false;
      if (has && !allowed) found.push(`${path}: ${what} (use ${helper})`);
      if (!has && allowed) stale.push(`${path}: ${what}`);
    }
  }
  assert.deepEqual(found, []);
  assert.deepEqual(stale, [], "these copies are gone: remove them from REMAINING");
});
