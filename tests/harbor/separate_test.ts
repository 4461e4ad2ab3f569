// Harbor tasks whose verifier runs in a container of its own (`[verifier]
// environment_mode = "separate"`, issue 35), on tasks in Harbor's format
// that this file writes: an honest agent scores 1 and an idle one 0 (the
// verifier's reward.json read before its reward.txt); an agent that writes
// /logs/verifier/reward.json in its container and leaves a process in a
// session of its own rewriting it scores 0; what Harbor carries across
// (/logs/artifacts, the task's `artifacts`) reaches the verifier, and nothing
// else of the agent's container does (another file, /logs/agent, a planted
// /conftest.py or /tests/conftest.py); the verifier runs as `[verifier]
// user` in `[verifier.environment] workdir` with both `env` tables; a
// verifier image taken as `docker_image` gets tests/ in its workdir; a
// verifier out of `[verifier] timeout_sec` is an error, and its container is
// removed then too, and when the run is aborted. Needs an engine (ENGINE):
// skipped without one, naming it. The images it built are removed by its
// last test.

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildHarborImage,
  buildVerifierImage,
  type HarborResult,
  type HarborTask,
  loadHarborTasks,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { EngineClient, EngineError } from "../../engines/_engine.ts";
import { type Agent, functionAgent } from "../../eval/mod.ts";
import { testSignal, withDeadline } from "../_deadline.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { abortOnceRunning, containersLeft, hasImage } from "./_engine.ts";
import { runs, writeTask } from "./_dataset.ts";

const BASE = "hud-test-harbor-separate-base:latest";

/** The verifier's image: its own user and workdir, the tests baked in as Harbor wants them. */
const VERIFIER_DOCKERFILE = `FROM ${BASE}\n` +
  "RUN echo 'judge:x:1234:1234::/judge:/bin/bash' >> /etc/passwd && " +
  "echo 'judge:x:1234:' >> /etc/group && mkdir -p /judge && chmod 777 /judge\n" +
  "COPY . /tests\n";

const TOML = [
  'artifacts = ["/app/answer.txt"]',
  "[verifier]",
  'environment_mode = "separate"',
  'user = "judge"',
  "timeout_sec = 30",
  'env = { JUDGE = "from-verifier" }',
  "[verifier.environment]",
  'workdir = "/judge"',
  'env = { SIDE = "verifier-env", JUDGE = "overridden" }',
  "",
].join("\n");

/** Each fact the verifier checks, a key of its reward.json (1: as Harbor has it). */
const FACTS: Record<string, string> = {
  answer: '[ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]',
  // The convention directory crosses; the agent's logs and other files do not.
  artifacts_dir: '[ "$(cat /logs/artifacts/note.txt 2>/dev/null)" = noted ]',
  not_other: "[ ! -e /app/other.txt ]",
  not_agent_logs: "[ ! -e /logs/agent/trace.txt ]",
  not_conftest: "[ ! -e /conftest.py ] && [ ! -e /tests/conftest.py ]",
  user: '[ "$(id -u)" = 1234 ]',
  workdir: '[ "$(pwd)" = /judge ]',
  env: '[ "$JUDGE" = from-verifier ] && [ "$SIDE" = verifier-env ]',
};

const FACTS_TEST = [
  "#!/bin/bash",
  "out=",
  ...Object.entries(FACTS).map(([k, check]) =>
    `if ${check}; then out="$out\\"${k}\\": 1, "; else out="$out\\"${k}\\": 0, "; fi`
  ),
  'echo "{${out%, }}" > /logs/verifier/reward.json',
  "",
].join("\n");

async function writeTasks(root: string): Promise<void> {
  const common = {
    "environment/Dockerfile": `FROM ${BASE}\nWORKDIR /app\n`,
    "instruction.md": "Write 42 to /app/answer.txt.\n",
    "tests/Dockerfile": VERIFIER_DOCKERFILE,
  };
  await writeTask(root, "answer", {
    ...common,
    "task.toml": TOML,
    "tests/test.sh": '#!/bin/bash\n[ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] && r=1 || r=0\n' +
      'echo "{\\"reward\\": $r}" > /logs/verifier/reward.json\n' +
      // reward.json is read before reward.txt, which says the opposite.
      "echo $((1 - r)) > /logs/verifier/reward.txt\n",
  });
  await writeTask(root, "facts", { ...common, "task.toml": TOML, "tests/test.sh": FACTS_TEST });
  // No tests/Dockerfile: the verifier's image is a docker_image, and tests/ goes to its
  // workdir, as Harbor uploads an environment folder beside a prebuilt image.
  await writeTask(root, "prebuilt", {
    "environment/Dockerfile": `FROM ${BASE}\nWORKDIR /app\n`,
    "instruction.md": "Write 42 to /app/answer.txt.\n",
    "task.toml": 'artifacts = ["/app/answer.txt"]\n' +
      `[verifier.environment]\ndocker_image = "${BASE}"\nworkdir = "/tests"\n`,
    "tests/test.sh": '#!/bin/bash\n[ "$(cat /app/answer.txt)" = 42 ] && r=1 || r=0\n' +
      "echo $r > /logs/verifier/reward.txt\n",
  });
  await writeTask(root, "slow", {
    ...common,
    "task.toml": TOML.replace("timeout_sec = 30", "timeout_sec = 2"),
    "tests/test.sh": "#!/bin/bash\necho started\nsleep 60\necho 1 > /logs/verifier/reward.txt\n",
  });
}

let builtBase = false;
const images: string[] = [];
let prepared: Promise<Map<string, HarborTask>> | null = null;

/** The tasks, written and their images (the agent's and the verifier's) built, once for the file. */
function tasks(): Promise<Map<string, HarborTask>> {
  prepared ??= (async () => {
    if (!await hasImage(BASE)) {
      builtBase = true;
      await buildShellBase(BASE);
    }
    const root = await Deno.makeTempDir({ prefix: "hud-harbor-separate-" });
    globalThis.addEventListener("unload", () => Deno.removeSync(root, { recursive: true }));
    await writeTasks(root);
    const { tasks, skipped } = await loadHarborTasks(root);
    assert.deepEqual(skipped, []);
    for (const t of tasks) {
      const built = await buildHarborImage(t);
      const verifier = await buildVerifierImage(t);
      images.unshift(
        built.image,
        built.taskImage,
        ...(t.verifierBuildContext ? [verifier.image] : []),
      );
    }
    return new Map(tasks.map((t) => [t.name, t]));
  })();
  return prepared;
}

async function one(task: HarborTask, agent: Agent, signal = testSignal()): Promise<HarborResult> {
  const [result] = await runHarborTasks([task], agent, { signal });
  assert.deepEqual(await containersLeft(task.path), [], "containers left behind");
  return result;
}

test({
  name:
    "runHarborTasks() scores an honest agent 1 and an idle one 0 with the verifier in its own container",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = (await tasks()).get("answer")!;
    const honest = await one(task, runs("echo 42 > /app/answer.txt"));
    assert.deepEqual([honest.reward, honest.error], [1, null]);
    assert.deepEqual(honest.subscores, { reward: 1 });
    assert.equal(honest.verifier?.code, 0);
    const idle = await one(task, functionAgent(() => {}));
    assert.deepEqual([idle.reward, idle.error], [0, null]);
  }),
});

test({
  name: "runHarborTasks() gives a docker_image verifier tests/ in its workdir, as Harbor does",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = (await tasks()).get("prebuilt")!;
    const honest = await one(task, runs("echo 42 > /app/answer.txt"));
    assert.deepEqual([honest.reward, honest.error], [1, null]);
  }),
});

test({
  name:
    "runHarborTasks() gives 0 to an agent that writes reward.json in its container and leaves a process in a session of its own rewriting it",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = (await tasks()).get("answer")!;
    const loop =
      'while :; do echo "{\\"reward\\": 1}" > /logs/verifier/reward.json; sleep 0.01; done';
    const detached = 'new Deno.Command("sh", { args: ["/tmp/w.sh"], detached: true, ' +
      'stdin: "null", stdout: "null", stderr: "null" }).spawn().unref()';
    const forger = runs(
      "echo '{\"reward\": 1}' > /logs/verifier/reward.json && echo 1 > /logs/verifier/reward.txt",
      `printf '%s\\n' '${loop}' > /tmp/w.sh`,
      `DENO_DIR=/tmp/deno-dir deno eval '${detached}'`,
      // The writer is running (it rewrites the file: one look may find it truncated).
      "for i in $(seq 100); do grep -q reward /logs/verifier/reward.json && exit 0; sleep 0.05; done; exit 1",
    );
    const forged = await one(task, forger);
    assert.deepEqual([forged.reward, forged.error], [0, null]);
  }),
});

test({
  name:
    "runHarborTasks() carries /logs/artifacts and the task's artifacts to the separate verifier, and nothing else of the agent's container",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = (await tasks()).get("facts")!;
    const result = await one(
      task,
      runs(
        "echo 42 > /app/answer.txt && echo other > /app/other.txt",
        "echo noted > /logs/artifacts/note.txt && echo agent > /logs/agent/trace.txt",
        // Planted for a pytest the verifier might run: only the agent's container has them.
        "echo 'raise SystemExit(0)' > /conftest.py && mkdir -p /tests && cp /conftest.py /tests/",
      ),
    );
    assert.equal(result.error, null);
    assert.deepEqual(result.subscores, Object.fromEntries(Object.keys(FACTS).map((k) => [k, 1])));
  }),
});

test({
  name:
    "runHarborTasks() ends a separate verifier at [verifier] timeout_sec, and removes its container then and on an abort",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const task = (await tasks()).get("slow")!;
    const slow = await one(task, functionAgent(() => {}));
    assert.equal(slow.reward, null);
    assert.match(
      slow.error ?? "",
      /verifier timed out after 2 s \(\[verifier\] timeout_sec\); last output: started/,
    );
    // Aborted while the verifier's container runs: nothing stays behind.
    const labels = [`dev.hud.harbor.path=${task.path}`, "dev.hud.harbor.role=verifier"];
    const aborted = await abortOnceRunning(
      labels,
      (signal) =>
        runHarborTasks([task], functionAgent(() => {}), {
          signal: AbortSignal.any([signal, testSignal()]),
        }),
    );
    assert.ok(aborted, "the verifier's container never ran");
    using engine = await EngineClient.open();
    const filters = encodeURIComponent(JSON.stringify({ label: labels }));
    // The verifier's container is gone at once; the agent's is released in the background.
    const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`);
    assert.deepEqual(list, []);
    for (let i = 0; i < 100 && (await containersLeft(task.path)).length > 0; i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(await containersLeft(task.path), [], "containers left behind");
  }),
});

test({ name: "separate_test removes the images it built", needs: [ENGINE] }, async () => {
  using engine = await EngineClient.open();
  for (const image of [...images, ...(builtBase ? [BASE] : [])]) {
    await engine.call("DELETE", `/images/${encodeURIComponent(image)}`).catch((err) => {
      if (!(err instanceof EngineError && (err.status === 404 || err.status === 409))) throw err;
    });
  }
});
