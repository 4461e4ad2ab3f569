// Issue 30, point 3: `hud image` of a user's project that imports "@hud/sdk"
// and "@hud/sdk/agents" through the README's import map, on the base image
// `hud image base` makes, starts and serves in a container. Skipped without
// an engine socket.

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { EngineClient, findEngineSocket } from "../../engines/_engine.ts";
import { AGENT, deno, makeProject, readmeImportMap } from "../_project.ts";
import { testSignal } from "../_deadline.ts";

function engineSocket(): string | null {
  try {
    return findEngineSocket();
  } catch {
    return null;
  }
}
const SOCKET = engineSocket();
const BASE = "hud-test-user-base:latest";
const IMAGE = "hud-test-user-env:latest";

test({
  name: "hud image: a user project's image (import map, --from the base) starts and serves",
  needs: [ENGINE],
  async fn(t) {
    const dir = await makeProject(await readmeImportMap());
    const project = `${dir}/project`;
    const cli = (...args: string[]) => deno(project, "run", "-A", "../hud-sdk/cli.ts", ...args);
    try {
      await t.step(
        "image base makes the README's base: the host's bash, no Deno libraries",
        async () => {
          const ran = await cli("image", "base", "--tag", BASE, "--socket", SOCKET!);
          assert.equal(ran.code, 0, ran.stderr);
          assert.match(ran.stdout, /^hud-test-user-base:latest sha256:[0-9a-f]{64}\n$/);
        },
      );
      await t.step(
        "image --from the base adds Deno's libraries; eval runs in its containers",
        async () => {
          const built = await cli(
            "image",
            "env.ts",
            "--tag",
            IMAGE,
            "--from",
            BASE,
            "--socket",
            SOCKET!,
          );
          assert.equal(built.code, 0, built.stderr);
          const ran = await cli(
            "eval",
            "env.ts",
            "--agent",
            AGENT,
            "--runtime",
            `container:${IMAGE}`,
          );
          assert.equal(ran.code, 0, ran.stderr);
          assert.match(ran.stdout, /mean reward 1\.000 ± 0\.000 over 2 graded runs, 0 errored/);
        },
      );
      await t.step("a module whose imports do not resolve is refused at build time", async () => {
        await Deno.remove(`${project}/deno.json`);
        const ran = await cli("image", "env.ts", "--tag", IMAGE, "--socket", SOCKET!);
        assert.equal(ran.code, 1, ran.stdout);
        assert.match(
          ran.stderr,
          /^error: Cannot build image: "env\.ts" imports "@hud\/sdk", which does not resolve \(Import "@hud\/sdk" not a dependency\); map it in a deno\.json beside the module \(see the README\)\n$/,
        );
      });
    } finally {
      await Deno.remove(dir, { recursive: true });
      using engine = await EngineClient.open(SOCKET!);
      for (const tag of [IMAGE, BASE]) {
        await engine.call("DELETE", `/images/${encodeURIComponent(tag)}?force=1`).catch(() => {});
      }
    }
  },
});

test("hud image and export-harbor refuse a module that imports the SDK by its path on this machine, before any build", async () => {
  // Issue 38: the image was built, and failed only when it started (the path is not in it).
  const dir = await Deno.makeTempDir({ prefix: "hud_abs_import_" });
  const sdk = new URL("../../mod.ts", import.meta.url);
  const cli = new URL("../../cli.ts", import.meta.url).pathname;
  try {
    for (const [name, specifier] of [["path", sdk.pathname], ["url", sdk.href]]) {
      const file = `${dir}/${name}.ts`;
      await Deno.writeTextFile(
        file,
        `import { Environment } from ${JSON.stringify(specifier)};
export const env = new Environment("abs");
env.template({ id: "hi" }, async function* () { yield "hi"; yield 1; });
`,
      );
      const refusal = `Cannot build image: "${file}" imports "${specifier}" by its path on this ` +
        `machine, which the image does not have; import it by a relative path, or map it in a ` +
        `deno.json beside the module (see the README)`;
      // No engine is reached: the socket does not exist.
      for (
        const args of [["image", file, "--tag", "hud-test-abs:latest"], [
          "export-harbor",
          file,
          "--out",
          `${dir}/out-${name}`,
          "--from",
          "base",
        ]]
      ) {
        const out = await new Deno.Command(Deno.execPath(), {
          args: ["run", "-A", cli, ...args],
          env: { NO_COLOR: "1", DOCKER_HOST: `unix://${dir}/no.sock` },
          stdin: "null",
          signal: testSignal(),
        }).output();
        const stderr = new TextDecoder().decode(out.stderr);
        assert.equal(out.code, 1, stderr);
        assert.equal(stderr, `error: ${refusal}\n`, args[0]);
      }
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
