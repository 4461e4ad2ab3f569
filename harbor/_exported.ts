// What runs inside the image of an exported Harbor task (harbor/export.ts
// writes the image and the task folder):
//
//   deno run -A _exported.ts start   (from the image's ENTRYPOINT, before Harbor's command)
//   deno run -A _exported.ts grade   (from tests/test.sh, as Harbor's verifier)
//
// `start` waits for the environment's server that the entrypoint started in
// the background on the container's loopback (its token and port in
// CONTROL_DIR/serve.out, a file only root can read), starts the task with its
// arguments, checks the prompt is the one exported as instruction.md, and
// closes without `bye`: the task stays parked, its state in place before the
// agent acts. It writes the session id beside the token and then the READY
// file, which the task's healthcheck waits for. `grade` resumes that session,
// grades with the agent's answer (the answer file, empty when there is none),
// and writes the score to /logs/verifier/reward.json (`reward` and the
// subscores), which Harbor's verifier reads first, and reward.txt. Both are
// removed first: what the agent left there (a planted reward.json that
// Harbor would read before reward.txt) never stands as the reward, even when
// grading fails.

import { connect } from "../client.ts";
import { readAnnouncement } from "../_internal/auth.ts";
import { writePrivateText } from "../_internal/private_file.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";

/** Where the exported image keeps the server's token, port and the parked session (mode 0700). */
export const CONTROL_DIR = "/run/hud-harbor";
/** The file whose presence says the task is started (the healthcheck's test). */
export const READY_FILE = `${CONTROL_DIR}/ready`;
/** The facts of the task an exported image runs. */
export const EXPORTED_TASK_FILE = "/opt/hud-harbor/task.json";
/** Where Harbor's verifier reads the reward. */
const VERIFIER_DIR = "/logs/verifier";

/** What {@linkcode EXPORTED_TASK_FILE} holds. */
export interface ExportedTask {
  /** The template id. */
  id: string;
  /** The task's arguments. */
  args: Record<string, unknown>;
  /** The prompt exported as instruction.md (without the answer line). */
  prompt: string;
  /** Where the agent writes its answer, or null to grade with an empty one. */
  answerFile: string | null;
  /** The user without privileges Harbor runs the agent as, or null (the image's, root). */
  agentUser?: string | null;
}

/** A prompt as text: a string as it is, anything else as JSON (as `hud start` prints it). */
export function promptText(prompt: unknown): string {
  return typeof prompt === "string" ? prompt : JSON.stringify(prompt, null, 2);
}

interface Control {
  url: string;
  token: string;
  session?: string;
}

async function readTask(): Promise<ExportedTask> {
  return JSON.parse(
    await Deno.readTextFile(Deno.env.get("HUD_HARBOR_EXPORTED_TASK") ?? EXPORTED_TASK_FILE),
  ) as ExportedTask;
}

/** The token and url the server printed (HUD_SERVE_TOKEN=, HUD_SERVE_PORT=), waited for. */
async function serverLines(): Promise<Control> {
  const deadline = Date.now() + 120_000;
  while (true) {
    const text = await Deno.readTextFile(`${CONTROL_DIR}/serve.out`).catch(() => "");
    const said = text.split("\n").map(readAnnouncement);
    const token = said.find((s) => s !== null && "token" in s)?.token;
    const port = said.find((s) => s !== null && "port" in s)?.port;
    if (token !== undefined && port !== undefined) {
      return { url: `tcp://127.0.0.1:${port}`, token };
    }
    const pid = (await Deno.readTextFile(`${CONTROL_DIR}/serve.pid`).catch(() => "")).trim();
    const alive = pid === "" || await Deno.stat(`/proc/${pid}`).then(() => true, () => false);
    if (!alive || Date.now() > deadline) {
      const log = await Deno.readTextFile(`${CONTROL_DIR}/serve.log`).catch(() => "");
      const last = log.trim().split("\n").slice(-3).join(" | ");
      throw new Error(
        `Cannot start the exported task: the environment's server ${
          alive ? "did not announce its port within 120 s" : "exited"
        }${last ? `: ${last}` : ""}`,
      );
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function start(): Promise<void> {
  const task = await readTask();
  const control = await serverLines();
  await using client = await connect(control.url, {
    token: control.token,
    readyTimeout: 60_000,
    heartbeatInterval: 0,
    forward: false,
  });
  const frame = await client.startTask(task.id, task.args);
  const prompt = promptText(frame.prompt);
  if (prompt !== task.prompt) {
    throw new Error(
      `Cannot start the exported task: template "${task.id}" gave another prompt than the ` +
        `exported instruction.md (its prompt varies between starts); export a template whose ` +
        `prompt depends only on its arguments`,
    );
  }
  await writePrivateText(
    `${CONTROL_DIR}/control.json`,
    JSON.stringify({ ...control, session: client.sessionId }),
  );
  await writePrivateText(READY_FILE, "");
  // Closing without "bye" leaves the task parked for the grader.
}

/** Removes the reward files (and whatever the agent put in their place: a directory, a link). */
async function removeRewards(): Promise<void> {
  for (const name of ["reward.json", "reward.txt"]) {
    await Deno.remove(`${VERIFIER_DIR}/${name}`, { recursive: true }).catch((err) => {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    });
  }
}

/** The uid of `name` in /etc/passwd. */
async function uidOf(name: string): Promise<number> {
  const passwd = await Deno.readTextFile("/etc/passwd");
  const entry = passwd.split("\n").map((l) => l.split(":")).find((e) => e[0] === name);
  if (entry === undefined || !/^\d+$/.test(entry[2] ?? "")) {
    throw new Error(`Cannot grade the exported task: no user "${name}" in /etc/passwd`);
  }
  return Number(entry[2]);
}

/** The pids of the live processes any of whose uids (real, effective, saved, file system) is `uid`. */
async function processesOf(uid: number): Promise<number[]> {
  const pids: number[] = [];
  for await (const e of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    const status = await Deno.readTextFile(`/proc/${e.name}/status`).catch(() => "");
    // A zombie (Harbor's `sleep infinity` as PID 1 reaps none) runs nothing any more.
    if (/^State:\s+[ZX]/m.test(status)) continue;
    const uids = /^Uid:\s+(.*)$/m.exec(status)?.[1].split(/\s+/).map(Number) ?? [];
    if (uids.includes(uid)) pids.push(Number(e.name));
  }
  return pids;
}

/**
 * Kills every process of the agent's user (a user without privileges cannot
 * take another uid), again until none is left: those that fork meanwhile.
 */
async function killUser(name: string): Promise<void> {
  const uid = await uidOf(name);
  for (let round = 0; round < 100; round++) {
    const pids = await processesOf(uid);
    if (pids.length === 0) return;
    for (const pid of pids) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch {
        // gone meanwhile
      }
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(
    `Cannot grade the exported task: the processes of "${name}" (uid ${uid}) did not all end`,
  );
}

async function grade(): Promise<void> {
  const task = await readTask();
  // Nothing the agent left running may write the reward from here on.
  if (task.agentUser) await killUser(task.agentUser);
  await removeRewards();
  let control: Control;
  try {
    control = JSON.parse(await Deno.readTextFile(`${CONTROL_DIR}/control.json`)) as Control;
  } catch (err) {
    throw new Error(
      `Cannot grade the exported task: ${CONTROL_DIR}/control.json: ${errorMessage(err)}; ` +
        `the image's entrypoint did not start the task (was the image run with its ENTRYPOINT?)`,
    );
  }
  let answer = "";
  if (task.answerFile !== null) {
    try {
      answer = await Deno.readTextFile(task.answerFile);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
      console.log(`no ${task.answerFile}: grading an empty answer`);
    }
    if (answer.endsWith("\n")) answer = answer.slice(0, -1).replace(/\r$/, "");
  }
  await using client = await connect(control.url, {
    token: control.token,
    sessionId: control.session,
    readyTimeout: 30_000,
    heartbeatInterval: 0,
    forward: false,
  });
  const result = await client.grade({ answer });
  const subscores: Record<string, number> = {};
  if (isRecord(result.subscores)) {
    for (const [k, v] of Object.entries(result.subscores)) {
      if (typeof v === "number" && Number.isFinite(v)) subscores[k] = v;
    }
  }
  await Deno.mkdir(VERIFIER_DIR, { recursive: true });
  // Removed again: a process the agent left running may have written one meanwhile.
  await removeRewards();
  await Deno.writeTextFile(
    `${VERIFIER_DIR}/reward.json`,
    JSON.stringify({ ...subscores, reward: result.score }) + "\n",
    { createNew: true },
  );
  await Deno.writeTextFile(`${VERIFIER_DIR}/reward.txt`, `${result.score}\n`);
  console.log(JSON.stringify(result));
}

if (import.meta.main) {
  const step = Deno.args[0];
  try {
    if (step === "start") await start();
    else if (step === "grade") await grade();
    else throw new TypeError(`usage: _exported.ts start|grade (got "${step}")`);
  } catch (err) {
    console.error(`error: ${errorMessage(err).split("\n")[0]}`);
    Deno.exit(1);
  }
}
