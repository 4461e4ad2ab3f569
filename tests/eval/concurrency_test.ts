// Adaptive concurrency of model calls (eval/concurrency.ts): the limit's
// sequence, never its timing, on a virtual clock.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Environment, type JobProgress, Taskset } from "../../mod.ts";
import { AdaptiveConcurrency, formatProgress, virtualClock } from "../../eval/mod.ts";
import { ChatAgent } from "../../agents/mod.ts";
import { completion, failure, scriptedServer } from "../agents/_scripted.ts";

async function calls(limiter: AdaptiveConcurrency, outcomes: ("ok" | "rate_limited")[]) {
  for (const o of outcomes) {
    (await limiter.acquire()).release(o, o === "rate_limited" ? 1000 : null);
  }
}

test("AdaptiveConcurrency shrinks once per rate-limit episode and grows after clean windows", async (t) => {
  await t.step("starts at 20, or the max when lower", () => {
    assert.equal(new AdaptiveConcurrency({ max: 100 }).limit, 20);
    assert.equal(new AdaptiveConcurrency({ max: 8 }).limit, 8);
  });
  await t.step(
    "the 429s of calls sent under one limit are one episode; growth waits for the cool-down",
    async () => {
      const clock = virtualClock();
      const limiter = new AdaptiveConcurrency({ max: 100, clock });
      const sent = await Promise.all([1, 2, 3].map(() => limiter.acquire()));
      for (const permit of sent) permit.release("rate_limited", 1000);
      assert.equal(limiter.limit, 16);
      assert.equal(limiter.rateLimitEpisodes, 1);
      // Clean calls inside the cool-down do not grow it.
      await calls(limiter, Array(40).fill("ok"));
      assert.equal(limiter.limit, 16);
      // A call sent under the lowered limit and refused: a new episode, cool-down or not.
      await calls(limiter, ["rate_limited"]);
      assert.equal(limiter.limit, 12); // 16 * 0.8 = 12.8, down to 12.
      assert.equal(limiter.rateLimitEpisodes, 2);
      clock.advance(15_000);
      await calls(limiter, Array(12 + 13 + 14).fill("ok"));
      assert.deepEqual(limiter.history, [20, 16, 12, 13, 14, 15]);
    },
  );
  await t.step("a limit the server keeps refusing shrinks round after round", async () => {
    const clock = virtualClock();
    const limiter = new AdaptiveConcurrency({ max: 16, clock });
    // The server takes 6 at once: each round sends the limit, the rest are refused.
    for (let round = 0; round < 6; round++) {
      const sent = await Promise.all(
        Array.from({ length: limiter.limit }, () => limiter.acquire()),
      );
      sent.forEach((permit, i) => i < 6 ? permit.release("ok") : permit.release("rate_limited"));
      clock.advance(1_000);
    }
    assert.deepEqual(limiter.history, [16, 12, 9, 7, 5]);
  });
  await t.step("never below min nor above max", async () => {
    const clock = virtualClock();
    const limiter = new AdaptiveConcurrency({ max: 3, min: 2, clock });
    for (let i = 0; i < 4; i++) {
      await calls(limiter, ["rate_limited"]);
      clock.advance(15_000);
    }
    assert.equal(limiter.limit, 2);
    await calls(limiter, Array(50).fill("ok"));
    assert.deepEqual(limiter.history, [3, 2, 3]);
  });
  await t.step("a call past the limit waits for a slot; an aborted wait leaves", async () => {
    const limiter = new AdaptiveConcurrency({ max: 2, clock: virtualClock() });
    const a = await limiter.acquire();
    const b = await limiter.acquire();
    let third = false;
    const waiting = limiter.acquire().then((p) => {
      third = true;
      return p;
    });
    const stop = new AbortController();
    const aborted = limiter.acquire(stop.signal);
    await Promise.resolve();
    assert.equal(third, false);
    assert.equal(limiter.waiting, 2);
    stop.abort(new Error("gone"));
    await assert.rejects(aborted, /gone/);
    a.release("ok");
    (await waiting).release("ok");
    assert.equal(third, true);
    b.release("ok");
    assert.equal(limiter.inFlight, 0);
  });
  await t.step("Retry-After holds new calls until it has passed", async () => {
    const clock = virtualClock();
    const limiter = new AdaptiveConcurrency({ max: 4, clock });
    (await limiter.acquire()).release("rate_limited", 30_000);
    await limiter.acquire();
    assert.ok(clock.now() >= 30_000, `a call went out at ${clock.now()} ms`);
  });
  await t.step("bad bounds are refused", () => {
    assert.throws(() => new AdaptiveConcurrency({ max: 0 }), RangeError);
    assert.throws(() => new AdaptiveConcurrency({ max: 4, start: 5 }), /min <= start <= max/);
    assert.throws(() => new AdaptiveConcurrency({ max: 4, decrease: 1 }), /decrease/);
  });
});

test("Taskset.run(): a server answering 429 with Retry-After shrinks the model-call limit; clean calls bring it back", async () => {
  const env = new Environment("limits");
  const echo = env.template({ id: "echo", args: {} }, async function* () {
    const answer = yield "Say ok.";
    yield answer === "ok" ? 1 : 0;
  });
  const rows = (n: number, from: number) =>
    Array.from({ length: n }, (_, i) => echo({}, { slug: `echo-${from + i}` }));
  const clock = virtualClock();
  const at: number[] = [];
  const limited = failure(429, "rate limit reached", { "retry-after": "2" });
  const ok = completion({ content: "ok" });
  // The first three requests are refused; every other one is answered.
  await using model = scriptedServer(
    Array.from({ length: 40 }, (_, i) => (r, n) => {
      at.push(clock.now());
      return i < 3 ? limited(r, n) : ok(r, n);
    }),
  );
  const agent = new ChatAgent({
    model: "m",
    baseUrl: model.baseUrl,
    stream: false,
    capabilityTools: false,
    retry: { baseDelay: 1 },
  });
  const limiter = new AdaptiveConcurrency({ max: 8, clock });
  const progress: JobProgress[] = [];
  const first = await new Taskset(rows(8, 0)).run(agent, {
    maxConcurrent: 8,
    concurrency: limiter,
    onProgress: (p) => progress.push(p),
  });
  assert.equal(first.meanReward, 1, JSON.stringify(first.errored));
  // One episode: 8 * 0.8 = 6.4, down to 6; no growth inside the cool-down.
  assert.deepEqual(limiter.history, [8, 6]);
  assert.equal(limiter.rateLimitEpisodes, 1);
  // The calls after the 429s (the three retried ones) waited out Retry-After.
  assert.equal(model.received.length, 11);
  assert.ok(at.slice(8).every((t) => t >= 2000), `${at}`);
  const shown = progress.find((p) => p.concurrency?.limit === 6);
  assert.ok(shown, "the progress never showed the lowered limit");
  assert.match(formatProgress(shown), /model calls ≤6\/8/);

  // Past the cool-down, clean windows grow it back to the bound.
  clock.advance(15_000);
  const second = await new Taskset(rows(16, 8)).run(agent, {
    maxConcurrent: 8,
    concurrency: limiter,
  });
  assert.equal(second.meanReward, 1);
  assert.deepEqual(limiter.history, [8, 6, 7, 8]);
});
