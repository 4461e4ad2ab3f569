// A dataset of Harbor-format tasks for the Harbor tests, their Dockerfiles
// FROM BASE (tests/engines/_shell_base.ts builds it: no registry is reachable).

import assert from "node:assert/strict";
import { type Agent, functionAgent } from "../../eval/mod.ts";
import { testSignal } from "../_deadline.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;

/** The base image the tasks' Dockerfiles start from. */
export const BASE = "hud-test-harbor-base:latest";

/** Writes a task directory: files by relative path. */
export async function writeTask(root: string, name: string, files: Record<string, string>) {
  for (const [rel, text] of Object.entries(files)) {
    const path = `${root}/${name}/${rel}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true });
    await Deno.writeTextFile(path, text, { mode: rel.endsWith(".sh") ? 0o755 : 0o644 });
  }
}

const DOCKERFILE =
  `FROM ${BASE}\nWORKDIR /app\nENV GREETING=hello\nRUN echo seed > /app/seed.txt\n`;
// The expected text sits in a dot-file of tests/: the whole tree is copied.
const HELLO_TEST = [
  "#!/bin/bash",
  'echo "checking $(pwd)"',
  'if [ "$(cat /app/out.txt 2>/dev/null)" = "$(cat /tests/.expected)" ]; then',
  "  echo 1 > /logs/verifier/reward.txt",
  "else",
  "  echo 0 > /logs/verifier/reward.txt",
  "fi",
  "",
].join("\n");

/** A dataset of nine tasks, two of which cannot be adapted. */
export async function writeDataset(root: string): Promise<void> {
  const common = {
    "environment/Dockerfile": DOCKERFILE,
    "instruction.md": "Write hello to /app/out.txt.\n",
    // The image's ENV reaches the agent.
    "solution/solve.sh": '#!/bin/bash\necho "$GREETING" > /app/out.txt\n',
  };
  await writeTask(root, "hello", {
    ...common,
    "task.toml": 'version = "1.0"\n[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 30.0\n',
    "tests/test.sh": HELLO_TEST,
    "tests/.expected": "hello\n",
  });
  await writeTask(root, "multi", {
    ...common,
    "task.toml": "[verifier]\ntimeout_sec = 30\n[environment]\ncpus = 1\nmemory_mb = 512\n",
    "tests/test.sh":
      "#!/bin/bash\nok=0; [ -f /app/out.txt ] && ok=1\necho '{\"correctness\": '$ok', \"style\": 0.5}' > /logs/verifier/reward.json\necho 0 > /logs/verifier/reward.txt\n",
  });
  // Reward 1 when the container has no interface but its loopback.
  const offline =
    '#!/bin/bash\nn=$(tail -n +3 /proc/net/dev | grep -vc "^ *lo:")\n[ "$n" = 0 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n';
  await writeTask(root, "offline", {
    ...common,
    "task.toml": "[environment]\nallow_internet = false\n",
    "tests/test.sh": offline,
  });
  await writeTask(root, "online", { ...common, "task.toml": "", "tests/test.sh": offline });
  // [environment.env] over the image's ENV, for the agent and the verifier;
  // [solution.env] for solve.sh only.
  await writeTask(root, "envs", {
    ...common,
    "task.toml": '[environment.env]\nTASK_VAR = "from-task"\nGREETING = "over-image"\n' +
      '[solution.env]\nSOL_VAR = "it\'s the oracle"\n',
    "solution/solve.sh": '#!/bin/bash\necho "$GREETING $TASK_VAR $SOL_VAR" > /app/out.txt\n',
    "tests/test.sh": [
      "#!/bin/bash",
      'want="over-image from-task it\'s the oracle"',
      'if [ "$(cat /app/out.txt)" = "$want" ] && [ "$TASK_VAR" = from-task ] && [ -z "$SOL_VAR" ]; then',
      "  echo 1 > /logs/verifier/reward.txt",
      "else",
      "  echo 0 > /logs/verifier/reward.txt",
      "fi",
      "",
    ].join("\n"),
  });
  await writeTask(root, "slow", {
    ...common,
    "task.toml": "[verifier]\ntimeout_sec = 2\n",
    "tests/test.sh": "#!/bin/bash\necho started\nsleep 60\necho 1 > /logs/verifier/reward.txt\n",
  });
  await writeTask(root, "noreward", {
    ...common,
    "task.toml": "[verifier]\ntimeout_sec = 30\n",
    "tests/test.sh": "#!/bin/bash\necho forgot the reward\n",
  });
  await writeTask(root, "broken", {
    ...common,
    "environment/Dockerfile": `FROM ${BASE}\nRUN echo about to fail && exit 3\n`,
    "task.toml": "",
    "tests/test.sh": HELLO_TEST,
  });
  await writeTask(root, "compose", {
    "environment/docker-compose.yaml": "services: {}\n",
    "instruction.md": "x\n",
    "task.toml": "",
    "tests/test.sh": HELLO_TEST,
  });
  await writeTask(root, "badconfig", {
    ...common,
    "task.toml": '[agent]\ntimeout_sec = "soon"\n',
    "tests/test.sh": HELLO_TEST,
  });
}

/** An agent that runs `cmds` in its shell, in order, and asserts each succeeded. */
export function runs(...cmds: string[]): Agent {
  return functionAgent(async (_prompt, run, { signal }) => {
    await using shell = await run.client.open("shell", { signal });
    for (const cmd of cmds) {
      const r = await shell.exec(cmd, { signal });
      assert.equal(r.code, 0, `${cmd}: ${r.stderrText}`);
    }
  });
}

/**
 * `hud eval harbor:DATASET --agent oracle --json`, which must exit 0; its
 * summary: each task's reward, and what was skipped.
 */
export async function oracleSummary(
  dataset: string,
): Promise<{ tasks: { task: string; reward: number }[]; skipped: unknown[] }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, "eval", `harbor:${dataset}`, "--agent", "oracle", "--json"],
    stdout: "piped",
    stderr: "piped",
    signal: testSignal(),
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  return JSON.parse(new TextDecoder().decode(out.stdout));
}
