// KubernetesRuntime's reading of pod status, without a cluster: listings as
// the API server writes them (Kubernetes 1.20), folded into a pod's record,
// and what that record means for a placement.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  eventsText,
  failedOnItsNode,
  failOnLostNode,
  logText,
  markGone,
  newPodState,
  nodeProblem,
  nodeReady,
  observePod,
  pendingByNode,
  type PodObject,
  podProgress,
  type PodState,
  type PodStatus,
} from "../../engines/_pod_status.ts";

const T0 = 1_700_000_000_000;

function pod(name = "hud-1-ab-x7k2q"): PodState {
  return newPodState({ metadata: { name } }, T0);
}

function listing(status: PodStatus, node = "k8s-n1", extra: Partial<PodObject> = {}): PodObject {
  return { metadata: { name: "hud-1-ab-x7k2q" }, spec: { nodeName: node }, status, ...extra };
}

function waiting(reason: string, message = ""): PodStatus {
  return {
    phase: "Pending",
    containerStatuses: [{ name: "env", state: { waiting: { reason, message } } }],
  };
}

test("observePod() follows a pod from Pending to Running", () => {
  const p = pod();
  assert.deepEqual(podProgress(p, T0, 30_000), { state: "pending" });
  observePod(p, listing({ phase: "Pending" }), T0 + 100);
  assert.equal(p.node, "k8s-n1");
  observePod(
    p,
    listing({
      phase: "Running",
      podIP: "10.244.1.7",
      conditions: [{ type: "Ready", status: "True" }],
    }),
    T0 + 900,
  );
  assert.equal(p.ip, "10.244.1.7");
  assert.equal(p.wasReady, true);
  assert.equal(p.failure, null);
  assert.deepEqual(podProgress(p, T0 + 900, 30_000), { state: "running" });
});

test("observePod() fails a pod at once on a pull error, with the kubelet's words", () => {
  const p = pod();
  observePod(p, listing(waiting("ErrImagePull", 'pull access denied for "nope"')), T0);
  assert.equal(p.failure, 'ErrImagePull: pull access denied for "nope"');
  assert.deepEqual(podProgress(p, T0, 30_000), {
    state: "failed",
    why: 'failed: ErrImagePull: pull access denied for "nope"',
  });
  assert.equal(failedOnItsNode(p), true, "another node may have the image");
});

test("observePod() gives CreateContainerConfigError 20 s (a Secret the kubelet has not seen yet)", () => {
  const p = pod();
  const status = waiting("CreateContainerConfigError", "failed to sync secret cache");
  observePod(p, listing(status), T0);
  observePod(p, listing(status), T0 + 19_999);
  assert.equal(p.failure, null);
  observePod(p, listing({ phase: "Pending" }), T0 + 20_500);
  observePod(p, listing(status), T0 + 21_000);
  assert.equal(p.failure, null, "the wait starts again once the reason went away");
  observePod(p, listing(status), T0 + 41_000);
  assert.equal(p.failure, "CreateContainerConfigError: failed to sync secret cache");
});

test("observePod() fails a pod whose container exited, with its code and reason", () => {
  const p = pod();
  observePod(
    p,
    listing({
      phase: "Failed",
      containerStatuses: [{
        name: "env",
        state: { terminated: { exitCode: 1, reason: "Error" } },
      }],
    }),
    T0,
  );
  assert.equal(p.failure, "the container exited with code 1 (Error)");
  assert.equal(failedOnItsNode(p), false, "it would exit on any node");
  const evicted = pod();
  observePod(
    evicted,
    listing({ phase: "Failed", reason: "DeadlineExceeded", message: "active deadline" }),
    T0,
  );
  assert.equal(evicted.failure, "the container exited (DeadlineExceeded: active deadline)");
});

test("observePod() tells a pod waiting for room from one that cannot be placed", () => {
  const p = pod();
  const unschedulable = {
    phase: "Pending",
    conditions: [{
      type: "PodScheduled",
      status: "False",
      reason: "Unschedulable",
      message: "0/3 nodes are available: 3 Insufficient cpu.",
    }],
  };
  observePod(p, listing(unschedulable, ""), T0);
  assert.deepEqual(podProgress(p, T0 + 29_999, 30_000), { state: "unschedulable" });
  observePod(p, listing(unschedulable, ""), T0 + 10_000);
  assert.equal(p.unschedulableSince, T0, "counted from the first listing that said so");
  assert.deepEqual(podProgress(p, T0 + 30_000, 30_000), {
    state: "failed",
    why: "is unschedulable: 0/3 nodes are available: 3 Insufficient cpu.",
  });
  assert.equal(failedOnItsNode(p), false, "it has no node");
  observePod(p, listing({ phase: "Pending" }), T0 + 31_000);
  assert.equal(p.unschedulable, null, "scheduled after all");
});

test("observePod() marks a pod not ready once its node is lost, and a deletion not ours as a failure", () => {
  const p = pod();
  observePod(
    p,
    listing({ phase: "Running", conditions: [{ type: "Ready", status: "False" }] }),
    T0,
  );
  assert.equal(p.notReady, false, "never ready yet: starting, not lost");
  observePod(p, listing({ phase: "Running", conditions: [{ type: "Ready", status: "True" }] }), T0);
  observePod(
    p,
    listing({ phase: "Running", conditions: [{ type: "Ready", status: "False" }] }),
    T0,
  );
  assert.equal(p.notReady, true);
  const deleting = { metadata: { name: p.name, deletionTimestamp: "2026-12-07T03:00:00Z" } };
  const ours = pod();
  observePod(ours, listing({ phase: "Running" }, "k8s-n1", deleting), T0, true);
  assert.equal(ours.failure, null, "our own deletion is no failure");
  const theirs = pod();
  observePod(theirs, listing({ phase: "Running" }, "k8s-n1", deleting), T0);
  assert.equal(theirs.failure, "the pod is being deleted");
});

test("markGone() counts a pod missing from a listing as deleted, after the listing grace", () => {
  const fresh = pod("a");
  const old = pod("b");
  old.createdAt = T0 - 10_000;
  const listed = pod("c");
  listed.createdAt = T0 - 10_000;
  const went = markGone([fresh, old, listed], new Set(["c"]), T0);
  assert.deepEqual(went.map((p) => p.name), ["b"]);
  assert.equal(old.gone, true);
  assert.equal(old.failure, "the pod was deleted");
  assert.equal(fresh.gone, false, "made too recently to be listed");
  assert.deepEqual(markGone([old], new Set(), T0), [], "said once");
});

test("pendingByNode() and failOnLostNode(): the pending pods of a node that stopped answering fail", () => {
  const a = pod("a");
  observePod(a, listing({ phase: "Pending" }, "k8s-n3"), T0);
  const b = pod("b");
  observePod(b, listing({ phase: "Running", podIP: "10.244.3.2" }, "k8s-n3"), T0);
  const c = pod("c");
  observePod(c, listing({ phase: "Pending" }, ""), T0);
  const byNode = pendingByNode([a, b, c]);
  assert.deepEqual([...byNode.keys()], ["k8s-n3"]);
  assert.deepEqual(byNode.get("k8s-n3")!.map((p) => p.name), ["a"]);
  failOnLostNode(byNode.get("k8s-n3")!, "k8s-n3");
  assert.equal(a.failure, "its node k8s-n3 is not ready");
  assert.equal(a.notReady, true);
  assert.equal(b.failure, null);
});

test("nodeReady(), nodeProblem(), eventsText() and logText() say what errors show", () => {
  const lost = {
    status: { conditions: [{ type: "Ready", status: "Unknown", reason: "NodeStatusUnknown" }] },
  };
  assert.equal(nodeReady(lost), false);
  assert.equal(nodeReady({ status: { conditions: [{ type: "Ready", status: "True" }] } }), true);
  assert.equal(nodeReady({}), undefined);
  assert.equal(nodeProblem("k8s-n2", lost), "node k8s-n2 is not ready (NodeStatusUnknown)");
  assert.equal(
    eventsText([
      { reason: "Pulling", message: "x", lastTimestamp: "2026-12-07T03:00:02Z" },
      { reason: "Scheduled", message: "to n1", lastTimestamp: "2026-12-07T03:00:00Z" },
      { reason: "Pulling", message: "x", lastTimestamp: "2026-12-07T03:00:03Z" },
    ]),
    "; events: Scheduled: to n1 | Pulling: x",
  );
  assert.equal(eventsText([]), "");
  assert.equal(logText("a\n\nb\nc\nd\ne\nf\n"), "; last output: b | c | d | e | f");
  assert.equal(logText(null), "");
});
