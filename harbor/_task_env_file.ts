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
   * The task's `tests/` as the runner copies it to /tests: each file's
   * relative path to its mode and SHA-256 (`"0755:ab12..."`).
   */
  tests: Record<string, string>;
}

/**
 * Where the layer puts the task's facts: apart from /opt/hud-harbor, which
 * an exported task's image (harbor/export.ts) uses for its own.
 */
export const TASK_FILE = "/opt/hud-harbor-in/task.json";
