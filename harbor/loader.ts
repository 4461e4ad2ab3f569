/**
 * {@linkcode loadHarborTasks}: one Harbor task directory, or a dataset (a
 * directory of them), read into tasks; those that cannot be adapted are
 * listed with a reason code, and the others still load.
 *
 * @module
 */

import { type HarborTaskConfig, parseHarborConfig } from "./config.ts";
import { errorMessage } from "../_internal/util.ts";

/** Why a task directory cannot be adapted. */
export type HarborSkipCode =
  /** `task.toml` is not TOML, or a key has the wrong shape. */
  | "bad_config"
  /** No `instruction.md`, or an empty one. */
  | "no_instruction"
  /** No `tests/test.sh`. */
  | "no_tests"
  /** Neither `environment/Dockerfile` nor `[environment] docker_image`. */
  | "no_environment"
  /** `environment/docker-compose.yaml`: several services, which this runner does not place. */
  | "compose"
  /** `network_mode = "allowlist"` in a phase: this runner cannot hold the agent to a list of hosts yet. */
  | "network_allowlist";

/** A Harbor task, read. */
export interface HarborTask {
  /** The directory's name. */
  name: string;
  /** The directory, absolute. */
  path: string;
  /** `instruction.md`: the prompt. */
  instruction: string;
  /** `task.toml`, checked. */
  config: HarborTaskConfig;
  /** `environment/` when it holds a Dockerfile (the build context), else null (`docker_image`). */
  buildContext: string | null;
  /** `tests/`, absolute (copied into the container only at verification). */
  testsDir: string;
  /** `solution/` when it holds `solve.sh`, else null. */
  solutionDir: string | null;
}

/** A task directory that cannot be adapted. */
export interface HarborSkipped {
  /** The directory's name. */
  name: string;
  /** The directory, absolute. */
  path: string;
  /** Why, as a code. */
  code: HarborSkipCode;
  /** Why, in words. */
  reason: string;
}

/** What {@linkcode loadHarborTasks} returns. */
export interface HarborDataset {
  /** The tasks that can run, by name. */
  tasks: HarborTask[];
  /** The ones that cannot, with why. */
  skipped: HarborSkipped[];
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await Deno.stat(path)).isFile;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return false;
    throw err;
  }
}

class Skip extends Error {
  readonly code: HarborSkipCode;
  constructor(code: HarborSkipCode, message: string) {
    super(message);
    this.code = code;
  }
}

async function readTask(path: string): Promise<HarborTask> {
  const name = path.slice(path.lastIndexOf("/") + 1);
  const file = `${path}/task.toml`;
  let config: HarborTaskConfig;
  try {
    config = parseHarborConfig(await Deno.readTextFile(file), file);
  } catch (err) {
    if (err instanceof Deno.errors.PermissionDenied) throw err;
    throw new Skip("bad_config", errorMessage(err));
  }
  let instruction = "";
  try {
    instruction = await Deno.readTextFile(`${path}/instruction.md`);
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
  if (instruction.trim() === "") {
    throw new Skip("no_instruction", `${path}/instruction.md is missing or empty`);
  }
  if (!await isFile(`${path}/tests/test.sh`)) {
    throw new Skip("no_tests", `${path}/tests/test.sh is missing`);
  }
  const hasDockerfile = await isFile(`${path}/environment/Dockerfile`);
  for (const compose of ["docker-compose.yaml", "docker-compose.yml"]) {
    if (await isFile(`${path}/environment/${compose}`)) {
      throw new Skip(
        "compose",
        `${path}/environment/${compose}: multi-container tasks are not supported`,
      );
    }
  }
  refuseAllowlist(path, config);
  if (!hasDockerfile && config.environment.dockerImage === null) {
    throw new Skip(
      "no_environment",
      `${path} has neither environment/Dockerfile nor [environment] docker_image`,
    );
  }
  return {
    name,
    path,
    instruction,
    config,
    buildContext: hasDockerfile ? `${path}/environment` : null,
    testsDir: `${path}/tests`,
    solutionDir: await isFile(`${path}/solution/solve.sh`) ? `${path}/solution` : null,
  };
}

/** Skips a task with an `allowlist` phase: run `public`, it would silently lose its isolation. */
function refuseAllowlist(path: string, config: HarborTaskConfig): void {
  const phases = (["environment", "agent", "verifier"] as const)
    .filter((phase) => config.network[phase].mode === "allowlist");
  if (phases.length === 0) return;
  throw new Skip(
    "network_allowlist",
    `${path}/task.toml: network_mode "allowlist" (${
      phases.join(", ")
    }) is not enforced by this runner; it runs "public" and "no-network" phases only`,
  );
}

/**
 * Reads Harbor tasks: `path` is one task directory (it holds `task.toml`)
 * or a dataset (its subdirectories that hold one; others are ignored).
 * Tasks that cannot be adapted are in `skipped` with a code and a reason.
 *
 * @param path a task or dataset directory
 * @returns the tasks and the skipped ones, each sorted by name
 * @throws {Deno.errors.NotFound} when `path` is not a directory, or holds no task
 *
 * @example
 * ```ts
 * import { loadHarborTasks } from "./loader.ts";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * await Deno.mkdir(`${dir}/hello/tests`, { recursive: true });
 * await Deno.writeTextFile(`${dir}/hello/task.toml`, '[environment]\ndocker_image = "alpine"\n');
 * await Deno.writeTextFile(`${dir}/hello/instruction.md`, "Say hello.\n");
 * await Deno.writeTextFile(`${dir}/hello/tests/test.sh`, "echo 1 > /logs/verifier/reward.txt\n");
 * const { tasks, skipped } = await loadHarborTasks(dir);
 * assert.equal(tasks[0].instruction, "Say hello.\n");
 * assert.deepEqual(skipped, []);
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function loadHarborTasks(path: string): Promise<HarborDataset> {
  let abs: string;
  try {
    abs = await Deno.realPath(path);
    if (!(await Deno.stat(abs)).isDirectory) throw new Deno.errors.NotFound();
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
    throw new Deno.errors.NotFound(
      `Cannot load Harbor tasks: "${path}" is not a directory; give a task or dataset directory`,
    );
  }
  const dirs: string[] = [];
  if (await isFile(`${abs}/task.toml`)) {
    dirs.push(abs);
  } else {
    for await (const entry of Deno.readDir(abs)) {
      if (entry.isDirectory && await isFile(`${abs}/${entry.name}/task.toml`)) {
        dirs.push(`${abs}/${entry.name}`);
      }
    }
    dirs.sort();
  }
  if (dirs.length === 0) {
    throw new Deno.errors.NotFound(
      `Cannot load Harbor tasks: "${path}" holds no task.toml, nor directories with one`,
    );
  }
  const tasks: HarborTask[] = [];
  const skipped: HarborSkipped[] = [];
  for (const dir of dirs) {
    try {
      tasks.push(await readTask(dir));
    } catch (err) {
      if (!(err instanceof Skip)) throw err;
      skipped.push({
        name: dir.slice(dir.lastIndexOf("/") + 1),
        path: dir,
        code: err.code,
        reason: err.message,
      });
    }
  }
  return { tasks, skipped };
}
