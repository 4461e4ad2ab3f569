// Issue 30, points 1 and 2: a project of the user's own beside a checkout of
// the SDK, depending on it through the import map of docs/environments.md, run with
// `deno run`, through `../hud-sdk/cli.ts` and through an installed `hud`.
import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { ChildProcess } from "../_helpers.ts";
import { testSignal } from "../_deadline.ts";
import { AGENT, command, deno, makeProject, readmeImportMap, SDK } from "../_project.ts";

test("docs' import map: a user's project runs with deno run, the CLI and an installed hud", async (t) => {
  const map = await readmeImportMap();
  const sdkExports = (JSON.parse(await Deno.readTextFile(`${SDK}/deno.json`)) as {
    exports: Record<string, string>;
  }).exports;
  await t.step("the map names real exports, each its module (no folder prefix)", () => {
    assert.ok(map["@hud/sdk"] && map["@hud/sdk/agents"], JSON.stringify(map));
    for (const [name, target] of Object.entries(map)) {
      assert.ok(!name.endsWith("/"), `"${name}" is a folder prefix`);
      const sub = name === "@hud/sdk" ? "." : `.${name.slice("@hud/sdk".length)}`;
      assert.equal(target, `../hud-sdk/${sdkExports[sub]?.slice(2)}`, name);
    }
  });
  const dir = await makeProject(map);
  const project = `${dir}/project`;
  try {
    await t.step("deno run env.ts serves it; the CLI lists its tasks by url", async () => {
      await using child = new ChildProcess(Deno.execPath(), {
        args: ["run", "-A", "env.ts"],
        cwd: project,
        env: { NO_COLOR: "1" },
      });
      const [, token] = await child.waitForLine(/^HUD_SERVE_TOKEN=(\w+)$/, "the token", 30_000);
      const [, port] = await child.waitForLine(/^HUD_SERVE_PORT=(\d+)$/, "the port", 30_000);
      const ran = await deno(
        project,
        "run",
        "-A",
        "../hud-sdk/cli.ts",
        "tasks",
        "--url",
        `tcp://:${token}@127.0.0.1:${port}`,
      );
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, /^add +a: integer, b: integer +Add \(agents: function\)$/m);
    });
    await t.step(
      "../hud-sdk/cli.ts eval runs the module's tasks; view serves the results",
      async () => {
        const ran = await deno(
          project,
          "run",
          "-A",
          "../hud-sdk/cli.ts",
          "eval",
          "env.ts",
          "--agent",
          AGENT,
          "--out",
          "results.jsonl",
        );
        assert.equal(ran.code, 0, ran.stderr);
        assert.match(ran.stdout, /mean reward 1\.000 ± 0\.000 over 2 graded runs, 0 errored/);
        await using viewer = new ChildProcess(Deno.execPath(), {
          args: ["run", "-A", "../hud-sdk/cli.ts", "view", "results.jsonl"],
          cwd: project,
          env: { NO_COLOR: "1" },
        });
        const [, url] = await viewer.waitForLine(/ at (http:\/\/\S+)$/, "the viewer's url", 30_000);
        const res = await fetch(url, { signal: testSignal() });
        const page = await res.text();
        assert.equal(res.status, 200, page.slice(0, 200));
        assert.match(page, /<html/i);
      },
    );
    await t.step("hud installed with --config deno.json runs the project's modules", async () => {
      const root = `${dir}/installed`;
      const inst = await deno(
        project,
        "install",
        "-g",
        "-A",
        "-n",
        "hud",
        "--root",
        root,
        "--config",
        "deno.json",
        "../hud-sdk/cli.ts",
      );
      assert.equal(inst.code, 0, inst.stderr);
      // From another directory: the config travels with the installed command.
      const ran = await command(`${root}/bin/hud`, dir, [
        "eval",
        "project/env.ts",
        "--agent",
        AGENT,
      ]);
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, /mean reward 1\.000 ± 0\.000 over 2 graded runs, 0 errored/);
    });
    await t.step("hud installed without --config names the fix", async () => {
      const root = `${dir}/bare`;
      const inst = await deno(
        project,
        "install",
        "-g",
        "-A",
        "-n",
        "hud",
        "--root",
        root,
        "../hud-sdk/cli.ts",
      );
      assert.equal(inst.code, 0, inst.stderr);
      const ran = await command(`${root}/bin/hud`, project, ["tasks", "env.ts"]);
      assert.equal(ran.code, 1, ran.stdout);
      assert.match(ran.stderr, /^error: .*not a dependency.*install hud with --config deno\.json/);
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("the README's map before issue 30 (a folder prefix) fails under deno run", async () => {
  // A prefix maps "@hud/sdk/agents" to a folder, not to its mod.ts.
  const dir = await makeProject({ "@hud/sdk": "../hud-sdk/mod.ts", "@hud/sdk/": "../hud-sdk/" });
  try {
    const ran = await deno(`${dir}/project`, "run", "-A", "env.ts");
    assert.notEqual(ran.code, 0, ran.stdout);
    assert.match(ran.stderr, /ERR_UNSUPPORTED_DIR_IMPORT/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
