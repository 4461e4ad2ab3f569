import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { connect, Environment, LocalRuntime } from "../../mod.ts";
import { Runtime } from "../../runtime/mod.ts";
import { demoEnv } from "../_helpers.ts";

test("Runtime places at its address and releases nothing", async () => {
  const runtime = new Runtime("127.0.0.1:9", { where: "elsewhere" });
  assert.equal(runtime.url, "tcp://127.0.0.1:9");
  await using placed = await runtime.place();
  assert.equal(placed.params.where, "elsewhere");
  assert.throws(() => new Runtime("http://x:1"), TypeError);
});

test("LocalRuntime shares one server per environment and stops after the last release", async () => {
  const log: string[] = [];
  const env = demoEnv();
  env.initialize(() => void log.push("init"));
  env.shutdown(() => void log.push("down"));
  const runtime = new LocalRuntime(env);
  const a = await runtime.place();
  const b = await runtime.place();
  assert.equal(a.url, b.url);
  const token = /^tcp:\/\/:([0-9a-f]{64})@127\.0\.0\.1:(\d+)$/.exec(a.url);
  assert.ok(token, "the placement's url carries a fresh token");
  await assert.rejects(
    connect(`tcp://127.0.0.1:${token[2]}`, { readyTimeout: 5_000 }),
    { code: -32001 },
    "the server requires it",
  );
  {
    await using client = await connect(a, { readyTimeout: 10_000 });
    await client.startTask("add", { a: 1 });
    assert.equal((await client.grade({ answer: 3 })).score, 1);
  }
  await a[Symbol.asyncDispose]();
  await a[Symbol.asyncDispose]();
  assert.deepEqual(log, ["init"]);
  await b[Symbol.asyncDispose]();
  assert.deepEqual(log, ["init", "down"]);
  await assert.rejects(connect(a, { readyTimeout: 100, retryInterval: 20 }));
});

test("LocalRuntime with a factory gives each placement its own environment", async () => {
  let made = 0;
  const runtime = new LocalRuntime(() => {
    made++;
    return demoEnv();
  });
  await using a = await runtime.place();
  await using b = await runtime.place();
  assert.notEqual(a.url, b.url);
  assert.equal(made, 2);
});

test("LocalRuntime tears down in order when start fails or times out", async (t) => {
  await t.step("a failing hook", async () => {
    const log: string[] = [];
    const env = new Environment("fails");
    env.initialize(() => void log.push("init ok"));
    env.initialize(() => {
      throw new Error("boot failed");
    });
    env.shutdown(() => void log.push("down"));
    await assert.rejects(new LocalRuntime(env).place(), { message: "boot failed" });
    assert.deepEqual(log, ["init ok", "down"]);
  });
  await t.step("a hook slower than the ready timeout", async () => {
    const log: string[] = [];
    const env = new Environment("slow");
    let release!: () => void;
    const gate = new Promise<void>((r) => release = r);
    env.initialize(() => gate);
    env.shutdown(() => void log.push("down"));
    await assert.rejects(new LocalRuntime(env, { readyTimeout: 50 }).place(), {
      name: "TimeoutError",
    });
    release();
    await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(log, ["down"], "torn down once the hook settled");
  });
});

test("connect() places a runtime provider and releases it on close", async () => {
  const log: string[] = [];
  const env = demoEnv();
  env.initialize(() => void log.push("init"));
  env.shutdown(() => void log.push("down"));
  const client = await connect(new LocalRuntime(env), { readyTimeout: 10_000 });
  await client.startTask("add", { a: 1 });
  assert.equal((await client.grade({ answer: 3 })).score, 1);
  assert.deepEqual(log, ["init"]);
  await client.close();
  assert.deepEqual(log, ["init", "down"]);
});
