/**
 * robolab: a small lab of buggy shell programs, each in a workspace the
 * agent reaches over SSH through the control port's forwarder.
 *
 * ```sh
 * deno run -A examples/robolab.ts                 # the scripted agent
 * deno run -A examples/robolab.ts --agent "CMD"   # any external agent
 * ```
 *
 * Each task copies a program with a real bug into a fresh directory of the
 * workspace. The agent must fix the program, and answer with the output of
 * a command named in the prompt. Grading runs a check that lives here, in
 * the environment's code, with `workspace.exec()`: inside the workspace's
 * sandbox, as the agent's user, while the agent's processes are stopped.
 * Half the reward for the check, half for the answer.
 *
 * @module
 */

import { parseArgs } from "node:util";
import {
  addWorkspace,
  type Agent,
  Environment,
  functionAgent,
  integer,
  type JobProgress,
  type Run,
  type TaskRow,
  Taskset,
  type Workspace,
} from "../mod.ts";
import { commonFailureText, formatProgress } from "../eval/mod.ts";
import { CommandAgent } from "../agents/mod.ts";

interface Lab {
  /** What the program should do. */
  goal: string;
  /** The buggy program. */
  program: (seed: number) => Record<string, string>;
  /** A shell check, run in the task's directory: exit 0 when the program is right. */
  check: string;
  /** The command whose output is the answer. */
  ask: (seed: number) => string;
  /** The right answer. */
  expected: (seed: number) => string;
}

// Three programs of growing difficulty. The scripted agent below knows the
// first bug, half of the second, and none of the third.
const LABS: Record<number, Lab> = {
  1: {
    goal: "count.sh N should print the numbers 1 to N, one per line",
    program: () => ({
      "count.sh": [
        "#!/usr/bin/env bash",
        "# Prints the numbers 1..N, one per line.",
        "n=$1",
        "i=1",
        'while [ "$i" -lt "$n" ]; do',
        '  echo "$i"',
        "  i=$((i + 1))",
        "done",
        "",
      ].join("\n"),
    }),
    check: '[ "$(./count.sh 5 | wc -l)" -eq 5 ] && [ "$(./count.sh 3 | tail -n 1)" = 3 ]',
    ask: (seed) => `./count.sh ${seed + 6} | tail -n 1`,
    expected: (seed) => String(seed + 6),
  },
  2: {
    goal: "freq.sh FILE WORD should print how many times WORD occurs in FILE, ignoring case",
    program: (seed) => ({
      "freq.sh": [
        "#!/usr/bin/env bash",
        "# Prints how many times WORD occurs in FILE, ignoring case.",
        'grep -c -w -- "$2" "$1"',
        "",
      ].join("\n"),
      "notes.txt": Array.from(
        { length: seed + 2 },
        (_, i) => `robot ${i % 2 ? "Robot" : "robot"} arm, the robot lab\n`,
      ).join(""),
    }),
    // The check counts occurrences; only the answer needs case folding too.
    check: '[ "$(printf "a b a\\na c\\n" > t.txt; ./freq.sh t.txt a)" = 3 ]',
    ask: () => "./freq.sh notes.txt robot",
    expected: (seed) => String((seed + 2) * 3),
  },
  3: {
    goal: "total.sh FILE should print the sum of the `cost` fields of the JSON lines in FILE",
    program: (seed) => ({
      "total.sh": [
        "#!/usr/bin/env bash",
        "# Prints the sum of the cost fields of the JSON lines in FILE.",
        `sed -n 's/.*"cost": *\\([0-9]*\\).*/\\1/p' "$1" | paste -sd+ | bc`,
        "",
      ].join("\n"),
      "orders.jsonl": Array.from(
        { length: seed + 3 },
        (_, i) => JSON.stringify({ id: i, cost: 1.5 + i, note: 'says "cost": 0' }) + "\n",
      ).join(""),
    }),
    check: `printf '{"cost": 2.5}\\n{"cost": 1}\\n' > t.jsonl; [ "$(./total.sh t.jsonl)" = 3.5 ]`,
    ask: () => "./total.sh orders.jsonl",
    expected: (seed) =>
      String(Array.from({ length: seed + 3 }, (_, i) => 1.5 + i).reduce((a, b) => a + b)),
  },
};

const tmp = Deno.env.get("TMPDIR") ?? "/tmp";
/** The workspace root, made when the environment starts and removed when it stops. */
export const root = `${tmp}/robolab-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;

/** The robolab environment: one SSH workspace, one template. */
export const env = new Environment("robolab", { version: "1.0.0" });
env.initialize(async () => {
  await Deno.mkdir(root, { recursive: true });
});
env.shutdown(async () => {
  await Deno.remove(root, { recursive: true }).catch(() => {});
});
// The workspace sandboxes its commands wherever it runs, also in a container
// ContainerRuntime placed (bubblewrap in user namespaces). Where none can be
// made (a swarm replica, a kernel without user namespaces),
// ROBOLAB_ISOLATION=none runs them unconfined; without a sandbox there is no
// safe hand-over of the directories each task makes (as root) to another
// uid, so the agent is then the server's user, with every capability dropped.
/** The workspace: the agent's shell, and where the checks run. */
export const workspace: Workspace = addWorkspace(
  env,
  root,
  Deno.env.get("ROBOLAB_ISOLATION") === "none" ? { isolation: "none", uid: 0 } : {},
);

/** Fix a buggy program in the workspace. Difficulty 1 to 3; seed varies the data. */
export const fixBug = env.template(
  {
    id: "fix_bug",
    description: "Fix a buggy shell program so that its check passes",
    args: { difficulty: integer(), seed: integer() },
  },
  async function* ({ difficulty, seed }) {
    const lab = LABS[difficulty];
    if (!lab) {
      throw new RangeError(`Cannot start fix_bug: difficulty must be 1, 2 or 3, got ${difficulty}`);
    }
    const dir = await Deno.makeTempDir({ dir: root, prefix: `fix-${difficulty}-${seed}-` });
    for (const [name, text] of Object.entries(lab.program(seed))) {
      await Deno.writeTextFile(`${dir}/${name}`, text, {
        mode: name.endsWith(".sh") ? 0o755 : 0o644,
      });
    }
    try {
      const answer = yield {
        prompt: `In ${dir}: ${lab.goal}, but it has a bug. Fix it; once you answer, this check ` +
          `runs there: ${lab.check}. Then answer with the output of \`${lab.ask(seed)}\`.`,
        // The tracker watches the whole workspace; this task's changes are
        // the ones under its own directory.
        bindings: { shell: { cwd: dir }, filetracking: { path: dir.slice(root.length + 1) } },
      };
      // The check is this code's, not a file the agent could have written;
      // the program it runs is the agent's, run as the agent, in the sandbox.
      const check = await workspace.exec(["bash", "-c", lab.check], {
        cwd: dir,
        timeout: 30_000,
      });
      const right = String(answer ?? "").trim() === lab.expected(seed);
      const subscores = { check: check.code === 0 ? 1 : 0, answer: right ? 1 : 0 };
      yield {
        score: (subscores.check + subscores.answer) / 2,
        subscores,
        info: {
          check_output: (check.stdout + check.stderr).trim().slice(0, 2000),
          expected: lab.expected(seed),
        },
      };
    } finally {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
);

/** The tasks: each difficulty with two seeds. */
export const tasks: TaskRow[] = [1, 2, 3].flatMap((difficulty) =>
  [1, 2].map((seed) => fixBug({ difficulty, seed }))
);

// Repairs the scripted agent knows: a pattern to find and what to put instead.
const REPAIRS: [RegExp, string][] = [
  [/-lt "\$n"/, '-le "$n"'], // off by one
  [/grep -c -w -- "\$2" "\$1"/, 'grep -o -w -- "$2" "$1" | wc -l'], // lines, not occurrences
];

/**
 * A scripted agent: it reads the programs over SSH, applies the repairs it
 * knows, and answers with the output of the asked command.
 */
export const scriptedAgent: Agent = functionAgent(async (prompt, run: Run, { signal }) => {
  await using shell = await run.client.open("shell", { signal });
  const cwd = (run.bindings.shell as { cwd: string }).cwd;
  for (const entry of await shell.listDir(cwd, { signal })) {
    if (!entry.isFile || !entry.name.endsWith(".sh")) continue;
    const path = `${cwd}/${entry.name}`;
    let text = await shell.readText(path, { signal });
    for (const [pattern, replacement] of REPAIRS) text = text.replace(pattern, replacement);
    await shell.writeText(path, text, { signal });
  }
  const ask = /`([^`]+)`/.exec(String(prompt))?.[1] ?? "true";
  const result = await shell.exec(`cd ${cwd} && ${ask}`, { signal });
  return result.stdoutText.trim();
});

function pad(s: string, n: number): string {
  return s.length >= n ? s : s + " ".repeat(n - s.length);
}

/** Robolab's own switch for a machine where no sandbox can be made. */
const NO_SANDBOX =
  "Where no sandbox can be made (no bubblewrap, user namespaces not allowed, as in a container), ROBOLAB_ISOLATION=none runs the workspace's commands unconfined, as the server's user with every capability dropped (SECURITY.md says what the agent can then do)";

/** Runs the taskset and prints progress and a per-task table; returns the job. */
export async function main(args: string[] = Deno.args): Promise<number> {
  const usage =
    "Usage: deno run -A examples/robolab.ts [--agent CMD] [--group N] [--max-concurrent N]\n" +
    `\n${NO_SANDBOX}.`;
  let values;
  try {
    ({ values } = parseArgs({
      args,
      options: {
        agent: { type: "string" },
        group: { type: "string", default: "1" },
        "max-concurrent": { type: "string", default: "3" },
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (err) {
    // node:util's message spans lines; one is enough, with the way out.
    const first = (err as Error).message.split("\n")[0].replace(/\. .*$/, "");
    console.error(`error: ${first} (see --help)`);
    return 2;
  }
  if (values.help) {
    console.log(usage);
    return 0;
  }
  const group = Number(values.group);
  const maxConcurrent = Number(values["max-concurrent"]);
  if (
    !Number.isInteger(group) || group < 1 || !Number.isInteger(maxConcurrent) || maxConcurrent < 1
  ) {
    console.error("error: --group and --max-concurrent must be positive integers");
    return 2;
  }
  const agent = values.agent ? new CommandAgent(values.agent) : scriptedAgent;
  const tty = Deno.stdout.isTerminal();
  const show = (p: JobProgress) => {
    const line = formatProgress(p);
    if (tty) Deno.stdout.writeSync(new TextEncoder().encode(`\r\x1b[2K${line}`));
    else if (p.last) {
      console.log(`${p.last.task.slug}: ${p.last.reward ?? p.last.status}  (${line})`);
    }
  };
  console.log(`robolab: ${tasks.length} tasks, agent: ${values.agent ?? "scripted"}`);
  const job = await new Taskset(tasks).run(agent, {
    group,
    maxConcurrent,
    rolloutTimeout: 120_000,
    onProgress: show,
  });
  if (tty) console.log();
  console.log();
  console.log(
    `${pad("task", 22)}${pad("difficulty", 12)}${pad("reward", 8)}${pad("check", 7)}${
      pad("answer", 8)
    }status`,
  );
  for (const r of job.runs) {
    const grade =
      (r.trace.steps as { type: string; content?: { subscores?: Record<string, number> } }[])
        .find((s) => s.type === "evaluate")?.content?.subscores;
    console.log(
      pad(r.task.slug, 22) + pad(String(r.task.args.difficulty), 12) +
        pad(r.reward === null ? "-" : r.reward.toFixed(2), 8) +
        pad(String(grade?.check ?? "-"), 7) +
        pad(String(grade?.answer ?? "-"), 8) +
        (r.failed_phase ? `${r.status} (${r.failed_phase})` : r.status),
    );
  }
  console.log();
  console.log(
    `mean reward ${job.meanReward?.toFixed(3) ?? "-"} over ${
      job.runs.length - job.errored.length
    } graded runs, ${job.errored.length} errored`,
  );
  // Every rollout failing alike (no sandbox here, say): the reason once, with the way out.
  const common = job.summary().common_failure;
  if (common !== null) console.log(`\n${commonFailureText(common).trimEnd()}`);
  if (common?.class === "provisioning" && /no sandbox/.test(common.message)) {
    console.log(`  robolab: ${NO_SANDBOX}`);
  }
  return job.errored.length === 0 ? 0 : 1;
}

if (import.meta.main) Deno.exit(await main());
