// The environment a Harbor task's image serves (the layer `buildHarborImage`
// puts on the task's own image): one template, `harbor`, whose prompt is the
// instruction and whose grade is Harbor's verifier. The runner copies
// `tests/` to /tests (whole tree, dot-files) only after the agent is done;
// the grade then runs `bash /tests/test.sh` as root in the task's workdir
// with the verifier timeout, its output going to
// /logs/verifier/test-stdout.txt (a file, not a pipe: a child it leaves
// behind holding its output cannot keep the verifier from ending), and reads
// /logs/verifier/reward.json before reward.txt, as Harbor's verifier does.

import { Environment } from "../env.ts";
import { addWorkspace } from "../workspace/workspace.ts";
import { bashGrader, type ExecTarget } from "../graders/bash.ts";

/** What the image layer holds about its task, at {@linkcode TASK_FILE}. */
export interface HarborTaskFile {
  name: string;
  /** The task image's ENV. */
  env: Record<string, string>;
  instruction: string;
  workdir: string;
  verifierTimeoutSec: number;
  verifierEnv: Record<string, string>;
}

/** Where the layer puts the task's facts. */
export const TASK_FILE = "/opt/hud-harbor/task.json";
const LOGS = "/logs/verifier";
const OUTPUT_KEPT = 16_384;

const task = JSON.parse(
  await Deno.readTextFile(Deno.env.get("HUD_HARBOR_TASK_FILE") ?? TASK_FILE),
) as HarborTaskFile;

/** The task's environment. */
export const env: Environment = new Environment(`harbor-${task.name}`, { version: "1.0.0" });

// The container is the sandbox (as Harbor's own runs: the agent is the
// container's root); bubblewrap may be asked for with HUD_HARBOR_ISOLATION.
const isolation = Deno.env.get("HUD_HARBOR_ISOLATION") === "auto" ? "auto" : "none";
const workspace = addWorkspace(
  env,
  task.workdir,
  isolation === "none"
    ? { isolation, uid: 0, trackFiles: false, env: task.env }
    : { trackFiles: false, env: task.env },
);

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

function tail(s: string): string {
  return s.length <= OUTPUT_KEPT ? s : s.slice(s.length - OUTPUT_KEPT);
}

/** Reads the reward Harbor's way: reward.json (name → number), else reward.txt (one number). */
async function readReward(): Promise<{ score: number; subscores: Record<string, number> }> {
  const json = `${LOGS}/reward.json`;
  if (await exists(json)) {
    const text = (await Deno.readTextFile(json)).trim();
    if (text === "") throw new Error(`Cannot grade Harbor task: ${json} is empty`);
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      throw new Error(`Cannot grade Harbor task: ${json} is not JSON: ${text.slice(0, 80)}`);
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      throw new Error(`Cannot grade Harbor task: ${json} must be an object of numbers`);
    }
    const subscores: Record<string, number> = {};
    for (const [k, v] of Object.entries(parsed)) {
      const n = typeof v === "boolean" ? Number(v) : v;
      if (typeof n !== "number" || !Number.isFinite(n)) {
        throw new Error(`Cannot grade Harbor task: ${json}: "${k}" is not a number`);
      }
      subscores[k] = n;
    }
    const values = Object.values(subscores);
    if (values.length === 0) throw new Error(`Cannot grade Harbor task: ${json} has no rewards`);
    // "reward" is the score when given; else the mean of the keys.
    const score = subscores.reward ?? values.reduce((a, b) => a + b, 0) / values.length;
    return { score, subscores };
  }
  const txt = `${LOGS}/reward.txt`;
  if (await exists(txt)) {
    const text = (await Deno.readTextFile(txt)).trim();
    if (text === "") throw new Error(`Cannot grade Harbor task: ${txt} is empty`);
    const score = Number(text);
    if (!Number.isFinite(score)) {
      throw new Error(`Cannot grade Harbor task: ${txt} is not a number: "${text.slice(0, 80)}"`);
    }
    return { score, subscores: {} };
  }
  throw new Error(
    `Cannot grade Harbor task: no reward written: tests/test.sh wrote neither ${LOGS}/reward.json nor ${LOGS}/reward.txt`,
  );
}

env.template(
  { id: "harbor", description: `Harbor task ${task.name}` },
  async function* () {
    yield { prompt: task.instruction, bindings: { shell: { cwd: task.workdir } } };
    if (!await exists("/tests/test.sh")) {
      throw new Error("Cannot grade Harbor task: /tests/test.sh was not copied in");
    }
    await Deno.remove(LOGS, { recursive: true }).catch(() => {});
    await Deno.mkdir(LOGS, { recursive: true });
    // The agent's leftover processes stay stopped while the verifier runs.
    await using phase = await workspace.grading();
    const target: ExecTarget = { exec: (argv, options) => phase.exec(argv, options) };
    const timeoutSec = task.verifierTimeoutSec;
    const ran = await bashGrader(
      target,
      ["bash", "-c", `exec bash /tests/test.sh > ${LOGS}/test-stdout.txt 2>&1 < /dev/null`],
      { name: "verifier", cwd: task.workdir, timeoutMs: timeoutSec * 1000, env: task.verifierEnv },
    );
    const output = await Deno.readTextFile(`${LOGS}/test-stdout.txt`).catch(() => "");
    const verifier = { ...ran.info, stdout: tail(output) };
    if (ran.info?.timed_out) {
      throw new Error(
        `Cannot grade Harbor task: verifier timed out after ${timeoutSec} s ([verifier] timeout_sec); last output: ${
          tail(output).trim().split("\n").slice(-3).join(" | ")
        }`,
      );
    }
    const { score, subscores } = await readReward();
    yield { score, subscores, info: { verifier } };
  },
);
