// KubernetesRuntime's options and what it asks the API for, without a
// cluster: every default resolved in one record, the pod and Secret specs,
// and the nodes a pool's new pods keep off.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { resolveKubernetesOptions } from "../../engines/_kube_options.ts";
import { AVOID_NODE_MS, NodeAvoidance, podSpec, secretSpec } from "../../engines/_pod_spec.ts";
import { HOST_LABEL, OWNER_LABEL, RUNTIME_LABEL } from "../../engines/_constants.ts";

test("resolveKubernetesOptions() resolves every default once", () => {
  const bare = resolveKubernetesOptions("img:1", {});
  assert.equal(bare.pooled, false);
  assert.equal(bare.replicas, 0, "no pool, no pods up front");
  assert.equal(bare.readyTimeout, 120_000);
  assert.equal(bare.unschedulableTimeout, 30_000);
  assert.equal(bare.activeDeadline, 3_600_000);
  assert.equal(bare.closeTimeout, 30_000);
  assert.equal(bare.pollInterval, 500);
  assert.equal(bare.port, 8765);
  assert.equal(bare.reach, "auto");
  assert.equal(bare.spread, true);
  assert.deepEqual([bare.maxCreating, bare.createRate, bare.deleteRate], [8, 10, 20]);
  const pooled = resolveKubernetesOptions("img:1", {
    pool: { minReplicas: 2, width: 3 },
    readyTimeout: 5_000,
    unschedulableTimeout: 0,
  });
  assert.deepEqual(
    [pooled.pooled, pooled.min, pooled.replicas, pooled.max, pooled.width, pooled.scaleDownAfter],
    [true, 2, 2, 8, 3, 10_000],
  );
  assert.equal(pooled.readyTimeout, 5_000);
  assert.equal(pooled.unschedulableTimeout, 0, "0 is a value, not a default");
  assert.throws(() => resolveKubernetesOptions("", {}), TypeError);
  assert.throws(
    () => resolveKubernetesOptions("x", { closeTimeout: -1 }),
    /closeTimeout must be a positive number, got "-1"/,
  );
});

test("podSpec() asks for a confined bare pod, owned by the Secret, the token from it", () => {
  const config = resolveKubernetesOptions("registry:5000/env:1", {
    pool: {},
    env: { A: "1" },
    cpus: 1.5,
    memory: 256 * 2 ** 20,
    labels: { run: "r1" },
    activeDeadline: 90_500,
  });
  const spec = podSpec(config, { runtime: "hud-7-ab", secretUid: "uid-1", avoidance: {} }) as {
    metadata: Record<string, unknown>;
    spec: Record<string, unknown> & { containers: Record<string, unknown>[] };
  };
  assert.equal(spec.metadata.generateName, "hud-7-ab-");
  const labels = spec.metadata.labels as Record<string, string>;
  assert.equal(labels.run, "r1");
  assert.equal(labels[OWNER_LABEL], String(Deno.pid));
  assert.equal(labels[RUNTIME_LABEL], "hud-7-ab");
  assert.ok(labels[HOST_LABEL]);
  assert.deepEqual(spec.metadata.ownerReferences, [{
    apiVersion: "v1",
    kind: "Secret",
    name: "hud-7-ab",
    uid: "uid-1",
    blockOwnerDeletion: false,
  }]);
  assert.equal(spec.spec.restartPolicy, "Never");
  assert.equal(spec.spec.automountServiceAccountToken, false);
  assert.equal(spec.spec.enableServiceLinks, false);
  assert.equal(spec.spec.activeDeadlineSeconds, 91);
  assert.match(JSON.stringify(spec.spec), /"topologyKey":"kubernetes.io\/hostname"/);
  const [container] = spec.spec.containers;
  assert.deepEqual(container.env, [
    { name: "A", value: "1" },
    { name: "HUD_SERVE_TOKEN", valueFrom: { secretKeyRef: { name: "hud-7-ab", key: "token" } } },
  ]);
  assert.deepEqual(container.resources, {
    requests: { cpu: "1500m", memory: String(256 * 2 ** 20) },
    limits: { cpu: "1500m", memory: String(256 * 2 ** 20) },
  });
  const plain = podSpec(resolveKubernetesOptions("x", { spread: false }), {
    runtime: "r",
    secretUid: "u",
    avoidance: {},
  });
  assert.doesNotMatch(JSON.stringify(plain), /topologySpreadConstraints|resources/);
});

test("secretSpec() holds the token, owned by the runner's pod when there is one", () => {
  const config = resolveKubernetesOptions("x", {});
  const token = "t".repeat(64);
  const secret = secretSpec(config, "hud-7-ab", token, { name: "runner", uid: "u-9" }) as {
    metadata: { ownerReferences?: unknown[] };
    data: { token: string };
  };
  assert.equal(atob(secret.data.token), token);
  assert.deepEqual(secret.metadata.ownerReferences, [{
    apiVersion: "v1",
    kind: "Pod",
    name: "runner",
    uid: "u-9",
    blockOwnerDeletion: false,
  }]);
  const orphan = secretSpec(config, "hud-7-ab", token, null) as { metadata: object };
  assert.ok(!("ownerReferences" in orphan.metadata));
});

test("NodeAvoidance keeps new pods off a failing node for a minute, while other nodes are left", () => {
  const avoidance = new NodeAvoidance();
  for (const n of ["k8s-n1", "k8s-n2", "k8s-n3"]) avoidance.seen(n);
  const t0 = 1_000_000;
  assert.deepEqual(avoidance.affinity(t0), {});
  avoidance.avoid("k8s-n2", t0);
  avoidance.avoid("k8s-n1", t0 + 10);
  const terms = (avoidance.affinity(t0 + 20) as {
    affinity: {
      nodeAffinity: {
        requiredDuringSchedulingIgnoredDuringExecution: {
          nodeSelectorTerms: { matchFields: unknown[] }[];
        };
      };
    };
  }).affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms;
  assert.deepEqual(terms, [{
    matchFields: [
      { key: "metadata.name", operator: "NotIn", values: ["k8s-n1"] },
      { key: "metadata.name", operator: "NotIn", values: ["k8s-n2"] },
    ],
  }]);
  avoidance.avoid("k8s-n3", t0 + 20);
  assert.deepEqual(avoidance.affinity(t0 + 30), {}, "every node avoided: none is");
  assert.ok("affinity" in avoidance.affinity(t0 + AVOID_NODE_MS + 5), "n1 and n3 still avoided");
  assert.deepEqual(avoidance.affinity(t0 + AVOID_NODE_MS + 25), {}, "all expired");
});
