import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  FirstFrameDeadlines,
  Gate,
  MISSING_TOKEN_MESSAGE,
  UNAUTHORIZED_MESSAGE,
  WRONG_TOKEN_MESSAGE,
} from "../../_server/admission.ts";
import { waitFor } from "../_helpers.ts";

const TOKEN = "k".repeat(64);

test("Gate admits only a first hello or tunnel.open with the token", async (t) => {
  const gate = new Gate(TOKEN);
  assert.equal(gate.required, true);
  const refused = (id: unknown, message = UNAUTHORIZED_MESSAGE) => ({
    jsonrpc: "2.0",
    id,
    error: { code: -32001, message },
  });
  await t.step("first frames", () => {
    assert.equal(gate.check({ id: 1, method: "hello", params: { token: TOKEN } }, false), null);
    assert.equal(
      gate.check(
        { id: 1, method: "tunnel.open", params: { capability: "x", token: TOKEN } },
        false,
      ),
      null,
    );
    const cases: [Record<string, unknown>, string][] = [
      [{ id: 1, method: "hello", params: {} }, MISSING_TOKEN_MESSAGE],
      [{ id: 1, method: "hello" }, MISSING_TOKEN_MESSAGE],
      [{ id: 1, method: "tunnel.open", params: { capability: "x" } }, MISSING_TOKEN_MESSAGE],
      [{ id: 1, method: "hello", params: { token: TOKEN.slice(1) + "j" } }, WRONG_TOKEN_MESSAGE],
      [{ id: 1, method: "hello", params: { token: [TOKEN] } }, WRONG_TOKEN_MESSAGE],
      [{ id: 1, method: "tunnel.open", params: { token: "x" } }, WRONG_TOKEN_MESSAGE],
      [{ id: 1, method: "tasks.list", params: { token: TOKEN } }, UNAUTHORIZED_MESSAGE],
      [{ id: 1, method: "tasks.start", params: { id: "add", token: TOKEN } }, UNAUTHORIZED_MESSAGE],
    ];
    for (const [request, message] of cases) {
      assert.deepEqual(gate.check(request, false), refused(1, message), JSON.stringify(request));
    }
    assert.deepEqual(gate.check({ method: "hello" }, false), refused(null, MISSING_TOKEN_MESSAGE));
    // Each says what to do, in one line, and a wrong one shows nothing of the right one.
    assert.match(MISSING_TOKEN_MESSAGE, /^unauthorized: no token: .*set HUD_SERVE_TOKEN/);
    assert.match(WRONG_TOKEN_MESSAGE, /^unauthorized: wrong token: .*check HUD_SERVE_TOKEN/);
    for (const m of [MISSING_TOKEN_MESSAGE, WRONG_TOKEN_MESSAGE]) assert.doesNotMatch(m, /\n/);
  });
  await t.step("later frames need no token; a later hello with one must be right", () => {
    assert.equal(gate.check({ id: 2, method: "tasks.list" }, true), null);
    assert.equal(gate.check({ id: 2, method: "hello", params: {} }, true), null);
    assert.equal(gate.check({ id: 2, method: "hello", params: { token: TOKEN } }, true), null);
    assert.deepEqual(
      gate.check({ id: 3, method: "hello", params: { token: "x" } }, true),
      refused(3, WRONG_TOKEN_MESSAGE),
    );
  });
  await t.step("without a token everything passes", () => {
    const open = new Gate(null);
    assert.equal(open.required, false);
    assert.equal(open.check({ id: 1, method: "tasks.list" }, false), null);
    assert.equal(open.check({ id: 1, method: "hello", params: { token: "x" } }, true), null);
  });
});

test("FirstFrameDeadlines expires only the connections that did not speak, in order", async () => {
  const expired: string[] = [];
  const deadlines = new FirstFrameDeadlines<string>(30, (key) => expired.push(key));
  try {
    deadlines.start("a");
    deadlines.start("b");
    deadlines.start("c");
    assert.equal(deadlines.arrived("b"), true);
    assert.equal(deadlines.arrived("b"), false, "once");
    await waitFor(() => expired.length === 2);
    assert.deepEqual(expired, ["a", "c"]);
    assert.equal(deadlines.arrived("a"), false, "too late");
    // The timer re-arms for connections that come after a sweep.
    deadlines.start("d");
    await waitFor(() => expired.length === 3);
    assert.deepEqual(expired, ["a", "c", "d"]);
    assert.equal(deadlines.size, 0);
  } finally {
    deadlines.clear();
  }
});

test("FirstFrameDeadlines.oldestWait() and takeOldest() see the connection that waited longest", async () => {
  const deadlines = new FirstFrameDeadlines<string>(10_000, () => {});
  try {
    assert.equal(deadlines.oldestWait(), null, "none waits");
    deadlines.start("a");
    await new Promise((r) => setTimeout(r, 60));
    deadlines.start("b");
    const waited = deadlines.oldestWait()!;
    assert.ok(waited >= 50 && waited < 10_000, `the oldest waited ${waited} ms`);
    assert.equal(deadlines.takeOldest(waited + 1_000), undefined, "not long enough");
    assert.equal(deadlines.takeOldest(50), "a");
    assert.equal(deadlines.takeOldest(50), undefined, "b is younger");
    assert.equal(deadlines.takeOldest(), "b");
    assert.equal(deadlines.oldestWait(), null);
  } finally {
    deadlines.clear();
  }
});

/** Holds this thread for `ms`, as a process busy with a thousand rollouts holds its event loop. */
function busy(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) { /* our own queue, not the peer's silence */ }
}

test("FirstFrameDeadlines does not count the time this process's event loop ran late", async () => {
  const expired: string[] = [];
  const deadlines = new FirstFrameDeadlines<string>(200, (key) => expired.push(key));
  try {
    deadlines.start("busy");
    // The loop is held past the deadline: the peer was not silent that long, we were.
    busy(700);
    await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(expired, [], "expired for our own lag");
    assert.equal(deadlines.arrived("busy"), true);
    // A peer that is silent while the loop runs on time still expires.
    deadlines.start("silent");
    await waitFor(() => expired.length === 1);
    assert.deepEqual(expired, ["silent"]);
  } finally {
    deadlines.clear();
  }
});

test("LoopLag measures only while watched, and never holds the process open", async () => {
  const { LoopLag } = await import("../../_internal/loop_lag.ts");
  const lag = new LoopLag();
  assert.equal(lag.watched, false);
  const before = lag.late;
  busy(200);
  assert.equal(lag.late, before, "not watched: nothing measured");
  {
    using _ = lag.watch();
    await new Promise((r) => setTimeout(r, 60));
    const start = lag.late;
    busy(300);
    assert.ok(lag.late - start >= 200, `late by ${lag.late - start} ms, held 300`);
    assert.ok(lag.lag >= 200);
  }
  assert.equal(lag.watched, false);
});
