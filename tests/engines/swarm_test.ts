// SwarmRuntime on a real 3-node Docker Swarm: .ci/engine/swarm_up.sh puts
// three network namespaces on a bridge of their own (10.213.0.0/24), one
// dockerd in each, behind the firewall guard, and Debian's docker-registry
// to distribute the image (docker save|load when it is not installed).
// swarm_down.sh removes all of it, by PID, even when the test fails. Root and
// the engine's binaries are needed; without them the test is skipped, saying
// why (in CI it runs). Run alone with `deno task test-engine`.

import { test } from "../_test.ts";
import { counterpart, ENGINE, FLOCK } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { connect } from "../../client.ts";
import type { Placement, PlaceOptions } from "../../runtime/placement.ts";
import { buildEnvironmentImage, OWNER_LABEL } from "../../engines/mod.ts";
import { SwarmRuntime } from "../../engines/mod.ts";
import { EngineClient } from "../../engines/_engine.ts";
import { functionAgent, Taskset } from "../../eval/mod.ts";
import { taskSlug } from "../../env.ts";
import { delay } from "../../_internal/async.ts";
import { withDeadline } from "../_deadline.ts";
import { type HeldLock, holdSwarmLock } from "./_swarm_lock.ts";

const ENGINE_DIR = new URL("../../.ci/engine/", import.meta.url).pathname;
const FIXTURE = new URL("../fixtures/basic_env.ts", import.meta.url).pathname;
const NODES = ["sw1", "sw2", "sw3"];
const socketOf = (node: string) => `/run/docker-${node}.sock`;

function which(bin: string): boolean {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    try {
      if (Deno.statSync(`${dir}/${bin}`).isFile) return true;
    } catch {
      // not here
    }
  }
  return false;
}

function skipReason(): string | null {
  if (Deno.build.os !== "linux") return "needs Linux network namespaces";
  if (Deno.uid() !== 0) return "needs root (network namespaces, dockerd)";
  const missing = ["dockerd", "containerd", "ctr", "docker", "nsenter", "unshare", "iptables"]
    .filter((b) => !which(b));
  if (missing.length > 0) {
    return `missing ${missing.join(", ")}: apt-get install docker.io containerd iptables`;
  }
  return null;
}
/** What the swarm test brings up its 3-node swarm with. */
const SWARM = counterpart(
  "swarm",
  "as root on Linux: apt-get install docker.io containerd iptables",
  skipReason,
);

async function sh(script: string, env: Record<string, string>, ms: number): Promise<string> {
  const out = await new Deno.Command("bash", {
    args: [`${ENGINE_DIR}${script}`],
    env,
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(ms),
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (!out.success) throw new Error(`${script} failed (code ${out.code}): ${text.slice(-2000)}`);
  return text;
}

/** Reads an engine's JSON-lines progress stream; throws its first error. */
async function drain(res: Response, what: string): Promise<void> {
  for (const line of (await res.text()).split("\n")) {
    if (line.trim() === "") continue;
    const msg = JSON.parse(line) as { error?: string };
    if (msg.error) throw new Error(`${what}: ${msg.error}`);
  }
}

/** Puts `tag` (built on sw1) where every node can get it; says how. */
async function distribute(tag: string, registry: string | null): Promise<string> {
  using sw1 = await EngineClient.open(socketOf("sw1"));
  if (registry !== null) {
    const [name, version] = tag.split(/:(?=[^:/]+$)/);
    const res = await sw1.raw(
      "POST",
      `/images/${encodeURIComponent(name)}/push?tag=${version}`,
      { headers: { "x-registry-auth": btoa("{}") }, signal: AbortSignal.timeout(120_000) },
    );
    await drain(res, `push ${tag}`);
    return `registry ${registry}`;
  }
  const saved = await sw1.raw("GET", `/images/get?names=${encodeURIComponent(tag)}`, {
    signal: AbortSignal.timeout(120_000),
  });
  const bytes = new Uint8Array(await saved.arrayBuffer());
  for (const node of NODES.slice(1)) {
    using engine = await EngineClient.open(socketOf(node));
    const res = await engine.raw("POST", "/images/load?quiet=1", {
      body: bytes,
      headers: { "content-type": "application/x-tar" },
      signal: AbortSignal.timeout(120_000),
    });
    await drain(res, `load ${tag} on ${node}`);
  }
  return "docker save|load";
}

async function runningOwned(node: string): Promise<number> {
  using engine = await EngineClient.open(socketOf(node));
  const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${Deno.pid}`] }));
  const list = await engine.call("GET", `/containers/json?filters=${filters}`) as unknown[];
  return list.length;
}

/** Kills a node as a host crash would: its dockerd (by PID), then what it ran. */
async function crash(node: string, state: string): Promise<void> {
  const pid = Number(await Deno.readTextFile(`${state}/dockerd-${node}.pid`));
  Deno.kill(pid, "SIGKILL");
  const tasks = await new Deno.Command("ctr", {
    args: ["-n", node, "tasks", "ls", "-q"],
    stdout: "piped",
    signal: AbortSignal.timeout(20_000),
  }).output();
  for (const id of new TextDecoder().decode(tasks.stdout).split("\n").filter((l) => l)) {
    await new Deno.Command("ctr", {
      args: ["-n", node, "tasks", "kill", "-s", "SIGKILL", id],
      stdout: "null",
      stderr: "null",
      signal: AbortSignal.timeout(20_000),
    }).output();
  }
}

const shared = Deno.env.get("ENGINE_STATE");
/** The scripts' environment, once the test holds the swarm lock and has made its state directory. */
let env: Record<string, string> | null = null;
/** The machine-wide lock, held from before swarm_up.sh until after swarm_down.sh. */
let lock: HeldLock | null = null;

/** Bounded: daemons (by PID), namespaces, bridge, rules, state; then the lock. */
async function swarmDown(): Promise<void> {
  try {
    // Without the lock the swarm on this machine is another run's: leave it.
    if (env === null) return;
    await sh("swarm_down.sh", env, 120_000).catch((err) => console.error(String(err)));
    if (shared === undefined) {
      await Deno.remove(env.ENGINE_STATE, { recursive: true }).catch(() => {});
    }
  } finally {
    await lock?.release();
  }
}

test({
  name: "SwarmRuntime serves 60 rollouts on 3 nodes and survives a node's crash",
  needs: [SWARM],
  fn: withDeadline(59_000, async (t) => {
    lock = await holdSwarmLock();
    env = {
      ENGINE_STATE: shared ?? await Deno.makeTempDir({ prefix: "hud-swarm-" }),
      SWARM_REGISTRY: which("docker-registry") ? "1" : "0",
    };
    const state = env.ENGINE_STATE;
    await sh("swarm_up.sh", env, 180_000);
    let registry: string | null = null;
    try {
      registry = (await Deno.readTextFile(`${state}/registry.addr`)).trim();
    } catch {
      // no registry: save|load
    }
    const tag = registry === null
      ? "hud-swarm-fixture:latest"
      : `${registry}/hud-swarm-fixture:latest`;
    await buildEnvironmentImage(FIXTURE, tag, {
      socket: socketOf("sw1"),
      envName: "fixture",
      envVersion: "0.3.0",
      signal: AbortSignal.timeout(240_000),
    });
    const how = await distribute(tag, registry);
    console.log(`swarm_test: image ${tag} distributed by ${how}`);

    await t.step("60 rollouts, each node used, one node crashes mid-job", async () => {
      await using runtime = new SwarmRuntime(tag, {
        socket: socketOf("sw1"),
        minReplicas: 6,
        maxReplicas: 6,
        readyTimeout: 60_000,
      });
      await runtime.ready(6, { timeout: 120_000 });
      assert.deepEqual(Object.keys(runtime.readyByNode).sort(), NODES);

      const servedBy: string[] = [];
      let crashed: Promise<void> | null = null;
      const recording = {
        async place(options?: PlaceOptions): Promise<Placement> {
          const p = await runtime.place(options);
          servedBy.push(String(p.params.node));
          // Crash sw3 (a worker) a third of the way in, with rollouts on it.
          if (servedBy.length === 20) crashed = crash("sw3", state);
          return p;
        },
      };
      const rows = Array.from({ length: 60 }, (_, i) => ({
        env: "fixture",
        id: "add",
        args: { a: i, b: 1 },
        slug: taskSlug("add", { a: i, b: 1 }),
      }));
      const agent = functionAgent(async (prompt) => {
        await delay(200);
        const [a, b] = String(prompt).match(/\d+/g)!.map(Number);
        return String(a + b);
      });
      const job = await new Taskset(rows).run(agent, {
        runtime: recording,
        maxConcurrent: 6,
        rolloutTimeout: 60_000,
        connect: { readyTimeout: 10_000 },
        signal: AbortSignal.timeout(240_000),
      });
      await crashed;
      const before = servedBy.slice(0, 20);
      for (const node of NODES) assert.ok(before.includes(node), `${node} served no rollout`);
      assert.equal(job.runs.length, 60);
      const good = job.runs.filter((r) => r.reward === 1).length;
      const errored = job.runs.filter((r) => r.status === "error");
      console.log(
        `swarm_test: ${good} of 60 rewarded, ${errored.length} errored (${
          [...new Set(errored.map((r) => r.failed_phase))].join(", ")
        }); served by ${
          NODES.map((n) => `${n} ${servedBy.filter((s) => s === n).length}`).join(", ")
        }`,
      );
      assert.equal(good + errored.length, 60, "every rollout finished or errored");
      assert.ok(good >= 40, `only ${good} of 60 rollouts rewarded`);
      for (const r of errored) assert.ok(r.failed_phase, "an errored rollout names its phase");

      // The pool recovers: sw3's replicas are replaced on the other nodes.
      const until = AbortSignal.timeout(90_000);
      while (!until.aborted) {
        const ready = runtime.readyByNode;
        if (!("sw3" in ready) && (ready.sw1 ?? 0) + (ready.sw2 ?? 0) >= 6) break;
        await delay(500);
      }
      const ready = runtime.readyByNode;
      assert.ok(!("sw3" in ready), `sw3 still in the pool: ${JSON.stringify(ready)}`);
      assert.equal((ready.sw1 ?? 0) + (ready.sw2 ?? 0), 6, JSON.stringify(ready));
      await using client = await connect(runtime, { readyTimeout: 10_000 });
      assert.equal((await client.startTask("add", { a: 1, b: 1 })).prompt, "What is 1 + 1?");
    });

    await t.step("the service is gone after close()", async () => {
      for (const node of ["sw1", "sw2"]) assert.equal(await runningOwned(node), 0, node);
    });

    await t.step("demand scales the service up to maxReplicas and back down", async () => {
      await using runtime = new SwarmRuntime(tag, {
        socket: socketOf("sw1"),
        minReplicas: 1,
        maxReplicas: 3,
        scaleDownAfter: 1_000,
        readyTimeout: 60_000,
      });
      await runtime.ready(1, { timeout: 60_000 });
      assert.equal(runtime.desiredReplicas, 1);
      const held = await Promise.all([1, 2, 3].map(() => runtime.place()));
      assert.equal(runtime.desiredReplicas, 3);
      assert.equal(new Set(held.map((p) => p.params.taskId)).size, 3, "three replicas");
      // Each replica has a token of its own: one's token opens no other.
      const tokens = held.map((p) => decodeURIComponent(/^tcp:\/\/:([^@]+)@/.exec(p.url)![1]));
      assert.equal(new Set(tokens).size, 3, "the replicas share a token");
      const [a, b] = held;
      const borrowed = `tcp://:${encodeURIComponent(tokens[0])}@${b.params.host}:${b.params.port}`;
      await assert.rejects(
        connect(borrowed, { readyTimeout: 5_000, forward: false }),
        /unauthorized/,
        "replica B took replica A's token",
      );
      {
        await using own = await connect(a.url, { readyTimeout: 5_000, forward: false });
        assert.equal(own.manifest.env.name, "fixture");
      }
      // A fourth waits for a free one: it gets the first released.
      const fourth = runtime.place({ signal: AbortSignal.timeout(30_000) });
      await held[0][Symbol.asyncDispose]();
      assert.equal((await fourth).params.taskId, held[0].params.taskId);
      await (await fourth)[Symbol.asyncDispose]();
      for (const p of held.slice(1)) await p[Symbol.asyncDispose]();
      const until = AbortSignal.timeout(30_000);
      while (runtime.desiredReplicas !== 1 && !until.aborted) await delay(200);
      assert.equal(runtime.desiredReplicas, 1, "scaled back down when idle");
    });
    await t.step("width: one replica serves two rollouts at once, not three", async () => {
      await using runtime = new SwarmRuntime(tag, {
        socket: socketOf("sw1"),
        minReplicas: 1,
        maxReplicas: 1,
        width: 2,
        readyTimeout: 3_000,
      });
      await runtime.ready(1, { timeout: 60_000 });
      await using a = await runtime.place();
      await using b = await runtime.place();
      assert.equal(a.params.taskId, b.params.taskId);
      const err = await runtime.place().catch((e) => e);
      assert.match(
        String(err),
        /no free ready replica after 3000 ms \(1 ready, 1 wanted, at most 1\)/,
      );
      await using c1 = await connect(a, { readyTimeout: 10_000 });
      await using c2 = await connect(b, { readyTimeout: 10_000 });
      assert.equal((await c1.startTask("add", { a: 2, b: 2 })).prompt, "What is 2 + 2?");
      assert.equal((await c2.startTask("add", { a: 3, b: 3 })).prompt, "What is 3 + 3?");
    });
    await t.step("hud eval --runtime swarm:IMAGE runs a taskset on the swarm", async () => {
      const dir = await Deno.makeTempDir();
      try {
        const rows = `${dir}/rows.jsonl`;
        await Deno.writeTextFile(
          rows,
          [1, 2, 3, 4].map((a) =>
            JSON.stringify({ env: "fixture", id: "add", args: { a, b: 1 }, slug: `add-${a}-1` })
          ).join("\n") + "\n",
        );
        // The agent reads "What is A + B?" on stdin and computes it.
        const agent = `read -r q; set -- $q; echo $(( $3 + \${5%?} ))`;
        // The swarm's manager through DOCKER_HOST, in a process of its own:
        // this process's other test files (deno test --parallel) keep theirs.
        const ran = await new Deno.Command(Deno.execPath(), {
          args: [
            "run",
            "-A",
            new URL("../../cli.ts", import.meta.url).pathname,
            "eval",
            FIXTURE,
            "--agent",
            agent,
            "--tasks",
            rows,
            "--runtime",
            `swarm:${tag}`,
            "--max-concurrent",
            "2",
          ],
          env: { DOCKER_HOST: `unix://${socketOf("sw1")}`, NO_COLOR: "1" },
          stdin: "null",
          signal: AbortSignal.timeout(120_000),
        }).output();
        const [code, out, err] = [
          ran.code,
          new TextDecoder().decode(ran.stdout),
          new TextDecoder().decode(ran.stderr),
        ];
        assert.equal(code, 0, err);
        assert.match(out, /mean reward 1\.000 ± 0\.000 over 4 graded runs, 0 errored/);
        for (const node of ["sw1", "sw2"]) assert.equal(await runningOwned(node), 0, node);
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    });
  }, {
    // After the body, and also when the deadline passes while the body still
    // waits: the daemons, namespaces, bridge and rules must not outlive the run.
    teardown: swarmDown,
    teardownMs: 150_000,
  }),
});

test("holdSwarmLock() waits while another process holds the lock, and takes it after", {
  needs: [FLOCK],
}, async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/swarm.lock`;
    const first = await holdSwarmLock(path);
    // A second run (another process's flock) cannot have it meanwhile.
    await assert.rejects(
      holdSwarmLock(path, { ms: 1_000 }),
      new RegExp(`Timed out after 1000 ms waiting for the machine-wide swarm lock ${path}`),
    );
    const probe = await new Deno.Command("flock", { args: ["--nonblock", path, "true"] }).output();
    assert.equal(probe.code, 1, "flock --nonblock took the held lock");
    await first.release();
    await first.release(); // idempotent
    await using second = await holdSwarmLock(path, { ms: 20_000 });
    assert.equal(second.path, path);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("SwarmRuntime rejects replica counts and width out of range", () => {
  assert.throws(() => new SwarmRuntime(""), /image must be a non-empty string/);
  assert.throws(
    () => new SwarmRuntime("x", { minReplicas: 0 }),
    /minReplicas must be a positive integer, got "0"/,
  );
  assert.throws(() => new SwarmRuntime("x", { width: 1.5 }), /width must be a positive integer/);
  assert.throws(
    () => new SwarmRuntime("x", { minReplicas: 4, maxReplicas: 2 }),
    /need minReplicas <= replicas <= maxReplicas, got "4", "4", "2"/,
  );
});

test({
  name: "SwarmRuntime.place() on an engine that is not a swarm manager says how to make one",
  needs: [ENGINE],
  async fn() {
    using engine = await EngineClient.open();
    const info = await engine.call("GET", "/info") as { Swarm?: { LocalNodeState?: string } };
    if (info.Swarm?.LocalNodeState === "active") return; // a manager here: nothing to check
    await using runtime = new SwarmRuntime("hud-test-fixture:latest");
    const err = await runtime.place().catch((e) => e);
    assert.match(String(err), /is not a swarm manager; run `docker swarm init` there/);
  },
});
