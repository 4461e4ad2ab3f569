// Harbor's multi-step tasks (`[[steps]]`, issue 37): the loader reads the
// steps with Harbor's fields and its defaults (a step's settings, else the
// task's), and refuses a bad steps table in one line naming the file and
// the field (`bad_config`), a step feature this runner does not carry out
// (`steps`), a step without its instruction or tests; Harbor's combination
// of the steps' rewards (each key's mean, a missing key 0; or the last
// step's) and its `min_reward` gate; and, on an engine, the two-step task of
// tests/fixtures/harbor-steps/: the oracle scores 1.0 with each step's
// rewards as subscores, an idle agent 0.0 (stopped after step 1 by its
// `min_reward`), a step that cannot start is an error with its class, never
// a 0, and an agent that solves step 1 but leaves a process to forge step
// 2's reward (the reward file written in a loop, the verifier's shell
// replaced once step 1 was graded) does not score; nor, in a one-step task,
// does a reward writer the agent put in a process group of its own (it
// forged 1.0 before harbor/_strays.ts stopped it). Nothing is left behind:
// no container, and the images this file built are removed by its last test.

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildHarborImage,
  type HarborResult,
  type HarborTask,
  loadHarborTasks,
  parseHarborConfig,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { belowMinReward, combineStepRewards, scoreOf, stepRewards } from "../../harbor/_steps.ts";
import { EngineClient, EngineError } from "../../engines/_engine.ts";
import { type Agent, functionAgent } from "../../eval/mod.ts";
import { testSignal, withDeadline } from "../_deadline.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { containersLeft, hasImage } from "./_engine.ts";
import { writeTask } from "./_dataset.ts";

const FIXTURE = new URL("../fixtures/harbor-steps", import.meta.url).pathname;
/** The base the fixture's Dockerfile starts from (this machine's shell tools). */
const STEPS_BASE = "hud-test-harbor-steps-base:latest";

/** The two steps of a task.toml, and what a step's folder holds. */
const TWO_STEPS = '[[steps]]\nname = "a"\n[[steps]]\nname = "b"\n';
const STEP_FILES = {
  "environment/Dockerfile": `FROM ${STEPS_BASE}\n`,
  "steps/a/instruction.md": "Do a.\n",
  "steps/a/tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
  "steps/b/instruction.md": "Do b.\n",
  "steps/b/tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
};

test("loadHarborTasks() reads [[steps]] with Harbor's fields, each step's settings over the task's", async () => {
  const { tasks, skipped } = await loadHarborTasks(FIXTURE);
  assert.deepEqual(skipped, []);
  const [task] = tasks;
  assert.equal(task.name, "two-steps");
  assert.equal(task.config.multiStepRewardStrategy, "mean");
  assert.equal(task.instruction, "", "a multi-step task's prompts are its steps'");
  const [write, extend] = task.steps!;
  assert.equal(write.config.name, "write");
  assert.match(write.instruction, /^Write the line `hello`/);
  assert.deepEqual(write.config.minReward, { reward: 1 });
  assert.equal(write.config.agentTimeoutSec, 60);
  assert.equal(write.config.verifierTimeoutSec, 30);
  assert.deepEqual(write.config.verifierEnv, { GREETING: "hello" });
  assert.ok(write.testsDir?.endsWith("/two-steps/steps/write/tests"));
  assert.ok(write.solutionDir?.endsWith("/two-steps/steps/write/solution"));
  assert.equal(extend.config.agentTimeoutSec, 30);
  assert.equal(extend.config.verifierTimeoutSec, 20);
  assert.deepEqual(extend.config.verifierEnv, { GREETING: "hello", SUFFIX: "world" });
  assert.equal(extend.config.minReward, null);
  // A task without [[steps]] is one step, as before; the strategy defaults to Harbor's "mean".
  const one = parseHarborConfig("[agent]\ntimeout_sec = 5\n", "t/task.toml");
  assert.equal(one.steps, null);
  assert.equal(one.multiStepRewardStrategy, "mean");
  assert.deepEqual(
    parseHarborConfig(`${TWO_STEPS}[steps.min_reward]\nok = 0.5\n`, "x").steps![1].minReward,
    { ok: 0.5 },
  );
});

test("parseHarborConfig() refuses a bad steps table in one line naming the file and the field", () => {
  const cases: [string, RegExp][] = [
    ['steps = "a"\n', /"steps" must be a non-empty array of tables \(\[\[steps\]\]\)$/],
    ["steps = []\n", /"steps" must be a non-empty array of tables/],
    ["steps = [1]\n", /"steps\[0\]" must be a table$/],
    ["[[steps]]\ntimeout = 1\n", /"steps\[0\]\.name" must be a folder name of steps\//],
    ['[[steps]]\nname = "../x"\n', /"steps\[0\]\.name" must be a folder name/],
    ['[[steps]]\nname = "a"\n[[steps]]\nname = "a"\n', /"steps\[1\]\.name": "a" is named twice$/],
    [
      '[[steps]]\nname = "a"\n[steps.agent]\ntimeout_sec = -1\n',
      /"steps\[0\]\.agent\.timeout_sec" must be a positive number$/,
    ],
    [
      '[[steps]]\nname = "a"\n[steps.verifier]\nenv = { X = 1 }\n',
      /"steps\[0\]\.verifier\.env\.X" must be a string$/,
    ],
    [
      '[[steps]]\nname = "a"\nmin_reward = "high"\n',
      /"steps\[0\]\.min_reward" must be a number or a table of numbers$/,
    ],
    [
      '[[steps]]\nname = "a"\nmin_reward = { ok = "x" }\n',
      /"steps\[0\]\.min_reward\.ok" must be a number$/,
    ],
    [
      '[[steps]]\nname = "a"\n[steps.healthcheck]\nretries = 2\n',
      /"steps\[0\]\.healthcheck\.command" must be a non-empty string$/,
    ],
    [
      'multi_step_reward_strategy = "max"\n[[steps]]\nname = "a"\n',
      /"multi_step_reward_strategy" must be "mean" or "final"$/,
    ],
  ];
  for (const [toml, message] of cases) {
    assert.throws(
      () => parseHarborConfig(toml, "t/task.toml"),
      (err: Error) => {
        assert.ok(err instanceof TypeError, toml);
        assert.ok(!err.message.includes("\n"), `one line: ${err.message}`);
        assert.match(err.message, /^Cannot load Harbor task: t\/task\.toml: /, toml);
        assert.match(err.message, message, toml);
        return true;
      },
    );
  }
});

test("loadHarborTasks() skips a task whose steps it cannot run, with a code and the file", async () => {
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-steps-" });
  try {
    await writeTask(root, "ok", { ...STEP_FILES, "task.toml": TWO_STEPS });
    await writeTask(root, "badtable", {
      ...STEP_FILES,
      "task.toml": '[[steps]]\nname = "a"\nmin_reward = "x"\n',
    });
    await writeTask(root, "stepuser", {
      ...STEP_FILES,
      "task.toml":
        `${TWO_STEPS}[steps.agent]\nuser = "nobody"\n[steps.verifier]\nnetwork_mode = "no-network"\n`,
    });
    await writeTask(root, "stepworkdir", {
      ...STEP_FILES,
      "task.toml": TWO_STEPS,
      "steps/b/workdir/setup.sh": "touch /app/ready\n",
    });
    const noPrompt: Record<string, string> = { ...STEP_FILES, "task.toml": TWO_STEPS };
    delete noPrompt["steps/b/instruction.md"];
    await writeTask(root, "noprompt", noPrompt);
    const noTests: Record<string, string> = { ...STEP_FILES, "task.toml": TWO_STEPS };
    delete noTests["steps/a/tests/test.sh"];
    await writeTask(root, "notests", noTests);
    // A step's folder that is a link out of the task folder is not read.
    const outside = await Deno.makeTempDir({ prefix: "hud-harbor-outside-" });
    await writeTask(root, "linked", {
      "environment/Dockerfile": `FROM ${STEPS_BASE}\n`,
      "task.toml": '[[steps]]\nname = "a"\n',
    });
    await writeTask(outside, "a", { "instruction.md": "x\n", "tests/test.sh": "exit 0\n" });
    await Deno.mkdir(`${root}/linked/steps`);
    await Deno.symlink(`${outside}/a`, `${root}/linked/steps/a`);
    const { tasks, skipped } = await loadHarborTasks(root);
    await Deno.remove(outside, { recursive: true });
    assert.deepEqual(tasks.map((t) => [t.name, t.steps?.map((s) => s.config.name)]), [
      ["ok", ["a", "b"]],
    ]);
    const by = new Map(skipped.map((s) => [s.name, s]));
    assert.deepEqual(skipped.map((s) => [s.name, s.code]), [
      ["badtable", "bad_config"],
      ["linked", "bad_file"],
      ["noprompt", "no_instruction"],
      ["notests", "no_tests"],
      ["stepuser", "steps"],
      ["stepworkdir", "steps"],
    ]);
    for (const s of skipped) assert.ok(!s.reason.includes("\n"), s.reason);
    assert.match(by.get("badtable")!.reason, /badtable\/task\.toml: "steps\[0\]\.min_reward"/);
    assert.match(
      by.get("stepuser")!.reason,
      /stepuser\/task\.toml: steps\[1\]\.agent\.user, steps\[1\]\.verifier\.network_mode: not supported in \[\[steps\]\]/,
    );
    assert.match(
      by.get("stepworkdir")!.reason,
      /stepworkdir\/steps\/b\/workdir: a step's workdir\//,
    );
    assert.match(
      by.get("noprompt")!.reason,
      /noprompt\/steps\/b\/instruction\.md is missing or empty/,
    );
    assert.match(
      by.get("notests")!.reason,
      /notests\/steps\/a\/tests\/test\.sh and .*\/notests\/tests\/test\.sh are missing/,
    );
    assert.match(by.get("linked")!.reason, /leads outside the task folder/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("combineStepRewards() and the min_reward gate are Harbor's", () => {
  // reward.txt is `{ reward }`; reward.json's keys as written.
  assert.deepEqual(stepRewards({ reward: 0.5 }), { reward: 0.5 });
  assert.deepEqual(stepRewards({ reward: 0.5, subscores: { a: 1, b: 0 } }), { a: 1, b: 0 });
  const steps: Record<string, number>[] = [{ reward: 1 }, { reward: 0, extra: 1 }];
  // Each key's mean over the steps, a key a step lacks counting 0.
  assert.deepEqual(combineStepRewards(steps, "mean"), { reward: 0.5, extra: 0.5 });
  assert.deepEqual(combineStepRewards(steps, "final"), { reward: 0, extra: 1 });
  assert.equal(scoreOf({ reward: 0.25, extra: 1 }), 0.25);
  assert.equal(scoreOf({ a: 1, b: 0 }), 0.5);
  assert.equal(belowMinReward({ reward: 1 }, { reward: 1 }), null);
  assert.equal(belowMinReward({ reward: 0.5 }, { reward: 1 }), "reward=0.5 below min_reward 1");
  // A gated key the step did not write counts as below.
  assert.equal(belowMinReward({ reward: 1 }, { ok: 0 }), "ok=-Infinity below min_reward 0");
});

/** Whether this file built the base (then it removes it), and the images it built. */
let builtBase = false;
const images: string[] = [];
let prepared: Promise<HarborTask> | null = null;

/** The fixture's task, its base and images built once for the file. */
function fixture(): Promise<HarborTask> {
  prepared ??= (async () => {
    if (!await hasImage(STEPS_BASE)) {
      builtBase = true;
      await buildShellBase(STEPS_BASE);
    }
    const { tasks } = await loadHarborTasks(FIXTURE);
    const built = await buildHarborImage(tasks[0]);
    images.unshift(built.image, built.taskImage);
    return tasks[0];
  })();
  return prepared;
}

async function one(task: HarborTask, agent: Agent | "oracle"): Promise<HarborResult> {
  const [result] = await runHarborTasks([task], agent, { signal: testSignal() });
  assert.deepEqual(await containersLeft(task.path), [], "containers left behind");
  return result;
}

/** Runs `cmd` in the agent's shell, asserting it succeeded. */
async function sh(run: Parameters<Parameters<typeof functionAgent>[0]>[1], cmd: string) {
  await using shell = await run.client.open("shell", { signal: testSignal() });
  const r = await shell.exec(cmd, { signal: testSignal() });
  assert.equal(r.code, 0, `${cmd}: ${r.stderrText}`);
}

test({
  name: "runHarborTasks() runs a two-step task's steps in one container: the oracle scores 1.0",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = await fixture();
    const result = await one(task, "oracle");
    assert.equal(result.error, null);
    assert.equal(result.reward, 1);
    // The combined keys (each key's mean: step 1 wrote no `appended`), and each step's.
    assert.deepEqual(result.subscores, {
      reward: 1,
      appended: 0.5,
      "write/reward": 1,
      "extend/reward": 1,
      "extend/appended": 1,
    });
    assert.deepEqual(result.runs.map((r) => [r.task.slug, r.task.args, r.reward]), [
      ["two-steps/write", { step: 0 }, 1],
      ["two-steps/extend", { step: 1 }, 1],
    ]);
    // Each step's prompt is its own instruction.
    const prompts = result.runs.map((r) =>
      JSON.stringify(
        (r.trace as { steps?: { type: string; content?: unknown }[] }).steps
          ?.find((s) => s.type === "user")?.content,
      )
    );
    assert.match(prompts[0], /Write the line `hello`/);
    assert.match(prompts[1], /Append a space and the word `world`/);
    assert.equal(result.verifier?.code, 0);
  }),
});

test({
  name:
    "runHarborTasks() scores an idle agent 0.0 on a two-step task, stopping at step 1's min_reward",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = await fixture();
    const result = await one(task, functionAgent(async () => {}));
    assert.equal(result.error, null);
    assert.equal(result.reward, 0);
    assert.deepEqual(result.subscores, { reward: 0, "write/reward": 0 });
    // Step 2 never ran: step 1 fell below its min_reward.
    assert.deepEqual(result.runs.map((r) => r.task.slug), ["two-steps/write"]);
  }),
});

test({
  name: "runHarborTasks() makes a step that cannot start an error with its class, never a 0",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = await fixture();
    // Step 2's healthcheck never passes: the task cannot start it.
    const broken: HarborTask = {
      ...task,
      steps: task.steps!.map((s, i) =>
        i === 0 ? s : {
          ...s,
          config: {
            ...s.config,
            healthcheck: {
              command: "false",
              intervalSec: 0,
              timeoutSec: 5,
              startPeriodSec: 0,
              startIntervalSec: 0,
              retries: 1,
            },
          },
        }
      ),
    };
    const built = await buildHarborImage(broken);
    images.unshift(built.image);
    const result = await one(broken, "oracle");
    assert.equal(result.reward, null);
    assert.match(result.error ?? "", /^step "extend": .*healthcheck failed after 1 retries: false/);
    assert.deepEqual(result.runs.map((r) => [r.reward, r.error_class]), [
      [1, null],
      [null, "start_error"],
    ]);
  }),
});

/**
 * An agent that does step 1's work honestly and leaves a process that writes a full reward to /logs/verifier in a loop and,
 * with `replaceShell`, once step 1's reward is written (it was held while
 * the verifier ran), replaces the verifier's shell with one that writes a
 * full reward: to forge step 2's. In step 2 it does nothing.
 */
function forger(replaceShell: boolean): Agent {
  const forged = `{"reward": 1, "appended": 1}`;
  const script = [
    "#!/bin/sh",
    `while :; do echo '${forged}' > /logs/verifier/reward.json 2>/dev/null; touch /tmp/tried; sleep 0.01; done &`,
    ...(replaceShell
      ? [
        // Step 1's verifier wrote its reward: step 1 is graded, this process is running again.
        "until [ -e /logs/verifier/reward.txt ]; do sleep 0.01; done",
        `printf '#!/bin/sh\\necho %s > /logs/verifier/reward.json\\n' "'${forged}'" > /tmp/fake`,
        'chmod 755 /tmp/fake && mv -f /tmp/fake "$(command -v bash)" && touch /tmp/replaced',
      ]
      : []),
    "wait",
    "",
  ].join("\n");
  return functionAgent(async (_prompt, run) => {
    if (run.task.args.step !== 0) {
      // Its accomplice is at work before step 2 is graded: the forged reward tried (and,
      // with replaceShell, the verifier's shell replaced).
      const ready = replaceShell ? "/tmp/replaced" : "/tmp/tried";
      await sh(run, `for i in $(seq 200); do [ -e ${ready} ] && exit 0; sleep 0.05; done; exit 1`);
      return;
    }
    await sh(run, "echo hello > /app/out.txt");
    await sh(run, `cat > /tmp/leftover.sh <<'EOF'\n${script}EOF`);
    // In a process group of its own (`set -m`): out of the groups the workspace knows.
    await sh(run, "set -m; nohup sh /tmp/leftover.sh > /dev/null 2>&1 < /dev/null &");
  });
}

test({
  name:
    "runHarborTasks(): a process an agent leaves in step 1 to write step 2's reward does not score",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = await fixture();
    const result = await one(task, forger(false));
    // Step 1 honestly 1, step 2 honestly 0: the mean, not the forged 1.
    assert.equal(result.error, null);
    assert.deepEqual(result.runs.map((r) => r.reward), [1, 0]);
    assert.equal(result.reward, 0.5);
    assert.equal(result.subscores["extend/reward"], 0);
  }),
});

test({
  name:
    "runHarborTasks(): the verifier's shell replaced after step 1 was graded ends step 2 tampered",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = await fixture();
    const result = await one(task, forger(true));
    // Measured against the image as it was before any agent ran, not as step 1 left it.
    assert.equal(result.reward, null);
    // Step 2's record: 0 without its verifier run, classed tampered (no mean counts it).
    assert.deepEqual(result.runs.map((r) => [r.reward, r.error_class]), [
      [1, null],
      [0, "tampered"],
    ]);
    assert.match(result.error ?? "", /^step "extend": .*tampering/);
  }),
});

test({
  name:
    "runHarborTasks(): a one-step task's reward is not written by a process the agent put in a group or session of its own",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    await fixture();
    const root = await Deno.makeTempDir({ prefix: "hud-harbor-steps-one-" });
    try {
      await writeTask(root, "one", {
        "environment/Dockerfile": `FROM ${STEPS_BASE}\nWORKDIR /app\n`,
        "task.toml": "[verifier]\ntimeout_sec = 20\n",
        "instruction.md": "Write hello to /app/out.txt.\n",
        "tests/test.sh": '[ "$(cat /app/out.txt)" = hello ] && r=1 || r=0\n' +
          "echo $r > /logs/verifier/reward.txt\n",
      });
      const [task] = (await loadHarborTasks(root)).tasks;
      const built = await buildHarborImage(task);
      images.unshift(built.image, built.taskImage);
      // reward.json is read before reward.txt: a writer of it that ran on would forge the score.
      const writer = (detach: string) =>
        functionAgent(async (_prompt, run) => {
          await sh(
            run,
            `printf '%s\\n' 'while :; do echo "{\\"reward\\": 1}" > /logs/verifier/reward.json; touch /tmp/tried; sleep 0.01; done' > /tmp/w.sh`,
          );
          await sh(run, detach);
          await sh(
            run,
            "for i in $(seq 100); do [ -e /tmp/tried ] && exit 0; sleep 0.05; done; exit 1",
          );
        });
      // A process group of its own (`set -m`); a session of its own (setsid(2), through the
      // container's deno, as the image has no setsid command).
      const detached = 'new Deno.Command("sh", { args: ["/tmp/w.sh"], detached: true, ' +
        'stdin: "null", stdout: "null", stderr: "null" }).spawn().unref()';
      for (
        const detach of [
          "set -m; nohup sh /tmp/w.sh > /dev/null 2>&1 < /dev/null &",
          `DENO_DIR=/tmp/deno-dir deno eval '${detached}'`,
        ]
      ) {
        const result = await one(task, writer(detach));
        assert.equal(result.error, null, detach);
        assert.equal(result.reward, 0, detach);
      }
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  }),
});

test({ name: "steps_test removes the images it built", needs: [ENGINE] }, async () => {
  using engine = await EngineClient.open();
  for (const image of [...images, ...(builtBase ? [STEPS_BASE] : [])]) {
    await engine.call("DELETE", `/images/${encodeURIComponent(image)}`).catch((err) => {
      if (!(err instanceof EngineError && (err.status === 404 || err.status === 409))) throw err;
    });
  }
});
