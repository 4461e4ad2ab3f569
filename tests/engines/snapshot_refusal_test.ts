// Which runtime places from which snapshot, refused up front in one line
// that names the runtime and what places from snapshots: Kubernetes, Swarm
// and Slurm place from none; ContainerRuntime from container snapshots
// only (its own), ForkRuntime from workspace snapshots only. Nothing is
// placed (and no engine or cluster is needed): the refusal comes first.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { taskSlug } from "../../env.ts";
import {
  ContainerRuntime,
  KubernetesRuntime,
  SlurmRuntime,
  SwarmRuntime,
} from "../../engines/mod.ts";
import { ForkRuntime, functionAgent, rollout, type Snapshot, Taskset } from "../../eval/mod.ts";
import { Environment } from "../../env.ts";
import type { Placement, RuntimeProvider } from "../../runtime/placement.ts";

const ROW = { env: "e", id: "t", args: {}, slug: taskSlug("t", {}) };
const agent = functionAgent(() => "x");

/** A snapshot-shaped record of `kind` that no runtime made. */
function record(kind: string): Snapshot {
  return {
    kind,
    id: "snap-00000000000a",
    workspace: "w",
    parent: null,
    lineage: [],
    bytes: 0,
    removed: false,
    remove: () => Promise.resolve(),
    [Symbol.asyncDispose]: () => Promise.resolve(),
  };
}

/** `runtime`, counting its placements (each refused). */
function counted<R extends RuntimeProvider>(runtime: R): R & { placed: number } {
  const r = runtime as R & { placed: number };
  r.placed = 0;
  r.place = () => {
    r.placed++;
    return Promise.reject(new Error("placed"));
  };
  return r;
}

test("rollout() and Taskset.run() refuse `from` on Kubernetes, Swarm and Slurm, naming the runtime", async () => {
  const runtimes = [
    counted(new KubernetesRuntime("x:1")),
    counted(new SwarmRuntime("x:1")),
    counted(new SlurmRuntime({ module: "/nonexistent/env.ts" })),
  ];
  for (const runtime of runtimes) {
    const name = runtime.constructor.name;
    const line = (verb: string) =>
      new RegExp(
        `^Cannot ${verb}: ${name} cannot place an environment from a snapshot \\(workspace snapshots: runtime ForkRuntime; container snapshots: ContainerRuntime\\)$`,
      );
    for (const kind of ["container", "workspace"]) {
      await assert.rejects(rollout(ROW, agent, { runtime, from: record(kind) }), {
        name: "TypeError",
        message: line("roll out from a snapshot"),
      });
      await assert.rejects(new Taskset([ROW]).run(agent, { runtime, from: record(kind) }), {
        name: "TypeError",
        message: line("run taskset from a snapshot"),
      });
    }
    await assert.rejects(
      new Taskset([ROW]).run(agent, { runtime, from: () => Promise.resolve(record("container")) }),
      { name: "TypeError", message: line("run taskset from a snapshot") },
    );
    assert.equal(runtime.placed, 0, `${name} placed nothing`);
  }
});

test("rollout() refuses a snapshot of the other kind: ContainerRuntime's and ForkRuntime's say which runtime places it", async () => {
  const container = counted(new ContainerRuntime("x:1", { readOnly: false }));
  await assert.rejects(rollout(ROW, agent, { runtime: container, from: record("workspace") }), {
    name: "TypeError",
    message:
      /^Cannot roll out from a snapshot: ContainerRuntime places from container snapshots, and "snap-00000000000a" is a workspace snapshot \(pass runtime: a ForkRuntime\)$/,
  });
  const fork = counted(new ForkRuntime(() => new Environment("e")));
  await assert.rejects(rollout(ROW, agent, { runtime: fork, from: record("container") }), {
    name: "TypeError",
    message: /ForkRuntime places from workspace snapshots.*\(pass runtime: a ContainerRuntime\)$/,
  });
  assert.equal(container.placed + fork.placed, 0);
});

test("ContainerRuntime.placeFrom() and snapshot() refuse what they did not make", async () => {
  const runtime = new ContainerRuntime("x:1", { readOnly: false });
  await assert.rejects(runtime.placeFrom(record("container")), {
    name: "TypeError",
    message:
      /^Cannot place container from a snapshot: snapshot "snap-00000000000a" was not made by ContainerRuntime.snapshot\(\) in this process$/,
  });
  const forged = { address: {}, params: { containerId: "abc" } } as unknown as Placement;
  await assert.rejects(runtime.snapshot(forged), {
    name: "TypeError",
    message: /^Cannot snapshot container: not a placement of this runtime, or released/,
  });
  // A read-only image changes nowhere a commit keeps.
  await assert.rejects(new ContainerRuntime("x:1").snapshot(forged), {
    name: "TypeError",
    message: /read-only.*create the runtime with readOnly: false$/,
  });
});
