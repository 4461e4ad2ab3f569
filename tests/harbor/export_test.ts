// Harbor tasks out: a fixture environment's task exported as a Harbor task
// folder loads with loadHarborTasks, and run as Harbor's Docker environment
// runs it (harbor/export.ts cites the code: the image's ENTRYPOINT kept,
// command `sh -c "sleep infinity"`, the healthcheck awaited, the agent's and
// the verifier's commands exec'd with bash, tests/ copied to /tests) scores
// 1 for an agent that answers with the code the task made, 0 for one that
// does nothing. Needs an engine socket; skipped without one (in CI it runs).

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { exportHarborTasks, loadHarborTasks, parseToml } from "../../harbor/mod.ts";
import { EngineClient, EngineError } from "../../engines/_engine.ts";
import { tarTree } from "../../harbor/image.ts";
import { OWNER_LABEL } from "../../engines/mod.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { BASE } from "./_dataset.ts";
import { withDeadline } from "../_deadline.ts";
import { main } from "../../cli.ts";

const FIXTURE = new URL("../fixtures/harbor_export_env.ts", import.meta.url).pathname;
const REPO = `hud-test-harbor-export-${Deno.pid}`;

/** Runs `cmd` in the container as Harbor's `exec` does (`bash -c`); its exit code and output. */
async function exec(
  engine: EngineClient,
  id: string,
  cmd: string,
  user?: string,
): Promise<{ code: number; output: string }> {
  const made = await engine.call("POST", `/containers/${id}/exec`, {
    AttachStdout: true,
    AttachStderr: true,
    Cmd: ["bash", "-c", cmd],
    ...(user === undefined ? {} : { User: user }),
  }) as { Id: string };
  const res = await engine.raw("POST", `/exec/${made.Id}/start`, {
    body: JSON.stringify({ Detach: false, Tty: false }),
    headers: { "content-type": "application/json" },
  });
  const bytes = new Uint8Array(await res.arrayBuffer());
  let output = "";
  for (let at = 0; at + 8 <= bytes.length;) {
    const n = new DataView(bytes.buffer, at + 4, 4).getUint32(0);
    output += new TextDecoder().decode(bytes.subarray(at + 8, at + 8 + n));
    at += 8 + n;
  }
  const info = await engine.call("GET", `/exec/${made.Id}/json`) as { ExitCode: number };
  return { code: info.ExitCode, output };
}

/**
 * One Harbor trial of the exported task at `dir`: the container from its
 * docker_image with Harbor's command, the healthcheck awaited, `agent`
 * exec'd, tests/ copied to /tests, test.sh run; returns reward.txt and
 * reward.json.
 */
async function trial(
  dir: string,
  agent: string,
): Promise<
  { txt: string; json: string; agentOutput: string; token: string } | { exited: string }
> {
  const config = parseToml(await Deno.readTextFile(`${dir}/task.toml`)) as {
    environment: { docker_image: string; healthcheck: { command: string } };
    agent?: { user?: string };
  };
  using engine = await EngineClient.open();
  const { Id: id } = await engine.call("POST", "/containers/create", {
    Image: config.environment.docker_image,
    Cmd: ["sh", "-c", "sleep infinity"],
    Labels: { [OWNER_LABEL]: String(Deno.pid) },
  }) as { Id: string };
  try {
    await engine.call("POST", `/containers/${id}/start`);
    // Harbor's bind mounts, made writable for all.
    await exec(engine, id, "mkdir -p /logs/agent /logs/verifier && chmod 777 /logs/*");
    let healthy = false;
    for (let i = 0; i < 120 && !healthy; i++) {
      const state = await engine.call("GET", `/containers/${id}/json`) as {
        State: { Running: boolean };
      };
      if (!state.State.Running) return { exited: await engine.logs(id) };
      healthy = (await exec(engine, id, config.environment.healthcheck.command)).code === 0;
      if (!healthy) await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(healthy, `never healthy: ${await engine.logs(id)}`);
    // As `[agent] user` when the task names one, as Harbor execs the agent's commands.
    const acted = await exec(engine, id, agent, config.agent?.user);
    assert.equal(acted.code, 0, acted.output);
    const tar = await tarTree(`${dir}/tests`, "tests");
    const put = await engine.raw("PUT", `/containers/${id}/archive?path=/`, {
      body: tar,
      headers: { "content-type": "application/x-tar" },
    });
    await put.body?.cancel();
    const verified = await exec(
      engine,
      id,
      "bash /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1",
    );
    const stdout = (await exec(engine, id, "cat /logs/verifier/test-stdout.txt")).output;
    assert.equal(verified.code, 0, stdout);
    // The token never reaches the verifier's output.
    const token = (await exec(engine, id, "cat /run/hud-harbor/serve.out")).output;
    assert.match(token, /HUD_SERVE_TOKEN=/);
    assert.ok(!stdout.includes(/HUD_SERVE_TOKEN=(.+)/.exec(token)![1]), "token in the output");
    const modes = await exec(
      engine,
      id,
      "stat -c %a /run/hud-harbor /run/hud-harbor/serve.out /run/hud-harbor/control.json",
    );
    assert.deepEqual(modes.output.trim().split("\n"), ["700", "600", "600"]);
    return {
      txt: (await exec(engine, id, "cat /logs/verifier/reward.txt")).output.trim(),
      json: (await exec(engine, id, "cat /logs/verifier/reward.json")).output.trim(),
      agentOutput: acted.output,
      token: /HUD_SERVE_TOKEN=(.+)/.exec(token)![1].trim(),
    };
  } finally {
    await engine.call("DELETE", `/containers/${id}?force=true`);
  }
}

async function removeImages(prefix: string): Promise<void> {
  using engine = await EngineClient.open();
  const filters = encodeURIComponent(JSON.stringify({ reference: [`${prefix}*`] }));
  const list = await engine.call("GET", `/images/json?filters=${filters}`) as {
    Id: string;
    RepoTags: string[] | null;
  }[];
  for (const image of list) {
    for (const tag of image.RepoTags ?? []) {
      await engine.call("DELETE", `/images/${encodeURIComponent(tag)}`).catch((err) => {
        if (!(err instanceof EngineError && err.status === 404)) throw err;
      });
    }
  }
}

/** The fixture exported once (base and images built), for the tests that use it; removed at unload. */
let exported: Promise<string> | null = null;
function exportOnce(): Promise<string> {
  exported ??= (async () => {
    await buildShellBase(BASE);
    const out = await Deno.makeTempDir({ prefix: "hud-harbor-export-" });
    globalThis.addEventListener("unload", () => {
      Deno.removeSync(out, { recursive: true });
    });
    const result = await exportHarborTasks(FIXTURE, `${out}/tasks`, {
      from: BASE,
      repository: REPO,
    });
    assert.deepEqual(result.tasks.map((t) => [t.name, t.id]), [
      ["code", "code"],
      ["plain", "plain"],
      ["varying", "varying"],
    ]);
    return `${out}/tasks`;
  })();
  return exported;
}

test({
  name: "exportHarborTasks() writes task folders that loadHarborTasks() reads",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const out = await exportOnce();
    const { tasks, skipped } = await loadHarborTasks(out);
    assert.deepEqual(skipped, []);
    assert.deepEqual(tasks.map((t) => t.name), ["code", "plain", "varying"]);
    assert.match(tasks[0].instruction, /^Read the code in the one file under \/tmp\//);
    assert.match(tasks[0].instruction, /write your final answer to \/logs\/agent\/answer\.txt/);
    assert.equal(tasks[0].config.environment.dockerImage, `${REPO}:code`);
    assert.equal(
      await Deno.readTextFile(`${out}/code/environment/Dockerfile`),
      `FROM ${REPO}:code\n`,
    );
    assert.equal((await Deno.stat(`${out}/code/tests/test.sh`)).mode! & 0o777, 0o755);
    const toml = parseToml(await Deno.readTextFile(`${out}/code/task.toml`)) as {
      metadata: Record<string, string>;
      agent: { timeout_sec: number };
      verifier: { timeout_sec: number };
    };
    assert.deepEqual([toml.agent.timeout_sec, toml.verifier.timeout_sec], [600, 600]);
    assert.deepEqual(toml.metadata, {
      hud_env: "harbor-export-fixture",
      hud_env_version: "0.1.0",
      hud_template: "code",
      hud_args: "{}",
      hud_slug: "code",
    });
    // The command line, with the environment's image given: one line per task.
    const again = await Deno.makeTempDir({ prefix: "hud-harbor-export-" });
    try {
      const lines: string[] = [];
      const code = await main([
        "export-harbor",
        FIXTURE,
        "--out",
        again,
        "--image",
        `${REPO}-env:latest`,
        "--repository",
        `${REPO}-cli`,
        "--no-answer",
        "--agent-timeout",
        "90",
        "--verifier-timeout",
        "1.5",
      ], { stdout: (t) => lines.push(t), stderr: () => {} });
      assert.equal(code, 0);
      // The flags in seconds, the library's agentTimeout/verifierTimeout in ms, the file in seconds.
      const timed = parseToml(await Deno.readTextFile(`${again}/code/task.toml`)) as {
        agent: { timeout_sec: number };
        verifier: { timeout_sec: number };
      };
      assert.deepEqual([timed.agent.timeout_sec, timed.verifier.timeout_sec], [90, 1.5]);
      assert.deepEqual(lines.join("").trim().split("\n").map((l) => l.split(" ")[1]), [
        `${REPO}-cli:code`,
        `${REPO}-cli:plain`,
        `${REPO}-cli:varying`,
      ]);
      const instruction = await Deno.readTextFile(`${again}/code/instruction.md`);
      assert.ok(!instruction.includes("answer.txt"), instruction);
      // An image that "hud image" did not build is refused, naming it.
      let err = "";
      const refused = await main(
        ["export-harbor", FIXTURE, "--out", `${again}/x`, "--image", BASE],
        { stdout: () => {}, stderr: (t) => err += t },
      );
      assert.equal(refused, 1);
      assert.equal(
        err,
        `error: Cannot export Harbor tasks: image "${BASE}" was not built by "hud image"; build it with "hud image" or leave out --image\n`,
      );
      // Without --repository, the images' names come from the output folder (issue 38: all were
      // hud-harbor-export/ENV, so two exports on one engine replaced each other's images).
      const images = async (out: string) => {
        const printed: string[] = [];
        const code = await main(
          ["export-harbor", FIXTURE, "--out", out, "--image", `${REPO}-env:latest`],
          { stdout: (t) => printed.push(t), stderr: () => {} },
        );
        assert.equal(code, 0);
        return printed.join("").trim().split("\n").map((l) => l.split(" ")[1]);
      };
      const [a, b] = [await images(`${again}/a`), await images(`${again}/b`)];
      const named = /^hud-harbor-export\/harbor-export-fixture-[0-9a-f]{10}:(code|plain|varying)$/;
      assert.ok([...a, ...b].every((image) => named.test(image)), [...a, ...b].join(" "));
      assert.notEqual(a[0].split(":")[0], b[0].split(":")[0]);
      // Exported again to the same folder, the same names.
      await Deno.remove(`${again}/a`, { recursive: true });
      assert.deepEqual(await images(`${again}/a`), a);
    } finally {
      await Deno.remove(again, { recursive: true });
      await removeImages("hud-harbor-export/harbor-export-fixture-");
    }
  }),
});

test({
  name: "exportHarborTasks() tasks run as Harbor runs them: 1 for the right answer, 0 for none",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    const dir = `${await exportOnce()}/code`;
    try {
      // The code exists before the agent acts, and only the environment knows it.
      const right = await trial(
        dir,
        "cat /tmp/hud-harbor-export-code/code-*.txt > /logs/agent/answer.txt",
      );
      assert.ok("txt" in right, JSON.stringify(right));
      assert.equal(right.txt, "1");
      assert.deepEqual(JSON.parse(right.json), { match: 1, answered: 1, reward: 1 });
      const idle = await trial(dir, "true");
      assert.ok("txt" in idle, JSON.stringify(idle));
      assert.equal(idle.txt, "0");
      assert.deepEqual(JSON.parse(idle.json), { match: 0, answered: 0, reward: 0 });
      // A planted reward (issue 35, 8): Harbor reads reward.json before reward.txt, and a
      // grade without subscores wrote only reward.txt, so the planted file stood. Now
      // both are removed and rewritten, even where the agent made one a directory.
      const plant = "echo '{\"reward\": 1}' > /logs/verifier/reward.json; " +
        "mkdir /logs/verifier/reward.txt";
      const planted = await trial(`${dir}/../plain`, plant);
      assert.ok("txt" in planted, JSON.stringify(planted));
      assert.deepEqual([planted.txt, JSON.parse(planted.json)], ["0", { reward: 0 }]);
      const plainRight = await trial(
        `${dir}/../plain`,
        `echo ok > /logs/agent/answer.txt; ${plant}`,
      );
      assert.ok("txt" in plainRight, JSON.stringify(plainRight));
      assert.deepEqual([plainRight.txt, JSON.parse(plainRight.json)], ["1", { reward: 1 }]);
      const plantedCode = await trial(dir, plant);
      assert.ok("txt" in plantedCode, JSON.stringify(plantedCode));
      assert.equal(plantedCode.txt, "0");
      // A template whose prompt varies: its container refuses to start, saying why.
      const varying = await trial(`${dir}/../varying`, "true");
      assert.ok("exited" in varying, JSON.stringify(varying));
      assert.match(varying.exited, /gave another prompt than the exported instruction\.md/);
    } finally {
      await removeImages(REPO);
    }
  }),
});

test({
  name:
    "exportHarborTasks({ agentUser }): the agent cannot read the environment's token, and what it leaves running cannot change the reward",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    await buildShellBase(BASE);
    const out = await Deno.makeTempDir({ prefix: "hud-harbor-export-user-" });
    try {
      await exportHarborTasks(FIXTURE, `${out}/tasks`, {
        from: BASE,
        repository: `${REPO}-user`,
        agentUser: "hud-agent",
      });
      const dir = `${out}/tasks/code`;
      const { tasks } = await loadHarborTasks(dir);
      assert.equal(tasks[0].config.agentUser, "hud-agent");
      // Honest work as that user still scores.
      const right = await trial(
        dir,
        '[ "$(id -un)" = hud-agent ] && cat /tmp/hud-harbor-export-code/code-*.txt > /logs/agent/answer.txt',
      );
      assert.ok("txt" in right, JSON.stringify(right));
      assert.equal(right.txt, "1");
      // The token: neither its files nor any process's environment give it away.
      const snoop = await trial(
        dir,
        "cat /run/hud-harbor/serve.out /run/hud-harbor/control.json 2>&1; " +
          "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done; true",
      );
      assert.ok("txt" in snoop, JSON.stringify(snoop));
      assert.match(snoop.agentOutput, /Permission denied/);
      assert.ok(!snoop.agentOutput.includes(snoop.token), "the agent read the token");
      // A process left writing a full reward, detached from the command: killed before the grade.
      const loop = "while :; do rm -f /logs/verifier/reward.json /logs/verifier/reward.txt; " +
        `echo '{"reward": 1}' > /logs/verifier/reward.json; echo 1 > /logs/verifier/reward.txt; ` +
        "sleep 0.005; done";
      const forger =
        `echo no > /logs/agent/answer.txt; cat > /tmp/forge.sh <<'EOF'\n${loop}\nEOF\n` +
        "nohup bash /tmp/forge.sh > /dev/null 2>&1 < /dev/null & sleep 0.5";
      const forged = await trial(`${out}/tasks/plain`, forger);
      assert.ok("txt" in forged, JSON.stringify(forged));
      assert.deepEqual([forged.txt, JSON.parse(forged.json)], ["0", { reward: 0 }]);
    } finally {
      await removeImages(`${REPO}-user`);
      await Deno.remove(out, { recursive: true });
    }
  }),
});

test("hud export-harbor refuses bad input with one line naming it and the way out", async () => {
  const out = await Deno.makeTempDir({ prefix: "hud-harbor-export-" });
  try {
    const run = async (...args: string[]) => {
      let err = "";
      const code = await main(["export-harbor", ...args], {
        stdout: () => {},
        stderr: (t) => err += t,
      });
      return { code, err };
    };
    await Deno.writeTextFile(`${out}/taken`, "x");
    const full = await run(FIXTURE, "--out", out, "--from", "x");
    assert.equal(full.code, 1);
    assert.equal(
      full.err,
      `error: Cannot export Harbor tasks: "${out}" is not empty; give a new or empty --out directory\n`,
    );
    const missing = await run(`${out}/nope.ts`, "--out", `${out}/a`, "--from", "x");
    assert.equal(missing.code, 1);
    assert.match(missing.err, /^error: Cannot load environment: file ".*nope\.ts" not found\n$/);
    const broken = new URL("../fixtures/broken_env.ts", import.meta.url).pathname;
    const throws = await run(broken, "--out", `${out}/a`, "--from", "x");
    assert.equal(throws.code, 1);
    assert.match(
      throws.err,
      /^error: Cannot load environment from ".*broken_env\.ts": .*fixture refuses to load \(at .*broken_env\.ts:3:\d+\)\n$/,
    );
    await Deno.writeTextFile(
      `${out}/rows.jsonl`,
      JSON.stringify({ env: "harbor-export-fixture", id: "nope", args: {}, slug: "nope" }) + "\n",
    );
    const unknown = await run(
      FIXTURE,
      "--out",
      `${out}/b`,
      "--from",
      "x",
      "--tasks",
      `${out}/rows.jsonl`,
    );
    assert.equal(unknown.code, 1);
    assert.equal(
      unknown.err,
      `error: Cannot export Harbor tasks: unknown template "nope" (available: "code", "plain", "varying")\n`,
    );
    // A prompt that differs at every start (a temporary directory in it, as robolab's): refused
    // before anything is built (issue 38: it was exported, and refused when its container started).
    const unstable = new URL("../fixtures/harbor_export_unstable_env.ts", import.meta.url).pathname;
    const varies = await run(unstable, "--out", `${out}/d`, "--from", "x");
    assert.equal(varies.code, 1);
    assert.match(
      varies.err,
      /^error: Cannot export Harbor tasks: template "tmpdir" gave two prompts for the same arguments \(they differ from character \d+: ".*" and ".*"\); export templates whose prompt depends only on their arguments \(a fixed path in it, not a temporary one\)\n$/,
    );
    for (const user of ["root", "Bad User"]) {
      const bad = await run(FIXTURE, "--out", `${out}/e`, "--from", "x", "--agent-user", user);
      assert.equal(bad.code, 1);
      assert.equal(
        bad.err,
        `error: Cannot export Harbor tasks: agent user "${user}" must be a user name other than root (lower-case letters, digits, "_" and "-", up to 32)\n`,
      );
    }
    const noBase = await run(FIXTURE, "--out", `${out}/c`);
    assert.equal(noBase.code, 2);
    assert.match(noBase.err, /^error: give --from IMAGE .* or --image TAG\n$/);
    // Nothing was written for the refused ones.
    for (const d of ["a", "b", "c", "d", "e"]) {
      await assert.rejects(Deno.stat(`${out}/${d}`), Deno.errors.NotFound);
    }
  } finally {
    await Deno.remove(out, { recursive: true });
  }
});
