// Harbor tasks in: a dataset of Harbor-format tasks written here, their
// Dockerfiles FROM a base image this test builds (tests/engines/_shell_base.ts;
// no registry is reachable):
// the oracle scores 1.0, a do-nothing agent 0.0, reward.json gives
// subscores, a verifier time-out, a failing build and a missing reward each
// fail with their own message, and a second run builds nothing. Needs an
// engine socket; skipped without one, saying why (in CI it runs).

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildHarborImage,
  type HarborTask,
  loadHarborTasks,
  oracleAgent,
  parseHarborConfig,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { BASE, writeDataset } from "./_dataset.ts";
import { functionAgent } from "../../eval/mod.ts";
import { testSignal, withDeadline } from "../_deadline.ts";
import { containersLeft } from "./_engine.ts";

test("loadHarborTasks() loads the valid tasks and lists the others with a reason code", async () => {
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-" });
  try {
    await writeDataset(root);
    const { tasks, skipped } = await loadHarborTasks(root);
    assert.deepEqual(tasks.map((t) => t.name), [
      "broken",
      "envs",
      "hello",
      "multi",
      "noreward",
      "offline",
      "online",
      "slow",
    ]);
    assert.deepEqual(skipped.map((s) => [s.name, s.code]), [
      ["badconfig", "bad_config"],
      ["compose", "compose"],
    ]);
    assert.match(
      skipped[0].reason,
      /badconfig\/task\.toml: "agent\.timeout_sec" must be a positive number/,
    );
    const hello = tasks[2];
    assert.equal(hello.instruction, "Write hello to /app/out.txt.\n");
    assert.equal(hello.config.agentTimeoutSec, 60);
    assert.equal(hello.config.verifierTimeoutSec, 30);
    assert.equal(hello.config.environment.memoryMb, 2048);
    assert.ok(hello.solutionDir?.endsWith("/hello/solution"));
    // One task directory loads alone.
    const one = await loadHarborTasks(`${root}/multi`);
    assert.equal(one.tasks[0].config.environment.memoryMb, 512);
    await assert.rejects(loadHarborTasks(`${root}/nope`), /is not a directory/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("parseHarborConfig() names the file and key of a bad shape", () => {
  assert.throws(
    () => parseHarborConfig("[environment]\nallow_internet = 1\n", "t/task.toml"),
    /^TypeError: Cannot load Harbor task: t\/task\.toml: "environment\.allow_internet" must be a boolean$/,
  );
  assert.throws(() => parseHarborConfig("[agent\n", "t/task.toml"), /line 1, column/);
  const c = parseHarborConfig('[environment]\nworkdir = "/w"\nallow_internet = false\n', "x");
  assert.equal(c.environment.workdir, "/w");
  assert.equal(c.environment.allowInternet, false);
  assert.deepEqual(c.environment.env, {});
  assert.deepEqual(c.solutionEnv, {});
  // The three tables of variables a task.toml may have.
  const e = parseHarborConfig(
    '[verifier.env]\nV = "1"\n[environment.env]\nPATH = "/app/.venv/bin:/usr/bin"\n[solution.env]\nS = "2"\n',
    "x",
  );
  assert.deepEqual([e.verifierEnv, e.environment.env, e.solutionEnv], [
    { V: "1" },
    { PATH: "/app/.venv/bin:/usr/bin" },
    { S: "2" },
  ]);
  assert.throws(
    () => parseHarborConfig("[solution.env]\nS = 2\n", "t/task.toml"),
    /"solution\.env\.S" must be a string$/,
  );
  assert.throws(
    () => parseHarborConfig('[environment.env]\n"A-B" = "x"\n', "t/task.toml"),
    /"environment\.env\.A-B": not a variable name/,
  );
});

let base: Promise<void> | null = null;

/** Runs `fn` on the dataset's loaded tasks, in a directory removed after. */
async function withDataset(fn: (tasks: HarborTask[]) => Promise<void>): Promise<void> {
  base ??= buildShellBase(BASE);
  await base;
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-" });
  try {
    await writeDataset(root);
    await fn((await loadHarborTasks(root)).tasks);
    assert.deepEqual(await containersLeft(root), [], "containers left behind");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

function pick(tasks: HarborTask[], ...names: string[]): HarborTask[] {
  return names.map((n) => tasks.find((t) => t.name === n)!);
}

test({
  name: "runHarborTasks() with the oracle scores 1.0, and reward.json's keys become subscores",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withDataset(async (tasks) => {
      const [hello, multi] = await runHarborTasks(pick(tasks, "hello", "multi"), "oracle");
      assert.equal(hello.error, null);
      assert.equal(hello.reward, 1);
      // The verifier's output is in the grade's info, in the trace.
      assert.match(JSON.stringify(hello.runs[0].trace), /checking \/app/);
      assert.equal(multi.error, null);
      assert.deepEqual(multi.subscores, { correctness: 1, style: 0.5 });
      assert.equal(multi.reward, 0.75);
      // allow_internet = false: no network; Harbor's default (true): the engine's bridge.
      const [offline, online] = await runHarborTasks(pick(tasks, "offline", "online"), "oracle");
      assert.equal(offline.reward, 1, offline.error ?? "");
      assert.equal(online.reward, 0, online.error ?? "");
    })),
});

test({
  name:
    "runHarborTasks() gives [environment.env] to the agent and the verifier, [solution.env] to solve.sh only",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withDataset(async (tasks) => {
      const [envs] = await runHarborTasks(pick(tasks, "envs"), "oracle");
      assert.equal(envs.error, null);
      assert.equal(envs.reward, 1);
    })),
});

test({
  name: "runHarborTasks() tells a verifier time-out, a missing reward and a failed build apart",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withDataset(async (tasks) => {
      const [slow, noreward, broken] = await runHarborTasks(
        pick(tasks, "slow", "noreward", "broken"),
        "oracle",
      );
      assert.equal(slow.reward, null);
      assert.match(slow.error ?? "", /verifier timed out after 2 s/);
      assert.equal(noreward.reward, null);
      assert.match(noreward.error ?? "", /no reward written/);
      assert.equal(broken.reward, null);
      assert.match(broken.error ?? "", /Cannot run Harbor task "broken": build failed: .*3/);
    })),
});

test({
  name:
    "runHarborTasks() scores a do-nothing agent 0.0, hides tests/, and reuses the images it built",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withDataset(async (tasks) => {
      const [hello] = pick(tasks, "hello");
      const first = await buildHarborImage(hello);
      // It only looks: tests/ and solution/ are not in the container while it works.
      let seen = "";
      const looker = functionAgent(async (_prompt, run, { signal }) => {
        await using shell = await run.client.open("shell", { signal });
        const r = await shell.exec("ls -a /tests /solution 2>&1; pwd", { signal });
        seen = r.stdoutText;
      });
      const [idle] = await runHarborTasks([hello], looker);
      assert.match(seen, /\/tests.*No such file/);
      assert.match(seen, /\/solution.*No such file/);
      assert.match(seen, /^\/app$/m);
      assert.equal(idle.error, null);
      assert.equal(idle.reward, 0);
      assert.equal(idle.built, false);
      const again = await buildHarborImage(hello);
      assert.equal(again.built, false);
      assert.equal(again.image, first.image);
      assert.equal(again.workdir, "/app");
      // From another process, with a file beside the SDK's that no image holds (issue 38: any
      // untracked file in the SDK's folder changed the key, and every task's image was rebuilt).
      const sdk = new URL("../../", import.meta.url).pathname;
      const untracked = `${sdk}untracked-${Deno.pid}.jsonl`;
      await Deno.writeTextFile(untracked, "{}\n");
      try {
        const out = await new Deno.Command(Deno.execPath(), {
          args: [
            "eval",
            `import { buildHarborImage, loadHarborTasks } from ${
              JSON.stringify(new URL("../../harbor/mod.ts", import.meta.url).href)
            };
            const { tasks } = await loadHarborTasks(${
              JSON.stringify(hello.path)
            }.replace(/\\/[^/]+$/, ""));
            const { image, built } = await buildHarborImage(tasks.find((t) => t.name === "hello"));
            console.log(JSON.stringify({ image, built }));`,
          ],
          stdin: "null",
          signal: testSignal(),
        }).output();
        const stderr = new TextDecoder().decode(out.stderr);
        assert.equal(out.code, 0, stderr);
        const elsewhere = JSON.parse(new TextDecoder().decode(out.stdout));
        assert.deepEqual(elsewhere, { image: first.image, built: false });
      } finally {
        await Deno.remove(untracked);
      }
      assert.throws(
        () => oracleAgent({ ...hello, solutionDir: null }),
        /Harbor task "hello": it has no solution\/solve\.sh/,
      );
    })),
});
