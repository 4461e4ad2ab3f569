// bashGrader against real processes, through the workspace's exec contract
// (tests/graders/_local_exec.ts runs it on this host).

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { bashGrader, type BashGraderOptions, combine, type ExecTarget } from "../../graders/mod.ts";
import { localExec } from "./_local_exec.ts";

async function withDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "graders-bash-" });
  try {
    return await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

test("bashGrader() scores 1 for exit 0 and keeps code, output and timing in info", () =>
  withDir(async (dir) => {
    await Deno.writeTextFile(`${dir}/answer.txt`, "42\n");
    const target = localExec(dir);
    const s = await bashGrader(target, "grep -q 42 answer.txt && echo found; echo warn >&2", {
      name: "answer",
    });
    assert.equal(s.name, "answer");
    assert.equal(s.value, 1);
    assert.equal(s.weight, 1);
    assert.equal(s.info?.exit_code, 0);
    assert.equal(s.info?.stdout, "found\n");
    assert.equal(s.info?.stderr, "warn\n");
    assert.equal(s.info?.timed_out, false);
    assert.equal(typeof s.info?.duration_ms, "number");
    // A string runs under bash -lc, as the Python SDK's BashGrader does.
    assert.deepEqual(target.calls[0].argv.slice(0, 2), ["bash", "-lc"]);
  }));

test("bashGrader() scores 0 for a non-zero exit and keeps the code", () =>
  withDir(async (dir) => {
    const s = await bashGrader(localExec(dir), "echo failing; exit 3");
    assert.equal(s.value, 0);
    assert.equal(s.info?.exit_code, 3);
    assert.equal(s.info?.stdout, "failing\n");
  }));

test("bashGrader() runs an argv as given, with cwd, env and stdin passed through", () =>
  withDir(async (dir) => {
    await Deno.mkdir(`${dir}/sub`);
    const target = localExec(dir);
    const s = await bashGrader(
      target,
      ["sh", "-c", 'test "$(pwd)" = "$WANT" && read line && test "$line" = hello'],
      { cwd: `${dir}/sub`, env: { WANT: `${dir}/sub` }, stdin: "hello\n", timeout: 20_000 },
    );
    assert.equal(s.value, 1, JSON.stringify(s.info));
    assert.deepEqual(target.calls[0].argv[0], "sh");
    assert.equal(target.calls[0].options.timeout, 20_000);
    assert.deepEqual(s.info?.command, target.calls[0].argv);
  }));

test("bashGrader() scores 0 when the command times out, and says so", () =>
  withDir(async (dir) => {
    const s = await bashGrader(localExec(dir), "echo started; sleep 30", { timeout: 300 });
    assert.equal(s.value, 0);
    assert.equal(s.info?.timed_out, true);
    assert.equal(s.info?.exit_code, null);
    assert.equal(s.info?.signal, "SIGTERM");
    assert.equal(s.info?.stdout, "started\n");
  }));

test("bashGrader() keeps the end of long output, saying how much was cut", () =>
  withDir(async (dir) => {
    const s = await bashGrader(
      localExec(dir),
      "for i in $(seq 1 20000); do echo line$i; done; echo SUMMARY: 3 passed",
      { maxOutput: 1000 },
    );
    const stdout = s.info?.stdout as string;
    assert.match(stdout, /^\[\d+ earlier characters cut\]\n/);
    assert.ok(stdout.endsWith("SUMMARY: 3 passed\n"));
    assert.equal(stdout.length - stdout.indexOf("\n") - 1, 1000);
  }));

test("bashGrader() with a negative weight is a penalty in combine", () =>
  withDir(async (dir) => {
    await Deno.writeTextFile(`${dir}/test_x.py`, "");
    const target = localExec(dir);
    const grade = await combine([
      bashGrader(target, "true", { name: "tests" }),
      // The agent deleted no test file: the penalty check fails, nothing is taken off.
      bashGrader(target, "test ! -e test_x.py", { name: "deleted_tests", weight: -0.5 }),
    ]);
    assert.equal(grade.score, 1);
    await Deno.remove(`${dir}/test_x.py`);
    const worse = await combine([
      bashGrader(target, "true", { name: "tests" }),
      bashGrader(target, "test ! -e test_x.py", { name: "deleted_tests", weight: -0.5 }),
    ]);
    assert.equal(worse.score, 0.5);
    assert.deepEqual(worse.subscores, { tests: 1, deleted_tests: 1 });
  }));

test("bashGrader() fails to grade, not scores 0, when the command cannot run at all", async () => {
  const gone: ExecTarget = {
    exec: () => Promise.reject(new Error("the workspace is not running")),
  };
  await assert.rejects(() => bashGrader(gone, "true", { name: "tests" }), {
    message: 'Cannot run bash grader "tests": the workspace is not running',
  });
  await withDir(async (dir) => {
    await assert.rejects(() => bashGrader(localExec(dir), ["/no/such/program"]), {
      message: /^Cannot run bash grader "bash": /,
    });
  });
});

test("bashGrader() fails to grade, not scores 0, when its command is not found, not executable or killed", () =>
  withDir(async (dir) => {
    await Deno.writeTextFile(`${dir}/plain.txt`, "not a program\n");
    const cases: [string | string[], RegExp][] = [
      // The case: a test runner that is not installed (bash says 127).
      [
        "hud-no-such-runner -q",
        /the command was not found \(exit 127\): .*hud-no-such-runner: command not found/,
      ],
      ["./plain.txt", /the command could not be executed \(exit 126\): .*Permission denied/],
      // Killed before its timeout: what the sandbox's memory limit does.
      ["kill -KILL $$", /the command was killed \((SIGKILL|exit 137)\) before its timeout/],
      [
        ["sh", "-c", "kill -KILL $$"],
        /the command was killed \((SIGKILL|exit 137)\) before its timeout/,
      ],
    ];
    for (const [command, message] of cases) {
      await assert.rejects(
        () => bashGrader(localExec(dir), command, { name: "tests", timeout: 20_000 }),
        (err: Error) => {
          assert.match(err.message, /^Cannot run bash grader "tests": /);
          assert.match(err.message, message);
          return true;
        },
        JSON.stringify(command),
      );
    }
    // A check that fails on its own (exit 1) is still a score of 0.
    assert.equal((await bashGrader(localExec(dir), "grep -q absent plain.txt")).value, 0);
  }));

test("bashGrader() stops with the signal's reason when aborted", () =>
  withDir(async (dir) => {
    const controller = new AbortController();
    const reason = new Error("grading cancelled");
    const graded = bashGrader(localExec(dir), "sleep 30", { signal: controller.signal });
    setTimeout(() => controller.abort(reason), 100);
    await assert.rejects(() => graded, (err) => err === reason);
    await assert.rejects(
      () => bashGrader(localExec(dir), "true", { signal: AbortSignal.abort(reason) }),
      (err) => err === reason,
    );
  }));

test("bashGrader() refuses an empty command and bad bounds", async () => {
  const target = localExec("/");
  await assert.rejects(() => bashGrader(target, "  "), {
    name: "TypeError",
    message: 'Cannot run bash grader "bash": the command is empty',
  });
  await assert.rejects(() => bashGrader(target, []), TypeError);
  await assert.rejects(() => bashGrader(target, "true", { timeout: 0 }), RangeError);
  // The name before 0.1.0 is refused, not ignored.
  await assert.rejects(
    () => bashGrader(target, "true", { timeoutMs: 300 } as BashGraderOptions),
    {
      name: "TypeError",
      message: 'Cannot run bash grader "bash": option "timeoutMs" is now "timeout"',
    },
  );
  await assert.rejects(() => bashGrader(target, "true", { maxOutput: -1 }), RangeError);
  assert.equal(target.calls.length, 0);
});
