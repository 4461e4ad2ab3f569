// The rollout's stages (eval/_rollout_stages.ts) in-process: a fake
// runtime, placement and control client stand in for the environment, so
// that no socket, container or cluster is needed; what each stage returns
// and what the pipeline records and releases is checked directly.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import type { HudClient } from "../../client.ts";
import type { GradeFrame, PromptFrame, TaskRow } from "../../env.ts";
import { ConnectionClosedError } from "../../errors.ts";
import { ModelHttpError, ModelUnavailableError } from "../../agents/model.ts";
import type { Placement, RuntimeProvider } from "../../runtime/placement.ts";
import { type Agent, functionAgent, NotGradedError } from "../../eval/agent.ts";
import { createRun, Run } from "../../eval/run.ts";
import { Trace } from "../../eval/trace.ts";
import {
  act,
  connectTo,
  grade,
  type Held,
  place,
  recordEnding,
  recordFailure,
  release,
  type RolloutConfig,
  runRollout,
  type StageScope,
  start,
} from "../../eval/_rollout_stages.ts";
import { scoped } from "../../eval/_file_tracking.ts";

const ROW: TaskRow = { env: "fake", id: "add", args: { a: 2, b: 3 }, slug: "add-2-3" };

/** What the fakes saw, in order. */
type Log = string[];

/** A control client that answers from memory and logs each call. */
function fakeClient(
  log: Log,
  answers: {
    start?: (id: string) => PromptFrame;
    grade?: (answer: unknown) => GradeFrame;
  } = {},
): HudClient {
  const client = {
    sessionId: "sess-fake",
    manifest: { sessionId: "sess-fake", env: { name: "fake", version: "1.0.0" }, bindings: [] },
    bindings: [],
    startTask(id: string) {
      log.push(`start ${id}`);
      return Promise.resolve(answers.start?.(id) ?? { prompt: "2+3" });
    },
    grade(payload: { answer?: unknown }) {
      log.push(`grade ${JSON.stringify(payload.answer)}`);
      return Promise.resolve(
        answers.grade?.(payload.answer) ?? { score: payload.answer === "5" ? 1 : 0 },
      );
    },
    cancel() {
      log.push("cancel");
      return Promise.resolve();
    },
    close() {
      log.push("close");
      return Promise.resolve();
    },
  };
  return client as unknown as HudClient;
}

/** A placement that logs its release; `dispose` may hang or fail. */
function fakePlacement(
  log: Log,
  dispose: () => Promise<void> = () => Promise.resolve(),
): Placement {
  return {
    address: { hostname: "127.0.0.1", port: 1 },
    params: {},
    async [Symbol.asyncDispose]() {
      log.push("release");
      await dispose();
    },
  };
}

function fakeRuntime(log: Log, placement: () => Promise<Placement>): RuntimeProvider {
  return {
    place() {
      log.push("place");
      return placement();
    },
  };
}

function config(log: Log, overrides: Partial<RolloutConfig> = {}): RolloutConfig {
  return {
    runtime: fakeRuntime(log, () => Promise.resolve(fakePlacement(log))),
    from: null,
    rolloutTimeout: 10_000,
    agentTimeout: undefined,
    connect: {},
    fileTracking: {},
    observers: [],
    context: {},
    signal: undefined,
    dial: () => {
      log.push("dial");
      return Promise.resolve(fakeClient(log));
    },
    ...overrides,
  };
}

function scope(log: Log, agent: Agent, overrides: Partial<RolloutConfig> = {}): StageScope {
  return {
    task: ROW,
    agent,
    config: config(log, overrides),
    trace: new Trace(),
    signal: new AbortController().signal,
  };
}

const answer5 = functionAgent(() => "5");

test("runRollout() composes the stages: place, connect, start, agent, grade, then release", async () => {
  const log: Log = [];
  const run = await runRollout(ROW, answer5, config(log));
  assert.equal(run.reward, 1);
  assert.equal(run.trace.status, "completed");
  assert.equal(run.trace.stopReason, "graded");
  assert.deepEqual(run.trace.steps.map((s) => s.type), ["setup", "user", "agent", "evaluate"]);
  assert.deepEqual(run.trace.steps[0].info, {
    slug: "add-2-3",
    session_id: "sess-fake",
    env_version: "1.0.0",
  });
  // The connection closes before the placement is released.
  assert.deepEqual(log, ["place", "dial", "start add", 'grade "5"', "close", "release"]);
});

test("stage place: a runtime that fails is a provisioning failure, classed for retry", async () => {
  const log: Log = [];
  const s = scope(log, answer5, {
    runtime: fakeRuntime(log, () => Promise.reject(new Error("no capacity left"))),
  });
  const placed = await place(s);
  assert.equal(placed.kind, "failed");
  if (placed.kind !== "failed") return;
  assert.equal(placed.failure.phase, "provisioning");
  assert.equal(placed.failure.errorClass, "provisioning");
  assert.match(String(placed.failure.error), /no capacity left/);
  // A runtime that throws before it returns a promise fails the same way.
  const sync = await place(scope(log, answer5, {
    runtime: {
      place() {
        throw new TypeError("bad image name");
      },
    },
  }));
  assert.equal(sync.kind === "failed" && sync.failure.phase, "provisioning");
});

test("stage place: a placement that arrives after the deadline is released at once", async () => {
  const log: Log = [];
  let arrive!: (p: Placement) => void;
  const controller = new AbortController();
  const s: StageScope = {
    ...scope(log, answer5, {
      runtime: fakeRuntime(log, () => new Promise<Placement>((r) => arrive = r)),
    }),
    signal: controller.signal,
  };
  const placing = place(s);
  controller.abort();
  const placed = await placing;
  assert.deepEqual(placed, { kind: "interrupted", phase: "provisioning" });
  arrive(fakePlacement(log));
  await Promise.resolve();
  await Promise.resolve();
  assert.deepEqual(log, ["place", "release"]);
});

test("stage connect: a refused connection is a provisioning failure", async () => {
  const log: Log = [];
  const s = scope(log, answer5, {
    dial: () => Promise.reject(new Deno.errors.ConnectionRefused("refused")),
  });
  const connected = await connectTo(s, fakePlacement(log));
  assert.equal(connected.kind, "failed");
  if (connected.kind !== "failed") return;
  assert.equal(connected.failure.phase, "provisioning");
  assert.equal(connected.failure.errorClass, "provisioning");
});

test("stage start: the environment's refusal is a start failure; the task is not cancelled", async () => {
  const log: Log = [];
  const client = fakeClient(log, {
    start: () => {
      throw new Error("setup exploded");
    },
  });
  const run = await runRollout(ROW, answer5, config(log, { dial: () => Promise.resolve(client) }));
  assert.equal(run.reward, null);
  assert.equal(run.trace.failedPhase, "start");
  assert.equal(run.trace.stopReason, "start_error");
  assert.equal(run.trace.errors[0].class, "start_error");
  assert.equal(run.client, client, "the run keeps the client it started on");
  assert.deepEqual(log, ["place", "start add", "close", "release"]);
});

test("stage agent: a failing agent is recorded before the observers' after, and graded", async () => {
  const log: Log = [];
  const trace = new Trace();
  const client = fakeClient(log);
  const run = createRun(client, ROW, trace);
  const s: StageScope = {
    ...scope(
      log,
      functionAgent((_p, run) => {
        run.answer = "5";
        throw new Error("the agent's plan fell apart");
      }),
    ),
    trace,
  };
  const observed: string[] = [];
  const withObservers: StageScope = {
    ...s,
    config: {
      ...s.config,
      observers: [{
        before: () => void observed.push(`before ${trace.errors.length}`),
        after: () => void observed.push(`after ${trace.errors.length}`),
      }, {
        before: () => {
          throw new Error("observer broke");
        },
      }],
    },
  };
  const acted = await act(withObservers, run);
  assert.deepEqual(acted, { kind: "ok", value: undefined });
  assert.deepEqual(observed, ["before 0", "after 1"]);
  assert.equal(trace.errors[0].phase, "agent");
  assert.equal(trace.errors[0].class, "agent_error", "the stage's class is the one recorded");
  assert.ok(
    trace.steps.some((st) => st.type === "observer_error" && st.content === "observer broke"),
  );
  const graded = await grade(s, run);
  assert.equal(graded.kind === "ok" && graded.value?.reward, 1);
  assert.equal(trace.stopReason, "agent_error");
});

test("stage agent: NotGradedError ends the rollout ungraded and cancels the started task", async () => {
  const log: Log = [];
  const agent = functionAgent(() => {
    throw new NotGradedError("answer exceeds 16 bytes");
  });
  const run = await runRollout(ROW, agent, config(log));
  assert.equal(run.reward, null);
  assert.equal(run.trace.status, "error", "the cancel that follows does not restate it");
  assert.equal(run.trace.stopReason, "agent_error");
  assert.equal(run.trace.failedPhase, "agent");
  assert.equal(run.trace.errors[0].class, "agent_error");
  assert.deepEqual(log, ["place", "dial", "start add", "cancel", "close", "release"]);
  assert.ok(!log.some((l) => l.startsWith("grade")), "never graded");
});

test("stage agent: an agent timeout grades what the agent had", async () => {
  const log: Log = [];
  const agent = functionAgent(async (_p, run, { signal }) => {
    run.answer = "5";
    await new Promise((_r, reject) =>
      signal.addEventListener("abort", () => reject(signal.reason))
    );
  });
  const run = await runRollout(ROW, agent, config(log, { agentTimeout: 50 }));
  assert.equal(run.reward, 1);
  assert.equal(run.trace.errors[0].name, "TimeoutError");
  assert.equal(run.trace.errors[0].class, "agent_timeout");
  assert.match(run.trace.errors[0].message, /agent timed out after 50 ms/);
});

test("stage agent: a failure that is not the agent's (the environment gone, the model down) ends the rollout ungraded", async (t) => {
  const cases: [string, () => Error, string][] = [
    [
      "a lost connection",
      () => new ConnectionClosedError("the tool server went away"),
      "infrastructure_lost",
    ],
    [
      "a model server down",
      () => new ModelUnavailableError("model server down"),
      "model_unavailable",
    ],
    [
      "a model server that refuses the key",
      () => new ModelHttpError("HTTP 401: bad key", 401),
      "model_error",
    ],
  ];
  for (const [name, error, errorClass] of cases) {
    await t.step(name, async () => {
      const log: Log = [];
      const agent = functionAgent((_p, run) => {
        run.answer = "5"; // a right answer, yet not graded: the failure was not the agent's
        throw error();
      });
      const run = await runRollout(ROW, agent, config(log));
      assert.equal(run.reward, null, "never a zero (or a one) the agent did not earn");
      assert.equal(run.trace.status, "error");
      assert.equal(run.trace.stopReason, "agent_error");
      assert.equal(run.trace.errors.length, 1);
      assert.equal(run.trace.errors[0].class, errorClass);
      assert.ok(!log.some((l) => l.startsWith("grade")), "never graded");
      assert.ok(log.includes("cancel"), "the started task is cancelled");
    });
  }
});

test("runRollout(): the caller's abort cancels the task and leaves a hanging teardown behind", async () => {
  const log: Log = [];
  const controller = new AbortController();
  let releaseTeardown!: () => void;
  const teardown = new Promise<void>((r) => releaseTeardown = r);
  const agent = functionAgent(() => {
    controller.abort();
    return "5";
  });
  const run = await runRollout(
    ROW,
    agent,
    config(log, {
      signal: controller.signal,
      runtime: fakeRuntime(log, () => Promise.resolve(fakePlacement(log, () => teardown))),
    }),
  );
  assert.equal(run.reward, null);
  assert.equal(run.trace.status, "cancelled");
  assert.equal(run.trace.stopReason, "cancelled");
  assert.deepEqual(run.trace.errors, [], "a cancel by the caller is not a timeout failure");
  assert.deepEqual(log, ["place", "dial", "start add", "cancel", "close", "release"]);
  releaseTeardown();
});

test("stage record: an interruption by the deadline is a timeout in the phase it stopped", async () => {
  const log: Log = [];
  const s = scope(log, answer5, { rolloutTimeout: 300 });
  const held: Held = { placement: null, client: null, run: null, started: false };
  await recordEnding(s, held, { kind: "interrupted", phase: "provisioning" });
  assert.equal(s.trace.status, "cancelled");
  assert.equal(s.trace.stopReason, "timeout");
  assert.equal(s.trace.failedPhase, "provisioning");
  assert.match(s.trace.errors[0].message, /rollout timed out after 300 ms/);
  assert.equal(s.trace.errors[0].class, "rollout_timeout");
  // While grading, the same deadline is the verifier's.
  const late = scope(log, answer5, { rolloutTimeout: 300 });
  await recordEnding(late, held, { kind: "interrupted", phase: "grading" });
  assert.equal(late.trace.errors[0].class, "verifier_timeout");
});

test("stage record: a stage may set its failure's class; the trace records that one", () => {
  const trace = new Trace();
  recordFailure(trace, { phase: "agent", errorClass: "model_unavailable", error: new Error("x") });
  assert.equal(trace.errors[0].class, "model_unavailable");
  const step = trace.steps.at(-1)!;
  const { at, ...info } = step.info!;
  assert.deepEqual(info, { phase: "agent", name: "Error", class: "model_unavailable" });
  // An error made outside the SDK (here, this file) says where.
  assert.match(String(at), /tests\/eval\/rollout_stages_test\.ts:\d+:\d+$/);
  assert.equal(trace.errors[0].at, at);
});

test("stage release: a failed teardown is a teardown_error step, after the close", async () => {
  const log: Log = [];
  const trace = new Trace();
  const held: Held = {
    placement: fakePlacement(log, () => Promise.reject(new Error("container stuck"))),
    client: fakeClient(log),
    run: null,
    started: false,
  };
  await release(trace, held, false);
  assert.deepEqual(log, ["close", "release"]);
  assert.deepEqual(trace.steps.map((s) => [s.type, s.content]), [
    ["teardown_error", "container stuck"],
  ]);
});

test("stage start and grade: a non-finite score is a grading failure, recorded once", async () => {
  const log: Log = [];
  const trace = new Trace();
  const client = fakeClient(log, { grade: () => ({ score: null as unknown as number }) });
  const run = createRun(client, ROW, trace);
  const s = { ...scope(log, answer5), trace };
  assert.deepEqual(await start(s, run), { kind: "ok", value: undefined });
  assert.equal(run.prompt, "2+3");
  const graded = await grade(s, run);
  assert.deepEqual(graded, { kind: "ok", value: null });
  assert.equal(trace.stopReason, "grading_error");
  assert.equal(trace.errors.length, 1);
  assert.equal(trace.errors[0].class, "grading_error");
});

test("Run has no public constructor and no public _begin: runs come from Run.start() or the stages", () => {
  assert.equal("_begin" in Run.prototype, false);
  // @ts-expect-error: the constructor is private (this line fails type checking if it is not).
  const make = () => new Run(null, ROW, new Trace());
  assert.equal(typeof make, "function");
  const run = createRun(null, ROW, new Trace());
  assert.throws(() => run.client, /failed before it connected/);
  assert.deepEqual(run.capabilities, []);
});

test("scoped(): the file tracker's results cut to the task's part of the workspace", () => {
  const patch = (path: string) => ({ path, diff: "" });
  const diff = { patches: [patch("task/a.py"), patch("other/b.py")], files_changed: 2 };
  assert.deepEqual(scoped({ kind: "diff", result: diff } as never, "task"), {
    patches: [patch("task/a.py")],
    files_changed: 1,
  });
  assert.equal(scoped({ kind: "diff", result: diff } as never, "none"), null);
  assert.deepEqual(scoped({ kind: "diff", result: diff } as never, null), diff);
  // A flat flush (an earlier tracker's): the diff's members beside capture.
  const flat = { patches: [patch("task/a.py")], capture: { files: [], skipped_files: [] } };
  assert.deepEqual(scoped({ kind: "flush", result: flat } as never, "task/"), {
    diff: { ...flat, patches: [patch("task/a.py")], files_changed: 1 },
    capture: {
      files: [],
      skipped_files: [],
      files_eligible: 0,
      files_captured: 0,
      files_skipped: 0,
    },
  });
});

test("stage grade: a rollout stopped while grading is cancelled or a verifier timeout, never a grading error", async (t) => {
  /** A client whose grading waits until its call's signal aborts, as a real one does. */
  const hanging = (log: Log): HudClient => {
    const client = fakeClient(log);
    return Object.assign(Object.create(client), {
      grade: (_payload: unknown, options: { signal?: AbortSignal } = {}) => {
        log.push("grade");
        return new Promise((_ok, fail) =>
          options.signal?.addEventListener("abort", () => fail(options.signal!.reason))
        );
      },
      cancel: client.cancel,
      close: client.close,
    }) as HudClient;
  };
  await t.step("the rollout's deadline: verifier_timeout", async () => {
    const log: Log = [];
    const run = await runRollout(
      ROW,
      answer5,
      config(log, { rolloutTimeout: 300, dial: () => Promise.resolve(hanging(log)) }),
    );
    assert.equal(run.reward, null);
    assert.deepEqual(run.trace.errors.map((e) => e.class), ["verifier_timeout"]);
    assert.equal(run.trace.stopReason, "timeout");
    assert.ok(log.includes("cancel"), "the task is cancelled");
  });
  await t.step("the job's abort: cancelled, no failure recorded", async () => {
    const log: Log = [];
    const stop = new AbortController();
    const running = runRollout(
      ROW,
      answer5,
      config(log, { signal: stop.signal, dial: () => Promise.resolve(hanging(log)) }),
    );
    while (!log.includes("grade")) await new Promise((r) => setTimeout(r, 5));
    stop.abort();
    const run = await running;
    assert.deepEqual(run.trace.errors, [], "an interrupt is not a grading error");
    assert.equal(run.trace.status, "cancelled");
    assert.ok(log.includes("cancel"));
  });
});

/** A placement whose network changes by phase; `fail` names a phase whose switch throws. */
function phasedPlacement(log: Log, fail?: string): Placement {
  return {
    ...fakePlacement(log),
    enterPhase(phase) {
      log.push(`network ${phase}`);
      return phase === fail
        ? Promise.reject(new Error("engine refused to disconnect"))
        : Promise.resolve();
    },
  };
}

test("stage phase: the network switches to the agent's after the start and to the verifier's before grading", async () => {
  const log: Log = [];
  const agent = functionAgent(() => {
    log.push("agent");
    return "5";
  });
  const run = await runRollout(
    ROW,
    agent,
    config(log, {
      runtime: fakeRuntime(log, () => Promise.resolve(phasedPlacement(log))),
    }),
  );
  assert.equal(run.reward, 1);
  assert.deepEqual(log, [
    "place",
    "dial",
    "start add",
    "network agent",
    "agent",
    "network verifier",
    'grade "5"',
    "close",
    "release",
  ]);
});

test("stage phase: a switch that fails ends the rollout ungraded, never a zero, the task cancelled", async () => {
  for (const phase of ["agent", "verifier"]) {
    const log: Log = [];
    const agent = functionAgent(() => {
      log.push("agent");
      return "5";
    });
    const run = await runRollout(
      ROW,
      agent,
      config(log, {
        runtime: fakeRuntime(log, () => Promise.resolve(phasedPlacement(log, phase))),
      }),
    );
    assert.equal(run.reward, null, phase);
    assert.equal(run.trace.status, "error");
    assert.equal(run.trace.stopReason, "provisioning_error");
    assert.equal(run.trace.errors[0].class, "provisioning");
    assert.ok(!log.some((l) => l.startsWith("grade")), `${phase}: ${log}`);
    assert.equal(log.includes("agent"), phase === "verifier", phase);
    assert.ok(log.includes("cancel"), phase);
    const error = run.trace.steps.find((s) => s.type === "error");
    assert.match(
      JSON.stringify(error?.content),
      new RegExp(`network for the ${phase} phase: engine refused to disconnect`),
    );
  }
});
