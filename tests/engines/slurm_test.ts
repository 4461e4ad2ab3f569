// SlurmRuntime on a real 3-node Slurm 22.05 cluster: .ci/engine/slurm_up.sh
// puts slurmctld and three slurmds in network namespaces of their own on a
// bridge (10.215.0.0/24) behind the firewall guard, with munged and
// slurmrestd (JWT, on a unix socket, as nobody). .ci/run starts it and sets
// HUD_TEST_SLURM_STATE (and HUD_REQUIRE_SLURM=1: a missing cluster fails
// the test); otherwise the test brings one up itself when it can (root,
// Debian's slurm packages) and removes it afterwards, and skips, saying
// why, when it cannot.

import { test } from "../_test.ts";
import { counterpart } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { cancelStaleJobs, SlurmRuntime } from "../../engines/slurm.ts";
import { connect } from "../../client.ts";
import type { Placement, PlaceOptions } from "../../runtime/placement.ts";
import { Taskset } from "../../eval/taskset.ts";
import { functionAgent } from "../../eval/agent.ts";
import { taskSlug } from "../../env.ts";
import { delay } from "../../_internal/async.ts";
import { withDeadline } from "../_deadline.ts";
import { crashNode, exists, sh, which } from "./_clusters.ts";

const FIXTURE = new URL("../fixtures/basic_env.ts", import.meta.url).pathname;
const NODES = ["slurm-n1", "slurm-n2", "slurm-n3"];
const ANNOUNCE = "10.215.0.254";
// The cluster .ci/run (or slurm_up.sh by hand) started, else none.
const given = Deno.env.get("HUD_TEST_SLURM_STATE") ??
  (exists("/run/hud-slurm/slurm.conf") ? "/run/hud-slurm" : undefined);

function skipReason(): string | null {
  if (Deno.build.os !== "linux") return "needs Linux network namespaces";
  if (Deno.uid() !== 0) return "needs root (network namespaces, slurmd)";
  if (given !== undefined) {
    if (!exists(`${given}/slurm.conf`)) return `no cluster in HUD_TEST_SLURM_STATE "${given}"`;
    // A cluster there, but this machine has no client to reach it with.
    const client = ["sbatch", "squeue", "scontrol", "nsenter"].filter((b) => !which(b));
    return client.length === 0
      ? null
      : `missing ${client.join(", ")}: apt-get install slurm-client`;
  }
  const missing = ["slurmctld", "slurmd", "slurmrestd", "munged", "sbatch", "nsenter", "iptables"]
    .filter((b) => !which(b));
  if (missing.length > 0) {
    return `missing ${
      missing.join(", ")
    }: apt-get install slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin munge`;
  }
  return null;
}
/** A Slurm cluster: the one .ci/run started (HUD_TEST_SLURM_STATE), or one these tests bring up. */
const SLURM = counterpart(
  "slurm",
  "as root, with Slurm installed; bash .ci/run starts a cluster (.ci/engine/slurm_up.sh)",
  skipReason,
);
/** Slurm's client commands. */
const SLURM_CLIENT = counterpart("slurm-client", "apt-get install slurm-client", () => {
  const absent = ["sbatch", "squeue"].filter((b) => !which(b));
  return absent.length === 0 ? null : `${absent.join(", ")} not found`;
});

/** The cluster's state directory, once up (ours to remove when `owned`). */
let state = "";
let owned = false;

async function run(cmd: string, args: string[], env: Record<string, string> = {}): Promise<string> {
  const out = await new Deno.Command(cmd, {
    args,
    env: { SLURM_CONF: `${state}/slurm.conf`, ...env },
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(30_000),
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return text;
}

/** The jobs of ours still queued or running (any runtime of this process). */
async function ourJobs(): Promise<string[]> {
  const out = await run("squeue", ["-h", "-o", "%i %k"]);
  return out.split("\n").filter((l) => l.includes(`:${Deno.pid}`)).map((l) => l.split(" ")[0]);
}

async function token(): Promise<string> {
  return (await run("scontrol", ["token", "lifespan=3600"])).trim().replace(/^SLURM_JWT=/, "");
}

async function clusterDown(): Promise<void> {
  if (!owned) return;
  await sh("slurm_down.sh", { SLURM_STATE: state }, 120_000).catch((err) =>
    console.error(String(err))
  );
}

const rows = (n: number) =>
  Array.from({ length: n }, (_, i) => ({
    env: "fixture",
    id: "add",
    args: { a: i, b: 1 },
    slug: taskSlug("add", { a: i, b: 1 }),
  }));
const adder = functionAgent(async (prompt) => {
  await delay(200);
  const [a, b] = String(prompt).match(/\d+/g)!.map(Number);
  return String(a + b);
});

test({
  name: "SlurmRuntime serves 60 rollouts on 3 nodes and survives losing one",
  needs: [SLURM],
  fn: withDeadline(59_000, async (t) => {
    if (given !== undefined) {
      state = given;
    } else {
      state = "/run/hud-slurm-test";
      owned = true;
      await sh("slurm_up.sh", { SLURM_STATE: state }, 180_000);
    }
    const rest = `unix:${state}/rest/slurmrestd.sock`;
    const jwt = await token();

    await t.step("60 rollouts through slurmrestd, one node killed mid-job", async () => {
      await using runtime = new SlurmRuntime({
        module: FIXTURE,
        rest,
        token: jwt,
        user: "root",
        nodes: 3,
        tasksPerNode: 2,
        announceHost: ANNOUNCE,
        time: 10 * 60_000,
      });
      await runtime.ready(6, { timeout: 120_000 });
      assert.deepEqual(Object.keys(runtime.readyByNode).sort(), NODES);
      const [job] = runtime.jobIds;
      // The dead-man's switch and the owner tag are on the job.
      const shown = await run("scontrol", ["show", "job", "-o", job]);
      assert.match(shown, /TimeLimit=00:10:00/);
      assert.match(shown, new RegExp(`Comment=hud:owner=[^ ]+:${Deno.pid}`));

      const servedBy: string[] = [];
      let crashed: Promise<number> | null = null;
      const recording = {
        async place(options?: PlaceOptions): Promise<Placement> {
          const p = await runtime.place(options);
          servedBy.push(String(p.params.node));
          if (servedBy.length === 20) crashed = crashNode("slurm-n3");
          return p;
        },
      };
      const result = await new Taskset(rows(60)).run(adder, {
        runtime: recording,
        maxConcurrent: 6,
        rolloutTimeout: 60_000,
        connect: { readyTimeout: 10_000 },
        signal: AbortSignal.timeout(240_000),
      });
      assert.ok((await crashed!) > 0, "nothing was killed on slurm-n3");
      for (const node of NODES) {
        assert.ok(servedBy.slice(0, 20).includes(node), `${node} served no rollout`);
      }
      assert.equal(result.runs.length, 60);
      const good = result.runs.filter((r) => r.reward === 1).length;
      const errored = result.runs.filter((r) => r.status === "error");
      console.log(
        `slurm_test: ${good} of 60 rewarded, ${errored.length} errored; served by ${
          NODES.map((n) => `${n} ${servedBy.filter((s) => s === n).length}`).join(", ")
        }`,
      );
      assert.equal(good + errored.length, 60, "every rollout graded or errored");
      assert.ok(good >= 40, `only ${good} of 60 rollouts rewarded`);
      for (const r of errored) {
        assert.ok(r.failed_phase, "an errored rollout names its phase");
        assert.match(
          JSON.stringify(r.trace),
          /slurm-n3/,
          `an errored rollout names the node:\n${
            errored.map((e) => JSON.stringify(e.trace).slice(0, 600)).join("\n")
          }`,
        );
      }
      // The lost node's tasks left the pool; the others serve on.
      assert.ok(!("slurm-n3" in runtime.readyByNode), JSON.stringify(runtime.readyByNode));
      await using client = await connect(runtime, { readyTimeout: 10_000 });
      assert.equal((await client.startTask("add", { a: 1, b: 1 })).prompt, "What is 1 + 1?");
    });

    await t.step("nothing is left: no job, and gc finds nothing", async () => {
      const until = AbortSignal.timeout(30_000);
      while ((await ourJobs()).length > 0 && !until.aborted) await delay(250);
      assert.deepEqual(await ourJobs(), []);
      assert.deepEqual(await cancelStaleJobs({ rest, token: jwt, user: "root" }), []);
      // The lost node comes back for what follows (slurm_up.sh restarts its slurmd).
      await sh("slurm_up.sh", { SLURM_STATE: state }, 120_000);
    });

    await t.step(
      "hud eval --runtime slurm:PARTITION; hud gc --slurm finds nothing after",
      async () => {
        const dir = await Deno.makeTempDir();
        const vars = { SLURMRESTD: rest, SLURM_JWT: jwt, HUD_ANNOUNCE_HOST: ANNOUNCE };
        const before = Object.fromEntries(Object.keys(vars).map((k) => [k, Deno.env.get(k)]));
        try {
          const rowsFile = `${dir}/rows.jsonl`;
          await Deno.writeTextFile(
            rowsFile,
            rows(6).map((r) => JSON.stringify(r)).join("\n") + "\n",
          );
          const { main } = await import("../../cli.ts");
          let out = "";
          let err = "";
          const io = { stdout: (t: string) => out += t, stderr: (t: string) => err += t };
          // The agent reads "What is A + B?" on stdin and computes it.
          const agent = `read -r q; set -- $q; echo $(( $3 + \${5%?} ))`;
          for (const [k, v] of Object.entries(vars)) Deno.env.set(k, v);
          // What ran: the jobs of this process seen while the command ran, with their partition.
          const seen = new Set<string>();
          let watching = true;
          const watch = (async () => {
            while (watching) {
              const lines = (await run("squeue", ["-h", "-o", "%i %P %k"])).split("\n");
              for (const l of lines) {
                if (l.endsWith(`:${Deno.pid}`)) seen.add(l.split(" ").slice(0, 2).join(" "));
              }
              await delay(250);
            }
          })();
          const code = await main([
            "eval",
            FIXTURE,
            "--agent",
            agent,
            "--tasks",
            rowsFile,
            "--runtime",
            "slurm:hud",
            "--max-concurrent",
            "2",
          ], io).finally(async () => {
            watching = false;
            await watch;
          });
          assert.equal(code, 0, err);
          assert.match(out, /mean reward 1\.000 ± 0\.000 over 6 graded runs, 0 errored/);
          // One job, in the partition asked for, served every rollout.
          assert.equal(seen.size, 1, [...seen].join(", "));
          assert.match([...seen][0], /^\d+ hud$/);
          // Its job went with the run, and gc finds nothing.
          const until = AbortSignal.timeout(30_000);
          while ((await ourJobs()).length > 0 && !until.aborted) await delay(250);
          assert.deepEqual(await ourJobs(), []);
          out = "";
          err = "";
          assert.equal(await main(["gc", "--slurm"], io), 0, err);
          assert.equal(out, "");
          assert.match(err, /^gc: cancelled 0 jobs\n$/);
        } finally {
          for (const [k, v] of Object.entries(before)) {
            if (v === undefined) Deno.env.delete(k);
            else Deno.env.set(k, v);
          }
          await Deno.remove(dir, { recursive: true });
        }
      },
    );

    await t.step("sbatch, a job per placement, cancelled on release", async () => {
      await using runtime = new SlurmRuntime({
        module: FIXTURE,
        slurmConf: `${state}/slurm.conf`,
        jobPerPlacement: true,
        announceHost: ANNOUNCE,
        time: 5 * 60_000,
      });
      const a = await runtime.place();
      const b = await runtime.place();
      assert.notEqual(a.params.job, b.params.job);
      assert.deepEqual((await ourJobs()).sort(), [a.params.job, b.params.job].map(String).sort());
      await using c = await connect(a, { readyTimeout: 10_000 });
      assert.equal((await c.startTask("add", { a: 2, b: 2 })).prompt, "What is 2 + 2?");
      await c.close();
      await a[Symbol.asyncDispose]();
      await b[Symbol.asyncDispose]();
      const until = AbortSignal.timeout(30_000);
      while ((await ourJobs()).length > 0 && !until.aborted) await delay(250);
      assert.deepEqual(await ourJobs(), []);
    });

    await t.step("a runner killed mid-job: its tasks stop, gc cancels what is queued", async () => {
      // A child runner with a running pool and a job that waits for its begin time.
      const script = `
        import { SlurmRuntime } from ${
        JSON.stringify(new URL("../../engines/slurm.ts", import.meta.url).href)
      };
        const running = new SlurmRuntime({ module: ${JSON.stringify(FIXTURE)}, slurmConf: ${
        JSON.stringify(`${state}/slurm.conf`)
      }, tasks: 2, announceHost: "${ANNOUNCE}" });
        await running.ready(2, { timeout: 60_000 });
        const queued = new SlurmRuntime({ module: ${JSON.stringify(FIXTURE)}, slurmConf: ${
        JSON.stringify(`${state}/slurm.conf`)
      }, sbatchArgs: ["--begin=now+1hour"], announceHost: "${ANNOUNCE}" });
        queued.ready(1, { timeout: 3_600_000 }).catch(() => {});
        await new Promise((r) => setTimeout(r, 1000));
        console.log(JSON.stringify([...running.jobIds, ...queued.jobIds]));
        await new Promise(() => {});
      `;
      const child = new Deno.Command(Deno.execPath(), {
        args: ["eval", script],
        stdout: "piped",
        stderr: "inherit",
      }).spawn();
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let text = "";
      while (!text.includes("\n")) {
        const { value, done } = await reader.read();
        if (done) break;
        text += value;
      }
      const [runningJob, queuedJob] = JSON.parse(text) as string[];
      child.kill("SIGKILL");
      await child.status;
      await reader.cancel();
      // The running pool's tasks hold a connection to the runner: they stop with it.
      const until = AbortSignal.timeout(30_000);
      const live = async () => (await run("squeue", ["-h", "-o", "%i"])).split("\n");
      while ((await live()).includes(runningJob) && !until.aborted) await delay(250);
      assert.ok(!(await live()).includes(runningJob), `job ${runningJob} outlived its runner`);
      // The queued one waits for gc.
      assert.ok((await live()).includes(queuedJob));
      assert.deepEqual(await cancelStaleJobs({ slurmConf: `${state}/slurm.conf` }), [queuedJob]);
      assert.deepEqual(await cancelStaleJobs({ slurmConf: `${state}/slurm.conf` }), []);
    });
  }, { teardown: clusterDown, teardownMs: 150_000 }),
});

test("SlurmRuntime rejects a missing module and counts out of range", () => {
  assert.throws(
    () => new SlurmRuntime({ module: "" }),
    /Cannot create SlurmRuntime: module must be a non-empty string/,
  );
  assert.throws(
    () => new SlurmRuntime({ module: "x.ts", tasks: 0 }),
    /tasks must be a positive integer, got "0"/,
  );
  assert.throws(
    () => new SlurmRuntime({ module: "x.ts", signalGrace: 1.5 }),
    /signalGrace must be a whole number of seconds/,
  );
});

test({
  name: "SlurmRuntime without a cluster to reach says which SLURM_CONF it used and the way out",
  needs: [SLURM_CLIENT],
  async fn() {
    // An empty file: the commands fail at once (a missing one, they retry for a minute).
    const dir = await Deno.makeTempDir();
    const conf = `${dir}/slurm.conf`;
    await Deno.writeTextFile(conf, "");
    await using _dir = { [Symbol.asyncDispose]: () => Deno.remove(dir, { recursive: true }) };
    await using runtime = new SlurmRuntime({
      module: FIXTURE,
      slurmConf: conf,
      announceHost: "127.0.0.1",
    });
    const err = await runtime.place().catch((e) => e);
    const wayOut =
      `is SLURM_CONF \\(${conf}\\) this cluster's\\? Or give slurmrestd \\(SLURMRESTD\\)`;
    assert.match(String(err?.message), new RegExp(`^sbatch refused the job: .+; ${wayOut}$`));
    assert.doesNotMatch(String(err?.message), /\n/);
    const gc = await cancelStaleJobs({ slurmConf: conf }).catch((e) => e);
    assert.match(String(gc?.message), new RegExp(`^squeue failed: .+; ${wayOut}$`));
  },
});
