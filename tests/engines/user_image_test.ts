// Issue 30, point 3: `hud image` of a user's project that imports "@hud/sdk"
// and "@hud/sdk/agents" through the README's import map, on the base image
// `hud image base` makes, starts and serves in a container. Skipped without
// an engine socket.

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { EngineClient, findEngineSocket } from "../../engines/_engine.ts";
import { AGENT, deno, makeProject, readmeImportMap } from "../_project.ts";

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
