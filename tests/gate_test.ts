// The gate (`deno task ok`, which CI runs): every check it makes, each once.
// Issue 38 (CI time): it type-checked the tree three times, in `deno check .`,
// again in `deno test --doc` (the same modules and the JSDoc examples) and
// again in `deno publish --dry-run`, some 25 s of a warm CI run on 2 cores.

import { test } from "./_test.ts";
import assert from "node:assert/strict";

const config = JSON.parse(
  await Deno.readTextFile(new URL("../deno.json", import.meta.url)),
) as { tasks: Record<string, string> };

/** The commands of a task, split at `&&`. */
function steps(task: string): string[][] {
  return task.split("&&").map((step) => step.trim().split(/\s+/));
}

/** Whether `step` is `deno SUB ...`. */
function isDeno(step: string[], sub: string): boolean {
  return step[0] === "deno" && step[1] === sub;
}

test("deno task ok type-checks the whole tree and the JSDoc examples once, first", () => {
  const ok = steps(config.tasks.ok);
  const checks = ok.filter((s) => isDeno(s, "check"));
  assert.deepEqual(checks, [["deno", "check", "--doc", "."]], config.tasks.ok);
  const at = ok.findIndex((s) => isDeno(s, "check"));
  // What comes after runs no type check of its own: the one above covered it.
  for (const sub of ["test", "publish"]) {
    const i = ok.findIndex((s) => isDeno(s, sub));
    assert.ok(i > at, `deno ${sub} runs after deno check: ${config.tasks.ok}`);
    assert.ok(ok[i].includes("--no-check"), `deno ${sub} checks again: ${ok[i].join(" ")}`);
  }
  // Everything else the gate ran, it still runs: the tests with the JSDoc examples, slow types.
  const test = ok.find((s) => isDeno(s, "test"))!;
  assert.ok(test.includes("--doc"), test.join(" "));
  // Test files run side by side, one per core: most of a run waits on engines and clusters.
  assert.ok(test.includes("--parallel"), test.join(" "));
  const publish = ok.find((s) => isDeno(s, "publish"))!;
  assert.ok(!publish.includes("--allow-slow-types"), publish.join(" "));
  for (const sub of ["fmt", "lint", "doc"]) assert.ok(ok.some((s) => isDeno(s, sub)), sub);
});

test("deno task test, run on its own, type-checks what it runs", () => {
  const [only, ...rest] = steps(config.tasks.test);
  assert.deepEqual(rest, []);
  assert.ok(isDeno(only, "test") && only.includes("--doc"), config.tasks.test);
  assert.ok(only.includes("--parallel"), config.tasks.test);
  assert.ok(!only.some((word) => word.startsWith("--no-check")), config.tasks.test);
});
