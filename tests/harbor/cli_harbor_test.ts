// `hud eval harbor:PATH` as a user runs it: a subprocess of cli.ts over a
// dataset of Harbor tasks. The oracle validates a dataset (exit 0, every
// task 1.0, the one that cannot be adapted listed with its code); a task
// the oracle does not bring to 1.0 fails the run; options that mean nothing
// for Harbor tasks are refused. Needs an engine socket; skipped without one.

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { buildShellBase } from "../engines/_shell_base.ts";
import { withDeadline } from "../_deadline.ts";
import { BASE, writeDataset } from "./_dataset.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;

async function hud(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decode = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: decode(out.stdout), stderr: decode(out.stderr) };
}

/** A dataset holding only `keep` of the test tasks. */
async function dataset(...keep: string[]): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-cli-" });
  await writeDataset(root);
  for await (const e of Deno.readDir(root)) {
    if (!keep.includes(e.name)) await Deno.remove(`${root}/${e.name}`, { recursive: true });
  }
  return root;
}

test("hud eval harbor:PATH refuses options that do not apply, and a missing agent", async () => {
  const root = await dataset("hello");
  try {
    const r = await hud(["eval", `harbor:${root}`, "--agent", "oracle", "--runtime", "local"]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /--runtime does not apply to harbor:PATH; leave it out/);
    // --filter and --limit select tasks by name, as they select rows of a module.
    const nothing = await hud(["eval", `harbor:${root}`, "--agent", "oracle", "--filter", "nope*"]);
    assert.equal(nothing.code, 2);
    assert.match(
      nothing.stderr,
      /--filter "nope\*" matches none of the 1 tasks \(slugs such as "hello"\)/,
    );
    const zero = await hud(["eval", `harbor:${root}`, "--agent", "oracle", "--limit", "0"]);
    assert.equal(zero.code, 2);
    assert.match(zero.stderr, /--limit must be a positive integer, got "0"/);
    const many = await hud([
      "eval",
      `harbor:${root}`,
      "--agent",
      "oracle",
      "--max-concurrent",
      "x",
    ]);
    assert.equal(many.code, 2);
    assert.match(many.stderr, /--max-concurrent must be a positive integer, got "x"/);
    const none = await hud(["eval", `harbor:${root}`]);
    assert.equal(none.code, 2);
    assert.match(none.stderr, /missing --agent \(a command, or "oracle"\) or --model/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test(
  {
    name: "hud eval harbor:PATH --agent oracle validates a dataset, and fails one below 1.0",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    await buildShellBase(BASE);
    const good = await dataset("hello", "offline", "compose");
    const bad = await dataset("hello", "multi");
    try {
      const ok = await hud(["eval", `harbor:${good}`, "--agent", "oracle", "--json"]);
      assert.equal(ok.code, 0, ok.stderr);
      const summary = JSON.parse(ok.stdout) as {
        tasks: { task: string; reward: number }[];
        skipped: { name: string; code: string }[];
      };
      assert.deepEqual(summary.tasks.map((t) => [t.task, t.reward]), [["hello", 1], [
        "offline",
        1,
      ]]);
      assert.deepEqual(summary.skipped.map((s) => [s.name, s.code]), [["compose", "compose"]]);
      assert.match(ok.stderr, /compose: skipped: compose: /);
      const below = await hud(["eval", `harbor:${bad}`, "--agent", "oracle"]);
      assert.equal(below.code, 1, below.stderr);
      assert.match(below.stderr, /multi: 0\.75 \(correctness 1, style 0\.5\)/);
      assert.match(below.stdout, /harbor: 2 tasks, mean reward 0\.875, 1 not 1\.0, 0 skipped/);
      // --filter keeps the tasks it names: without multi, the dataset validates.
      const kept = await hud(["eval", `harbor:${bad}`, "--agent", "oracle", "--filter", "hel*"]);
      assert.equal(kept.code, 0, kept.stderr);
      assert.match(kept.stdout, /harbor: 1 tasks, mean reward 1\.000, 0 not 1\.0, 0 skipped/);
    } finally {
      await Deno.remove(good, { recursive: true });
      await Deno.remove(bad, { recursive: true });
    }
  }),
);
