// A Harbor task whose verifier runs in a container of its own (`[verifier]
// environment_mode = "separate"`): once the agent is done (however it
// ended), its container leaves the network (Harbor stops it before the
// verifier's starts; here its server must still answer the grade), what
// Harbor carries across is collected from it, and the verifier runs in a
// fresh container (harbor/_verifier_container.ts). The verdict is handed
// to the grade as the answer (harbor/_task_env.ts), with the error that
// kept the verifier from giving one; a grade that comes back other than the
// verdict (the agent's container altered its server) is not counted.

import type { RolloutObserver } from "../eval/rollout.ts";
import type { Placement } from "../runtime/placement.ts";
import type { Run } from "../eval/run.ts";
import { EngineClient } from "../engines/_engine.ts";
import type { HarborTask } from "./loader.ts";
import { type HarborVerifierImage, tarTree } from "./image.ts";
import {
  ARTIFACTS_DIR,
  collectArtifacts,
  type Verdict,
  type VerifierSpec,
  verifyInContainer,
} from "./_verifier_container.ts";
import { VERDICT_KEY } from "./_task_env_file.ts";
import { errorMessage } from "../_internal/util.ts";

/** The verdict each run's verifier gave, as the runner read it from the verifier's container. */
const verdicts = new WeakMap<Run, Verdict>();

/**
 * Why `run`'s grade is not the verdict its separate verifier gave (it
 * passes back through the server in the agent's container), or null.
 */
export function alteredVerdict(run: Run): string | null {
  const verdict = verdicts.get(run);
  const grade = run.grade;
  if (verdict === undefined || grade === null) return null;
  const same = grade.reward === verdict.score &&
    JSON.stringify(grade.subscores ?? {}) === JSON.stringify(verdict.subscores);
  if (same) return null;
  return `Cannot grade Harbor task: the grade (${grade.reward}) is not the verdict of the verifier's own container (${verdict.score})`;
}

/** The agent's container of a run, as the runner placed it. */
export interface PlacedContainer {
  /** The container's id. */
  id: string;
  /** The engine socket it runs on. */
  socket: string | undefined;
  /** Its placement's network switch, when its network changes by phase. */
  enterPhase?: Placement["enterPhase"];
}

/** How the verifier's container is made for `task`, its image `image`. */
async function verifierSpec(task: HarborTask, image: HarborVerifierImage): Promise<VerifierSpec> {
  const config = task.config;
  const env = config.verifierEnvironment!;
  const into = image.testsInto;
  return {
    image: image.image,
    task: { name: task.name, path: task.path },
    user: config.verifierUser,
    workdir: image.workdir,
    // Harbor puts the environment's variables under each command's, the verifier's over them.
    env: { ...env.env, ...config.verifierEnv },
    timeoutSec: config.verifierTimeoutSec,
    cpus: env.cpus,
    memoryMb: env.memoryMb,
    network: config.network.verifier.mode === "public",
    testsInto: into === null
      ? null
      : { dir: into, tar: await tarTree(task.testsDir, into.replace(/^\/+/, "")) },
  };
}

/** What Harbor carries from the agent's container to the verifier's: /logs/artifacts, then `artifacts`. */
export function carriedPaths(task: HarborTask): string[] {
  return [...new Set([ARTIFACTS_DIR, ...task.config.artifacts.map((a) => a.source)])];
}

async function verdictOf(
  task: HarborTask,
  image: HarborVerifierImage,
  agent: PlacedContainer,
  signal: AbortSignal,
): Promise<Verdict> {
  // Off the network first: nothing it left running reaches the verifier's container.
  await agent.enterPhase?.("verifier", { signal });
  using engine = await EngineClient.open(agent.socket, signal);
  const collected = await collectArtifacts(engine, agent.id, carriedPaths(task), signal);
  return await verifyInContainer(agent.socket, await verifierSpec(task, image), collected, signal);
}

/**
 * The observer that verifies a "separate" task once its agent is done: the
 * verdict (or why there is none) becomes the answer the grade reads.
 *
 * @param placed the agent's container of a run, by its client's url
 */
export function separateVerifier(
  task: HarborTask,
  image: HarborVerifierImage,
  placed: (clientUrl: string) => PlacedContainer,
): RolloutObserver {
  return {
    after: async (run, signal) => {
      let verdict: Verdict | { error: string };
      try {
        verdict = await verdictOf(task, image, placed(run.client.url), signal);
        verdicts.set(run, verdict);
      } catch (err) {
        verdict = { error: errorMessage(err) };
      }
      run.answer = { [VERDICT_KEY]: verdict };
    },
  };
}
