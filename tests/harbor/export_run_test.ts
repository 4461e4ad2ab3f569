// Harbor tasks out, then in: a fixture environment's task exported as a
// Harbor folder (exportHarborTasks) grades under runHarborTasks, which keeps
// the exported image's ENTRYPOINT (it starts the environment's server and
// parks the task) and awaits its [environment.healthcheck] before the agent
// acts: 1 for an agent that writes the code the task made to the answer
// file through the workspace, 0 for one that does nothing. Needs an engine
// socket; skipped without one (in CI it runs).

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildHarborImage,
  exportHarborTasks,
  loadHarborTasks,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { EngineClient, EngineError } from "../../engines/_engine.ts";
import { functionAgent } from "../../eval/mod.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { BASE } from "./_dataset.ts";
import { withDeadline } from "../_deadline.ts";

const FIXTURE = new URL("../fixtures/harbor_export_env.ts", import.meta.url).pathname;
const REPO = `hud-test-harbor-export-run-${Deno.pid}`;

test({
  name: "runHarborTasks() grades an exported task: 1 for the right answer, 0 for none",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    await buildShellBase(BASE);
    const out = await Deno.makeTempDir({ prefix: "hud-harbor-export-run-" });
    const images: string[] = [];
    try {
      const exported = await exportHarborTasks(FIXTURE, `${out}/tasks`, {
        from: BASE,
        repository: REPO,
      });
      images.push(...exported.tasks.map((t) => t.image), exported.envImage);
      const { tasks } = await loadHarborTasks(`${out}/tasks/code`);
      const built = await buildHarborImage(tasks[0]);
      images.unshift(built.image, built.taskImage);
      const answer = functionAgent(async (_prompt, run, { signal }) => {
        await using shell = await run.client.open("shell", { signal });
        const r = await shell.exec(
          "cat /tmp/hud-harbor-export-code/code-*.txt > /logs/agent/answer.txt",
          { signal },
        );
        assert.equal(r.code, 0, r.stderrText);
      });
      const [right] = await runHarborTasks(tasks, answer);
      assert.equal(right.error, null);
      assert.equal(right.reward, 1);
      assert.deepEqual(right.subscores, { match: 1, answered: 1, reward: 1 });
      const [idle] = await runHarborTasks(tasks, functionAgent(() => {}));
      assert.equal(idle.error, null);
      assert.equal(idle.reward, 0);
      assert.deepEqual(idle.subscores, { match: 0, answered: 0, reward: 0 });
    } finally {
      await Deno.remove(out, { recursive: true });
      // By name, children first.
      using engine = await EngineClient.open();
      for (const image of images) {
        await engine.call("DELETE", `/images/${encodeURIComponent(image)}`).catch((err) => {
          if (!(err instanceof EngineError && (err.status === 404 || err.status === 409))) {
            throw err;
          }
        });
      }
    }
  }),
});
