import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Capability, Environment, functionAgent, LocalRuntime, rollout } from "../../mod.ts";
import { type FileDiff, type FlushResult, startFileTracker } from "../../filetracking/mod.ts";

function trackedEnv(root: string): Environment {
  const env = new Environment("tracked");
  let stop: (() => Promise<void>) | null = null;
  env.initialize(async () => {
    const tracker = await startFileTracker(root);
    env.addCapability(tracker.capability());
    stop = () => tracker.shutdown();
  });
  env.shutdown(async () => await stop?.());
  env.template({ id: "edit" }, async function* () {
    await Deno.writeTextFile(`${root}/setup.txt`, "made by setup\n");
    const answer = yield "Fix app.py";
    yield answer === "done" ? 1 : 0;
  });
  return env;
}

test("rollout() records the files the agent changed, as unified diffs", async () => {
  const root = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${root}/app.py`, "def add(a, b):\n    return a - b\n");
    const env = trackedEnv(root);
    const run = await rollout(
      { env: "tracked", id: "edit", args: {}, slug: "edit" },
      functionAgent(async () => {
        await Deno.writeTextFile(`${root}/app.py`, "def add(a, b):\n    return a + b\n");
        await Deno.writeTextFile(`${root}/.env`, "SECRET=hunter2\n");
        return "done";
      }),
      { runtime: new LocalRuntime(env), fileTracking: { pollInterval: 50 } },
    );
    assert.equal(run.reward, 1);
    const types = run.trace.steps.map((s) => s.type);
    assert.ok(types.includes("filetracking.setup"), types.join(","));
    assert.ok(types.includes("filetracking.flush"), types.join(","));
    const setup = run.trace.steps.find((s) => s.type === "filetracking.setup")!.content as FileDiff;
    assert.deepEqual(setup.patches.map((p) => p.path), ["setup.txt"]);
    const last = run.trace.steps.findLast((s) => s.type.startsWith("filetracking."))!;
    assert.equal(last.type, "filetracking.flush", "flush comes after the agent");
    assert.ok((last.content as FlushResult).capture, "the flush carries the artifact capture");
    // A flush nests its diff, as HUD's tracker sends it.
    const all = run.trace.steps.flatMap((s) =>
      s.type === "filetracking.diff"
        ? (s.content as FileDiff).patches
        : s.type === "filetracking.flush"
        ? (s.content as FlushResult).diff.patches
        : []
    );
    const app = all.find((p) => p.path === "app.py")!;
    assert.equal(app.status, "modified");
    assert.match(app.patch, /^- {4}return a - b$/m);
    assert.match(app.patch, /^\+ {4}return a \+ b$/m);
    assert.ok(
      !JSON.stringify(run.trace.toJSON()).includes("hunter2"),
      "secrets never in the trace",
    );
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("rollout() goes on when the file tracker is down", async () => {
  const dead = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = dead.addr.port;
  dead.close();
  const env = new Environment("untracked", {
    capabilities: [Capability.filetracking({ url: `tcp://127.0.0.1:${port}`, root: "/nowhere" })],
  });
  env.template({ id: "t" }, async function* () {
    const answer = yield "go";
    yield answer === "ok" ? 1 : 0;
  });
  const run = await rollout(
    { env: "untracked", id: "t", args: {}, slug: "t" },
    functionAgent(() => "ok"),
    { runtime: new LocalRuntime(env) },
  );
  assert.equal(run.reward, 1);
  assert.equal(run.trace.status, "completed");
  assert.ok(run.trace.steps.some((s) => s.type === "filetracking_error"));
});
