// The engines' shape, as a ratchet (tests/layout_test.ts's kind): options
// resolved once per runtime, one lease pool, readiness through the client
// library's hello, shared constants in a module of their own. Each check
// failed on the code before issue 34.

import { test } from "../_test.ts";
import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url);

async function sources(dir: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for await (const e of Deno.readDir(new URL(dir, ROOT))) {
    if (e.isFile && e.name.endsWith(".ts")) {
      out.set(`${dir}${e.name}`, await Deno.readTextFile(new URL(`${dir}${e.name}`, ROOT)));
    }
  }
  return out;
}

test("engines: no sibling imports container.ts for its constants", async () => {
  const importers = [...await sources("engines/")]
    .filter(([path, text]) => path !== "engines/mod.ts" && /from "\.\/container\.ts"/.test(text))
    .map(([path]) => path);
  assert.deepEqual(importers, [], "import the constants from engines/_constants.ts");
});

test("engines, runtime: each runtime resolves its options once, into a config record", async () => {
  const found: string[] = [];
  for (const dir of ["engines/", "runtime/"]) {
    for (const [path, text] of await sources(dir)) {
      // A runtime that keeps its options object reads defaults where it uses them.
      if (/readonly #options\b/.test(text)) found.push(`${path}: keeps #options`);
      const defaults = text.match(/readyTimeout \?\? /g)?.length ?? 0;
      if (defaults > 1) found.push(`${path}: ${defaults} readyTimeout defaults`);
    }
  }
  assert.deepEqual(found, []);
});

test("engines: the swarm leases through _pool.ts's LeasePool, as Kubernetes and Slurm do", async () => {
  const files = await sources("engines/");
  for (const path of ["engines/swarm.ts", "engines/kubernetes.ts", "engines/slurm.ts"]) {
    const text = files.get(path)!;
    assert.match(text, /import \{[^}]*\bLeasePool\b[^}]*\} from "\.\/_pool\.ts"/, path);
    assert.doesNotMatch(text, /#(take|dispatch|lease)\(/, `${path} leases by itself`);
  }
});

test("engines: KubernetesRuntime's readiness is the client library's hello, not a frame of its own", async () => {
  const text = (await sources("engines/")).get("engines/kubernetes.ts")!;
  assert.doesNotMatch(text, /encodeFrame|_internal\/framing\.ts|method: "hello"/);
  assert.match(text, /from "\.\.\/runtime\/_probe\.ts"/);
});
