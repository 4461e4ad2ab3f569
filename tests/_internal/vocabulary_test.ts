// One vocabulary across ssh/, workspace/ and graders/ (issue 34,
// /work/notes/VOCAB.md): these scans fail when one of their files grows a
// private copy of a shared helper, its own shape of "how a process ended",
// a timeout option named in milliseconds, or hand-formatted error text.

import { test } from "../_test.ts";
import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url);

/** The files the scans cover: ssh/, workspace/, graders/ and the helpers they share. */
async function scanned(): Promise<string[]> {
  const out = ["harbor/_task_env.ts"];
  for (const name of ["exit", "fs", "io", "private_file", "process", "util"]) {
    out.push(`_internal/${name}.ts`);
  }
  for (const dir of ["ssh", "workspace", "graders"]) {
    for await (const entry of Deno.readDir(new URL(`${dir}/`, ROOT))) {
      if (entry.isFile && entry.name.endsWith(".ts")) out.push(`${dir}/${entry.name}`);
    }
  }
  return out.sort();
}

const RULES: { what: string; use: string; home: string; pattern: RegExp }[] = [
  {
    what: "a private exists()",
    use: "exists() or reachableSync()",
    home: "_internal/fs.ts",
    pattern: /function exists\(/,
  },
  {
    what: "its own shape of how a process ended",
    use: "ExitStatus",
    home: "_internal/exit.ts",
    pattern: /^\s*(readonly )?signal: string \| null;|\bcode(: number)? = -1\b|\bcode: -1\b/m,
  },
  {
    what: "hand-formatted error text",
    use: "errorMessage()",
    home: "_internal/util.ts",
    pattern: /\(\w+ as Error\)\??\.message|instanceof Error \? \w+\.message : String\(/,
  },
  {
    what: "a timeout option in ms by name",
    use: "<what>Timeout, in milliseconds",
    home: "",
    pattern: /^\s*(readonly )?\w*[tT]imeoutMs\??: /m,
  },
];

test("vocabulary: one exists(), one ExitStatus, errorMessage(), timeouts named <what>Timeout", async () => {
  const found: string[] = [];
  for (const path of await scanned()) {
    const text = await Deno.readTextFile(new URL(path, ROOT));
    for (const { what, use, home, pattern } of RULES) {
      if (path !== home && pattern.test(text)) found.push(`${path}: ${what} (use ${use})`);
    }
  }
  assert.deepEqual(found, []);
});
