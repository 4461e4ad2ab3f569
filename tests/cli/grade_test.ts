// Issue 30, point 5: `hud grade` with several tasks parked says which flag
// picks one, and with --session checks TASK against the session's task.
import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { SubprocessRuntime } from "../../runtime/mod.ts";
import { testSignal } from "../_deadline.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const BASIC = new URL("../fixtures/basic_env.ts", import.meta.url).pathname;

test("cli.ts grade names --session when several tasks are parked, and checks TASK", async () => {
  await using served = await new SubprocessRuntime(BASIC).place();
  const [, token, address] = /^tcp:\/\/:([^@]+)@(.+)$/.exec(served.url)!;
  const url = `tcp://${address}`;
  const cli = async (...args: string[]) => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CLI, ...args],
      env: { HUD_SERVE_TOKEN: decodeURIComponent(token), NO_COLOR: "1" },
      stdin: "null",
      signal: testSignal(),
    }).output();
    const text = new TextDecoder();
    return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
  };
  const sessions: string[] = [];
  for (const args of ['{"a":1}', '{"a":2}']) {
    const started = await cli("start", "add", "--args", args, "--url", url, "--json");
    assert.equal(started.code, 0, started.stderr);
    sessions.push(JSON.parse(started.stdout).session_id);
  }
  const ambiguous = await cli("grade", "add", "--answer", "3", "--url", url);
  assert.equal(ambiguous.code, 1, ambiguous.stdout);
  // The hints name the command as it was run (issue 38: "hud grade" when it was deno run -A cli.ts).
  const asRun = (text: string) => text.replace(/deno run -A \S*cli\.ts/g, "PROGRAM");
  assert.match(ambiguous.stderr, /"(deno run -A \S*cli\.ts) start"/);
  assert.equal(
    asRun(ambiguous.stderr),
    `error: Cannot grade "add": 2 tasks are parked; pass --session ID, the id "PROGRAM start" printed\n`,
  );
  const wrong = await cli("grade", "echo", "--answer", "3", "--url", url, "--session", sessions[0]);
  assert.equal(wrong.code, 1, wrong.stdout);
  assert.equal(
    asRun(wrong.stderr),
    `error: Cannot grade "echo": session ${sessions[0]} holds a task of template "add"; ` +
      `run "PROGRAM grade add --session ${sessions[0]}"\n`,
  );
  // Refused before grading: the task is still there, and grades.
  for (const [i, session] of sessions.entries()) {
    const graded = await cli(
      "grade",
      "add",
      "--answer",
      String(i + 3),
      "--url",
      url,
      "--session",
      session,
    );
    assert.equal(graded.code, 0, graded.stderr);
    assert.deepEqual(JSON.parse(graded.stdout), { score: 1 });
  }
});
