// ContainerRuntime against real engines: the default one (Docker's socket,
// else Podman's) and, when HUD_TEST_PODMAN_SOCKET names one, Podman's too.
// `.ci/run` starts both (.ci/engine/engine_up.sh, behind its firewall
// guard); without an engine socket these tests are skipped, saying why.

import assert from "node:assert/strict";
import { connect } from "../../client.ts";
import { NotReadyError } from "../../errors.ts";
import { loadEnvironment } from "../../loader.ts";
import {
  buildEnvironmentImage,
  ContainerRuntime,
  OWNER_LABEL,
  removeStaleContainers,
} from "../../engines/mod.ts";
import { EngineClient, findEngineSocket } from "../../engines/_engine.ts";
import { functionAgent, Taskset } from "../../eval/mod.ts";
import { taskSlug } from "../../env.ts";

function engineSocket(): string | null {
  try {
    return findEngineSocket();
  } catch {
    return null;
  }
}
const SOCKET = engineSocket();
const PODMAN_SOCKET = Deno.env.get("HUD_TEST_PODMAN_SOCKET") || null;
const CI = Deno.env.get("CI") === "true";
if (SOCKET === null && !CI) console.log("container_test: skipped: no engine socket");
if (PODMAN_SOCKET === null) {
  console.log("container_test: Podman skipped: set HUD_TEST_PODMAN_SOCKET=/run/podman/podman.sock");
}
const fixture = (name: string) => new URL(`../fixtures/${name}`, import.meta.url).pathname;
const TAG = "hud-test-fixture:latest";
const BROKEN_TAG = "hud-test-broken:latest";

/**
 * Registers the suite against one engine: `socket` (undefined: the default
 * one), named `label` in the test names.
 */
function suite(label: string, socket: string | undefined, ignore: boolean) {
  let built: Promise<void> | null = null;
  /** Builds the two test images once per run. */
  function buildImages(): Promise<void> {
    built ??= (async () => {
      const env = await loadEnvironment(fixture("basic_env.ts"));
      await buildEnvironmentImage(fixture("basic_env.ts"), TAG, {
        envName: env.name,
        envVersion: env.version,
        socket,
        signal: AbortSignal.timeout(240_000),
      });
      await buildEnvironmentImage(fixture("broken_env.ts"), BROKEN_TAG, {
        envName: "broken",
        envVersion: "0",
        socket,
        signal: AbortSignal.timeout(240_000),
      });
    })();
    return built;
  }

  async function containersOf(pid: number): Promise<string[]> {
    using engine = await EngineClient.open(socket);
    const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${pid}`] }));
    const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
      Id: string;
    }[];
    return list.map((c) => c.Id);
  }

  Deno.test({
    name: `buildEnvironmentImage() makes an image with the env's label from no registry (${label})`,
    ignore,
    async fn() {
      await buildImages();
      using engine = await EngineClient.open(socket);
      const info = await engine.call("GET", `/images/${encodeURIComponent(TAG)}/json`) as {
        Config: { Labels: Record<string, string>; Cmd: string[] };
      };
      assert.equal(info.Config.Labels["dev.hud.env"], "fixture");
      // The server starts with a small young generation (SERVER_V8_FLAGS).
      assert.ok(
        info.Config.Cmd.includes("--v8-flags=--max-semi-space-size=1"),
        info.Config.Cmd.join(" "),
      );
      assert.equal(info.Config.Labels["dev.hud.env.version"], "0.3.0");
    },
  });

  Deno.test({
    name:
      `ContainerRuntime places, serves a task with a token, and removes the container (${label})`,
    ignore,
    async fn() {
      await buildImages();
      const runtime = new ContainerRuntime(TAG, { socket, memory: 256 * 1024 * 1024, pids: 256 });
      let containerId = "";
      {
        await using client = await connect(runtime, { readyTimeout: 60_000 });
        assert.match(client.url, /^tcp:\/\/.*127\.0\.0\.1:\d+/);
        assert.equal(client.manifest.env.name, "fixture");
        const { prompt } = await client.startTask("add", { a: 2, b: 3 });
        assert.equal(prompt, "What is 2 + 3?");
        assert.equal((await client.grade({ answer: "5" })).score, 1);
        const mine = await containersOf(Deno.pid);
        assert.equal(mine.length, 1);
        containerId = mine[0];
      }
      assert.deepEqual(await containersOf(Deno.pid), [], `container ${containerId} left behind`);
    },
  });

  Deno.test({
    name: `ContainerRuntime reports a container that exits before it is ready (${label})`,
    ignore,
    async fn() {
      await buildImages();
      const runtime = new ContainerRuntime(BROKEN_TAG, { socket, readyTimeout: 60_000 });
      const err = await runtime.place().catch((e) => e);
      assert.ok(err instanceof NotReadyError, String(err));
      assert.match(err.message, /exited with code [1-9]/);
      assert.match(err.message, /fixture refuses to load/);
      assert.deepEqual(await containersOf(Deno.pid), []);
    },
  });

  Deno.test({
    name: `ContainerRuntime runs 20 rollouts of a taskset, 4 at a time (${label})`,
    ignore,
    async fn() {
      await buildImages();
      const rows = Array.from({ length: 20 }, (_, i) => ({
        env: "fixture",
        id: "add",
        args: { a: i, b: 1 },
        slug: taskSlug("add", { a: i, b: 1 }),
      }));
      const taskset = new Taskset(rows);
      const agent = functionAgent((prompt) => {
        const [a, b] = String(prompt).match(/\d+/g)!.map(Number);
        return String(a + b);
      });
      const job = await taskset.run(agent, {
        runtime: new ContainerRuntime(TAG, { socket }),
        maxConcurrent: 4,
        signal: AbortSignal.timeout(300_000),
      });
      assert.equal(
        job.runs.filter((r) => r.reward === 1).length,
        20,
        JSON.stringify(job.errored[0]),
      );
      assert.deepEqual(await containersOf(Deno.pid), []);
    },
  });

  Deno.test({
    name: `removeStaleContainers() removes what a killed runner left behind (${label})`,
    ignore,
    async fn() {
      await buildImages();
      // A runner that places a container, then dies by SIGKILL before releasing it.
      const code = `
      import { ContainerRuntime } from ${
        JSON.stringify(new URL("../../engines/container.ts", import.meta.url).href)
      };
      await new ContainerRuntime(${JSON.stringify(TAG)}, { socket: ${
        JSON.stringify(socket ?? null)
      } ?? undefined }).place();
      console.log("placed");
      await new Promise(() => {});
    `;
      const child = new Deno.Command(Deno.execPath(), {
        args: ["eval", code],
        stdout: "piped",
        stderr: "inherit",
      }).spawn();
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let out = "";
      const deadline = AbortSignal.timeout(120_000);
      while (!out.includes("placed") && !deadline.aborted) {
        const { value, done } = await reader.read();
        if (done) break;
        out += value;
      }
      try {
        child.kill("SIGKILL");
      } catch {
        // It died on its own: the assertion below says how.
      }
      await child.status;
      await reader.cancel();
      assert.match(out, /placed/, "the runner placed its container");
      assert.equal((await containersOf(child.pid)).length, 1);
      const removed = await removeStaleContainers({ socket });
      assert.ok(removed.length >= 1);
      assert.deepEqual(await containersOf(child.pid), []);
    },
  });

  Deno.test({
    name: `hud gc and hud image: usage errors, and gc against the engine (${label})`,
    // The command line's gc finds the default engine only.
    ignore: ignore || socket !== undefined,
    async fn() {
      const { main } = await import("../../cli.ts");
      let err = "";
      const quiet = { stdout: () => {}, stderr: (t: string) => err += t };
      assert.equal(await main(["gc", "--older-than", "soon"], quiet), 2);
      assert.match(err, /--older-than must be a number of seconds, got "soon"/);
      assert.equal(await main(["image", fixture("basic_env.ts")], quiet), 2);
      assert.match(err, /--tag is required/);
      assert.equal(
        await main(["eval", fixture("basic_env.ts"), "--agent", "cat", "--runtime", "vm:x"], quiet),
        2,
      );
      assert.match(
        err,
        /--runtime must be "local", "container:IMAGE", "swarm:IMAGE", "k8s:IMAGE" or "slurm\[:PARTITION\]", got "vm:x"/,
      );
      err = "";
      assert.equal(await main(["gc"], quiet), 0);
      assert.match(err, /gc: removed \d+ containers?/);
    },
  });

  Deno.test({
    name: `removeStaleContainers() run by several cleaners at once: each succeeds (${label})`,
    ignore,
    async fn() {
      await buildImages();
      using engine = await EngineClient.open(socket);
      // Owned by a pid that cannot be alive (above this machine's pid_max).
      const created = await engine.call("POST", "/containers/create", {
        Image: TAG,
        Labels: { [OWNER_LABEL]: "4194305" },
      }) as { Id: string };
      await engine.call("POST", `/containers/${created.Id}/start`);
      const results = await Promise.allSettled(
        [1, 2, 3].map(() => removeStaleContainers({ socket })),
      );
      assert.deepEqual(results.map((r) => r.status), ["fulfilled", "fulfilled", "fulfilled"]);
      assert.deepEqual(await containersOf(4194305), []);
    },
  });
}

suite("default engine", undefined, SOCKET === null && !CI);
if (PODMAN_SOCKET !== null) suite("Podman", PODMAN_SOCKET, false);
