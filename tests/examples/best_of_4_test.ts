import { test } from "../_test.ts";
import { BWRAP } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { testSignal } from "../_deadline.ts";

const example = new URL("../../examples/best_of_4.ts", import.meta.url).pathname;

test({
  name: "examples/best_of_4.ts forks four rollouts from one prepared state and picks the best",
  needs: [BWRAP],
}, async () => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", example],
    stdout: "piped",
    stderr: "piped",
    signal: testSignal(),
  }).output();
  const out = new TextDecoder().decode(stdout);
  assert.equal(code, 0, out + new TextDecoder().decode(stderr));
  // Each fork graded on its own agent's fix alone: a fork that saw another's
  // write would score 1 for "true" or 0 for a right fix.
  assert.equal(out, "rewards 1 0 0 1; best: attempt 1 (sed -i 's/-/+/' add.sh)\n");
});
