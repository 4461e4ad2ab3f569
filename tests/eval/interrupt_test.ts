// `hud eval` under interruption, in child processes: no graded result is
// lost or re-run, and no process, key file or temp dir of the run is left.
import { test } from "../_test.ts";
import { LINUX, SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { liveGroupMembers } from "../../_internal/process.ts";

const CLI = new URL("../../cli.ts", import.meta.url).href;
const fixture = (name: string) =>
  decodeURIComponent(new URL(`../fixtures/${name}`, import.meta.url).pathname);
const FAST = fixture("fast_env.ts");
const WORKSPACE = fixture("workspace_env.ts");

interface Child {
  process: Deno.ChildProcess;
  output: Promise<{ code: number; stdout: string; stderr: string }>;
}

/** Starts `hud eval ...` with a private TMPDIR. */
function startEval(args: string[], tmp: string): Child {
  const process = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, "eval", ...args],
    env: { TMPDIR: tmp, NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const text = new TextDecoder();
  const output = process.output().then((o) => ({
    code: o.code,
    stdout: text.decode(o.stdout),
    stderr: text.decode(o.stderr),
  }));
  return { process, output };
}

/** Waits for `child` to exit, at most `ms`. */
async function finished(child: Child, what: string, ms = 60_000) {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      try {
        child.process.kill("SIGKILL");
      } catch { /* gone */ }
      reject(new Error(`eval did not exit within ${ms} ms ${what}`));
    }, ms);
  });
  try {
    return await Promise.race([child.output, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

async function waitUntil(what: string, predicate: () => Promise<boolean>, ms = 60_000) {
  const end = Date.now() + ms;
  while (!(await predicate())) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function lineCount(path: string): Promise<number> {
  const text = await Deno.readTextFile(path).catch(() => "");
  return text.split("\n").length - 1;
}

/** Kills what a failed test left, so the next one starts clean. */
function killGroups(pgids: number[]): void {
  for (const g of pgids) {
    try {
      Deno.kill(-g, "SIGKILL");
    } catch { /* gone */ }
  }
}

async function pgidsIn(path: string): Promise<number[]> {
  const text = await Deno.readTextFile(path).catch(() => "");
  return text.split("\n").filter(Boolean).map(Number);
}

interface Row {
  task: { slug: string };
  repeat: number;
  reward: number | null;
}

function parseRows(text: string): (Row | null)[] {
  return text.split("\n").filter(Boolean).map((l) => {
    try {
      return JSON.parse(l) as Row;
    } catch {
      return null;
    }
  });
}

test({
  name: "hud eval: a signal at a random point loses no graded rollout; --resume finishes the rest",
  needs: [LINUX],
}, async (t) => {
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"] as const) {
    await t.step(signal, async () => {
      const tmp = await Deno.makeTempDir({ prefix: "evaltrust-" });
      const pgids = `${tmp}/pgids`;
      const out = `${tmp}/out/results.jsonl`;
      // bash -c's $$ is the agent's process group (each agent leads its own).
      const agent = `echo $$ >> ${pgids}; cat`;
      const args = [FAST, "--agent", agent, "--group", "2", "--max-concurrent", "8", "--out", out];
      const stopAt = 1 + Math.floor(Math.random() * 150);
      const where = `(${signal} after ${stopAt} of 200 lines)`;
      try {
        const first = startEval(args, tmp);
        await waitUntil(`${stopAt} result lines ${where}`, async () => {
          return (await lineCount(out)) >= stopAt;
        });
        first.process.kill(signal);
        const ran = await finished(first, `after ${signal}`);
        const before = await Deno.readTextFile(out);
        if (signal === "SIGKILL") {
          assert.equal(ran.code, 137, ran.stderr);
        } else {
          assert.equal(ran.code, 130, `${where}\n${ran.stderr}`);
          assert.match(
            ran.stderr,
            /^interrupted: \d+ of 200 rollouts done; rerun with --resume to finish$/m,
          );
          // Nothing of the run is alive, nothing private is left.
          for (const g of await pgidsIn(pgids)) {
            assert.deepEqual(liveGroupMembers(g), [], `agent group ${g} is gone ${where}`);
          }
          const left = [...Deno.readDirSync(tmp)].map((e) => e.name).sort();
          assert.deepEqual(left, ["out", "pgids"], `nothing else in TMPDIR ${where}`);
        }
        const gradedBefore = new Set(
          parseRows(before).filter((r) => r?.reward != null).map((r) =>
            `${r!.task.slug}#${r!.repeat}`
          ),
        );
        assert.ok(gradedBefore.size >= Math.min(stopAt, 200) - 8, where);

        const second = startEval([...args, "--resume"], tmp);
        const resumed = await finished(second, "on resume");
        assert.equal(resumed.code, 0, `${where}\n${resumed.stderr}`);
        assert.match(resumed.stdout, /over 200 graded runs, 0 errored/);
        const after = await Deno.readTextFile(out);
        assert.ok(after.startsWith(before), `the file was only appended to ${where}`);
        const appended = parseRows(after.slice(before.length));
        for (const r of appended) {
          assert.ok(r !== null, `every appended line is a record ${where}`);
          const key = `${r.task.slug}#${r.repeat}`;
          assert.ok(!gradedBefore.has(key), `${key} was graded before and ran again ${where}`);
        }
        const graded = new Map<string, number>();
        for (const r of parseRows(after)) {
          if (r?.reward == null) continue;
          const key = `${r.task.slug}#${r.repeat}`;
          graded.set(key, (graded.get(key) ?? 0) + 1);
        }
        assert.equal(graded.size, 200, where);
        assert.ok([...graded.values()].every((n) => n === 1), `each graded once ${where}`);
      } finally {
        killGroups(await pgidsIn(pgids));
        await Deno.remove(tmp, { recursive: true });
      }
    });
  }
});

test({
  name: "hud eval: an interrupted run leaves no agent process, key file or temp dir",
  needs: [LINUX, SANDBOX],
}, async (t) => {
  // Each agent ignores SIGTERM, as does the child it leaves running.
  const stubborn = (pgids: string) =>
    `trap "" TERM; echo $$ >> ${pgids}; test -r "$HUD_CAP_SHELL_KEY_FILE" || exit 9; sleep 60 & sleep 60`;
  const cases: { name: string; signals: Deno.Signal[] }[] = [
    { name: "SIGINT", signals: ["SIGINT"] },
    { name: "SIGTERM", signals: ["SIGTERM"] },
    { name: "SIGHUP", signals: ["SIGHUP"] },
    { name: "SIGINT twice skips the grace period, still cleans up", signals: ["SIGINT", "SIGINT"] },
  ];
  for (const { name, signals } of cases) {
    await t.step(name, async () => {
      const tmp = await Deno.makeTempDir({ prefix: "evaltrust-" });
      const pgids = `${tmp}/pgids`;
      try {
        const child = startEval([
          WORKSPACE,
          "--agent",
          stubborn(pgids),
          "--group",
          "2",
          "--max-concurrent",
          "3",
        ], tmp);
        await waitUntil("three agents running", async () => (await pgidsIn(pgids)).length >= 3);
        const keysWhileRunning = [...Deno.readDirSync(tmp)].map((e) => e.name);
        assert.ok(keysWhileRunning.some((n) => n.startsWith("hud-ssh-")), "the fixture has keys");
        assert.ok(keysWhileRunning.some((n) => n.startsWith("hud-key-")), "agents have keys");
        for (const s of signals) {
          child.process.kill(s);
          await new Promise((r) => setTimeout(r, 100));
        }
        const ran = await finished(child, `after ${name}`);
        assert.equal(ran.code, 130, ran.stderr);
        assert.match(ran.stderr, /^interrupted: 0 of 8 rollouts done; rerun with --resume/m);
        for (const g of await pgidsIn(pgids)) {
          assert.deepEqual(liveGroupMembers(g), [], `agent group ${g} is gone`);
        }
        const left = [...Deno.readDirSync(tmp)].map((e) => e.name);
        assert.deepEqual(left, ["pgids"], "no key file or temp dir is left");
      } finally {
        killGroups(await pgidsIn(pgids));
        await Deno.remove(tmp, { recursive: true });
      }
    });
  }
});

test({
  name: "hud eval: a timed-out agent is graded on what it wrote, and its group is gone",
  needs: [LINUX, SANDBOX],
}, async () => {
  const tmp = await Deno.makeTempDir({ prefix: "evaltrust-" });
  const pgids = `${tmp}/pgids`;
  try {
    // The leader dies of SIGTERM at once; the child it leaves ignores it.
    const agent = `echo $$ >> ${pgids}; cat; (trap "" TERM; exec sleep 60) & sleep 60`;
    const child = startEval([
      FAST,
      "--agent",
      agent,
      "--tasks",
      await rowsFile(tmp, 2),
      "--agent-timeout",
      "1",
      "--timeout",
      "30",
    ], tmp);
    const ran = await finished(child, "with --agent-timeout 1");
    assert.equal(ran.code, 0, ran.stderr);
    assert.match(ran.stdout, /mean reward 1\.000 .*over 2 graded runs, 0 errored/);
    assert.match(ran.stdout, /agent: agent timed out after 1000 ms/);
    const groups = await pgidsIn(pgids);
    assert.equal(groups.length, 2);
    for (const g of groups) assert.deepEqual(liveGroupMembers(g), [], `agent group ${g} is gone`);
  } finally {
    killGroups(await pgidsIn(pgids));
    await Deno.remove(tmp, { recursive: true });
  }
});

async function rowsFile(dir: string, n: number): Promise<string> {
  const path = `${dir}/rows.jsonl`;
  // Rows without a slug: eval computes it.
  await Deno.writeTextFile(
    path,
    Array.from({ length: n }, (_, i) => JSON.stringify({ env: "fast", id: "echo", args: { n: i } }))
      .join("\n") + "\n",
  );
  return path;
}

/** Runs `hud ARGS` with a private TMPDIR until its first stdout line, sends `signals`, returns the exit code. */
async function interruptAfterFirstLine(
  args: string[],
  tmp: string,
  signals: Deno.Signal[],
): Promise<{ code: number; firstLine: string; stderr: string }> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { TMPDIR: tmp, NO_COLOR: "1" },
    stdin: "piped", // held open: start --source waits for an answer on it
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
  let text = "";
  let sent = false;
  try {
    const decoder = new TextDecoder();
    for await (const chunk of child.stdout) {
      text += decoder.decode(chunk, { stream: true });
      if (!sent && text.includes("\n")) {
        sent = true;
        for (const s of signals) {
          try {
            child.kill(s);
          } catch {
            break; // it finished on the first signal already
          }
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    }
  } finally {
    clearTimeout(timer);
    await child.stdin.close().catch(() => {});
  }
  const { code } = await child.status;
  assert.ok(sent, `printed a first line within 60 s: ${text}`);
  return { code, firstLine: text.split("\n")[0], stderr: await stderr };
}

test({
  name: "hud start --source and hud serve: a signal removes every key file and temp dir",
  needs: [LINUX, SANDBOX],
}, async (t) => {
  const cases: { name: string; args: string[]; signals: Deno.Signal[]; code: number }[] = [
    {
      name: "start --source, SIGINT",
      args: ["start", "echo", "--args", '{"n":1}', "--source", WORKSPACE],
      signals: ["SIGINT"],
      code: 130,
    },
    {
      name: "start --source, SIGHUP",
      args: ["start", "echo", "--args", '{"n":1}', "--source", WORKSPACE],
      signals: ["SIGHUP"],
      code: 130,
    },
    {
      name: "serve, SIGTERM",
      args: ["serve", WORKSPACE, "--port", "0"],
      signals: ["SIGTERM"],
      code: 0,
    },
    {
      name: "serve, SIGHUP",
      args: ["serve", WORKSPACE, "--port", "0"],
      signals: ["SIGHUP"],
      code: 0,
    },
    {
      name: "serve, SIGINT twice",
      args: ["serve", WORKSPACE, "--port", "0"],
      signals: ["SIGINT", "SIGINT"],
      code: -1,
    },
  ];
  for (const c of cases) {
    await t.step(c.name, async () => {
      const tmp = await Deno.makeTempDir({ prefix: "evaltrust-" });
      try {
        const ran = await interruptAfterFirstLine(c.args, tmp, c.signals);
        if (c.code >= 0) assert.equal(ran.code, c.code, ran.stderr);
        else assert.ok(ran.code === 0 || ran.code === 130, `exit ${ran.code}: ${ran.stderr}`);
        const left = [...Deno.readDirSync(tmp)].map((e) => e.name);
        assert.deepEqual(left, [], `TMPDIR is empty (exit ${ran.code}): ${ran.stderr}`);
      } finally {
        await Deno.remove(tmp, { recursive: true });
      }
    });
  }
});
