// loadHarborTasks() treats a task folder as hostile (issue 35, 9): a file it
// reads or copies that is a symlink out of the folder (a root-only file, a
// device) is refused, never read; so is a file that is not a regular one
// (a FIFO would block the loader), or one over its size bound; each refusal
// is one line naming the file, and the other tasks still load. A task that
// needs GPUs is refused as Harbor's Docker environment refuses it (issue 35,
// 4). A task whose verifier has a container of its own loads when that
// container has an image (tests/Dockerfile, or a docker_image), and is
// refused in one line otherwise, or with [[steps]], or with a malformed
// [verifier.environment] (naming the field).

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { loadHarborTasks, parseHarborConfig } from "../../harbor/mod.ts";
import { writeTask } from "./_dataset.ts";

const GOOD = {
  "task.toml": '[environment]\ndocker_image = "base"\n',
  "instruction.md": "Do it.\n",
  "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
};

async function withDataset(fn: (root: string, secret: string) => Promise<void>): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-hostile-" });
  const outside = await Deno.makeTempDir({ prefix: "hud-harbor-outside-" });
  const secret = `${outside}/secret`;
  await Deno.writeTextFile(secret, "root's secret\n", { mode: 0o600 });
  try {
    await writeTask(root, "good", GOOD);
    await fn(root, secret);
  } finally {
    await Deno.remove(root, { recursive: true });
    await Deno.remove(outside, { recursive: true });
  }
}

async function skipped(
  root: string,
  loaded = ["good"],
): Promise<Record<string, [string, string]>> {
  const { tasks, skipped } = await loadHarborTasks(root);
  assert.deepEqual(tasks.map((t) => t.name), loaded);
  return Object.fromEntries(skipped.map((s) => [s.name, [s.code, s.reason]]));
}

test("loadHarborTasks() refuses a symlink out of the task folder, naming it, and reads nothing of it", async () => {
  await withDataset(async (root, secret) => {
    for (
      const [name, rel] of [
        ["instruction", "instruction.md"],
        ["config", "task.toml"],
        ["zero", "instruction.md"],
        ["test", "tests/test.sh"],
        ["helper", "tests/helpers/data.txt"],
        ["solution", "solution/notes.txt"],
        ["context", "environment/secret"],
      ]
    ) {
      const files: Record<string, string> = { ...GOOD };
      delete files[rel];
      if (name === "solution") files["solution/solve.sh"] = "true\n";
      if (name === "context") files["environment/Dockerfile"] = "FROM base\n";
      await writeTask(root, name, files);
      await Deno.mkdir(`${root}/${name}/${rel.slice(0, rel.lastIndexOf("/") + 1) || "."}`, {
        recursive: true,
      });
      await Deno.symlink(name === "zero" ? "/dev/zero" : secret, `${root}/${name}/${rel}`);
    }
    const refused = await skipped(root);
    for (const [name, [code, reason]] of Object.entries(refused)) {
      assert.equal(code, "bad_file", name);
      assert.doesNotMatch(reason, /root's secret/, name);
      assert.ok(!reason.includes("\n"), `${name}: more than one line`);
    }
    const target = (name: string, rel: string, to = secret) =>
      `${root}/${name}/${rel} leads outside the task folder (to "${to}")`;
    assert.equal(refused.instruction[1], target("instruction", "instruction.md"));
    assert.equal(refused.config[1], target("config", "task.toml"));
    assert.equal(refused.zero[1], target("zero", "instruction.md", "/dev/zero"));
    assert.equal(refused.test[1], target("test", "tests/test.sh"));
    for (
      const [name, rel] of [["helper", "tests/helpers/data.txt"], [
        "solution",
        "solution/notes.txt",
      ], [
        "context",
        "environment/secret",
      ]]
    ) {
      assert.equal(
        refused[name][1],
        `${root}/${name}/${rel} is a symlink that leads outside the task folder (to "${secret}")`,
      );
    }
    // A symlink to a whole task elsewhere is no task of the dataset.
    await Deno.symlink(`${root}/good`, `${root}/linked`);
    assert.deepEqual((await loadHarborTasks(root)).tasks.map((t) => t.name), ["good"]);
  });
});

test("loadHarborTasks() refuses a FIFO and files over their bounds, and a task that needs GPUs", async () => {
  await withDataset(async (root) => {
    await writeTask(root, "fifo", { ...GOOD, "instruction.md": "" });
    await Deno.remove(`${root}/fifo/instruction.md`);
    const mkfifo = await new Deno.Command("mkfifo", { args: [`${root}/fifo/instruction.md`] })
      .output();
    assert.ok(mkfifo.success);
    await writeTask(root, "huge", { ...GOOD, "instruction.md": "x".repeat((1 << 20) + 1) });
    await writeTask(root, "gpu", {
      ...GOOD,
      "task.toml": '[environment]\ndocker_image = "b"\ngpus = 1\n',
    });
    const refused = await skipped(root);
    assert.deepEqual(refused.fifo, [
      "bad_file",
      `${root}/fifo/instruction.md is not a regular file`,
    ]);
    assert.deepEqual(refused.huge, [
      "bad_file",
      `${root}/huge/instruction.md holds ${(1 << 20) + 1} bytes, over the ${1 << 20} it may hold`,
    ]);
    assert.deepEqual(refused.gpu, [
      "gpu",
      `${root}/gpu/task.toml: needs 1 GPU(s) ([environment] gpus); this runner gives containers no GPUs, as Harbor's Docker environment gives none`,
    ]);
  });
});

test("parseHarborConfig() reads Harbor 0.22's verifier environment_mode and [environment] gpus", () => {
  const shared = parseHarborConfig("", "t/task.toml");
  assert.deepEqual([shared.verifierMode, shared.environment.gpus], ["shared", 0]);
  // [verifier.environment] implies "separate".
  const implied = parseHarborConfig(
    '[environment]\ngpus = 2\n[verifier.environment]\ndocker_image = "v"\n',
    "t/task.toml",
  );
  assert.deepEqual([implied.verifierMode, implied.environment.gpus], ["separate", 2]);
  const bad = (toml: string, message: RegExp) =>
    assert.throws(() => parseHarborConfig(toml, "t/task.toml"), message);
  bad(
    '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n',
    /"verifier\.environment" needs environment_mode "separate" \(it is "shared"\)/,
  );
  bad('[verifier]\nenvironment_mode = "apart"\n', /must be "shared" or "separate"/);
  bad("[environment]\ngpus = -1\n", /"environment\.gpus" must be an integer >= 0/);
  bad("[environment]\ngpus = 1.5\n", /"environment\.gpus" must be an integer >= 0/);
});

test("loadHarborTasks() loads separate-verifier tasks with an image for the verifier, and refuses the others in one line", async () => {
  await withDataset(async (root) => {
    const sep = '[verifier]\nenvironment_mode = "separate"\n';
    // The verifier's image: [environment]'s docker_image (copied), its own, or tests/Dockerfile.
    await writeTask(root, "copied", { ...GOOD, "task.toml": GOOD["task.toml"] + sep });
    await writeTask(root, "own", {
      ...GOOD,
      "environment/Dockerfile": "FROM base\n",
      "task.toml": '[verifier.environment]\ndocker_image = "judge"\ncpus = 2\n',
    });
    await writeTask(root, "built", {
      ...GOOD,
      "environment/Dockerfile": "FROM base\n",
      "tests/Dockerfile": "FROM base\nCOPY . /tests\n",
      "task.toml": 'artifacts = ["/app/out.txt", { source = "app/dir/" }]\n' + sep,
    });
    await writeTask(root, "noimage", {
      ...GOOD,
      "environment/Dockerfile": "FROM base\n",
      "task.toml": sep,
    });
    await writeTask(root, "stepped", {
      ...GOOD,
      "task.toml": GOOD["task.toml"] + sep + '[[steps]]\nname = "one"\n',
      "steps/one/instruction.md": "One.\n",
    });
    await writeTask(root, "malformed", {
      ...GOOD,
      "task.toml": '[verifier.environment]\ncpus = "two"\n',
    });
    await writeTask(root, "excluding", {
      ...GOOD,
      "task.toml": 'artifacts = [{ source = "/app", exclude = ["*.log"] }]\n' +
        GOOD["task.toml"] + sep,
    });
    await writeTask(root, "hooked", {
      ...GOOD,
      "task.toml": GOOD["task.toml"] + sep +
        '[[verifier.collect]]\ncommand = "pg_dump > /app/db.sql"\n',
    });
    const refused = await skipped(root, ["built", "copied", "good", "own"]);
    assert.deepEqual(refused, {
      noimage: [
        "separate_verifier",
        `${root}/noimage/task.toml: [verifier] environment_mode "separate": the verifier's image is built from tests/Dockerfile, or is [verifier.environment] docker_image; this task has neither`,
      ],
      stepped: [
        "separate_verifier",
        `${root}/stepped/task.toml: [verifier] environment_mode "separate": not supported with [[steps]] by this runner`,
      ],
      malformed: [
        "bad_config",
        `Cannot load Harbor task: ${root}/malformed/task.toml: "verifier.environment.cpus" must be a positive number`,
      ],
      hooked: [
        "separate_verifier",
        `${root}/hooked/task.toml: [verifier] environment_mode "separate": [[verifier.collect]] hooks are not run by this runner (what they collect would be missing)`,
      ],
      excluding: [
        "separate_verifier",
        `${root}/excluding/task.toml: [verifier] environment_mode "separate": artifacts[0].exclude is not supported yet (the whole path would reach the verifier)`,
      ],
    });
    const { tasks } = await loadHarborTasks(root);
    const byName = Object.fromEntries(tasks.map((t) => [t.name, t]));
    assert.deepEqual(
      ["copied", "own", "built", "good"].map((n) => [
        byName[n].config.verifierEnvironment?.dockerImage ?? null,
        byName[n].config.verifierEnvironment?.cpus ?? null,
        byName[n].verifierBuildContext,
      ]),
      [["base", 1, null], ["judge", 2, null], [null, 1, `${root}/built/tests`], [null, null, null]],
    );
    assert.deepEqual(byName.built.config.artifacts.map((a) => a.source), [
      "/app/out.txt",
      "/app/dir",
    ]);
  });
});

test("parseHarborConfig() gives a separate verifier [verifier.environment]'s network, else [environment]'s", () => {
  const phases = (toml: string) => {
    const c = parseHarborConfig(toml, "t/task.toml");
    return [c.network.environment.mode, c.network.verifier.mode];
  };
  assert.deepEqual(phases("[verifier.environment]\nallow_internet = false\n"), [
    "public",
    "no-network",
  ]);
  assert.deepEqual(
    phases(
      '[environment]\nnetwork_mode = "no-network"\n[verifier]\nenvironment_mode = "separate"\n',
    ),
    ["no-network", "no-network"],
  );
  assert.deepEqual(
    phases(
      '[verifier]\nnetwork_mode = "public"\n[verifier.environment]\nnetwork_mode = "no-network"\n',
    ),
    ["public", "public"],
  );
  assert.throws(
    () => parseHarborConfig('[verifier.environment]\nnetwork_mode = "open"\n', "t/task.toml"),
    /"verifier\.environment\.network_mode" must be "public", "no-network" or "allowlist"/,
  );
  assert.throws(
    () => parseHarborConfig('artifacts = ["/app/../etc"]\n', "t/task.toml"),
    /"artifacts\[0\]\.source" must not hold "\.\."/,
  );
});
