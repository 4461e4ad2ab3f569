// Harbor tasks in, run with Harbor's semantics as its Docker environment
// and trial runner have them (harbor/_task_env.ts cites the code): the task
// image's ENTRYPOINT runs with Harbor's command `sh -c "sleep infinity"` as
// its arguments, beside the environment's server and without its secrets;
// `[environment.healthcheck]` is awaited before the agent starts, and one
// that never passes fails the rollout saying so; `[agent] user` (with
// `:group`) and `[verifier] user` are the users of the agent's shell and of
// test.sh, and the image's USER theirs when not given; a user the image
// does not know fails the start, naming it. Each task's
// Dockerfile is FROM the local base (no registry is reachable). Needs an
// engine socket; skipped without one (in CI it runs).

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildHarborImage,
  type HarborTask,
  loadHarborTasks,
  parseHarborConfig,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { EngineClient, EngineError } from "../../engines/_engine.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { BASE, writeTask } from "./_dataset.ts";
import { withDeadline } from "../_deadline.ts";
import { containersLeft } from "./_engine.ts";

// Records its arguments and environment, then runs them, as an image's
// ENTRYPOINT does; the ready file comes two seconds later.
const ENTRYPOINT = [
  "#!/bin/bash",
  'echo "$*" > /marks/args',
  "id -u > /marks/uid",
  "env > /marks/env",
  "(sleep 2; touch /marks/ready) &",
  'exec "$@"',
  "",
].join("\n");

function dockerfile(extra: string[] = []): string {
  return [
    `FROM ${BASE}`,
    "WORKDIR /app",
    "RUN mkdir -m 1777 /marks && chmod 1777 /app",
    "RUN echo 'tester:x:1234:1234::/home/tester:/bin/bash' >> /etc/passwd && " +
    "echo 'tester:x:1234:' >> /etc/group && echo 'staff:x:4321:' >> /etc/group",
    "COPY entry.sh /entry.sh",
    'ENTRYPOINT ["/bin/bash", "/entry.sh"]',
    ...extra,
    "",
  ].join("\n");
}

/** reward.json: 1 for each check that holds. */
function checks(named: Record<string, string>): string {
  const lines = ["#!/bin/bash", "r='{'"];
  for (const [k, cond] of Object.entries(named)) {
    lines.push(`if ${cond}; then v=1; else v=0; fi; r="$r\\"${k}\\": $v, "`);
  }
  lines.push('echo "${r%, }}" > /logs/verifier/reward.json', "");
  return lines.join("\n");
}

async function writeTasks(root: string): Promise<void> {
  const common = {
    "environment/entry.sh": ENTRYPOINT,
    "instruction.md": "Write hello to /app/out.txt.\n",
    "solution/solve.sh":
      "#!/bin/bash\necho hello > /app/out.txt\n[ -f /marks/ready ] && echo yes > /app/saw\n",
  };
  await writeTask(root, "entry", {
    ...common,
    "environment/Dockerfile": dockerfile(),
    "task.toml": "[verifier]\ntimeout_sec = 30\n",
    "tests/test.sh": checks({
      args: '[ "$(cat /marks/args)" = "sh -c sleep infinity" ]',
      secrets: "! grep -q HUD_ /marks/env",
      home: "grep -qx HOME=/root /marks/env",
      ran: "[ -f /app/out.txt ]",
    }),
  });
  const hc = (command: string, more: string) =>
    `[environment.healthcheck]\ncommand = ${JSON.stringify(command)}\n${more}`;
  await writeTask(root, "healthy", {
    ...common,
    "environment/Dockerfile": dockerfile(),
    "task.toml": hc(
      "test -f /marks/ready",
      "interval_sec = 0.5\nstart_interval_sec = 0.5\nretries = 20\n",
    ),
    "tests/test.sh": checks({ saw: '[ "$(cat /app/saw)" = yes ]' }),
  });
  await writeTask(root, "unhealthy", {
    ...common,
    "environment/Dockerfile": dockerfile(),
    "task.toml": hc("test -f /marks/never", "interval_sec = 0.2\nretries = 2\n"),
    "tests/test.sh": checks({ ran: "true" }),
  });
  await writeTask(root, "users", {
    ...common,
    "environment/Dockerfile": dockerfile(),
    "task.toml": '[agent]\nuser = "tester:staff"\n[verifier]\nuser = "nobody"\n',
    "tests/test.sh": checks({
      owner: '[ "$(stat -c %u:%g /app/out.txt)" = 1234:4321 ]',
      verifier: '[ "$(id -u)" = 65534 ]',
      entrypoint: '[ "$(cat /marks/uid)" = 0 ]',
    }),
  });
  await writeTask(root, "ghost", {
    ...common,
    "environment/Dockerfile": dockerfile(),
    "task.toml": '[agent]\nuser = "ghost"\n',
    "tests/test.sh": checks({ ran: "true" }),
  });
  await writeTask(root, "imageuser", {
    ...common,
    "environment/Dockerfile": dockerfile(["USER tester"]),
    "task.toml": "",
    "tests/test.sh": checks({
      owner: '[ "$(stat -c %u:%g /app/out.txt)" = 1234:1234 ]',
      verifier: '[ "$(id -u)" = 1234 ]',
      entrypoint: '[ "$(cat /marks/uid)" = 1234 ]',
    }),
  });
}

/** Runs the tasks with the oracle, then removes the images built for them (by id). */
async function oracleRun(tasks: HarborTask[]) {
  const images: string[] = [];
  try {
    const task: string[] = [];
    for (const t of tasks) {
      const built = await buildHarborImage(t);
      images.push(built.image);
      task.push(built.taskImage);
    }
    images.push(...task);
    return await runHarborTasks(tasks, "oracle");
  } finally {
    // By name, layers first: a task image another task shares (same
    // environment/) goes with the last of them.
    using engine = await EngineClient.open();
    for (const image of images) {
      await engine.call("DELETE", `/images/${encodeURIComponent(image)}`).catch((err) => {
        if (!(err instanceof EngineError && (err.status === 404 || err.status === 409))) throw err;
      });
    }
  }
}

let base: Promise<void> | null = null;

async function withTasks(fn: (tasks: Map<string, HarborTask>) => Promise<void>): Promise<void> {
  base ??= buildShellBase(BASE);
  await base;
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-sem-" });
  try {
    await writeTasks(root);
    const { tasks, skipped } = await loadHarborTasks(root);
    assert.deepEqual(skipped, []);
    await fn(new Map(tasks.map((t) => [t.name, t])));
    assert.deepEqual(await containersLeft(root), [], "containers left behind");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

test("parseHarborConfig() reads [environment.healthcheck] and users with Harbor's defaults", () => {
  const c = parseHarborConfig(
    '[agent]\nuser = "dev:staff"\n[verifier]\nuser = 1000\n' +
      '[environment.healthcheck]\ncommand = "test -f /ready"\nretries = 5\n',
    "t/task.toml",
  );
  assert.equal(c.agentUser, "dev:staff");
  assert.equal(c.verifierUser, "1000");
  assert.deepEqual(c.environment.healthcheck, {
    command: "test -f /ready",
    intervalSec: 5,
    timeoutSec: 30,
    startPeriodSec: 0,
    startIntervalSec: 5,
    retries: 5,
  });
  const none = parseHarborConfig("", "t/task.toml");
  assert.equal(none.agentUser, null);
  assert.equal(none.verifierUser, null);
  assert.equal(none.environment.healthcheck, null);
  const bad = (toml: string, message: string) =>
    assert.throws(
      () => parseHarborConfig(toml, "t/task.toml"),
      (err: Error) => {
        assert.ok(err instanceof TypeError);
        assert.equal(err.message, `Cannot load Harbor task: t/task.toml: ${message}`);
        return true;
      },
    );
  bad(
    "[environment]\nhealthcheck = 1\n",
    '"environment.healthcheck" must be a table',
  );
  bad(
    "[environment.healthcheck]\ninterval_sec = 1\n",
    '"environment.healthcheck.command" must be a non-empty string',
  );
  bad(
    '[environment.healthcheck]\ncommand = "true"\nretries = 1.5\n',
    '"environment.healthcheck.retries" must be an integer >= 0',
  );
  bad(
    '[environment.healthcheck]\ncommand = "true"\ntimeout_sec = 0\n',
    '"environment.healthcheck.timeout_sec" must be a positive number',
  );
  bad(
    '[environment.healthcheck]\ncommand = "true"\nstart_period_sec = -1\n',
    '"environment.healthcheck.start_period_sec" must be a number >= 0',
  );
  bad(
    '[agent]\nuser = "a:b:c"\n',
    '"agent.user" must be a user name or uid, optionally with ":group"',
  );
  bad(
    "[verifier]\nuser = -1\n",
    '"verifier.user" must be a user name or uid, optionally with ":group"',
  );
  bad(
    "[agent]\nuser = true\n",
    '"agent.user" must be a user name or uid, optionally with ":group"',
  );
});

test({
  name: "runHarborTasks() keeps the image's ENTRYPOINT, with Harbor's command, beside the server",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withTasks(async (tasks) => {
      const [entry] = await oracleRun([tasks.get("entry")!]);
      assert.equal(entry.error, null);
      assert.deepEqual(entry.subscores, { args: 1, secrets: 1, home: 1, ran: 1 });
    })),
});

test({
  name: "runHarborTasks() awaits the healthcheck before the agent, and fails one that never passes",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withTasks(async (tasks) => {
      const [healthy, unhealthy] = await oracleRun([
        tasks.get("healthy")!,
        tasks.get("unhealthy")!,
      ]);
      assert.equal(healthy.error, null);
      assert.deepEqual(healthy.subscores, { saw: 1 });
      assert.equal(unhealthy.reward, null);
      assert.match(
        unhealthy.error ?? "",
        /healthcheck failed after 2 retries: test -f \/marks\/never/,
      );
    })),
});

test({
  name: "runHarborTasks() runs the agent as [agent] user and test.sh as [verifier] user",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withTasks(async (tasks) => {
      const [users, imageUser] = await oracleRun([tasks.get("users")!, tasks.get("imageuser")!]);
      assert.equal(users.error, null);
      assert.deepEqual(users.subscores, { owner: 1, verifier: 1, entrypoint: 1 });
      // No users given: the image's USER runs the ENTRYPOINT, the agent and the verifier.
      assert.equal(imageUser.error, null);
      assert.deepEqual(imageUser.subscores, { owner: 1, verifier: 1, entrypoint: 1 });
    })),
});

test({
  name: "runHarborTasks() fails a task whose [agent] user the image does not know, naming it",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withTasks(async (tasks) => {
      const [ghost] = await oracleRun([tasks.get("ghost")!]);
      assert.equal(ghost.reward, null);
      assert.match(
        ghost.error ?? "",
        /Cannot start Harbor task: \[agent\] user "ghost": no user "ghost" in the image's \/etc\/passwd/,
      );
    })),
});
