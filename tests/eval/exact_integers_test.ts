// Integers beyond 2^53 that an environment sends (issue 24, points 2 and 5)
// reach a command agent and the results file exactly, and break nothing on
// the way: the client reads them as bigint, and every writer on the path
// writes a bigint as its digits.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";

const ENV = new URL("../fixtures/big_int_env.ts", import.meta.url).pathname;

test("hud eval: a prompt holding 2^60 + 1 reaches the agent and the results file exactly", async () => {
  const dir = await Deno.makeTempDir({ prefix: "hud-exact-" });
  try {
    const out = `${dir}/results.jsonl`;
    let stderr = "";
    const code = await main(["eval", ENV, "--agent", "cat", "--out", out], {
      stdout: () => {},
      stderr: (text) => stderr += text,
    });
    assert.equal(code, 0, stderr);
    const text = await Deno.readTextFile(out);
    assert.doesNotMatch(text, /1152921504606847000/, "nothing rounded");
    const record = JSON.parse(text);
    assert.equal(record.reward, 1, "the agent saw the digits (the grade checks them)");
    assert.equal(record.trace.content, '{"seed":1152921504606846977}');
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
