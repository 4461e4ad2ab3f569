import { test, withCounterparts } from "../_test.ts";
import { OPENSSH_CLIENT, ROOT_USER, SANDBOX, UNSHARE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { type Agent, Taskset } from "../../mod.ts";
import type { FileDiff, FlushResult } from "../../filetracking/mod.ts";
import { CommandAgent } from "../../agents/mod.ts";
import type { SshClient } from "../../ssh/mod.ts";
import { fixBug, scriptedAgent, tasks } from "../../examples/robolab.ts";
import { testSignal } from "../_deadline.ts";

const example = new URL("../../examples/robolab.ts", import.meta.url).pathname;

test(
  "examples/robolab.ts runs to completion with every task graded",
  { needs: [SANDBOX] },
  async () => {
    const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", example],
      stdout: "piped",
      stderr: "piped",
      signal: testSignal(),
    }).output();
    const out = new TextDecoder().decode(stdout);
    assert.equal(code, 0, out + new TextDecoder().decode(stderr));
    const rows = out.split("\n").filter((l) => l.startsWith("fix_bug-") && /completed$/.test(l));
    assert.equal(rows.length, 6, out);
    assert.match(out, /mean reward 0\.500 over 6 graded runs, 0 errored/);
  },
);

test(
  "robolab: the scripted agent fixes what it knows, over SSH",
  { needs: [SANDBOX] },
  async () => {
    const job = await new Taskset(tasks).run(scriptedAgent, { maxConcurrent: 3 });
    const byDifficulty = job.runs.map((r) => [r.task.args.difficulty, r.reward]);
    assert.deepEqual(byDifficulty, [[1, 1], [1, 1], [2, 0.5], [2, 0.5], [3, 0], [3, 0]]);
    const steps = job.liveRuns[0]!.trace.steps;
    const fix = steps.find((s) => s.type === "evaluate");
    assert.deepEqual((fix!.content as { subscores: unknown }).subscores, { check: 1, answer: 1 });
  },
);

test(
  "robolab: each trace shows its own agent's fix as a unified diff",
  { needs: [SANDBOX] },
  async () => {
    // Three rollouts at once on one workspace: each trace must hold its own
    // task's changes, all of them, and nothing of the others'.
    const job = await new Taskset(tasks).run(scriptedAgent, { maxConcurrent: 3 });
    job.runs.forEach((record, i) => {
      const steps = job.liveRuns[i]!.trace.steps;
      const dir = (job.liveRuns[i]!.bindings.filetracking as { path: string }).path;
      const patches = steps
        .flatMap((s) =>
          s.type === "filetracking.diff"
            ? (s.content as FileDiff).patches
            : s.type === "filetracking.flush"
            ? (s.content as FlushResult).diff.patches
            : []
        );
      const setup = steps.find((s) => s.type === "filetracking.setup")!.content as FileDiff;
      for (const p of [...patches, ...setup.patches]) {
        assert.ok(p.path.startsWith(`${dir}/`), `${p.path} belongs to ${dir}`);
      }
      assert.ok(setup.patches.some((p) => p.path.endsWith(".sh")), "setup diff has the program");
      assert.ok(!setup.patches.some((p) => p.path === `${dir}/check.sh`), "the check is not there");
      if (record.task.args.difficulty !== 1) return;
      const count = patches.find((p) => p.path === `${dir}/count.sh`)!;
      assert.equal(count.status, "modified");
      assert.match(count.patch, /^-while \[ "\$i" -lt "\$n" \]; do$/m);
      assert.match(count.patch, /^\+while \[ "\$i" -le "\$n" \]; do$/m);
    });
  },
);

test("robolab: examples/ssh_agent.sh, an external agent using OpenSSH's ssh", {
  needs: [SANDBOX, OPENSSH_CLIENT],
}, async () => {
  // The agent reads its capability from the command agent contract's
  // environment variables and fixes the off-by-one with sed, over ssh.
  const agent = new CommandAgent([
    new URL("../../examples/ssh_agent.sh", import.meta.url).pathname,
  ]);
  const job = await new Taskset([
    fixBug({ difficulty: 1, seed: 1 }),
    fixBug({ difficulty: 2, seed: 1 }),
  ])
    .run(agent);
  for (const record of job.runs) {
    assert.equal(record.failed_phase, null, JSON.stringify(record.trace.errors));
  }
  assert.deepEqual(job.runs.map((r) => r.reward), [1, 0]);
});

test("examples/robolab.ts: a bad flag is one usage line, exit 2", async () => {
  const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", example, "--bogus"],
    stdin: "null",
  }).output();
  const err = new TextDecoder().decode(stderr);
  assert.equal(code, 2, err);
  assert.equal(new TextDecoder().decode(stdout), "");
  assert.match(err, /^error: Unknown option '--bogus' \(see --help\)\n$/);
});

test("cli.ts serve examples/robolab.ts announces one port and stops on SIGTERM", {
  needs: [SANDBOX],
}, async () => {
  const cli = new URL("../../cli.ts", import.meta.url).pathname;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", cli, "serve", example, "--port", "0"],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const decoder = new TextDecoder();
  let text = "";
  let killed = false;
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  try {
    for await (const chunk of child.stdout) {
      text += decoder.decode(chunk, { stream: true });
      if (!killed && text.includes("\n")) {
        killed = true;
        child.kill("SIGTERM");
      }
    }
  } finally {
    clearTimeout(timer);
  }
  const { code } = await child.status;
  assert.ok(killed, `announced the port within 30 s; stdout: ${text}`);
  assert.equal(code, 0);
  assert.equal(text.split("\n").filter((l) => l.startsWith("HUD_SERVE_PORT=")).length, 1, text);
});

// Agents that try to earn what they did not: each gets exactly the reward
// its honest work earns, and nothing it writes runs outside the sandbox.

/** The scripted agent, then `tamper(cwd, shell)` before it answers. */
function tamperingAgent(
  tamper: (cwd: string, shell: SshClient) => Promise<void>,
  fix = true,
): Agent {
  return {
    async run(run, context) {
      const cwd = (run.bindings.shell as { cwd: string }).cwd;
      if (fix) await scriptedAgent.run(run, context);
      await using shell = await run.client.open("shell", { signal: context.signal });
      await tamper(cwd, shell);
    },
  };
}

test("robolab: an agent that rewrites check.sh instead of fixing earns nothing", {
  needs: [SANDBOX],
}, async () => {
  const agent = tamperingAgent(async (cwd, shell) => {
    await shell.writeText(`${cwd}/check.sh`, "#!/usr/bin/env bash\nexit 0\n");
    await shell.exec(`chmod +x ${cwd}/check.sh`);
  }, false);
  const job = await new Taskset(tasks).run(agent, { maxConcurrent: 3 });
  const checks = job.liveRuns.map((r) =>
    (r!.trace.steps.find((s) => s.type === "evaluate")!.content as {
      subscores: { check: number };
    }).subscores.check
  );
  assert.deepEqual(checks, [0, 0, 0, 0, 0, 0]);
  assert.deepEqual(job.runs.map((r) => r.reward), [0, 0, 0, 0, 0, 0]);
});

test("robolab: a line appended to the program runs only in the sandbox, as the agent", {
  needs: [SANDBOX],
}, async () => {
  // A directory only root may write, outside the workspace: the appended
  // line tries to leave its uid there when the check runs the program.
  const outside = await Deno.makeTempDir({ prefix: "robolab-outside-" });
  await Deno.chmod(outside, 0o700);
  try {
    const agent = tamperingAgent(async (cwd, shell) => {
      const programs = (await shell.listDir(cwd)).filter((e) => e.name.endsWith(".sh"));
      for (const p of programs) {
        const text = await shell.readText(`${cwd}/${p.name}`);
        await shell.writeText(
          `${cwd}/${p.name}`,
          `${text}echo "uid=$(id -u)" >&2; echo "uid=$(id -u)" >> ${outside}/ran 2>/dev/null || :\n`,
        );
      }
    });
    const job = await new Taskset(tasks).run(agent, { maxConcurrent: 3 });
    assert.deepEqual(
      job.runs.map((r) => [r.task.args.difficulty, r.reward]),
      [[1, 1], [1, 1], [2, 0.5], [2, 0.5], [3, 0], [3, 0]],
    );
    // The check ran each program as the sandbox's user: what it printed says who.
    for (const r of job.liveRuns) {
      const info = (r!.trace.steps.find((s) => s.type === "evaluate")!.content as {
        info: { check_output: string };
      }).info;
      const uids = [...info.check_output.matchAll(/uid=(\d+)/g)].map((m) => Number(m[1]));
      assert.ok(uids.length > 0, info.check_output);
      // As root, the workspace's own uid (59000-59999); else this process's.
      const agent = (u: number) => Deno.uid() === 0 ? u >= 59000 && u <= 59999 : u === Deno.uid();
      assert.ok(uids.every(agent), info.check_output);
    }
    const ran = await Deno.readTextFile(`${outside}/ran`).catch(() => null);
    assert.equal(ran, null, `the appended line ran outside the sandbox: ${ran}`);
  } finally {
    await Deno.remove(outside, { recursive: true });
  }
});

/** A PATH directory with every program of the system's but `except`: as if they were not installed. */
async function pathWithout(except: readonly string[]): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "robolab-path-" });
  for (const from of ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"]) {
    const entries = await Array.fromAsync(Deno.readDir(from)).catch(() => []);
    for (const { name } of entries) {
      if (except.includes(name)) continue;
      await Deno.symlink(`${from}/${name}`, `${dir}/${name}`).catch(() => {});
    }
  }
  return dir;
}

/** Runs examples/robolab.ts under `wrapper`; its exit code and all it printed. */
async function robolabUnder(
  wrapper: string[],
  env: Record<string, string>,
): Promise<{ code: number; out: string }> {
  const argv = [...wrapper, Deno.execPath(), "run", "-A", "--no-lock", example];
  const ran = await new Deno.Command(argv[0], {
    args: argv.slice(1),
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: testSignal(),
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: ran.code, out: text(ran.stdout) + text(ran.stderr) };
}

/** Runs a command as an ordinary user in a user namespace that may make no more. */
const NO_USERNS = [
  "unshare",
  "--user",
  "--map-root-user",
  "--",
  "sh",
  "-c",
  'echo 1 > /proc/sys/user/max_user_namespaces && exec unshare --user --map-user=58777 --map-group=58777 -- "$@"',
  "hud-nouserns",
];

/** The line that says why, once, and robolab's switch: asserted on their stable parts. */
function assertSaysWhy(ran: { code: number; out: string }, why: RegExp): void {
  assert.equal(ran.code, 1, ran.out);
  const lines = ran.out.split("\n").filter((l) => /no sandbox works here/.test(l));
  assert.equal(lines.length, 1, `the reason once:\n${ran.out}`);
  assert.match(lines[0], /Cannot start workspace: no sandbox works here/);
  assert.match(lines[0], /bwrap: .*; unshare: /, "the mechanisms tried, and why each failed");
  assert.match(lines[0], why);
  assert.match(ran.out, /\n {2}robolab: .*ROBOLAB_ISOLATION=none/, "the way out, named");
}

test("examples/robolab.ts where no sandbox can be made says why in one line, and the way out", async (t) => {
  await t.step("--help names the switch", async () => {
    const help = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", example, "--help"],
      stdout: "piped",
    }).output();
    assert.match(
      new TextDecoder().decode(help.stdout),
      /ROBOLAB_ISOLATION=none runs the workspace's commands unconfined/,
    );
  });

  // As in a container under Docker's default profile: no bubblewrap, and
  // unshare refused. Where this machine refuses user namespaces itself, it is
  // that machine; elsewhere a user namespace that may make exactly one more,
  // spent on the one robolab runs in as an ordinary user, makes it so (root).
  const refused = SANDBOX.missing !== null;
  await t.step(withCounterparts({
    name: "no bubblewrap, and user namespaces refused",
    fn: async () => {
      const path = await pathWithout(["bwrap"]);
      try {
        const ran = await robolabUnder(refused ? [] : NO_USERNS, { PATH: path });
        // unshare refused, or not there at all (a minimal container image).
        assertSaysWhy(
          ran,
          /bwrap: "bwrap" is not installed; unshare: (.*unshare failed: |"unshare" is not installed)/,
        );
        assert.match(ran.out, /user namespaces/);
      } finally {
        await Deno.remove(path, { recursive: true });
      }
    },
  }, refused ? [] : [ROOT_USER, UNSHARE]));
});
