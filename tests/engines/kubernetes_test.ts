// KubernetesRuntime on a real 3-node Kubernetes 1.20 cluster:
// .ci/engine/k8s_up.sh runs etcd and the control plane on the host and a
// containerd and kubelet in each of three network namespaces on a bridge
// (10.214.0.0/24, pods on 10.244.N.0/24) behind the firewall guard, from the
// binaries .ci/engine/k8s_build.sh caches. .ci/run starts it and sets
// HUD_TEST_K8S_STATE (and HUD_REQUIRE_K8S=1: a missing cluster fails the
// test); otherwise the test brings one up itself when it can (root, the
// cached build) and removes it afterwards, and skips, saying why, when it
// cannot. The image is built with the host's Docker and imported into each
// node's containerd (no registry).

import { test } from "../_test.ts";
import { counterpart } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  KubernetesRuntime,
  type KubernetesRuntimeOptions,
  removeStalePods,
} from "../../engines/kubernetes.ts";
import { KubeClient, loadKubeConfig } from "../../engines/_kube.ts";
import { buildEnvironmentImage } from "../../engines/image.ts";
import { OWNER_LABEL, RUNTIME_LABEL } from "../../engines/_constants.ts";
import { EngineClient, findEngineSocket } from "../../engines/_engine.ts";
import { connect } from "../../client.ts";
import type { Placement, PlaceOptions } from "../../runtime/placement.ts";
import { Taskset } from "../../eval/taskset.ts";
import { functionAgent } from "../../eval/agent.ts";
import { taskSlug } from "../../env.ts";
import { delay } from "../../_internal/async.ts";
import { testSignal, withDeadline } from "../_deadline.ts";
import { crashNode, exists, namespacePids, sh, which } from "./_clusters.ts";

const FIXTURE = new URL("../fixtures/basic_env.ts", import.meta.url).pathname;
const NODES = ["k8s-n1", "k8s-n2", "k8s-n3"];
const IMAGE = "hud-k8s-fixture:test";
// The runner inside the cluster: its module, its image, and the module's path in the image
// (buildEnvironmentImage puts the files under /app, relative to the repository's root).
const RUNNER = new URL("../fixtures/k8s_runner.ts", import.meta.url).pathname;
const RUNNER_IMAGE = "hud-k8s-runner:test";
const RUNNER_IN_IMAGE = "/app/tests/fixtures/k8s_runner.ts";
const CACHE = Deno.env.get("K8S_CACHE") ?? "/var/cache/hud-sdk/k8s";
// The cluster .ci/run (or k8s_up.sh by hand) started, else none.
const given = Deno.env.get("HUD_TEST_K8S_STATE") ??
  (exists("/var/lib/hud-k8s/admin.kubeconfig") ? "/var/lib/hud-k8s" : undefined);

function skipReason(): string | null {
  if (Deno.build.os !== "linux") return "needs Linux network namespaces";
  if (Deno.uid() !== 0) return "needs root (network namespaces, kubelet)";
  try {
    findEngineSocket();
  } catch {
    return "needs Docker to build the image (.ci/engine/engine_up.sh)";
  }
  if (given !== undefined) {
    return exists(`${given}/admin.kubeconfig`)
      ? null
      : `no cluster in HUD_TEST_K8S_STATE "${given}"`;
  }
  if (!exists(`${CACHE}/v1.20.2/bin/kubelet`)) {
    return `no Kubernetes build in ${CACHE}: run .ci/engine/k8s_build.sh`;
  }
  const missing = ["etcd", "containerd", "ctr", "runc", "nsenter", "iptables", "openssl"]
    .filter((b) => !which(b));
  if (missing.length > 0) {
    return `missing ${
      missing.join(", ")
    }: apt-get install etcd-server containerd runc containernetworking-plugins`;
  }
  return null;
}
/** A Kubernetes cluster: the one .ci/run started (HUD_TEST_K8S_STATE), or one these tests bring up. */
const K8S = counterpart(
  "k8s",
  "as root, with Docker and the Kubernetes build (.ci/engine/k8s_build.sh); bash .ci/run starts a cluster (.ci/engine/k8s_up.sh)",
  skipReason,
);

let state = "";
let owned = false;
const kubeconfig = () => `${state}/admin.kubeconfig`;

async function clusterDown(): Promise<void> {
  if (!owned) return;
  await sh("k8s_down.sh", { K8S_STATE: state }, 120_000).catch((err) => console.error(String(err)));
}

/** Builds an image of `module` with Docker and imports it into the containerd of `nodes`. */
async function loadImage(
  module: string,
  tag: string,
  envName: string,
  nodes: readonly string[],
): Promise<void> {
  await buildEnvironmentImage(module, tag, {
    envName,
    envVersion: "0.3.0",
    signal: AbortSignal.timeout(240_000),
  });
  using engine = await EngineClient.open();
  const saved = await engine.raw("GET", `/images/get?names=${encodeURIComponent(tag)}`, {
    signal: AbortSignal.timeout(120_000),
  });
  const tar = new Uint8Array(await saved.arrayBuffer());
  for (const node of nodes) {
    const child = new Deno.Command("ctr", {
      args: ["-a", `/run/hud-k8s/${node}/containerd.sock`, "-n", "k8s.io", "images", "import", "-"],
      stdin: "piped",
      stdout: "null",
      stderr: "piped",
      signal: AbortSignal.timeout(120_000),
    }).spawn();
    const w = child.stdin.getWriter();
    await w.write(tar);
    await w.close();
    const out = await child.output();
    if (!out.success) {
      throw new Error(`import on ${node}: ${new TextDecoder().decode(out.stderr)}`);
    }
  }
}

/** Kills a node as a host crash would: its kubelet, containerd and shims, and its pods' processes. */
async function crashK8sNode(node: string): Promise<number> {
  let killed = await crashNode(node);
  const dir = `/run/hud-k8s/${node}/containerd/io.containerd.grpc.v1.cri/netns`;
  for (const e of exists(dir) ? [...Deno.readDirSync(dir)] : []) {
    const ino = Deno.statSync(`${dir}/${e.name}`).ino;
    for (const p of Deno.readDirSync("/proc")) {
      if (!/^\d+$/.test(p.name)) continue;
      try {
        if (Deno.readLinkSync(`/proc/${p.name}/ns/net`) === `net:[${ino}]`) {
          Deno.kill(Number(p.name), "SIGKILL");
          killed++;
        }
      } catch {
        // gone meanwhile
      }
    }
  }
  return killed;
}

async function api(method: string, path: string, body?: unknown): Promise<unknown> {
  using client = new KubeClient(await loadKubeConfig({ kubeconfig: kubeconfig() }));
  return await client.call(method, path, body);
}

/**
 * What a pod of namespace `ns` is doing, for a failure's message: its phase,
 * conditions and containers' states, the namespace's events (its other pods'
 * too) and the end of its log.
 */
async function podReport(ns: string, name: string): Promise<string> {
  const out: string[] = [];
  try {
    const pod = await api("GET", `/api/v1/namespaces/${ns}/pods/${name}`) as {
      spec?: { nodeName?: string };
      status?: {
        phase?: string;
        reason?: string;
        message?: string;
        conditions?: { type: string; status: string; reason?: string; message?: string }[];
        containerStatuses?: { name: string; state?: unknown; restartCount?: number }[];
      };
    };
    const s = pod.status ?? {};
    out.push(
      `pod ${name} on ${pod.spec?.nodeName ?? "?"}: phase ${s.phase ?? "?"}${
        s.reason ? ` (${s.reason}: ${s.message ?? ""})` : ""
      }`,
    );
    for (const c of s.conditions ?? []) {
      out.push(
        `  ${c.type}=${c.status}${c.reason ? ` ${c.reason}` : ""}${
          c.message ? `: ${c.message}` : ""
        }`,
      );
    }
    for (const c of s.containerStatuses ?? []) {
      out.push(`  container ${c.name}: ${JSON.stringify(c.state)} restarts ${c.restartCount ?? 0}`);
    }
  } catch (err) {
    out.push(`pod ${name}: ${err}`);
  }
  try {
    const events = await api("GET", `/api/v1/namespaces/${ns}/events`) as {
      items: {
        involvedObject: { name: string };
        reason?: string;
        message?: string;
        count?: number;
      }[];
    };
    out.push("events:");
    for (const e of events.items.slice(-30)) {
      out.push(
        `  ${e.involvedObject.name}: ${e.reason ?? ""} ${e.message ?? ""} (x${e.count ?? 1})`,
      );
    }
  } catch (err) {
    out.push(`events: ${err}`);
  }
  const log = await api("GET", `/api/v1/namespaces/${ns}/pods/${name}/log`).catch(String);
  out.push(`log: ${log === null ? "(empty)" : String(log).slice(-1500)}`);
  return out.join("\n");
}

/** Pods and secrets labelled by runtimes of this process, in a namespace. */
async function ours(ns = "default"): Promise<string[]> {
  const sel = encodeURIComponent(`${OWNER_LABEL}=${Deno.pid}`);
  const out: string[] = [];
  for (const kind of ["pods", "secrets"]) {
    const list = await api("GET", `/api/v1/namespaces/${ns}/${kind}?labelSelector=${sel}`) as {
      items: { metadata: { name: string } }[];
    };
    out.push(...list.items.map((i) => `${kind}/${i.metadata.name}`));
  }
  return out;
}

/** The default namespace's last Warning events, for a failure's message. */
async function warnings(): Promise<string> {
  const events = await api("GET", "/api/v1/namespaces/default/events") as {
    items: { type?: string; involvedObject: { name: string }; reason?: string; message?: string }[];
  };
  return events.items.filter((e) => e.type === "Warning").slice(-15)
    .map((e) => `  ${e.involvedObject.name}: ${e.reason ?? ""} ${e.message ?? ""}`).join("\n");
}

/** The nodes whose Ready condition is True. */
async function nodesReady(): Promise<string[]> {
  const nodes = await api("GET", "/api/v1/nodes") as {
    items: {
      metadata: { name: string };
      status?: { conditions?: { type: string; status: string }[] };
    }[];
  };
  return nodes.items.filter((n) =>
    n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True")
  ).map((n) => n.metadata.name).sort();
}

async function waitNone(ns = "default", ms = 60_000): Promise<string[]> {
  const until = AbortSignal.timeout(ms);
  let left = await ours(ns);
  while (left.length > 0 && !until.aborted) {
    await delay(250);
    left = await ours(ns);
  }
  return left;
}

const base = (): KubernetesRuntimeOptions => ({
  kubeconfig: kubeconfig(),
  imagePullPolicy: "IfNotPresent",
  readyTimeout: 90_000,
});

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

/** The cluster (given, or brought up here) with the image on every node; once. */
let ready: Promise<void> | null = null;
function setUp(): Promise<void> {
  ready ??= (async () => {
    if (given !== undefined) {
      state = given;
    } else {
      state = "/var/lib/hud-k8s-test";
      owned = true;
      await sh("k8s_up.sh", { K8S_STATE: state, K8S_CACHE: CACHE }, 300_000);
    }
    await loadImage(FIXTURE, IMAGE, "fixture", NODES);
  })();
  return ready;
}

/** A cluster test: the cluster set up first, bounded. */
function clusterTest(name: string, ms: number, fn: (t: Deno.TestContext) => Promise<void>): void {
  test({
    name,
    needs: [K8S],
    fn: withDeadline(ms, async (t) => {
      await setUp();
      await fn(t);
    }),
  });
}

const describe = (runs: { status: string; trace: unknown }[]) =>
  runs.map((r) => JSON.stringify(r.trace).slice(0, 400)).join("\n");

clusterTest(
  "KubernetesRuntime: a bare pod per placement, by pod IP and by port-forward",
  59_000,
  async () => {
    {
      for (const reach of ["pod-ip", "port-forward"] as const) {
        const runtime = new KubernetesRuntime(IMAGE, { ...base(), reach });
        try {
          const p = await runtime.place();
          assert.ok(NODES.includes(String(p.params.node)), String(p.params.node));
          const host = new URL(p.url.replace(/^tcp:/, "http:")).hostname;
          assert.equal(host, reach === "pod-ip" ? String(p.params.ip) : "127.0.0.1");
          await using c = await connect(p, { readyTimeout: 10_000 });
          assert.equal((await c.startTask("add", { a: 2, b: 3 })).prompt, "What is 2 + 3?");
          await c.close();
          await p[Symbol.asyncDispose]();
        } finally {
          await runtime.close();
        }
        assert.deepEqual(await waitNone("default", 30_000), []);
      }
    }
  },
);

clusterTest(
  "KubernetesRuntime fails fast with the pod's events, leaving nothing",
  59_000,
  async () => {
    {
      const cases: [string, KubernetesRuntimeOptions, string, RegExp][] = [
        ["a missing image", {}, "hud.local/missing:1", /ErrImagePull|ImagePullBackOff/],
        [
          "a container that exits",
          { command: ["/usr/local/bin/deno", "eval", "Deno.exit(3)"] },
          IMAGE,
          /exited with code 3/,
        ],
        [
          "an unschedulable pod",
          { nodeSelector: { "hud.dev/none": "x" }, unschedulableTimeout: 0 },
          IMAGE,
          /unschedulable: 0\/3 nodes are available/,
        ],
      ];
      for (const [what, options, image, pattern] of cases) {
        await using runtime = new KubernetesRuntime(image, { ...base(), ...options });
        const err = await runtime.place().catch((e) => e);
        assert.equal(err?.name, "NotReadyError", `${what}: ${err}`);
        assert.match(String(err), pattern, what);
        if (what !== "an unschedulable pod") assert.match(String(err), /events: /, what);
      }
      assert.deepEqual(await waitNone("default", 30_000), []);
      // A quota refusal, in a namespace with room for no pod.
      const ns = `hud-quota-${Deno.pid}`;
      await api("POST", "/api/v1/namespaces", { metadata: { name: ns } });
      try {
        await api("POST", `/api/v1/namespaces/${ns}/resourcequotas`, {
          metadata: { name: "none" },
          spec: { hard: { pods: "0" } },
        });
        await using runtime = new KubernetesRuntime(IMAGE, { ...base(), namespace: ns });
        const until = AbortSignal.timeout(30_000);
        let err: unknown;
        // The quota controller fills in the quota's status a moment after it is made.
        do {
          err = await runtime.place({ signal: until }).then(
            async (p) => {
              await p[Symbol.asyncDispose]();
              return null;
            },
            (e) => e,
          );
        } while (err === null && !until.aborted);
        assert.match(String(err), /exceeded quota/);
      } finally {
        await api("DELETE", `/api/v1/namespaces/${ns}`);
      }
    }
  },
);

clusterTest(
  "KubernetesRuntime: 60 rollouts on a pool over 3 nodes, the busiest killed mid-job",
  59_000,
  async (t) => {
    let victim = "k8s-n3";
    await t.step("the rollouts", async () => {
      await using runtime = new KubernetesRuntime(IMAGE, {
        ...base(),
        pool: { minReplicas: 6, maxReplicas: 6 },
      });
      await runtime.ready(6, { timeout: 120_000 });
      // The pods spread over the nodes that are Ready (the runtime asks the
      // scheduler to); a node the cluster lost before the job is named, not
      // silently counted.
      const before = runtime.readyByNode;
      const readyNodes = await nodesReady();
      const pods = await api("GET", "/api/v1/namespaces/default/pods") as {
        items: { metadata: { labels?: Record<string, string> }; spec: unknown }[];
      };
      const mine = pods.items.filter((p) => p.metadata.labels?.[RUNTIME_LABEL] === runtime.name);
      assert.ok(mine.length >= 6, `${mine.length} pods`);
      for (const p of mine) {
        assert.match(JSON.stringify(p.spec), /"topologyKey":"kubernetes.io\/hostname"/);
      }
      const where = `pods by node ${JSON.stringify(before)}; nodes Ready ${
        JSON.stringify(readyNodes)
      }`;
      console.log(`kubernetes_test: ${where}`);
      const empty = readyNodes.filter((n) => !(before[n] > 0));
      if (empty.length > 0 || Object.keys(before).length < 2) {
        assert.fail(`no pod on ${empty.join(", ") || "two nodes"}: ${where}\n${await warnings()}`);
      }
      // The node to kill is the one with the most pods (k8s-n3 on a tie).
      victim = Object.entries(before).sort((a, b) =>
        b[1] - a[1] || (b[0] === "k8s-n3" ? 1 : 0) - (a[0] === "k8s-n3" ? 1 : 0)
      )[0][0];
      const servedBy: string[] = [];
      let crashed: Promise<number> | null = null;
      const recording = {
        async place(options?: PlaceOptions): Promise<Placement> {
          const p = await runtime.place(options);
          servedBy.push(String(p.params.node));
          if (servedBy.length === 20) {
            crashed = crashK8sNode(victim);
          }
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
      const good = result.runs.filter((r) =>
        r.reward === 1
      ).length;
      const errored = result.runs.filter((r) => r.status === "error");
      console.log(
        `kubernetes_test: ${good} of 60 rewarded, ${errored.length} errored; ${victim} killed; served by ${
          NODES.map((n) => `${n} ${servedBy.filter((s) => s === n).length}`).join(", ")
        }`,
      );
      assert.ok((await crashed!) > 0, `nothing was killed on ${victim}`);
      assert.ok(servedBy.slice(0, 20).includes(victim), `${victim} served no rollout`);
      assert.equal(result.runs.length, 60);
      assert.equal(good + errored.length, 60, "every rollout graded or errored");
      assert.ok(good >= 40, `only ${good} of 60 rollouts rewarded`);
      for (const r of errored) {
        assert.ok(r.failed_phase, "an errored rollout names its phase");
        assert.ok(
          JSON.stringify(r.trace).includes(victim),
          `an errored rollout names the node:\n${describe(errored)}`,
        );
      }
      // The pool replaced the lost pods on the other nodes.
      const others = (ready: Record<string, number>) =>
        Object.entries(ready).filter(([n]) => n !== victim).reduce((a, [, k]) => a + k, 0);
      const until = AbortSignal.timeout(60_000);
      while (!until.aborted) {
        const ready = runtime.readyByNode;
        if (!(victim in ready) && others(ready) >= 6) break;
        await delay(250);
      }
      const ready = runtime.readyByNode;
      assert.ok(!(victim in ready), JSON.stringify(ready));
      assert.equal(others(ready), 6, JSON.stringify(ready));
    });

    await t.step("nothing is left, and gc finds nothing", async () => {
      assert.deepEqual(await waitNone(), []);
      assert.deepEqual(await removeStalePods({ kubeconfig: kubeconfig() }), []);
      // The lost node comes back for what follows (k8s_up.sh restarts what is gone).
      await sh("k8s_up.sh", { K8S_STATE: state, K8S_CACHE: CACHE }, 300_000);
      assert.ok(namespacePids(victim).length > 0);
    });
  },
);

clusterTest(
  "KubernetesRuntime: a pool keeps off a node where its pods cannot start, and fails fast where none can",
  59_000,
  async () => {
    // k8s-n2 loses the image; its pods fail there.
    const ctr = (node: string, args: string[]) =>
      new Deno.Command("ctr", {
        args: ["-a", `/run/hud-k8s/${node}/containerd.sock`, "-n", "k8s.io", ...args],
        stdout: "null",
        stderr: "null",
      }).output();
    await ctr("k8s-n2", ["images", "rm", `docker.io/library/${IMAGE}`]);
    const left = await new Deno.Command("ctr", {
      args: ["-a", "/run/hud-k8s/k8s-n2/containerd.sock", "-n", "k8s.io", "images", "ls", "-q"],
    }).output();
    assert.doesNotMatch(new TextDecoder().decode(left.stdout), /hud-k8s-fixture/);
    try {
      await using runtime = new KubernetesRuntime(IMAGE, {
        ...base(),
        // Never pulled: the node without the image fails at once (no registry to time out on).
        imagePullPolicy: "Never",
        pool: { minReplicas: 6, maxReplicas: 6 },
      });
      await runtime.ready(6, { timeout: 90_000 });
      const ready = runtime.readyByNode;
      assert.ok(!("k8s-n2" in ready), JSON.stringify(ready));
      assert.equal((ready["k8s-n1"] ?? 0) + (ready["k8s-n3"] ?? 0), 6, JSON.stringify(ready));
    } finally {
      await loadImage(FIXTURE, IMAGE, "fixture", ["k8s-n2"]);
    }
    // An image no node has: the pool's waiters hear the pull error, well before their timeout.
    {
      await using runtime = new KubernetesRuntime("hud.local/missing:1", {
        ...base(),
        // Never pulled: the node without the image fails at once (no registry to time out on).
        imagePullPolicy: "Never",
        pool: { minReplicas: 3, maxReplicas: 3 },
      });
      const err = await runtime.ready(3, { timeout: 90_000 }).catch((e) => e);
      assert.equal(err?.name, "NotReadyError", String(err));
      assert.match(String(err), /ErrImageNeverPull/);
      assert.doesNotMatch(String(err), /pods ready after/, "the waiters timed out instead");
    }
    assert.deepEqual(await waitNone("default", 30_000), []);
  },
);

clusterTest(
  "KubernetesRuntime.close() leaves no pod in the API when a kubelet never confirms the deletion",
  59_000,
  async () => {
    const runtime = new KubernetesRuntime(IMAGE, { ...base(), closeTimeout: 3_000 });
    let stopped: number[] = [];
    try {
      const p = await runtime.place();
      const node = String(p.params.node);
      // The node's kubelet, stopped: the pod's graceful deletion is never confirmed.
      stopped = namespacePids(node).filter((pid) => {
        try {
          return Deno.readTextFileSync(`/proc/${pid}/comm`).trim() === "kubelet";
        } catch {
          return false;
        }
      });
      assert.equal(stopped.length, 1, `kubelet of ${node}: ${stopped}`);
      Deno.kill(stopped[0], "SIGSTOP");
      await p[Symbol.asyncDispose]();
      await runtime.close();
      // Nothing is left of it in the API, at once (no waiting here).
      const pods = await api(
        "GET",
        `/api/v1/namespaces/default/pods?labelSelector=${
          encodeURIComponent(`${RUNTIME_LABEL}=${runtime.name}`)
        }`,
      ) as { items: unknown[] };
      assert.equal(pods.items.length, 0, JSON.stringify(pods.items).slice(0, 400));
    } finally {
      for (const pid of stopped) Deno.kill(pid, "SIGCONT");
      await runtime.close();
    }
    assert.deepEqual(await waitNone("default", 30_000), []);
  },
);

clusterTest(
  "KubernetesRuntime: a killed runner's pods go with its owner, or by gc",
  59_000,
  async () => {
    {
      // A pod standing for the runner: deleting it must take the runtime's pods with it.
      const owner = await api("POST", "/api/v1/namespaces/default/pods", {
        metadata: { generateName: "hud-runner-" },
        spec: {
          automountServiceAccountToken: false,
          containers: [{ name: "pause", image: "hud.local/pause:3.2" }],
        },
      }) as { metadata: { name: string; uid: string } };
      const child = (withOwner: boolean) => `
        import { KubernetesRuntime } from ${
        JSON.stringify(new URL("../../engines/kubernetes.ts", import.meta.url).href)
      };
        const rt = new KubernetesRuntime(${JSON.stringify(IMAGE)}, { kubeconfig: ${
        JSON.stringify(kubeconfig())
      }, imagePullPolicy: "IfNotPresent", pool: { minReplicas: 2 }${
        withOwner ? `, owner: ${JSON.stringify(owner.metadata)}` : ""
      } });
        await rt.ready(2, { timeout: 90_000 });
        console.log(rt.name);
        await new Promise(() => {});
      `;
      const names: string[] = [];
      for (const withOwner of [true, false]) {
        const proc = new Deno.Command(Deno.execPath(), {
          args: ["eval", child(withOwner)],
          stdout: "piped",
          stderr: "inherit",
        }).spawn();
        const reader = proc.stdout.pipeThrough(new TextDecoderStream()).getReader();
        let text = "";
        while (!text.includes("\n")) {
          const { value, done } = await reader.read();
          if (done) break;
          text += value;
        }
        names.push(text.trim());
        proc.kill("SIGKILL");
        await proc.status;
        await reader.cancel();
      }
      const podsOf = async (name: string) =>
        ((await api(
          "GET",
          `/api/v1/namespaces/default/pods?labelSelector=${
            encodeURIComponent(`${RUNTIME_LABEL}=${name}`)
          }`,
        )) as { items: unknown[] }).items.length;
      assert.equal(await podsOf(names[0]), 2);
      assert.equal(await podsOf(names[1]), 2);
      // The owner goes: the garbage collector removes the Secret, then the pods.
      await api(
        "DELETE",
        `/api/v1/namespaces/default/pods/${owner.metadata.name}?gracePeriodSeconds=0`,
      );
      const until = AbortSignal.timeout(120_000);
      while ((await podsOf(names[0])) > 0 && !until.aborted) await delay(250);
      assert.equal(await podsOf(names[0]), 0, "the owner's deletion left pods");
      // No owner: gc removes the dead runner's Secret and pods.
      const removed = await removeStalePods({ kubeconfig: kubeconfig() });
      assert.deepEqual(removed.filter((r) => r.startsWith("secret/")), [`secret/${names[1]}`]);
      assert.equal(removed.filter((r) => r.startsWith("pod/")).length, 2);
      assert.deepEqual(await waitNone("default", 120_000), []);
      assert.deepEqual(await removeStalePods({ kubeconfig: kubeconfig() }), []);
    }
  },
);

clusterTest(
  "KubernetesRuntime with a service account's token and only the permissions documented",
  59_000,
  async () => {
    {
      const ns = `hud-sa-${Deno.pid}`;
      await api("POST", "/api/v1/namespaces", { metadata: { name: ns } });
      const dir = await Deno.makeTempDir();
      try {
        await api("POST", `/api/v1/namespaces/${ns}/serviceaccounts`, {
          metadata: { name: "runner" },
        });
        await api("POST", `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/roles`, {
          metadata: { name: "hud-runner" },
          rules: [
            { apiGroups: [""], resources: ["pods"], verbs: ["create", "get", "list", "delete"] },
            { apiGroups: [""], resources: ["pods/portforward"], verbs: ["create", "get"] },
            { apiGroups: [""], resources: ["pods/log"], verbs: ["get"] },
            { apiGroups: [""], resources: ["secrets"], verbs: ["create", "delete"] },
            { apiGroups: [""], resources: ["events"], verbs: ["list"] },
          ],
        });
        await api("POST", `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/rolebindings`, {
          metadata: { name: "hud-runner" },
          roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "hud-runner" },
          subjects: [{ kind: "ServiceAccount", name: "runner", namespace: ns }],
        });
        // 1.20 makes a token Secret for each service account.
        let token = "";
        const until = AbortSignal.timeout(30_000);
        while (token === "" && !until.aborted) {
          const list = await api("GET", `/api/v1/namespaces/${ns}/secrets`) as {
            items: {
              type: string;
              metadata: { annotations?: Record<string, string> };
              data?: { token?: string };
            }[];
          };
          const s = list.items.find((i) =>
            i.type === "kubernetes.io/service-account-token" &&
            i.metadata.annotations?.["kubernetes.io/service-account.name"] === "runner"
          );
          token = s?.data?.token ? atob(s.data.token) : "";
          if (token === "") await delay(250);
        }
        const file = `${dir}/sa.kubeconfig`;
        await Deno.writeTextFile(
          file,
          [
            "apiVersion: v1",
            "kind: Config",
            "clusters:",
            "- name: hud",
            "  cluster:",
            "    server: https://10.214.0.254:6443",
            `    certificate-authority: ${state}/pki/ca.crt`,
            "users:",
            "- name: runner",
            "  user:",
            `    token: ${token}`,
            "contexts:",
            "- name: hud",
            "  context: {cluster: hud, user: runner, namespace: " + ns + "}",
            "current-context: hud",
            "",
          ].join("\n"),
          { mode: 0o600 },
        );
        for (const reach of ["pod-ip", "port-forward"] as const) {
          await using runtime = new KubernetesRuntime(IMAGE, {
            ...base(),
            kubeconfig: file,
            reach,
          });
          await using c = await connect(runtime, { readyTimeout: 10_000 });
          assert.equal((await c.startTask("add", { a: 4, b: 4 })).prompt, "What is 4 + 4?");
        }
        assert.deepEqual(await waitNone(ns), []);
      } finally {
        await Deno.remove(dir, { recursive: true });
        await api("DELETE", `/api/v1/namespaces/${ns}`);
      }
    }
  },
);

clusterTest(
  "KubernetesRuntime inside the cluster: the pod's service account, pods owned by the runner's pod",
  59_000,
  async () => {
    const ns = `hud-incluster-${Deno.pid}`;
    const runner = `hud-runner-${Deno.pid}`;
    await api("POST", "/api/v1/namespaces", { metadata: { name: ns } });
    try {
      // The runner's image: its module and the SDK, on the node it is pinned to.
      await loadImage(RUNNER, RUNNER_IMAGE, "k8s-runner", ["k8s-n1"]);
      await api("POST", `/api/v1/namespaces/${ns}/serviceaccounts`, {
        metadata: { name: "hud-runner" },
      });
      // Only the permissions KubernetesRuntime documents, in its namespace (nodes: none).
      await api("POST", `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/roles`, {
        metadata: { name: "hud-runner" },
        rules: [
          { apiGroups: [""], resources: ["pods"], verbs: ["create", "get", "list", "delete"] },
          { apiGroups: [""], resources: ["pods/portforward"], verbs: ["create", "get"] },
          { apiGroups: [""], resources: ["pods/log"], verbs: ["get"] },
          { apiGroups: [""], resources: ["secrets"], verbs: ["create", "delete"] },
          { apiGroups: [""], resources: ["events"], verbs: ["list"] },
        ],
      });
      await api("POST", `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/rolebindings`, {
        metadata: { name: "hud-runner" },
        roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "hud-runner" },
        subjects: [{ kind: "ServiceAccount", name: "hud-runner", namespace: ns }],
      });
      // Pods are refused until the namespace's service accounts have their token Secrets.
      const tokens = AbortSignal.timeout(60_000);
      while (!tokens.aborted) {
        const list = await api("GET", `/api/v1/namespaces/${ns}/secrets`) as {
          items: { type: string; metadata: { annotations?: Record<string, string> } }[];
        };
        const named = new Set(
          list.items.filter((i) => i.type === "kubernetes.io/service-account-token")
            .map((i) => i.metadata.annotations?.["kubernetes.io/service-account.name"]),
        );
        if (named.has("default") && named.has("hud-runner")) break;
        await delay(250);
      }
      await api("POST", `/api/v1/namespaces/${ns}/pods`, {
        metadata: { name: runner },
        spec: {
          serviceAccountName: "hud-runner",
          nodeName: "k8s-n1",
          restartPolicy: "Never",
          enableServiceLinks: false,
          terminationGracePeriodSeconds: 0,
          containers: [{
            name: "runner",
            image: RUNNER_IMAGE,
            imagePullPolicy: "IfNotPresent",
            command: ["/usr/local/bin/deno", "run", "-A", RUNNER_IN_IMAGE, IMAGE],
            // The test cluster runs no kube-proxy: the API server's own address stands in for
            // the kubernetes Service's (its certificate names both).
            env: [
              { name: "KUBERNETES_SERVICE_HOST", value: "10.214.0.254" },
              { name: "KUBERNETES_SERVICE_PORT", value: "6443" },
            ],
          }],
        },
      });
      // The runner's lines, from its log.
      const lines = async () => {
        const text = await api("GET", `/api/v1/namespaces/${ns}/pods/${runner}/log`)
          .catch(() => "") as string;
        return String(text ?? "").split("\n").filter((l) => l.startsWith("{")).map((l) =>
          JSON.parse(l) as Record<string, string>
        );
      };
      // The runner's own waits (2 x 90 s after it starts, tests/fixtures/k8s_runner.ts) end
      // before this one: it exits saying why by then, unless its pod never ran.
      const until = AbortSignal.any([AbortSignal.timeout(240_000), testSignal()]);
      let seen = await lines();
      while (!seen.some((l) => l.ready) && !until.aborted) {
        const pod = await api("GET", `/api/v1/namespaces/${ns}/pods/${runner}`) as {
          status?: { phase?: string };
        };
        if (pod.status?.phase === "Failed" || pod.status?.phase === "Succeeded") break;
        await delay(500);
        seen = await lines();
      }
      const done = seen.find((l) => "prompt" in l);
      const ready = seen.find((l) => "ready" in l);
      if (!ready?.ready) {
        assert.fail(`the runner did not get ready:\n${await podReport(ns, runner)}`);
      }
      assert.deepEqual(done, { prompt: "What is 20 + 22?", namespace: ns, reach: "pod-ip" });
      // Its Secret is owned by the runner's pod, and the pool's pods by the Secret.
      const name = ready.ready;
      const sel = encodeURIComponent(`${RUNTIME_LABEL}=${name}`);
      const self = await api("GET", `/api/v1/namespaces/${ns}/pods/${runner}`) as {
        metadata: { uid: string };
      };
      const secret = await api("GET", `/api/v1/namespaces/${ns}/secrets/${name}`) as {
        metadata: { uid: string; ownerReferences?: { kind: string; name: string; uid: string }[] };
      };
      assert.deepEqual(
        secret.metadata.ownerReferences?.map((o) => [o.kind, o.name, o.uid]),
        [["Pod", runner, self.metadata.uid]],
      );
      type Listed = {
        items: {
          metadata: { ownerReferences?: { kind: string; uid: string }[] };
          spec: { automountServiceAccountToken?: boolean };
        }[];
      };
      const pods = await api("GET", `/api/v1/namespaces/${ns}/pods?labelSelector=${sel}`) as Listed;
      assert.equal(pods.items.length, 2);
      for (const p of pods.items) {
        assert.deepEqual(
          p.metadata.ownerReferences?.map((o) => [o.kind, o.uid]),
          [["Secret", secret.metadata.uid]],
        );
        // The environment's pods get no API credentials.
        assert.equal(p.spec.automountServiceAccountToken, false);
      }
      // The runner's pod goes (not closing anything): the garbage collector takes the rest.
      await api("DELETE", `/api/v1/namespaces/${ns}/pods/${runner}?gracePeriodSeconds=0`);
      const gone = AbortSignal.timeout(120_000);
      const left = async () =>
        ((await api("GET", `/api/v1/namespaces/${ns}/pods?labelSelector=${sel}`)) as Listed)
          .items.length +
        ((await api("GET", `/api/v1/namespaces/${ns}/secrets?labelSelector=${sel}`)) as Listed)
          .items.length;
      while ((await left()) > 0 && !gone.aborted) await delay(250);
      assert.equal(await left(), 0, "the runner's pod went and left its pool behind");
    } finally {
      await api("DELETE", `/api/v1/namespaces/${ns}`);
    }
  },
);

clusterTest(
  "hud eval --runtime k8s:IMAGE runs a taskset on a pool of pods; hud gc --kubernetes finds nothing after",
  59_000,
  async () => {
    const dir = await Deno.makeTempDir();
    const before = Deno.env.get("KUBECONFIG");
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
      Deno.env.set("KUBECONFIG", kubeconfig());
      // What ran: the pods of this process seen running while the command ran.
      const seen = new Set<string>();
      let watching = true;
      const watch = (async () => {
        while (watching) {
          const list = await api(
            "GET",
            `/api/v1/namespaces/default/pods?labelSelector=${
              encodeURIComponent(`${OWNER_LABEL}=${Deno.pid}`)
            }`,
          ) as { items: { metadata: { name: string }; status?: { phase?: string } }[] };
          for (const p of list.items) {
            if (p.status?.phase === "Running") seen.add(p.metadata.name);
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
        `k8s:${IMAGE}`,
        "--max-concurrent",
        "3",
        "--out",
        `${dir}/results.jsonl`,
      ], io).finally(async () => {
        watching = false;
        await watch;
      });
      assert.equal(code, 0, err);
      assert.match(out, /mean reward 1\.000 ± 0\.000 over 6 graded runs, 0 errored/);
      assert.equal((await Deno.readTextFile(`${dir}/results.jsonl`)).trim().split("\n").length, 6);
      // A pool of pods served them: at most --max-concurrent + 1 (the held placement).
      assert.ok(seen.size >= 1 && seen.size <= 4, `pods seen: ${[...seen].join(", ")}`);
      // The pool and its Secret went with the run, and gc finds nothing.
      assert.deepEqual(await waitNone("default", 30_000), []);
      out = "";
      err = "";
      assert.equal(await main(["gc", "--kubernetes", "--namespace", "default"], io), 0, err);
      assert.equal(out, "");
      assert.match(err, /^gc: removed 0 pods and 0 secrets\n$/);
    } finally {
      if (before === undefined) Deno.env.delete("KUBECONFIG");
      else Deno.env.set("KUBECONFIG", before);
      await Deno.remove(dir, { recursive: true });
    }
  },
);

test({
  name: "KubernetesRuntime tests: the cluster they brought up goes",
  needs: [K8S],
  fn: withDeadline(59_000, clusterDown),
});

test("KubernetesRuntime rejects bad shapes and values", () => {
  assert.throws(() => new KubernetesRuntime(""), /image must be a non-empty string/);
  assert.throws(
    () => new KubernetesRuntime("x", { pool: { minReplicas: 0 } }),
    /minReplicas must be a positive integer, got "0"/,
  );
  assert.throws(
    () => new KubernetesRuntime("x", { pool: { minReplicas: 4, maxReplicas: 2 } }),
    /need minReplicas <= replicas <= maxReplicas, got "4", "4", "2"/,
  );
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => new KubernetesRuntime("x", { reach: "ssh" as any }),
    /reach must be "auto", "pod-ip" or "port-forward", got "ssh"/,
  );
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => new KubernetesRuntime("x", { spread: "yes" as any }),
    /spread must be true or false, got "yes"/,
  );
});
