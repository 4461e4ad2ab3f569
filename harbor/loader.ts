/**
 * {@linkcode loadHarborTasks}: one Harbor task directory, or a dataset (a
 * directory of them), read into tasks; those that cannot be adapted are
 * listed with a reason code, and the others still load.
 *
 * @module
 */

import { type HarborStepConfig, type HarborTaskConfig, parseHarborConfig } from "./config.ts";
import { errorMessage } from "../_internal/util.ts";
import { exists } from "../_internal/fs.ts";
import { type ComposeProject, ComposeRefusal, findComposeFile, parseCompose } from "./_compose.ts";

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
  /**
   * `environment/docker-compose.yaml` (or .yml) that uses a compose feature
   * this runner does not carry out (named), or a compose file with `[[steps]]`
   * or a separate verifier.
   */
  | "compose"
  /** A file the loader reads or copies is a symlink out of the task folder, not a regular file, or over its size bound. */
  | "bad_file"
  /** `[environment] gpus` above 0: containers get no GPUs here, as under Harbor's Docker environment. */
  | "gpu"
  /**
   * `[verifier] environment_mode = "separate"` that this runner cannot place:
   * with `[[steps]]`, with no image for the verifier (neither `tests/Dockerfile`
   * nor a `docker_image`), with `artifacts` that `exclude` files, or with
   * `[[verifier.collect]]` hooks.
   */
  | "separate_verifier"
  /** `network_mode = "allowlist"` for a separate verifier's container (its own container has no egress proxy). */
  | "network_allowlist"
  /** A `[[steps]]` setting this runner does not carry out yet (named), or a step's `workdir/`. */
  | "steps";

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
  /**
   * In "separate" verifier mode, `tests/` when it holds a Dockerfile: the
   * build context of the verifier's image, as Harbor builds it; else null
   * (the verifier environment's `docker_image`).
   */
  verifierBuildContext: string | null;
  /** `solution/` when it holds `solve.sh`, else null. */
  solutionDir: string | null;
  /** `[[steps]]`, in order, each with its files; null for a task of one step. */
  steps: HarborStep[] | null;
  /**
   * `environment/docker-compose.yaml` (or .yml), checked: the services
   * started beside the agent's (`main`); null when the task has none.
   */
  compose: ComposeProject | null;
}

/** One step of a multi-step task, read. */
export interface HarborStep {
  /** `steps/NAME/instruction.md`: the step's prompt. */
  instruction: string;
  /** Its `[[steps]]` table, the task's settings where it gives none. */
  config: HarborStepConfig;
  /**
   * `steps/NAME/tests/` when it exists, else null: copied to /tests over the
   * task's `tests/`, as Harbor's verifier uploads both; its `test.sh`, else
   * the task's, runs.
   */
  testsDir: string | null;
  /**
   * What the oracle runs: `steps/NAME/solution/` when it exists (null when
   * it holds no `solve.sh`), else the task's `solution/` when it holds `solve.sh`, else null.
   */
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

/** What `task.toml` and `instruction.md` may hold, in bytes. */
const TEXT_LIMIT = 1 << 20;

class Skip extends Error {
  readonly code: HarborSkipCode;
  constructor(code: HarborSkipCode, message: string) {
    super(message);
    this.code = code;
  }
}

/** Whether `path` (resolved) lies in `dir` (resolved). */
function inside(path: string, dir: string): boolean {
  return path === dir || path.startsWith(`${dir}/`);
}

/**
 * Whether `path` is a regular file of the task at `task` (missing: false).
 * A symlink out of the folder, or anything but a regular file, is refused
 * without being read: task folders are untrusted input.
 */
async function isFile(path: string, task: string): Promise<boolean> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.lstat(path);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return false;
    throw err;
  }
  if (info.isSymlink) {
    const to = await Deno.readLink(path);
    const real = await Deno.realPath(path).catch(() => null);
    if (real === null) return false;
    if (!inside(real, task)) {
      throw new Skip("bad_file", `${path} leads outside the task folder (to "${to}")`);
    }
    info = await Deno.stat(real);
  }
  if (info.isDirectory) return false;
  if (!info.isFile) throw new Skip("bad_file", `${path} is not a regular file`);
  return true;
}

/** `path`'s text (`""` when missing), checked by {@linkcode isFile} and bounded. */
async function readText(path: string, task: string): Promise<string> {
  if (!await isFile(path, task)) return "";
  using file = await Deno.open(path);
  // The file opened is the one checked: a swap in between is seen here.
  const info = await file.stat();
  if (!info.isFile) throw new Skip("bad_file", `${path} is not a regular file`);
  if (info.size > TEXT_LIMIT) {
    throw new Skip(
      "bad_file",
      `${path} holds ${info.size} bytes, over the ${TEXT_LIMIT} it may hold`,
    );
  }
  const bytes = new Uint8Array(TEXT_LIMIT + 1);
  let n = 0;
  while (n < bytes.length) {
    const read = await file.read(bytes.subarray(n));
    if (read === null) break;
    n += read;
  }
  if (n > TEXT_LIMIT) {
    throw new Skip("bad_file", `${path} holds over the ${TEXT_LIMIT} bytes it may hold`);
  }
  return new TextDecoder().decode(bytes.subarray(0, n));
}

/**
 * Checks a tree the runner copies (tests/, solution/, environment/): no
 * symlink in it leads outside the task folder, and it holds only
 * directories, regular files and symlinks.
 */
async function checkTree(dir: string, task: string): Promise<void> {
  const stack = [dir];
  while (stack.length > 0) {
    const at = stack.pop()!;
    let entries: Deno.DirEntry[];
    try {
      entries = await Array.fromAsync(Deno.readDir(at));
    } catch (err) {
      if (err instanceof Deno.errors.NotFound || err instanceof Deno.errors.NotADirectory) continue;
      throw err;
    }
    for (const e of entries) {
      const path = `${at}/${e.name}`;
      if (e.isDirectory) stack.push(path);
      else if (e.isSymlink) {
        const real = await Deno.realPath(path).catch(() => null);
        if (real !== null && !inside(real, task)) {
          throw new Skip(
            "bad_file",
            `${path} is a symlink that leads outside the task folder (to "${await Deno.readLink(
              path,
            )}")`,
          );
        }
      } else if (!e.isFile) throw new Skip("bad_file", `${path} is not a regular file`);
    }
  }
}

async function readTask(path: string): Promise<HarborTask> {
  const name = path.slice(path.lastIndexOf("/") + 1);
  const file = `${path}/task.toml`;
  const toml = await readText(file, path);
  let config: HarborTaskConfig;
  try {
    config = parseHarborConfig(toml, file);
  } catch (err) {
    throw new Skip("bad_config", errorMessage(err));
  }
  const solutionDir = await isFile(`${path}/solution/solve.sh`, path) ? `${path}/solution` : null;
  // A multi-step task's prompts and tests are its steps'.
  const steps = config.steps === null ? null : await readSteps(path, config.steps, solutionDir);
  const instruction = await readText(`${path}/instruction.md`, path);
  if (steps === null && instruction.trim() === "") {
    throw new Skip("no_instruction", `${path}/instruction.md is missing or empty`);
  }
  if (steps === null && !await isFile(`${path}/tests/test.sh`, path)) {
    throw new Skip("no_tests", `${path}/tests/test.sh is missing`);
  }
  for (const tree of ["tests", "solution", "environment"]) await checkTree(`${path}/${tree}`, path);
  refuseUnplaceable(file, config);
  const verifierBuildContext = await separateVerifier(path, config);
  const hasDockerfile = await isFile(`${path}/environment/Dockerfile`, path);
  const compose = await readCompose(path, config);
  refuseAllowlist(path, config, compose !== null);
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
    verifierBuildContext,
    solutionDir,
    steps,
    compose,
  };
}

/**
 * The task's compose file, checked (harbor/_compose.ts), or null; a task
 * whose file uses what this runner does not carry out is skipped, the
 * feature named.
 */
async function readCompose(path: string, config: HarborTaskConfig): Promise<ComposeProject | null> {
  const file = await findComposeFile(path);
  if (file === null) return null;
  const text = await readText(file, path);
  if (config.verifierMode === "separate") {
    throw new Skip(
      "compose",
      `${file}: not supported with [verifier] environment_mode "separate" by this runner`,
    );
  }
  if (config.steps !== null) {
    throw new Skip("compose", `${file}: not supported with [[steps]] by this runner`);
  }
  let project: ComposeProject;
  try {
    const vars = { ...config.environment.env, CONTEXT_DIR: `${path}/environment` };
    project = parseCompose(file, text, path, vars);
  } catch (err) {
    if (err instanceof ComposeRefusal) throw new Skip("compose", err.message);
    throw err;
  }
  // A build context outside environment/ (checked already) is sent to the engine whole.
  for (const s of project.services) {
    if (s.build !== null) await checkTree(s.build.context, path);
  }
  return project;
}

/**
 * Each step's files, as Harbor finds them: `steps/NAME/instruction.md`
 * (required), `steps/NAME/tests/test.sh` or the task's `tests/test.sh`,
 * `steps/NAME/solution/solve.sh` or the task's. A step's `workdir/`
 * (uploaded to the workdir with its `setup.sh` run) and the settings in
 * {@linkcode HarborStepConfig.unsupported} are refused: the task is skipped.
 */
async function readSteps(
  path: string,
  configs: HarborStepConfig[],
  taskSolution: string | null,
): Promise<HarborStep[]> {
  const unsupported = configs.flatMap((c) => c.unsupported);
  if (unsupported.length > 0) {
    throw new Skip(
      "steps",
      `${path}/task.toml: ${unsupported.join(", ")}: not supported in [[steps]] by this runner`,
    );
  }
  // No symlink in steps/ leads out of the task folder (the step folders included).
  await checkTree(`${path}/steps`, path);
  const taskTests = await isFile(`${path}/tests/test.sh`, path);
  const steps: HarborStep[] = [];
  for (const config of configs) {
    const dir = `${path}/steps/${config.name}`;
    if (await exists(`${dir}/workdir`)) {
      throw new Skip(
        "steps",
        `${dir}/workdir: a step's workdir/ (and its setup.sh) is not supported by this runner`,
      );
    }
    const instruction = await readText(`${dir}/instruction.md`, path);
    if (instruction.trim() === "") {
      throw new Skip("no_instruction", `${dir}/instruction.md is missing or empty`);
    }
    const ownTests = await isFile(`${dir}/tests/test.sh`, path);
    if (!ownTests && !taskTests) {
      throw new Skip("no_tests", `${dir}/tests/test.sh and ${path}/tests/test.sh are missing`);
    }
    // A step's solution/ without solve.sh leaves the oracle nothing to run, as in Harbor.
    const ownSolution = await exists(`${dir}/solution`);
    const solve = await isFile(`${dir}/solution/solve.sh`, path);
    steps.push({
      instruction,
      config,
      testsDir: await exists(`${dir}/tests`) ? `${dir}/tests` : null,
      solutionDir: ownSolution ? (solve ? `${dir}/solution` : null) : taskSolution,
    });
  }
  return steps;
}

/** Skips a task that needs GPUs, for the agent or for a verifier container of its own. */
function refuseUnplaceable(file: string, config: HarborTaskConfig): void {
  for (
    const [env, key] of [[config.environment, "[environment]"], [
      config.verifierEnvironment,
      "[verifier.environment]",
    ]] as const
  ) {
    if (env === null || env.gpus === 0) continue;
    throw new Skip(
      "gpu",
      `${file}: needs ${env.gpus} GPU(s) (${key} gpus); this runner gives containers no GPUs, as Harbor's Docker environment gives none`,
    );
  }
}

/**
 * Checks a task whose verifier has a container of its own ("separate"), as
 * Harbor places it: its image is built from `tests/` (its Dockerfile), else
 * is the verifier environment's `docker_image`. Returns the build context
 * (null: the `docker_image`, or "shared" mode).
 */
async function separateVerifier(path: string, config: HarborTaskConfig): Promise<string | null> {
  const env = config.verifierEnvironment;
  if (env === null) return null;
  const file = `${path}/task.toml`;
  const refuse = (why: string) => {
    throw new Skip("separate_verifier", `${file}: [verifier] environment_mode "separate": ${why}`);
  };
  if (config.steps !== null) refuse("not supported with [[steps]] by this runner");
  if (config.verifierCollectHooks > 0) {
    refuse(
      "[[verifier.collect]] hooks are not run by this runner (what they collect would be missing)",
    );
  }
  await refuseCompose(path, "tests");
  const i = config.artifacts.findIndex((a) => a.exclude.length > 0);
  if (i >= 0) {
    refuse(
      `artifacts[${i}].exclude is not supported yet (the whole path would reach the verifier)`,
    );
  }
  const j = config.artifacts.findIndex((a) => a.service !== null && a.service !== "main");
  if (j >= 0) {
    throw new Skip(
      "compose",
      `${file}: artifacts[${j}].service "${
        config.artifacts[j].service
      }": multi-container tasks are not supported`,
    );
  }
  if (await isFile(`${path}/tests/Dockerfile`, path)) return `${path}/tests`;
  if (env.dockerImage === null) {
    refuse(
      "the verifier's image is built from tests/Dockerfile, or is [verifier.environment] docker_image; this task has neither",
    );
  }
  return null;
}

/** Skips a task whose `dir` (environment/, or a separate verifier's tests/) holds a compose file. */
async function refuseCompose(path: string, dir: string): Promise<void> {
  for (const compose of ["docker-compose.yaml", "docker-compose.yml"]) {
    if (await isFile(`${path}/${dir}/${compose}`, path)) {
      throw new Skip(
        "compose",
        `${path}/${dir}/${compose}: multi-container tasks are not supported`,
      );
    }
  }
}

/**
 * Skips a task whose separate verifier's container would have an
 * `allowlist`: the task's own container enforces one (`_allowlist.ts`),
 * the verifier's (`_verifier_container.ts`) has only a network or none.
 * So is a compose task with an `allowlist` phase: that phase takes `main`
 * off every network, its services' too, so the tests could not reach them.
 */
function refuseAllowlist(path: string, config: HarborTaskConfig, compose: boolean): void {
  const { environment, agent, verifier } = config.network;
  const phases = { environment, agent, verifier };
  const listed = Object.entries(phases).filter(([, p]) => p.mode === "allowlist").map(([k]) => k);
  if (compose && listed.length > 0) {
    throw new Skip(
      "network_allowlist",
      `${path}/task.toml: network_mode "allowlist" (${
        listed.join(", ")
      }) with environment/docker-compose.yaml is not supported by this runner (the phase would cut main off from its services); give those phases "public" or "no-network"`,
    );
  }
  if (config.verifierMode !== "separate" || config.network.verifier.mode !== "allowlist") return;
  throw new Skip(
    "network_allowlist",
    `${path}/task.toml: network_mode "allowlist" for a separate verifier's container is not enforced by this runner; give the verifier "public" or "no-network", or run it in the task's container`,
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
  if (await exists(`${abs}/task.toml`)) {
    dirs.push(abs);
  } else {
    for await (const entry of Deno.readDir(abs)) {
      // A symlink to a task elsewhere is no task of the dataset.
      if (entry.isDirectory && await exists(`${abs}/${entry.name}/task.toml`)) {
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
