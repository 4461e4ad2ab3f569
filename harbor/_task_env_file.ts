// What the layer `buildHarborImage` puts on a Harbor task's image holds
// about its task (read by `_task_env.ts` inside the container).

import type { HarborHealthcheckConfig } from "./config.ts";

/** The task's facts, at {@linkcode TASK_FILE}. */
export interface HarborTaskFile {
  name: string;
  /** The task image's ENV. */
  env: Record<string, string>;
  instruction: string;
  workdir: string;
  verifierTimeoutSec: number;
  verifierEnv: Record<string, string>;
  /** The task image's USER ("" for root). */
  imageUser: string;
  /** `[agent] user`, or null for the image's USER. */
  agentUser: string | null;
  /** `[verifier] user`, or null for the image's USER. */
  verifierUser: string | null;
  /** `[environment.healthcheck]`, or null. */
  healthcheck: HarborHealthcheckConfig | null;
  /**
   * Whether the verifier runs in a container of its own ("separate"): the
   * runner runs it there, and the grade is the verdict it hands in as the answer.
   */
  separate: boolean;
  /**
   * The task's `tests/` as the runner copies it to /tests: each file's
   * relative path to its mode and SHA-256 (`"0755:ab12..."`).
   */
  tests: Record<string, string>;
  /** `[[steps]]`, in order, or null for a task of one step. */
  steps: HarborStepFacts[] | null;
}

/** One step of a multi-step task, as the server runs it. */
export interface HarborStepFacts {
  name: string;
  instruction: string;
  verifierTimeoutSec: number;
  /** The task's `[verifier] env` with the step's over it. */
  verifierEnv: Record<string, string>;
  /** The step's `[verifier] user`, else the task's, or null for the image's USER. */
  verifierUser: string | null;
  /** The step's healthcheck, awaited before its prompt, or null. */
  healthcheck: HarborHealthcheckConfig | null;
  /** /tests as the runner copies it for this step: the task's `tests/`, the step's over it. */
  tests: Record<string, string>;
}

/**
 * Where the layer puts the task's facts: apart from /opt/hud-harbor, which
 * an exported task's image (harbor/export.ts) uses for its own.
 */
export const TASK_FILE = "/opt/hud-harbor-in/task.json";

/**
 * The key of the answer under which the runner hands a separate verifier's
 * verdict (`{ score, subscores, info }`, or `{ error }`) to the grade.
 */
export const VERDICT_KEY = "harbor_verifier";
