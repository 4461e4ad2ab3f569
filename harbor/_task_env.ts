// The environment a Harbor task's image serves (the layer `buildHarborImage`
// puts on the task's own image): one template, `harbor`, whose prompt is the
// instruction and whose grade is Harbor's verifier; in a task with
// `[[steps]]`, started once per step in order (`{ step: i }`), with the
// step's prompt and verifier (harbor/_steps.ts runs them). Before the prompt,
// `[environment.healthcheck]` is awaited as Harbor's `run_healthcheck` does
// (environments/base.py: failures in the start period do not count; then
// `retries` consecutive ones fail the task), as the image's USER. The
// agent's shell runs as `[agent] user` and the verifier as
// `[verifier] user` (each the image's USER, else root, when not given),
// names and groups resolved in the image's /etc/passwd and /etc/group as
// `docker exec -u` does. The runner copies `tests/` to /tests (whole tree,
// dot-files) only after the agent is done; the grade then runs
// `bash /tests/test.sh` in the task's workdir with the verifier timeout, its
// output going to /logs/verifier/test-stdout.txt (a file, not a pipe: a
// child it leaves behind holding its output cannot keep the verifier from
// ending), and reads /logs/verifier/reward.json before reward.txt, as
// Harbor's verifier does. A task whose verifier has a container of its own
// ("separate") is graded by the verdict the runner hands in as the answer
// (harbor/_separate.ts ran the verifier there): nothing here runs it.
//
// Integrity (SECURITY.md): the task's facts (the verifier's variables, the
// tests' hashes) are read once and their file removed before any agent
// connects; the verifier's shell is the `bash` found on its PATH at the
// start, run by that path; and what the agent planted for the verifier to
// run (harbor/_tamper.ts) ends the rollout `tampered`, graded 0, with the
// files named, instead of running the verifier. What the agent runs, and
// all it leaves running, cannot change /logs/verifier or /tests (the
// workspace's `protect`, Landlock) and runs on while the verifier runs, as
// under `docker exec`; on a kernel without Landlock it is stopped instead
// (in the workspace's view or detached from it: harbor/_strays.ts) before
// /logs/verifier is emptied and until the verifier is done.

import { Environment } from "../env.ts";
import { addWorkspace } from "../workspace/workspace.ts";
import { killTrees } from "../workspace/_processes.ts";
import { inheritedProxyEnv } from "../workspace/_egress_relay.ts";
import { bashGrader, type ExecTarget } from "../graders/bash.ts";
import type { WorkspaceExecOptions, WorkspaceExecResult } from "../workspace/workspace.ts";
import { type HarborTaskFile, TASK_FILE, VERDICT_KEY } from "./_task_env_file.ts";
import type { HarborHealthcheckConfig } from "./config.ts";
import { treeDiff, treeFiles } from "./_tree.ts";
import { readReward, type Reward, VERIFIER_LOGS as LOGS } from "./_reward.ts";
import { TamperBaseline, VerificationWatch, VerifierLayout } from "./_tamper.ts";
import { ProcessBaseline } from "./_strays.ts";
import { landlockAbi } from "../workspace/_landlock.ts";
import { reachableSync } from "../_internal/fs.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import { shellQuote } from "../_internal/shell.ts";

const OUTPUT_KEPT = 16_384;
const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const taskFile = Deno.env.get("HUD_HARBOR_TASK_FILE") ?? TASK_FILE;
const task = JSON.parse(await Deno.readTextFile(taskFile)) as HarborTaskFile;
// It holds the verifier's variables (a judge's key) and the tests' hashes: from
// here on in this process only, before any agent connects.
await Deno.remove(taskFile).catch(() => {});

/** The task's environment. */
export const env: Environment = new Environment(`harbor-${task.name}`, { version: "1.0.0" });

/** A user resolved in the image: ids, and the home directory /etc/passwd gives. */
interface ImageUser {
  uid: number;
  gid: number;
  home: string;
}

function entries(file: string): string[][] {
  try {
    return Deno.readTextFileSync(file).split("\n").filter((l) => l.includes(":")).map((l) =>
      l.split(":")
    );
  } catch {
    return [];
  }
}

/**
 * `spec` as `docker exec -u` takes it: a name or uid, optionally `:group`
 * (a name or gid); a uid not in /etc/passwd gets gid 0, a name its primary
 * group.
 */
function resolveUser(spec: string, what: string): ImageUser {
  if (spec === "") return { uid: 0, gid: 0, home: "/root" };
  const [name, group] = spec.split(":");
  const passwd = entries("/etc/passwd");
  const numeric = /^\d+$/.test(name);
  const entry = passwd.find((e) => numeric ? e[2] === name : e[0] === name);
  if (entry === undefined && !numeric) {
    throw new Error(
      `Cannot start Harbor task: ${what} "${spec}": no user "${name}" in the image's /etc/passwd`,
    );
  }
  const uid = Number(numeric ? name : entry![2]);
  let gid = entry === undefined ? 0 : Number(entry[3]);
  if (group !== undefined) {
    if (/^\d+$/.test(group)) gid = Number(group);
    else {
      const g = entries("/etc/group").find((e) => e[0] === group);
      if (g === undefined) {
        throw new Error(
          `Cannot start Harbor task: ${what} "${spec}": no group "${group}" in the image's /etc/group`,
        );
      }
      gid = Number(g[2]);
    }
  }
  return { uid, gid, home: entry?.[5] || (uid === 0 ? "/root" : "/") };
}

/** The users, resolved once; an error is kept to fail the task's start with. */
function users():
  | { agent: ImageUser; verifier: ImageUser; image: ImageUser; steps: ImageUser[] }
  | Error {
  try {
    return {
      agent: resolveUser(task.agentUser ?? task.imageUser, "[agent] user"),
      verifier: resolveUser(task.verifierUser ?? task.imageUser, "[verifier] user"),
      image: resolveUser(task.imageUser, "the image's USER"),
      steps: (task.steps ?? []).map((s) =>
        resolveUser(s.verifierUser ?? task.imageUser, `[[steps]] "${s.name}" [verifier] user`)
      ),
    };
  } catch (err) {
    return err as Error;
  }
}
const resolved = users();
const agentUser = resolved instanceof Error ? { uid: 0, gid: 0, home: "/root" } : resolved.agent;

// The container is the sandbox (as Harbor's own runs); bubblewrap may be
// asked for with HUD_HARBOR_ISOLATION.
const isolation = Deno.env.get("HUD_HARBOR_ISOLATION") === "auto" ? "auto" : "none";
// Where the kernel has Landlock, nothing the agent runs (nor leaves running)
// can change /logs/verifier or /tests, and what it leaves runs on while the
// verifier runs, as under `docker exec`; elsewhere what it left is stopped
// meanwhile (holdAgent()).
// A separate verifier reads nothing of this container but what the runner carries out, so
// there is nothing here to keep: the agent gets all of `docker exec`'s freedom.
const protect = isolation === "none" && !task.separate && await landlockAbi() > 0
  ? [LOGS, "/tests"]
  : [];
const workspace = addWorkspace(
  env,
  task.workdir,
  {
    ...(isolation === "none" ? { isolation } : {}),
    // Under bubblewrap a root agent takes a uid of the workspace's own, as before.
    ...(isolation === "none" || agentUser.uid !== 0
      ? { uid: agentUser.uid, gid: agentUser.gid }
      : {}),
    // As `docker exec`: root keeps the container's capabilities (Docker's default set), and
    // what a command starts outlives it.
    ...(isolation === "none" ? { capabilities: "inherit" as const, lifetime: "workspace" } : {}),
    protect,
    trackFiles: false,
    env: task.env,
  },
);

/** The variables of a command run as `user`: the image's, the task's, then `extra`. */
function commandEnv(user: ImageUser, extra: Record<string, string> = {}): Record<string, string> {
  // The container's proxy variables (an allowlist phase), as `docker exec` inherits them.
  return { PATH: DEFAULT_PATH, HOME: user.home, ...inheritedProxyEnv(), ...task.env, ...extra };
}

/** Where the verifier finds what it runs, as its variables say. */
function verifierLayout(user: ImageUser, verifierEnv: Record<string, string>): VerifierLayout {
  const env = commandEnv(user, verifierEnv);
  return new VerifierLayout({
    workdir: task.workdir,
    path: env.PATH,
    pythonPath: env.PYTHONPATH ?? "",
    home: env.HOME,
  });
}

/**
 * Runs `argv` as `user` (setpriv), in a session of its own that a time-out
 * kills whole, with the image's variables: Harbor's `docker exec -u USER`,
 * root keeping the container's capabilities (Docker's default set), another
 * user none. Output is not kept (the verifier writes a file).
 */
async function runAs(
  user: ImageUser,
  argv: string[],
  options: WorkspaceExecOptions,
): Promise<WorkspaceExecResult> {
  const started = performance.now();
  const child = new Deno.Command("setpriv", {
    args: [
      // Root stays root (without CAP_SETGID even clearing groups is refused).
      ...(user.uid === 0 && user.gid === 0
        ? []
        : [`--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups"]),
      "--inh-caps=-all",
      ...(user.uid === 0 ? [] : ["--bounding-set=-all"]),
      "--no-new-privs",
      "--",
      ...argv,
    ],
    cwd: options.cwd ?? task.workdir,
    clearEnv: true,
    env: commandEnv(user, options.env),
    detached: true,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let timedOut = false;
  const timer = options.timeout === undefined ? undefined : setTimeout(() => {
    timedOut = true;
    killTrees([child.pid]);
  }, options.timeout);
  try {
    const out = await child.output();
    return {
      code: out.signal === null ? out.code : null,
      signal: out.signal,
      stdout: "",
      stderr: new TextDecoder().decode(out.stderr).slice(-OUTPUT_KEPT),
      timedOut,
      durationMs: performance.now() - started,
    };
  } finally {
    clearTimeout(timer);
  }
}

/** Harbor's `run_healthcheck` of `hc`, as the image's USER in the workdir. */
async function awaitHealthy(user: ImageUser, hc: HarborHealthcheckConfig | null): Promise<void> {
  if (hc === null) return;
  const startPeriodEnd = performance.now() + hc.startPeriodSec * 1000;
  let failures = 0;
  while (true) {
    const inStartPeriod = performance.now() < startPeriodEnd;
    const r = await runAs(user, ["bash", "-c", hc.command], { timeout: hc.timeoutSec * 1000 });
    if (r.timedOut) {
      throw new Error(
        `Cannot start Harbor task: healthcheck timed out after ${hc.timeoutSec} s: ${hc.command}`,
      );
    }
    if (r.code === 0) return;
    if (!inStartPeriod && ++failures >= hc.retries) {
      throw new Error(
        `Cannot start Harbor task: healthcheck failed after ${hc.retries} retries: ${hc.command}`,
      );
    }
    const wait = inStartPeriod ? hc.startIntervalSec : hc.intervalSec;
    await new Promise((r) => setTimeout(r, wait * 1000));
  }
}

function tail(s: string): string {
  return s.length <= OUTPUT_KEPT ? s : s.slice(s.length - OUTPUT_KEPT);
}

/** Checks that tests/ was copied in, and empties /logs/verifier for the verifier. */
async function prepareVerification(): Promise<void> {
  if (!reachableSync("/tests/test.sh")) {
    throw new Error("Cannot grade Harbor task: /tests/test.sh was not copied in");
  }
  await Deno.remove(LOGS, { recursive: true }).catch(() => {});
  await Deno.mkdir(LOGS, { recursive: true });
  await Deno.chmod(LOGS, 0o777);
}

/**
 * Checks that /tests is the tree the runner copied in: the agent's leftover
 * processes ran while it was copied, and the agent could make /tests before
 * (a conftest.py added, a test.sh changed, a symlink planted each stop it).
 */
async function checkTests(tests: Record<string, string>): Promise<void> {
  const changed = treeDiff(tests, await treeFiles("/tests", true).catch(() => ({})));
  if (changed.length === 0) return;
  throw new Error(
    `Cannot grade Harbor task: /tests is not the task's tests/ as copied in: ${
      changed.slice(0, 3).join(", ")
    }${
      changed.length > 3 ? ` and ${changed.length - 3} more` : ""
    } (the agent or a process it left wrote there; the image's own /tests, if it has one, counts too)`,
  );
}

/** What one run of the verifier gave: how it ended, its output, what was planted while it ran. */
interface Verified {
  info: Record<string, unknown>;
  output: string;
  planted: string[];
}

/**
 * What one verification runs with: the task's verifier, or a step's (its
 * user, variables, time limit and /tests), and the baseline the agent's
 * work is compared with, taken before any agent ran.
 */
interface Verification {
  user: ImageUser;
  env: Record<string, string>;
  timeoutSec: number;
  tests: Record<string, string>;
  layout: VerifierLayout;
  baseline: TamperBaseline;
}

/**
 * The verifications of the task: one, or one per step. All are taken at
 * once, before the first agent runs: what an agent plants in one step (or a
 * process it leaves plants after that step was graded) is measured against
 * the image as it was, and found when a later step is graded.
 */
function verifications(u: { verifier: ImageUser; steps: ImageUser[] }): Verification[] {
  const of = (
    user: ImageUser,
    env: Record<string, string>,
    timeoutSec: number,
    tests: Record<string, string>,
  ) => {
    const layout = verifierLayout(user, env);
    return {
      user,
      env,
      timeoutSec,
      tests,
      layout,
      baseline: new TamperBaseline(layout, task.workdir),
    };
  };
  if (task.steps === null) {
    return [of(u.verifier, task.verifierEnv, task.verifierTimeoutSec, task.tests)];
  }
  return task.steps.map((s, i) => of(u.steps[i], s.verifierEnv, s.verifierTimeoutSec, s.tests));
}

/** Runs `tests/test.sh` as the verification's user with the baseline's shell, watching what the rules watch. */
async function runVerifier(v: Verification): Promise<Verified> {
  const { user, layout, baseline } = v;
  const target: ExecTarget = { exec: (argv, options = {}) => runAs(user, argv, options) };
  const shell = baseline.shell;
  const watch = new VerificationWatch(layout.watched());
  const planted: string[] = [];
  let ran;
  try {
    ran = await bashGrader(
      target,
      [
        shell,
        "-c",
        `exec ${shellQuote(shell)} /tests/test.sh > ${LOGS}/test-stdout.txt 2>&1 < /dev/null`,
      ],
      {
        name: "verifier",
        cwd: task.workdir,
        timeout: v.timeoutSec * 1000,
        env: v.env,
      },
    );
  } finally {
    planted.push(...await watch.stop(baseline));
  }
  const output = await Deno.readTextFile(`${LOGS}/test-stdout.txt`).catch(() => "");
  return { info: ran.info ?? {}, output, planted };
}

/** The reward test.sh wrote, or why there is none. */
async function rewardOf(verified: Verified, timeoutSec: number): Promise<Reward> {
  const { info, output } = verified;
  if (info.timed_out) {
    throw new Error(
      `Cannot grade Harbor task: verifier timed out after ${timeoutSec} s ([verifier] timeout_sec); last output: ${
        tail(output).trim().split("\n").slice(-3).join(" | ")
      }`,
    );
  }
  try {
    return await readReward();
  } catch (err) {
    // What kept test.sh from running (setpriv refused the user, say).
    const said = String(info.stderr ?? "").trim().split("\n").slice(-2).join(" | ");
    if (said === "") throw err;
    throw new Error(`${errorMessage(err)}; starting it said: ${said}`, { cause: err });
  }
}

/** The verifications, made when the first step starts; the step that starts next. */
let prepared: Verification[] | null = null;
/** The container's processes when the first step started: others are the agent's. */
let processes: ProcessBaseline | null = null;
let nextStep = 0;

/** The step `args` name: its index in `[[steps]]` (0 for a task of one step). */
function stepOf(args: Record<string, unknown>): number {
  const step = args.step ?? 0;
  const count = task.steps?.length ?? 1;
  if (typeof step !== "number" || !Number.isSafeInteger(step) || step < 0 || step >= count) {
    throw new RangeError(
      `Cannot start Harbor task: step must be an integer from 0 to ${count - 1}, got ${
        JSON.stringify(step)
      }`,
    );
  }
  // Steps run once each, in order, in this container, as Harbor runs them.
  if (step !== nextStep) {
    throw new RangeError(
      `Cannot start Harbor task: step ${step} out of order (step ${nextStep} is next)`,
    );
  }
  return step;
}

/**
 * Without Landlock: the agent's processes, those the workspace knows and
 * those detached from it, stopped until the verifier is done, so that
 * nothing it left can write the reward once /logs/verifier is emptied.
 */
async function holdAgent(): Promise<AsyncDisposable> {
  const phase = await workspace.grading();
  try {
    const strays = await processes!.hold();
    return {
      async [Symbol.asyncDispose]() {
        await strays[Symbol.asyncDispose]();
        await phase.end();
      },
    };
  } catch (err) {
    await phase.end();
    throw err;
  }
}

/**
 * Grades the agent's work: /tests checked, the planted files looked for,
 * then the verifier; without Landlock, the agent's processes held
 * meanwhile.
 */
async function* grade(v: Verification): AsyncGenerator<unknown, void, unknown> {
  await using _held = protect.length > 0 ? null : await holdAgent();
  await prepareVerification();
  await checkTests(v.tests);
  // What the agent planted for the verifier to run: it does not run.
  const planted = v.baseline.compare();
  if (planted.length > 0) {
    yield { score: 0, info: { tampered: planted } };
    return;
  }
  const verified = await runVerifier(v);
  const verifier = { ...verified.info, stdout: tail(verified.output) };
  // Planted while it ran (and maybe removed again): its reward does not stand.
  if (verified.planted.length > 0) {
    yield { score: 0, info: { tampered: verified.planted, verifier } };
    return;
  }
  const reward = await rewardOf(verified, v.timeoutSec);
  yield { score: reward.score, subscores: reward.subscores, info: { verifier } };
}

/**
 * The grade of a task whose verifier ran in a container of its own: the
 * verdict the runner handed in as the answer (it ran the verifier there),
 * or its error.
 */
function separateGrade(answer: unknown): unknown {
  const verdict = isRecord(answer) ? answer[VERDICT_KEY] : undefined;
  if (!isRecord(verdict)) {
    throw new Error(
      "Cannot grade Harbor task: no verdict from the verifier's own container was handed in",
    );
  }
  if (typeof verdict.error === "string") throw new Error(verdict.error);
  const { score, subscores, info } = verdict;
  const numbers = isRecord(subscores) &&
    Object.values(subscores).every((v) => typeof v === "number" && Number.isFinite(v));
  if (typeof score !== "number" || !Number.isFinite(score) || !numbers || !isRecord(info)) {
    throw new Error("Cannot grade Harbor task: the verdict handed in is not of its shape");
  }
  return { score, subscores, info };
}

env.template(
  {
    id: "harbor",
    description: `Harbor task ${task.name}`,
    // `step`: which of `[[steps]]` (a task of one step takes none).
    extraArgs: true,
  },
  async function* (args: Record<string, unknown>) {
    if (resolved instanceof Error) throw resolved;
    const step = stepOf(args);
    nextStep = step + 1;
    if (step === 0) {
      // Harbor's bind mounts, writable for every user (environments/docker/docker.py).
      for (const dir of ["/logs/agent", LOGS, "/logs/artifacts"]) {
        await Deno.mkdir(dir, { recursive: true });
        await Deno.chmod(dir, 0o777);
      }
      await awaitHealthy(resolved.image, task.healthcheck);
      // A separate verifier sees nothing of this container but what the runner copies out.
      prepared = task.separate ? [] : verifications(resolved);
      if (protect.length === 0) processes = new ProcessBaseline();
    } else {
      // Harbor empties /tests before it uploads a step's: the copy is the step's alone.
      await Deno.remove("/tests", { recursive: true }).catch(() => {});
    }
    const facts = task.steps?.[step];
    await awaitHealthy(resolved.image, facts?.healthcheck ?? null);
    const answer = yield {
      prompt: facts?.instruction ?? task.instruction,
      bindings: { shell: { cwd: task.workdir } },
    };
    if (task.separate) yield separateGrade(answer);
    else yield* grade(prepared![step]);
  },
);
