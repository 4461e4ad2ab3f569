// Issue 30, point 5: `hud tasks FILE` lists the rows `eval FILE` runs.
import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";

const fixture = (name: string) => new URL(`../fixtures/${name}`, import.meta.url).pathname;

async function tasks(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = "";
  let err = "";
  const code = await main(["tasks", ...args], {
    stdout: (t) => out += t,
    stderr: (t) => err += t,
  });
  return { code, out, err };
}

test("main() tasks FILE lists the module's exported tasks rows after its templates", async () => {
  const ran = await tasks(fixture("fast_env.ts"));
  assert.equal(ran.code, 0, ran.err);
  assert.match(ran.out, /^echo {2}n: integer$/m);
  assert.match(ran.out, /^100 rows in the module's "tasks" export \(what eval runs\):$/m);
  assert.match(ran.out, /^SLUG +TEMPLATE +ARGS$/m);
  assert.match(ran.out, /^echo-[0-9a-f]{8} +echo +\{"n":99\}$/m);
  // No "tasks" export: the templates only.
  const plain = await tasks(fixture("basic_env.ts"));
  assert.equal(plain.code, 0, plain.err);
  assert.doesNotMatch(plain.out, /rows in the module/);
  // --json stays the tasks.list entries.
  const json = await tasks(fixture("fast_env.ts"), "--json");
  assert.deepEqual(JSON.parse(json.out).map((t: { id: string }) => t.id), ["echo"]);
});
