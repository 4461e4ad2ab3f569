// Tasks written for this SDK in Terminal-Bench 2's format and style
// (tests/fixtures/harbor-tbstyle/, its README.md says what they are modeled
// on): loadHarborTasks takes them all, the oracle (each task's
// solution/solve.sh) scores 1.0 on each and an agent that does nothing 0.0,
// through runHarborTasks and through `hud eval harbor:PATH`. Their
// Dockerfiles start FROM a base this test builds from this machine's files
// (tests/harbor/_tbstyle_base.ts, whole Debian packages copied in); the
// last test removes every image the others built, by the tags they built.
// Needs an engine socket; skipped without one.

import { test } from "../_test.ts";
import { ENGINE, LANDLOCK } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildHarborImage,
  type HarborTask,
  loadHarborTasks,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { EngineClient, EngineError } from "../../engines/_engine.ts";
import { OWNER_LABEL } from "../../engines/mod.ts";
import { functionAgent } from "../../eval/mod.ts";
import { testSignal, withDeadline } from "../_deadline.ts";
import { buildTbstyleBase, TBSTYLE_BASE } from "./_tbstyle_base.ts";
import { containersLeft } from "./_engine.ts";
import { oracleSummary } from "./_dataset.ts";

const DATASET = new URL("../fixtures/harbor-tbstyle", import.meta.url).pathname;
const TASKS = ["adler32-ctypes", "gateway-error-ids", "git-lost-branch", "weekly-level-report"];

/**
 * The images to remove at the end, children before their parents, by the
 * exact tags this test built (not by id: two tasks' images can be one image
 * under two tags, which the engine removes only tag by tag).
 */
const built: string[] = [];
let base: Promise<string> | null = null;

/** The verifier's output of a run, from its trace. */
function verifierOutput(result: { runs: { trace: unknown }[] }): string {
  return JSON.stringify(result.runs[0]?.trace ?? null);
}

test("loadHarborTasks() loads the Terminal-Bench-style tasks, refusing none", async () => {
  const { tasks, skipped } = await loadHarborTasks(DATASET);
  assert.deepEqual(skipped, []);
  assert.deepEqual(tasks.map((t) => t.name), TASKS);
  for (const task of tasks) {
    assert.equal(task.config.version, "1.0", task.name);
    assert.equal(task.config.metadata.author_name, "HUD SDK tests", task.name);
    assert.equal(task.config.agentTimeoutSec, 900, task.name);
    assert.equal(task.config.verifierTimeoutSec, 180, task.name);
    assert.equal(task.config.environment.buildTimeoutSec, 300, task.name);
    assert.equal(task.config.environment.memoryMb, 2048, task.name);
    assert.equal(task.config.environment.allowInternet, true, task.name);
    assert.equal(task.config.environment.dockerImage, null, task.name);
    assert.ok(task.buildContext?.endsWith(`/${task.name}/environment`), task.name);
    assert.ok(task.solutionDir?.endsWith(`/${task.name}/solution`), task.name);
  }
  assert.match(tasks[0].instruction, /^Write an Adler-32 checksum in C/);
  // git-lost-branch sets both tables: the git identity for every process of
  // the container, the reflog subject for the oracle's solve.sh alone.
  assert.equal(tasks[2].config.environment.env.GIT_COMMITTER_NAME, "Task Runner");
  assert.deepEqual(tasks[2].config.solutionEnv, {
    LOST_TIP_SUBJECT: "Add rollback steps to the release checklist",
  });
});

/** What the image's file at `path` is (the engine's stat of it), through a container never started. */
async function statInImage(
  engine: EngineClient,
  path: string,
): Promise<{ size: number; linkTarget: string }> {
  const { Id } = await engine.call("POST", "/containers/create", {
    Image: TBSTYLE_BASE,
    Cmd: ["true"],
    Labels: { [OWNER_LABEL]: String(Deno.pid) },
  }) as { Id: string };
  try {
    const res = await engine.raw("HEAD", `/containers/${Id}/archive?path=${path}`);
    await res.body?.cancel();
    return JSON.parse(atob(res.headers.get("x-docker-container-path-stat")!));
  } finally {
    await engine.call("DELETE", `/containers/${Id}?force=true`);
  }
}

test(
  { name: "buildBaseImage() with packages copies them whole, symlinks kept", needs: [ENGINE] },
  withDeadline(59_000, async () => {
    base ??= buildTbstyleBase();
    const id = await base;
    built.push(TBSTYLE_BASE);
    using engine = await EngineClient.open();
    const info = await engine.call("GET", `/images/${encodeURIComponent(TBSTYLE_BASE)}/json`) as {
      Id: string;
    };
    assert.equal(info.Id, id);
    // git's 140 other names for its 3.7 MB binary stay symlinks.
    assert.equal(
      (await statInImage(engine, "/usr/lib/git-core/git-add")).linkTarget,
      "/usr/lib/git-core/git",
    );
    assert.ok((await statInImage(engine, "/usr/lib/git-core/git")).size > 1_000_000);
    assert.equal((await statInImage(engine, "/usr/bin/python3")).linkTarget, "/usr/bin/python3.11");
    // Documentation is left out.
    await assert.rejects(
      statInImage(engine, "/usr/share/doc/git"),
      (err) => err instanceof EngineError && err.status === 404,
    );
  }),
);

for (const name of TASKS) {
  test({
    name: `runHarborTasks() scores the oracle 1.0 and a do-nothing agent 0.0 on ${name}`,
    needs: [ENGINE],
    fn: withDeadline(59_000, async () => {
      base ??= buildTbstyleBase();
      await base;
      const [task] = (await loadHarborTasks(`${DATASET}/${name}`)).tasks as HarborTask[];
      const image = await buildHarborImage(task, { signal: testSignal() });
      // The layer before the task's image, both before the base.
      built.unshift(image.image, image.taskImage);
      const [oracle] = await runHarborTasks([task], "oracle", { signal: testSignal() });
      assert.equal(oracle.error, null);
      assert.equal(oracle.reward, 1);
      // pytest ran the task's own tests/test_outputs.py, and they passed.
      assert.match(verifierOutput(oracle), /PASSED .*test_outputs\.py.* \d+ passed/);
      assert.doesNotMatch(verifierOutput(oracle), /\d+ failed/);
      const idle = functionAgent(async () => {});
      const [nothing] = await runHarborTasks([task], idle, { signal: testSignal() });
      assert.equal(nothing.error, null);
      assert.equal(nothing.reward, 0);
      assert.match(verifierOutput(nothing), /FAILED .*test_outputs\.py.* \d+ failed/);
      assert.deepEqual(await containersLeft(DATASET), [], "containers left behind");
    }),
  });
}

test({
  name:
    "runHarborTasks(): an agent that plants /tests/conftest.py, or leaves a process to rewrite test.sh, earns nothing",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    base ??= buildTbstyleBase();
    await base;
    const [task] = (await loadHarborTasks(`${DATASET}/gateway-error-ids`)).tasks as HarborTask[];
    // pytest imports a conftest.py beside the tests: one that exits 0 passes them all.
    // Where the kernel has Landlock, the agent cannot make /tests; elsewhere the grade
    // finds what it planted there.
    const landlock = LANDLOCK.missing === null;
    const planter = functionAgent(async (_prompt, run, { signal }) => {
      await using shell = await run.client.open("shell", { signal });
      const r = await shell.exec(
        "mkdir -p /tests && echo 'import os; os._exit(0)' > /tests/conftest.py",
        { signal },
      );
      if (landlock) assert.match(r.stderrText, /mkdir: cannot create directory '\/tests'/);
      else assert.equal(r.code, 0, r.stderrText);
    });
    const [planted] = await runHarborTasks([task], planter, { signal: testSignal() });
    if (landlock) {
      assert.deepEqual([planted.reward, planted.error], [0, null]);
    } else {
      assert.equal(planted.reward, null, "the planted conftest.py was graded");
      assert.match(
        planted.error ?? "",
        /\/tests is not the task's tests\/ as copied in: conftest\.py \(added\)/,
      );
    }
    // A process left behind waits for test.sh and rewrites it; it is stopped before the
    // verifier runs, and a rewrite it managed first is refused: never a reward.
    const racer = functionAgent(async (_prompt, run, { signal }) => {
      await using shell = await run.client.open("shell", { signal });
      await shell.exec(
        "nohup bash -c 'for i in $(seq 1 2000); do [ -f /tests/test.sh ] && " +
          'echo "echo 1 > /logs/verifier/reward.txt" > /tests/test.sh && exit; sleep 0.01; done\' ' +
          ">/dev/null 2>&1 &",
        { signal },
      );
    });
    const [raced] = await runHarborTasks([task], racer, { signal: testSignal() });
    assert.notEqual(raced.reward, 1, "the rewritten test.sh was graded");
    if (raced.reward === null) assert.match(raced.error ?? "", /test\.sh \(changed\)/);
    assert.deepEqual(await containersLeft(DATASET), [], "containers left behind");
  }),
});

test(
  {
    name: "hud eval harbor:tests/fixtures/harbor-tbstyle --agent oracle validates the dataset",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const summary = await oracleSummary(DATASET);
    assert.deepEqual(summary.tasks.map((t) => [t.task, t.reward]), TASKS.map((t) => [t, 1]));
    assert.deepEqual(summary.skipped, []);
  }),
);

test({ name: "tbstyle_test removes the images it built", needs: [ENGINE] }, async () => {
  using engine = await EngineClient.open();
  const failed: string[] = [];
  // The base last: the tasks' images are its children.
  for (const ref of new Set([...built.filter((r) => r !== TBSTYLE_BASE), TBSTYLE_BASE])) {
    try {
      await engine.call("DELETE", `/images/${encodeURIComponent(ref)}`);
    } catch (err) {
      if (!(err instanceof EngineError && err.status === 404)) failed.push(`${ref}: ${err}`);
    }
  }
  assert.deepEqual(failed, []);
});
