import { test } from "../_test.ts";
import { LINUX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { connect, NotReadyError } from "../../mod.ts";
import { SubprocessRuntime } from "../../runtime/mod.ts";
import { ChildProcess, waitFor } from "../_helpers.ts";

const FIXTURE = decodeURIComponent(
  new URL("../fixtures/subprocess_env.ts", import.meta.url).pathname,
);
// Process checks read /proc.

/** Whether `pid` is a live process (a zombie nobody reaped yet counts as gone). */
function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

function runtime(mode: string, lines: string[] = [], options = {}): SubprocessRuntime {
  return new SubprocessRuntime(FIXTURE, {
    env: { FIXTURE_MODE: mode },
    onOutput: (line) => lines.push(line),
    ...options,
  });
}

function pidFrom(lines: string[], pattern: RegExp): number {
  for (const line of lines) {
    const m = pattern.exec(line);
    if (m) return Number(m[1]);
  }
  throw new Error(`no line matches ${pattern}: ${JSON.stringify(lines)}`);
}

test({
  name: "SubprocessRuntime.place() serves the module in a child until released",
  needs: [LINUX],
  async fn() {
    const lines: string[] = [];
    const placed = await runtime("ok", lines).place();
    const pid = placed.params.pid as number;
    try {
      const token = /^tcp:\/\/:([0-9a-f]{64})@127\.0\.0\.1:\d+$/.exec(placed.url)?.[1];
      assert.ok(token, "the url carries a fresh 256-bit token");
      assert.equal(placed.url, `tcp://:${token}@127.0.0.1:${placed.params.port}`);
      assert.ok(alive(pid));
      assert.ok(lines.includes(`HUD_SERVE_PORT=${placed.params.port}`));
      // Passed through the child's environment: not in its arguments, not in its output.
      const argv = await Deno.readTextFile(`/proc/${pid}/cmdline`);
      assert.ok(!argv.includes(token), "not in the child's argv");
      // Started with the server's V8 flags (a small young generation).
      assert.ok(argv.split("\0").includes("--v8-flags=--max-semi-space-size=1"), argv);
      assert.ok(!lines.some((l) => l.includes(token)), "not in the child's output");
      const environ = await Deno.readTextFile(`/proc/${pid}/environ`);
      assert.ok(environ.split("\0").includes(`HUD_SERVE_TOKEN=${token}`), "in the child's env");
      // Without it, the child's server lets nobody in.
      await assert.rejects(
        connect(`tcp://127.0.0.1:${placed.params.port}`, { readyTimeout: 5_000 }),
        { code: -32001 },
      );
      await using client = await connect(placed, { readyTimeout: 5_000 });
      assert.equal(client.manifest.env.name, "subprocess-fixture");
      assert.equal((await client.startTask("add", { a: 2, b: 3 })).prompt, "What is 2 + 3?");
      assert.equal((await client.grade({ answer: "5" })).score, 1);
    } finally {
      await placed[Symbol.asyncDispose]();
    }
    assert.ok(!alive(pid));
    await assert.rejects(connect(placed, { readyTimeout: 200, retryInterval: 50 }), NotReadyError);
    // Idempotent.
    await placed[Symbol.asyncDispose]();
  },
});

test({
  name: "SubprocessRuntime.place() gives each placement its own child",
  needs: [LINUX],
  async fn() {
    // A path relative to the current directory, as a user would write it.
    const cwd = Deno.cwd().split("/").filter(Boolean);
    const target = FIXTURE.split("/").filter(Boolean);
    let common = 0;
    while (common < cwd.length && cwd[common] === target[common]) common++;
    const relative = [...cwd.slice(common).map(() => ".."), ...target.slice(common)].join("/");
    const rt = new SubprocessRuntime(relative, { env: { FIXTURE_MODE: "ok" } });
    await using a = await rt.place();
    await using b = await rt.place();
    assert.notEqual(a.params.pid, b.params.pid);
    assert.notEqual(a.url, b.url);
  },
});

test({
  name: "SubprocessRuntime.place() fails with the exit code and output of a child that dies early",
  needs: [LINUX],
  async fn() {
    await assert.rejects(runtime("crash").place(), (err: Error) => {
      assert.equal(err.constructor, Error);
      assert.match(err.message, /^Cannot place environment ".*subprocess_env\.ts"/);
      assert.match(err.message, /exited with code 7 before serving/);
      assert.match(err.message, /\| crash fixture: booting\n {2}\| crash fixture: giving up/);
      return true;
    });
  },
});

test({
  name: "SubprocessRuntime.place() reports the CLI's error for an unknown environment name",
  needs: [LINUX],
  async fn() {
    await assert.rejects(runtime("ok", [], { name: "nope" }).place(), (err: Error) => {
      assert.match(err.message, /exited with code 1 before serving/);
      assert.match(err.message, /has no environment "nope"; available: "env"/);
      return true;
    });
  },
});

test({
  name: "SubprocessRuntime.place() times out on a child that never announces, with its output",
  needs: [LINUX],
  async fn() {
    const lines: string[] = [];
    await assert.rejects(
      runtime("silent", lines, { readyTimeout: 2_500, killGrace: 200 }).place(),
      (err: Error) => {
        assert.ok(err instanceof NotReadyError);
        assert.match(err.message, /did not announce its port within 2500 ms/);
        assert.match(err.message, /\| silent fixture: warming up forever/);
        return true;
      },
    );
    const pid = pidFrom(lines, /warming up forever \(pid (\d+)\)/);
    assert.ok(!alive(pid));
  },
});

test({
  name: "SubprocessRuntime.place() honours its abort signal and ends the child",
  needs: [LINUX],
  async fn() {
    const lines: string[] = [];
    const controller = new AbortController();
    const placing = runtime("silent", lines, { killGrace: 200 }).place({
      signal: controller.signal,
    });
    await waitFor(() => lines.some((l) => l.includes("warming up forever")), 10_000);
    const reason = new Error("stop placing");
    controller.abort(reason);
    await assert.rejects(placing, (err) => err === reason);
    assert.ok(!alive(pidFrom(lines, /\(pid (\d+)\)/)));

    const aborted = AbortSignal.abort(new Error("already"));
    await assert.rejects(runtime("ok").place({ signal: aborted }), { message: "already" });
  },
});

test({
  name:
    "SubprocessRuntime.place() lets an abandoned child finish starting and run its shutdown hooks",
  needs: [LINUX],
  async fn() {
    const lines: string[] = [];
    const controller = new AbortController();
    const reason = new Error("stop placing");
    const placing = runtime("slow", lines, {
      // Stop placing once the initialize hook is running.
      onOutput: (line: string) => {
        lines.push(line);
        if (line === "slow fixture: initializing") controller.abort(reason);
      },
    }).place({ signal: controller.signal });
    await assert.rejects(placing, (err) => err === reason);
    // SIGTERM came during the initialize hook; the child served no one and stopped cleanly.
    assert.ok(lines.includes("slow fixture: shutdown hook ran"), JSON.stringify(lines));
  },
});

test({
  name: "SubprocessRuntime teardown ends processes the environment's hooks spawned",
  needs: [LINUX],
  async fn() {
    const lines: string[] = [];
    const placed = await runtime("grandchild", lines).place();
    const grandchild = pidFrom(lines, /^GRANDCHILD_PID=(\d+)$/);
    assert.ok(alive(grandchild));
    await placed[Symbol.asyncDispose]();
    await waitFor(() => !alive(grandchild), 3_000);
    assert.ok(!alive(placed.params.pid as number));
  },
});

test({
  name: "SubprocessRuntime teardown sends SIGKILL after the grace period",
  needs: [LINUX],
  async fn() {
    const lines: string[] = [];
    const placed = await runtime("stubborn", lines, { killGrace: 300 }).place();
    const grandchild = pidFrom(lines, /^GRANDCHILD_PID=(\d+)$/);
    await placed[Symbol.asyncDispose]();
    // The shutdown hook started (SIGTERM arrived) but never finished.
    assert.ok(lines.includes("stubborn fixture: refusing to stop"));
    assert.ok(!alive(placed.params.pid as number));
    await waitFor(() => !alive(grandchild), 3_000);
  },
});

test({
  name: "SubprocessRuntime's child stops serving when the process that placed it dies",
  needs: [LINUX],
  async fn() {
    const parent = new ChildProcess(Deno.execPath(), {
      args: ["run", "-A", new URL("../fixtures/orphaning_parent.ts", import.meta.url).href],
    });
    let server = 0;
    try {
      const [, pid] = await parent.waitForLine(
        /^SERVER_PID=(\d+)$/,
        "the placed server's pid",
        30_000,
      );
      server = Number(pid);
      assert.ok(alive(server));
    } finally {
      await parent.stop("SIGKILL");
    }
    await waitFor(() => !alive(server), 10_000);
  },
});

test({
  name: "SubprocessRuntime v8Flags reach the child's V8, and [] passes none (a bare --v8-flags)",
  needs: [LINUX],
  async fn() {
    for (const [v8Flags, exposed] of [[["--expose-gc"], true], [[], false]] as const) {
      const lines: string[] = [];
      const placed = await runtime("ok", lines, { v8Flags }).place();
      try {
        const argv = (await Deno.readTextFile(`/proc/${placed.params.pid}/cmdline`)).split("\0");
        assert.deepEqual(
          argv.filter((a) => a.startsWith("--v8-flags")),
          v8Flags.length ? [`--v8-flags=${v8Flags.join(",")}`] : ["--v8-flags"],
        );
        assert.ok(lines.includes(`GC_EXPOSED=${exposed}`), lines.join("\n"));
      } finally {
        await placed[Symbol.asyncDispose]();
      }
    }
  },
});

test("SubprocessRuntime() refuses bad options", () => {
  assert.throws(() => new SubprocessRuntime(""), TypeError);
  assert.throws(
    () => new SubprocessRuntime("env.ts", { env: "robolab" as unknown as Record<string, string> }),
    { name: "TypeError", message: /pick the environment with "name"/ },
  );
  assert.throws(() => new SubprocessRuntime("env.ts", { name: "" }), TypeError);
  assert.throws(() => new SubprocessRuntime("env.ts", { readyTimeout: -1 }), RangeError);
  assert.throws(() => new SubprocessRuntime("env.ts", { killGrace: NaN }), RangeError);
  assert.throws(() => new SubprocessRuntime("env.ts", { killGrace: Infinity }), RangeError);
  assert.throws(
    () => new SubprocessRuntime("env.ts", { v8Flags: ["--a,--b"] }),
    { name: "TypeError", message: /v8Flags entry "--a,--b" is not a V8 flag/ },
  );
  assert.throws(
    () => new SubprocessRuntime("env.ts", { v8Flags: "--expose-gc" as unknown as string[] }),
    { name: "TypeError", message: /"v8Flags" must be an array/ },
  );
});
