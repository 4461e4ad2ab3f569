// StartPacer: how many rollouts a job runs at once follows what the process
// keeps up with, between a floor and maxConcurrent (eval/_pacing.ts).

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { PACING_FLOOR, StartPacer } from "../../eval/_pacing.ts";
import type { LoopLag } from "../../_internal/loop_lag.ts";

/** A loop whose lag the test sets. */
function fakeLag(): { lag: LoopLag; set(ms: number): void; watchers(): number } {
  let now = 0;
  let watchers = 0;
  const lag = {
    get late() {
      return 0;
    },
    get lag() {
      return now;
    },
    get watched() {
      return watchers > 0;
    },
    watch() {
      watchers++;
      let done = false;
      return {
        [Symbol.dispose]() {
          if (!done) watchers--;
          done = true;
        },
      };
    },
  } as unknown as LoopLag;
  return { lag, set: (ms) => now = ms, watchers: () => watchers };
}

test("StartPacer: widths up to the floor are never paced", async () => {
  const { lag, set, watchers } = fakeLag();
  set(10_000); // however late the loop
  const pacer = new StartPacer(PACING_FLOOR, lag);
  const held = [];
  for (let i = 0; i < PACING_FLOOR; i++) held.push(await pacer.admit());
  assert.equal(pacer.running, PACING_FLOOR);
  assert.equal(watchers(), 0, "no loop to watch");
  for (const a of held) a[Symbol.dispose]();
  pacer.close();
});

test("StartPacer: grows while the loop is on time, shrinks to the floor while it is late, admits in order", async () => {
  const { lag, set, watchers } = fakeLag();
  const pacer = new StartPacer(1000, lag);
  try {
    // Late from the start: the floor, and nobody more, however long they wait.
    set(500);
    const held: Disposable[] = [];
    for (let i = 0; i < PACING_FLOOR; i++) held.push(await pacer.admit());
    assert.equal(pacer.width, PACING_FLOOR);
    assert.equal(watchers(), 1);
    const order: number[] = [];
    const waiting = [0, 1, 2].map((i) => pacer.admit().then((a) => (order.push(i), a)));
    await new Promise((r) => setTimeout(r, 350));
    assert.deepEqual(order, []);
    assert.equal(pacer.width, PACING_FLOOR, "never below the floor");
    // On time: the width grows, and the waiters come in, in order.
    set(0);
    held.push(...await Promise.all(waiting));
    assert.deepEqual(order, [0, 1, 2]);
    assert.ok(pacer.width > PACING_FLOOR);
    // Demand keeps it growing while the loop keeps up.
    held.push(...await Promise.all(Array.from({ length: 200 }, () => pacer.admit())));
    assert.ok(pacer.width >= PACING_FLOOR + 203, String(pacer.width));
    assert.equal(pacer.peak, PACING_FLOOR + 203);
    for (const a of held) a[Symbol.dispose]();
    assert.equal(pacer.running, 0);
  } finally {
    pacer.close();
  }
  assert.equal(watchers(), 0, "closed: the loop is not watched");
});

test("StartPacer: a waiter whose signal aborts leaves the queue with the reason", async () => {
  const { lag, set } = fakeLag();
  set(500);
  const pacer = new StartPacer(100, lag);
  try {
    const held: Disposable[] = [];
    for (let i = 0; i < PACING_FLOOR; i++) held.push(await pacer.admit());
    const stop = new AbortController();
    const reason = new Error("job stopped");
    const waiting = pacer.admit(stop.signal);
    stop.abort(reason);
    await assert.rejects(waiting, (err) => err === reason);
    await assert.rejects(pacer.admit(stop.signal), (err) => err === reason);
    held.pop()![Symbol.dispose]();
    assert.equal(pacer.running, PACING_FLOOR - 1, "the aborted waiter took no place");
    for (const a of held) a[Symbol.dispose]();
  } finally {
    pacer.close();
  }
});
