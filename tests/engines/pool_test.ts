// What the pooled runtimes (Swarm, Kubernetes, Slurm) share, without an
// engine or a cluster: leasing members, the size demand asks for, the timer
// that looks at the pool, and the slots that bound pods being created.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { LeasePool, Poller, type PoolMember, scaleTarget } from "../../engines/_pool.ts";
import { CreateSlots } from "../../engines/_kube_pods.ts";
import { controlAddress } from "../../_internal/auth.ts";
import { NotReadyError } from "../../errors.ts";

function member(id: string, node: string): PoolMember {
  return {
    id,
    node,
    address: controlAddress("10.0.0.1", 8765, "t".repeat(64)),
    params: { id },
    ready: false,
    dead: null,
    leases: 0,
    lastUsed: 0,
  };
}

test("LeasePool leases the least loaded member on the least loaded node, and says a death on release", async () => {
  const pool = new LeasePool(2, `service "hud-1"`, "replica");
  const [a, b, c] = [member("a", "n1"), member("b", "n1"), member("c", "n2")];
  for (const m of [a, b, c]) {
    pool.add(m);
    pool.markReady(m);
  }
  const first = pool.lease(pool.take()!);
  const second = pool.lease(pool.take()!);
  assert.deepEqual([first.params.id, second.params.id], ["a", "c"], "then the other node's");
  assert.equal(first.address.port, 8765);
  assert.equal(first.url, `tcp://:${"t".repeat(64)}@10.0.0.1:8765`);
  pool.kill(a, "node n1 is down");
  const third = pool.lease(pool.take()!);
  assert.equal(third.params.id, "b", "a dead member is not leased");
  await assert.rejects(
    Promise.resolve(first[Symbol.asyncDispose]()),
    /^Error: a of service "hud-1" on node n1 died while placed: node n1 is down$/,
  );
  await second[Symbol.asyncDispose]();
  await second[Symbol.asyncDispose](); // once
  await third[Symbol.asyncDispose]();
  assert.equal(pool.demand, 0);
});

test("LeasePool.wait() times out naming the pool, its member noun and its state", async () => {
  const pool = new LeasePool(1, `service "hud-2"`, "replica");
  await assert.rejects(
    pool.wait(50, undefined, () => "(0 ready, 1 wanted, at most 1); last task error: x"),
    (e: unknown) =>
      e instanceof NotReadyError &&
      /^Cannot place on service "hud-2": no free ready replica after 50 ms \(0 ready, 1 wanted, at most 1\); last task error: x$/
        .test(e.message),
  );
  const waiting = pool.wait(5_000, undefined, () => "");
  assert.equal(pool.demand, 1, "a rollout waiting is demand");
  const m = member("m", "n1");
  pool.add(m);
  pool.markReady(m);
  assert.equal((await waiting).id, "m");
});

test("scaleTarget(): demand grows a pool up to max, idleness shrinks it to min, and regrows it there", () => {
  const limits = { min: 2, max: 6, width: 2, scaleDownAfter: 10_000 };
  assert.equal(scaleTarget(2, 7, 0, limits), 4, "7 rollouts at width 2");
  assert.equal(scaleTarget(2, 20, 0, limits), 6, "capped at max");
  assert.equal(scaleTarget(5, 3, 0, limits), 5, "demand below size: kept");
  assert.equal(scaleTarget(5, 0, 9_999, limits), 5, "not idle long enough");
  assert.equal(scaleTarget(5, 0, 10_000, limits), 2, "idle: down to min");
  assert.equal(scaleTarget(1, 0, 10_000, limits), 2, "below min after a failed creation: back up");
});

test("Poller shares one look between callers, and stops", async () => {
  let looks = 0;
  let release!: () => void;
  const poller = new Poller(60_000, async () => {
    looks++;
    await new Promise<void>((r) => release = r);
  }, () => {});
  const a = poller.poll();
  const b = poller.poll();
  assert.equal(a, b);
  release();
  await a;
  assert.equal(looks, 1);
  poller.start();
  await poller.stop();
  poller.start(); // stopped: no timer is left behind (the op sanitizer would say)
});

test("CreateSlots: a waiter that gives up does not take the next one's wake-up", async () => {
  const slots = new CreateSlots(1);
  const held = await slots.take();
  const quitter = new AbortController();
  const giving = slots.take(quitter.signal);
  const waiting = slots.take();
  quitter.abort(new Error("gave up"));
  await assert.rejects(giving, /gave up/);
  held.release();
  held.release(); // once
  const next = await waiting;
  next.release();
  const again = await slots.take();
  again.release();
});
