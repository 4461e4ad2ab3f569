// A failure is never a zero, measured: a job of N rollouts of a task every
// agent here always solves (write the number into its file, in one sandboxed
// workspace; graded by one sandboxed command), run while faults are injected.
// Every rollout that is graded must be graded 1: a graded 0 is a silent zero,
// an infrastructure failure that reads as the agent's. Then --resume (with
// the faults off) runs what errored, and every rollout must end graded 1.
//
// Faults: the model endpoint refuses connections, resets them, hangs,
// answers 500 at random, and goes down for spells of 5 s (503 to all)
// (bench/_fault_model.ts); the agents' processes are
// killed (the model agent's tool commands, and the command agent itself);
// the workspace's disk (a tmpfs of its own, in a mount namespace of this
// process) is filled for moments; control connections and capability tunnels
// are cut (bench/_cut_proxy.ts); the grader throws. A quarter of the
// rollouts run a command agent (bench/_fault_agent.sh), the rest a
// ChatAgent against the fault model.
//
//   deno run -A bench/faults.ts [--rollouts 500] [--max-concurrent 50] [--containers N] [--json]
//
// With --containers N (an engine up: Docker, or DOCKER_HOST), N more
// rollouts run in containers of bench/_fault_container_env.ts's image,
// which are killed mid-rollout at random.
//
// Each fault is put down to the rollout it hit (the grader and the model
// server know the task's number; a killed process's command line or
// environment says it; each placement has a relay of its own that reads
// its task's number from the tasks.start frame), and each errored rollout's
// class is checked against the classes its faults lead to (EXPECTED).
//
// Prints rollouts, graded, graded but below 1 (silent zeros, each with the
// faults it met), errored by class, what was injected, a table of the
// rollouts by the faults they met (graded 1, below 1, errored by class,
// errored with a class none of its faults leads to), what leaked, and the
// same after --resume. Exits 0 when there were no silent zeros, no wrong or
// unexplained classes, no leaks, and --resume brought every rollout to
// graded 1.

import { parseArgs } from "node:util";
import { Environment } from "../env.ts";
import { integer } from "../schema.ts";
import { addWorkspace } from "../workspace/mod.ts";
import { LocalRuntime } from "../runtime/local.ts";
import type { Agent } from "../eval/agent.ts";
import { Taskset } from "../eval/taskset.ts";
import type { Job } from "../eval/job.ts";
import { isGraded, recordClass, type RolloutErrorClass } from "../eval/failure.ts";
import { ChatAgent } from "../agents/chat_agent.ts";
import { CommandAgent } from "../agents/command.ts";
import { bashGrader } from "../graders/bash.ts";
import { FaultModel } from "./_fault_model.ts";
import { CuttingRuntime } from "./_cut_proxy.ts";
import { descendants, leakSnapshot, leaksSince } from "./_leaks.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    rollouts: { type: "string", default: "500" },
    "max-concurrent": { type: "string", default: "50" },
    "no-disk": { type: "boolean", default: false },
    containers: { type: "string", default: "0" },
    json: { type: "boolean", default: false },
  },
});
const rollouts = Number(values.rollouts);
const width = Number(values["max-concurrent"]);
const containers = Number(values.containers);
if (
  !(Number.isInteger(rollouts) && rollouts > 0 && Number.isInteger(width) && width > 0 &&
    Number.isInteger(containers) && containers >= 0)
) {
  console.error(
    "error: --rollouts and --max-concurrent take positive integers, --containers a count",
  );
  Deno.exit(2);
}
const disk = !values["no-disk"];

// A tmpfs for the workspace's disk needs a mount namespace of our own, so
// that nothing is mounted on the machine's: run again inside one.
if (disk && Deno.env.get("HUD_FAULTS_NS") !== "1") {
  const child = new Deno.Command("unshare", {
    args: [
      "-m",
      "--propagation",
      "private",
      Deno.execPath(),
      "run",
      "-A",
      import.meta.filename!,
      ...Deno.args,
    ],
    env: { HUD_FAULTS_NS: "1" },
    stdin: "inherit",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  Deno.exit((await child.status).code);
}

const AGENT_SCRIPT = new URL("./_fault_agent.sh", import.meta.url).pathname;
const DISK_BYTES = 32 << 20;

const before = await leakSnapshot();
const root = await Deno.makeTempDir({ prefix: "hud-faults-" });
if (disk) await run("mount", ["-t", "tmpfs", "-o", `size=${DISK_BYTES},mode=0777`, "tmpfs", root]);

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
}

/** What the faults did, counted. */
const injected = { graderThrows: 0, kills: 0, agentKills: 0, diskFills: 0 };
const faultsOn = { grader: 0.03 };

/** The faults a rollout can be told it met, each with the classes it may end it with. */
const EXPECTED = {
  // The grader threw: not graded.
  grader: ["grading_error"],
  // Resets, hangs and 500s at random: the model call's retries ride them out.
  model: ["model_unavailable"],
  // An outage (503 to all) longer than the call's retries.
  model_outage: ["model_unavailable"],
  // A tool command of the model agent killed: the agent sees it fail and tries again.
  tool_kill: [],
  // The command agent killed from outside: not its doing.
  agent_kill: ["infrastructure_lost"],
  // A connection of the rollout's (control or tunnel) cut.
  cut: ["infrastructure_lost", "provisioning", "start_error"],
} satisfies Record<string, RolloutErrorClass[]>;
type Fault = keyof typeof EXPECTED;

/** The faults each rollout met, by its number (the task's `n`). */
const met = new Map<string, Map<Fault, number>>();
function meet(key: string, fault: Fault, times = 1): void {
  let faults = met.get(key);
  if (!faults) met.set(key, faults = new Map());
  faults.set(fault, (faults.get(fault) ?? 0) + times);
}
const keyOf = (args: unknown) =>
  typeof (args as { n?: unknown })?.n === "number" ? String((args as { n: number }).n) : null;

const env = new Environment("faults");
const workspace = addWorkspace(env, root, { trackFiles: false, onError: () => {} });
const write = env.template({ id: "write", args: { n: integer() } }, async function* ({ n }) {
  yield `Write the number ${n} into the file ${root}/${n}.txt, then submit.`;
  if (Math.random() < faultsOn.grader) {
    injected.graderThrows++;
    meet(String(n), "grader");
    throw new Error("injected grader fault");
  }
  const check = await bashGrader(workspace, `test "$(cat ${n}.txt)" = ${n}`, {
    cwd: root,
    timeout: 30_000,
  });
  yield check.value;
});

const model = new FaultModel({
  reset: 0.05,
  hang: 0.03,
  error500: 0.08,
  refuse: 0.05,
  outage: 0.2,
});
const chat = new ChatAgent({
  model: "scripted",
  baseUrl: model.baseUrl,
  stream: false,
  maxSteps: 40,
  callTimeout: 30_000,
  retry: { maxRetries: 4, baseDelay: 100, maxDelay: 2_000, attemptTimeout: 2_000 },
});
const command = new CommandAgent(["bash", AGENT_SCRIPT]);
/** A quarter of the rollouts run the command agent, the rest the model. */
const agent: Agent = {
  run: (r, context) =>
    ((r.task.args as { n: number }).n % 4 === 3 ? command : chat).run(r, context),
};

const runtime = new CuttingRuntime(new LocalRuntime(env), keyOf);
const rows = Array.from({ length: rollouts }, (_, n) => write({ n }));
const out = `${root}.results.jsonl`;

/** Runs `f` every `ms` (jittered) until stopped. */
function every(ms: number, f: () => void | Promise<void>): () => Promise<void> {
  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let running: Promise<void> = Promise.resolve();
  const tick = () => {
    timer = setTimeout(() => {
      running = Promise.resolve(f()).catch(() => {}).finally(() => {
        if (!stopped) tick();
      });
    }, ms * (0.5 + Math.random()));
  };
  tick();
  return async () => {
    stopped = true;
    clearTimeout(timer);
    await running;
  };
}

function commandOf(pid: number): string {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/cmdline`).split("\0").join(" ");
  } catch {
    return "";
  }
}

/** The parent of `pid`, or 0. */
function parentOf(pid: number): number {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return 0;
  }
}

/** The task number of a command agent's process (its HUD_TASK_ARGS), or null. */
function agentKey(pid: number): string | null {
  try {
    const environ = Deno.readTextFileSync(`/proc/${pid}/environ`).split("\0");
    const args = environ.find((e) => e.startsWith("HUD_TASK_ARGS="));
    return args ? keyOf(JSON.parse(args.slice("HUD_TASK_ARGS=".length))) : null;
  } catch {
    return null;
  }
}

function kill(pid: number): void {
  try {
    Deno.kill(pid, "SIGKILL");
  } catch {
    // gone meanwhile
  }
}

const injectors = [
  // Control connections and capability tunnels, cut.
  every(400, () => {
    runtime.cut();
  }),
  // The model agent's tool commands, killed mid-run.
  every(300, () => {
    const sleeps = descendants().filter((p) => commandOf(p).startsWith("sleep 0.2"));
    if (sleeps.length === 0) return;
    const pid = sleeps[Math.floor(Math.random() * sleeps.length)];
    // Its shell's command line names the file, and so the rollout.
    const key = /echo (\d+) >/.exec(commandOf(parentOf(pid)))?.[1];
    kill(pid);
    injected.kills++;
    if (key !== undefined) meet(key, "tool_kill");
  }),
  // The command agent itself, killed (SIGKILL from outside: not its doing).
  every(1_500, () => {
    // The agent's own process (a child of this one), not a subshell of its.
    const agents = descendants().filter((p) =>
      parentOf(p) === Deno.pid && commandOf(p).includes(AGENT_SCRIPT)
    );
    if (agents.length === 0) return;
    const pid = agents[Math.floor(Math.random() * agents.length)];
    const key = agentKey(pid);
    kill(pid);
    injected.agentKills++;
    if (key !== null) meet(key, "agent_kill");
  }),
  // The workspace's disk, filled for a moment.
  ...(disk
    ? [every(3_000, async () => {
      const fill = `${root}/.fill`;
      try {
        using f = await Deno.open(fill, { write: true, create: true });
        const chunk = new Uint8Array(1 << 20);
        for (let i = 0; i < DISK_BYTES >> 20; i++) await f.write(chunk);
      } catch {
        // full: that was the point
      }
      injected.diskFills++;
      await new Promise((r) => setTimeout(r, 300 + Math.random() * 500));
      await Deno.remove(fill).catch(() => {});
    })]
    : []),
];

/**
 * `count` rollouts in containers of the fault environment's image (built
 * now, removed after), while containers are killed mid-rollout; then
 * --resume without kills. Containers this process left are leaks.
 */
async function containerPhase(
  count: number,
): Promise<{ faulted: Figures; resumed: Figures; killed: number; containersLeft: string[] }> {
  const { buildEnvironmentImage } = await import("../engines/image.ts");
  const { ContainerRuntime } = await import("../engines/container.ts");
  const module = new URL("./_fault_container_env.ts", import.meta.url).pathname;
  const tag = `hud-faults-bench:${Deno.pid}`;
  await buildEnvironmentImage(module, tag, { envName: "faults-container", envVersion: "1.0.0" });
  const live = new Set<string>();
  const inner = new ContainerRuntime(tag);
  const boxes = {
    async place(o?: { signal?: AbortSignal }) {
      const p = await inner.place(o);
      const id = String(p.params.containerId);
      live.add(id);
      return {
        address: p.address,
        params: p.params,
        [Symbol.asyncDispose]: async () => {
          live.delete(id);
          await p[Symbol.asyncDispose]();
        },
      };
    },
  };
  let killed = 0;
  const slow: Agent = {
    async run(r) {
      await new Promise((ok) => setTimeout(ok, 1_000 + Math.random() * 1_000));
      r.answer = String((r.task.args as { n: number }).n);
    },
  };
  const rows = Array.from({ length: count }, (_, n) => ({
    env: "faults-container",
    id: "echo",
    args: { n },
    slug: `echo-${n}`,
  }));
  const boxedOut = `${root}.containers.jsonl`;
  const opts = { runtime: boxes, maxConcurrent: 8, out: boxedOut, rolloutTimeout: 120_000 };
  const stop = every(700, async () => {
    const ids = [...live];
    if (ids.length === 0) return;
    const id = ids[Math.floor(Math.random() * ids.length)];
    const out = await new Deno.Command("docker", {
      args: ["kill", id],
      stdout: "null",
      stderr: "null",
    })
      .output();
    if (out.success) killed++;
  });
  let t = performance.now();
  // Kills are not put down to rollouts here: a killed container is the one
  // fault, and every errored rollout must be classed as one.
  const none = new Map();
  const faulted = figures(await new Taskset(rows).run(slow, opts), performance.now() - t, none);
  await stop();
  t = performance.now();
  const resumed = figures(
    await new Taskset(rows).run(slow, { ...opts, resume: true }),
    performance.now() - t,
    none,
  );
  await Deno.remove(boxedOut);
  const left = await new Deno.Command("docker", {
    args: ["ps", "-aq", "--filter", `label=dev.hud.owner=${Deno.pid}`],
    stderr: "null",
  }).output();
  const containersLeft = new TextDecoder().decode(left.stdout).split("\n").filter(Boolean);
  await new Deno.Command("docker", { args: ["rmi", "-f", tag], stdout: "null", stderr: "null" })
    .output();
  return { faulted, resumed, killed, containersLeft };
}

/** The rollouts by the faults they met: a table, then what is wrong. */
function showVerdict(v: Verdict): void {
  const widths = [13, 9, 9, 9, 10, 12];
  const row = (cells: unknown[], errored: string) =>
    console.log("  " + cells.map((c, i) => String(c).padEnd(widths[i])).join(" ") + errored);
  console.log("by the faults each rollout met (a rollout counts under each one it met)");
  row(["fault", "injected", "rollouts", "graded 1", "graded <1", "wrong class"], "errored");
  for (const [name, r] of Object.entries(v.by_fault)) {
    row(
      [name, r.injected, r.rollouts, r.graded_1, r.graded_below_1, r.wrong_class],
      JSON.stringify(r.errored),
    );
  }
  const n = v.none_met;
  row(["none met", "-", n.rollouts, n.graded_1, n.graded_below_1, "-"], JSON.stringify(n.errored));
  console.log(`  wrong class        ${JSON.stringify(v.wrong)}`);
  console.log(`  unexplained        ${v.unexplained}`);
}

interface Figures {
  rollouts: number;
  graded: number;
  graded_below_1: number;
  errored: number;
  errored_by_class: Record<string, number>;
  rewards: Record<string, number>;
  wall_s: number;
  /** Each rollout graded below 1: its number, the faults it met, its answer and errors. */
  silent_zeros: { n: string; met: string[]; answer: unknown; errors: unknown[] }[];
}

/** A job's figures; `faultsMet` names the faults each silent zero met. */
function figures(job: Job, ms: number, faultsMet = met): Figures {
  const s = job.summary();
  const rewards: Record<string, number> = {};
  for (const r of job.runs) {
    if (isGraded(r)) rewards[String(r.reward)] = (rewards[String(r.reward)] ?? 0) + 1;
  }
  return {
    rollouts: s.total,
    graded: s.graded,
    graded_below_1: job.runs.filter((r) => isGraded(r) && r.reward! < 1).length,
    errored: s.errored,
    errored_by_class: s.errored_by_class,
    rewards,
    wall_s: Math.round(ms / 100) / 10,
    silent_zeros: job.runs.filter((r) => isGraded(r) && r.reward! < 1).map((r) => {
      const n = String((r.task.args as { n: number }).n);
      return {
        n,
        met: [...(faultsMet.get(n)?.keys() ?? [])],
        answer: "content" in r.trace ? r.trace.content : null,
        errors: ("errors" in r.trace ? r.trace.errors : []).map((e) =>
          `${e.phase}/${e.class}: ${e.message}`
        ),
      };
    }),
  };
}

/** What befell the rollouts that met each fault, and whether each errored one has a class its faults lead to. */
interface FaultRow {
  injected: number;
  rollouts: number;
  graded_1: number;
  graded_below_1: number;
  errored: Record<string, number>;
  wrong_class: number;
}

interface Verdict {
  by_fault: Record<string, FaultRow>;
  /** Rollouts that met none of the faults above (a cut before their task started, a refused model call, a full disk: not put down to one rollout). */
  none_met: Omit<FaultRow, "injected" | "wrong_class">;
  /** Errored rollouts whose class none of the faults they met leads to. */
  wrong: { n: string; class: string | null; met: string[] }[];
  /** Errored rollouts that met no fault, beyond what the cuts before a task started explain. */
  unexplained: number;
}

function emptyRow(injected: number): FaultRow {
  return { injected, rollouts: 0, graded_1: 0, graded_below_1: 0, errored: {}, wrong_class: 0 };
}

/** Puts each rollout of `job` against the faults it met. */
function verdict(job: Job, injectedBy: Record<Fault, number>): Verdict {
  const byFault = Object.fromEntries(
    Object.entries(injectedBy).map(([f, count]) => [f, emptyRow(count)]),
  ) as Record<Fault, FaultRow>;
  const none = emptyRow(0);
  const wrong: Verdict["wrong"] = [];
  for (const r of job.runs) {
    const key = String((r.task.args as { n: number }).n);
    const faults = [...(met.get(key)?.keys() ?? [])];
    const graded = isGraded(r);
    const cls = graded ? null : recordClass(r);
    const allowed = new Set<string>(faults.flatMap((f) => EXPECTED[f]));
    const isWrong = !graded && faults.length > 0 && !allowed.has(String(cls));
    if (isWrong) wrong.push({ n: key, class: cls, met: faults });
    for (const row of faults.length === 0 ? [none] : faults.map((f) => byFault[f])) {
      row.rollouts++;
      if (graded && r.reward === 1) row.graded_1++;
      else if (graded) row.graded_below_1++;
      else row.errored[String(cls)] = (row.errored[String(cls)] ?? 0) + 1;
      if (isWrong) row.wrong_class++;
    }
  }
  const byCut = ["provisioning", "infrastructure_lost", "start_error"];
  const noneErrored = Object.entries(none.errored);
  const cutLike = noneErrored.filter(([c]) => byCut.includes(c)).reduce((a, [, k]) => a + k, 0);
  const other = noneErrored.filter(([c]) => !byCut.includes(c)).reduce((a, [, k]) => a + k, 0);
  const { injected: _, wrong_class: _w, ...noneMet } = none;
  return {
    by_fault: byFault,
    none_met: noneMet,
    wrong,
    unexplained: other + Math.max(0, cutLike - runtime.cutsUnkeyed),
  };
}

const options = { runtime, maxConcurrent: width, out, rolloutTimeout: 120_000 };
let started = performance.now();
const faultedJob = await new Taskset(rows).run(agent, options);
const faulted = figures(faultedJob, performance.now() - started);
await Promise.all(injectors.map((stop) => stop()));
const models = { ...model.counts };
for (const [key, times] of model.faultsByKey) meet(key, "model", times);
for (const [key, times] of model.outagesByKey) meet(key, "model_outage", times);
for (const [key, times] of runtime.cutsByKey) meet(key, "cut", times);
const checked = verdict(faultedJob, {
  grader: injected.graderThrows,
  model: models.reset + models.hang + models.error500,
  model_outage: models.outage503,
  tool_kill: injected.kills,
  agent_kill: injected.agentKills,
  cut: runtime.cuts,
});

// The faults off: --resume runs what errored (a grader that threw is
// retried here too: resume runs whatever was not graded).
model.calm();
faultsOn.grader = 0;
started = performance.now();
const resumed = figures(
  await new Taskset(rows).run(agent, { ...options, resume: true }),
  performance.now() - started,
);

const boxed = containers > 0 ? await containerPhase(containers) : null;

await command.whenIdle();
await runtime.close();
await model[Symbol.asyncDispose]();
if (disk) await run("umount", [root]);
await Deno.remove(root, { recursive: true });
await Deno.remove(out);
const leaks = [
  ...await leaksSince(before),
  ...(boxed?.containersLeft ?? []).map((id) => `container ${id}`),
];

const report = {
  faulted,
  injected: {
    ...injected,
    cuts: runtime.cuts,
    cutsBeforeTaskStart: runtime.cutsUnkeyed,
    model: models,
  },
  by_fault: checked,
  resumed,
  containers: boxed,
  leaks,
  load: (await Deno.readTextFile("/proc/loadavg")).split(" ").slice(0, 3).join(" "),
};
if (values.json) {
  console.log(JSON.stringify(report));
} else {
  const show = (title: string, f: Figures) => {
    console.log(title);
    for (const [k, v] of Object.entries(f)) {
      console.log(`  ${k.padEnd(18)} ${typeof v === "object" ? JSON.stringify(v) : v}`);
    }
  };
  show("with faults injected", faulted);
  console.log(`injected           ${JSON.stringify(report.injected)}`);
  showVerdict(checked);
  show("after --resume (faults off)", resumed);
  if (boxed) {
    show("in containers, killed at random", boxed.faulted);
    console.log(`  containers killed  ${boxed.killed}`);
    show("in containers, after --resume", boxed.resumed);
  }
  console.log(`leaks              ${JSON.stringify(leaks)}`);
  console.log(`load               ${report.load}`);
}
/** No silent zero, every errored rollout lost with its container (no more than were killed), all 1 after --resume. */
function containersRight(b: NonNullable<typeof boxed>): boolean {
  const classes = Object.keys(b.faulted.errored_by_class);
  return b.faulted.graded_below_1 === 0 && b.faulted.errored <= b.killed &&
    classes.every((c) => c === "infrastructure_lost" || c === "provisioning") &&
    b.resumed.rewards["1"] === containers;
}

const ok = checked.wrong.length === 0 && checked.unexplained === 0 &&
  faulted.graded_below_1 === 0 && resumed.graded_below_1 === 0 && leaks.length === 0 &&
  resumed.graded === rollouts && resumed.rewards["1"] === rollouts &&
  (boxed === null || containersRight(boxed));
Deno.exit(ok ? 0 : 1);
