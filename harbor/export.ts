/**
 * {@linkcode exportHarborTasks}: an environment's tasks as Harbor task
 * folders, so that Harbor (and what loads its format) runs what is built
 * here. Each folder names an image as `[environment] docker_image` whose
 * ENTRYPOINT starts the environment's server on the container's loopback
 * and starts the task (parked) before Harbor's own command runs, so the
 * task's state is there before the agent acts; `tests/test.sh` grades that
 * task through the environment and writes Harbor's reward files.
 *
 * Harbor's semantics, read from its code (harbor-framework/harbor,
 * `src/harbor/environments/docker/`): the Docker environment starts the
 * task's container with `docker compose up --detach --wait`, its compose
 * file for a `docker_image` setting only `image` and
 * `command: ["sh", "-c", "sleep infinity"]` (no `entrypoint`), so the image's
 * ENTRYPOINT runs with that command as its arguments; `_validate_definition`
 * wants `environment/Dockerfile` (or a compose file) even with a
 * `docker_image`; `/logs/verifier`, `/logs/agent` and `/logs/artifacts` are
 * bind mounts it makes writable for all; the trial runs
 * `[environment.healthcheck]` (`environments/base.py` `run_healthcheck`)
 * before the agent's setup; the agent's and the verifier's commands are
 * `docker compose exec [-u USER] main bash -c CMD` (the image's USER, root
 * here, and its WORKDIR); the verifier copies `tests/` to `/tests`, runs
 * `/tests/test.sh` with its output to `/logs/verifier/test-stdout.txt`, then
 * reads `reward.json` before `reward.txt` (`verifier/verifier.py`).
 *
 * @module
 */

import type { Environment, TaskRow } from "../env.ts";
import { loadEnvironment } from "../loader.ts";
import { exportedRows } from "../eval/_rows.ts";
import { EngineClient, EngineError } from "../engines/_engine.ts";
import { TarWriter } from "../engines/_tar.ts";
import { buildContext } from "../engines/_base_image.ts";
import { buildEnvironmentImage } from "../engines/image.ts";
import { ENV_LABEL } from "../engines/_constants.ts";
import { shellQuote } from "../_internal/shell.ts";
import { sha256 } from "./_tree.ts";
import {
  CONTROL_DIR,
  EXPORTED_TASK_FILE,
  type ExportedTask,
  promptText,
  READY_FILE,
} from "./_exported.ts";

/** Options for {@linkcode exportHarborTasks}. */
export interface ExportHarborOptions {
  /** The environment, by export or environment name (for a module with several). */
  env?: string;
  /**
   * The tasks to export.
   * @default the module's exported `tasks` rows, else every template that takes no arguments
   */
  tasks?: readonly TaskRow[];
  /**
   * An image of the environment that `hud image` built (this SDK's, with
   * bash in it), instead of building one.
   */
  image?: string;
  /**
   * The base image to build the environment's image from, when `image` is
   * not given: one with bash and coreutils (Harbor runs `bash -c` in the
   * container), such as `hud image base` makes. One of `image` and `from` is needed.
   */
  from?: string;
  /**
   * The repository the task images are tagged in: `REPO:TASK`, and the
   * environment's image `REPO-env:latest` when built.
   * @default "hud-harbor-export/ENV-DIGEST" (the environment's name in lower
   *   case, and 10 hex digits of the output folder's path: another folder,
   *   other images)
   */
  repository?: string;
  /**
   * Where the agent writes its answer, named at the end of instruction.md;
   * `null` grades with an empty answer and names no file.
   * @default "/logs/agent/answer.txt"
   */
  answerFile?: string | null;
  /**
   * A user without privileges that Harbor runs the agent as (`[agent]
   * user`), made in each task's image when it has no such user (uid 61000,
   * home /home/NAME). The agent can then neither read the environment's
   * token, its memory or the parked session, nor leave anything running
   * that changes the reward: the grade kills every process of that user
   * first. Without it the agent runs as the image's user, root, which can
   * (SECURITY.md, "Exported Harbor tasks").
   * @default the image's user (root)
   */
  agentUser?: string;
  /**
   * The agent's time, in ms: `[agent] timeout_sec`, in seconds.
   * @default 600_000
   */
  agentTimeout?: number;
  /**
   * The verifier's time, in ms: `[verifier] timeout_sec`, in seconds.
   * @default 600_000
   */
  verifierTimeout?: number;
  /**
   * Engine socket.
   * @default as `ContainerRuntimeOptions.socket`
   */
  socket?: string;
  /** Aborts the export. */
  signal?: AbortSignal;
}

/** One exported task folder. */
export interface ExportedHarborTask {
  /** The folder's name (the row's slug). */
  name: string;
  /** The folder, absolute. */
  path: string;
  /** Its `docker_image`. */
  image: string;
  /** The template id. */
  id: string;
  /** The task's arguments. */
  args: Record<string, unknown>;
}

/** What {@linkcode exportHarborTasks} wrote. */
export interface HarborExport {
  /** The environment's image the task images are built from. */
  envImage: string;
  /** The task folders, in the order of the rows. */
  tasks: ExportedHarborTask[];
}

const DEFAULT_ANSWER_FILE = "/logs/agent/answer.txt";
/** A user name `useradd` would take. */
const USER_NAME = /^[a-z_][a-z0-9_-]{0,31}$/;
/** The uid of an agent user made in the image. */
const AGENT_UID = 61000;
const HELPER = new URL("./_exported.ts", import.meta.url).pathname;
const SDK_ROOT = new URL("../", import.meta.url).pathname;
/** How long a parked task waits for test.sh, in s: longer than any trial's agent phase. */
const PARKED_TTL_S = 7 * 24 * 3600;

function fail(message: string): never {
  throw new Error(`Cannot export Harbor tasks: ${message}`);
}

function repoName(name: string): string {
  return name.toLowerCase().replace(/[^a-z0-9._-]+/g, "-").replace(/^[^a-z0-9]+/, "")
    .slice(0, 60) || "env";
}

/**
 * The repository the images are tagged in unless one is given: the
 * environment's name and a digest of the output folder's path, so that two
 * exports (two people's on one engine, or one person's to two folders) never
 * tag the same images, and exporting again to a folder keeps its names.
 */
async function defaultRepository(envName: string, outDir: string): Promise<string> {
  const absolute = outDir.startsWith("/") ? outDir : `${Deno.cwd()}/${outDir}`;
  const digest = await sha256([absolute.replace(/\/+$/, "")]);
  return `hud-harbor-export/${repoName(envName)}-${digest.slice(0, 10)}`;
}

function folderName(slug: string): string {
  return slug.replace(/[^A-Za-z0-9._-]+/g, "-").replace(/^[^A-Za-z0-9]+/, "").slice(0, 100) ||
    "task";
}

/** A TOML basic string: JSON's escapes are all TOML escapes. */
function tomlString(s: string): string {
  return JSON.stringify(s);
}

function tomlNumber(n: number): string {
  return Number.isInteger(n) ? `${n}.0` : String(n);
}

async function checkOutDir(dir: string): Promise<void> {
  try {
    const stat = await Deno.stat(dir);
    if (!stat.isDirectory) fail(`"${dir}" is not a directory; give a new or empty --out directory`);
    for await (const _ of Deno.readDir(dir)) {
      fail(`"${dir}" is not empty; give a new or empty --out directory`);
    }
  } catch (err) {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  }
}

async function rowsOf(module: string, env: Environment, given?: readonly TaskRow[]) {
  const rows = given ? [...given] : await exportedRows(module, env) ??
    env.listTasks().filter((t) => !Array.isArray(t.args.required)).map((t) => ({
      env: env.name,
      id: t.id,
      args: {},
      slug: t.id,
    }));
  if (rows.length === 0) {
    fail(`"${module}" has no tasks to export: every template needs arguments; give the tasks`);
  }
  const known = env.listTasks().map((t) => `"${t.id}"`).join(", ") || "none";
  for (const row of rows) {
    if (row.env !== env.name) {
      fail(`task "${row.slug}" is for environment "${row.env}", not "${env.name}"`);
    }
    if (!env.hasTemplate(row.id)) {
      throw new RangeError(
        `Cannot export Harbor tasks: unknown template "${row.id}" (available: ${known})`,
      );
    }
  }
  return rows;
}

/** The prompt of `row`'s task, started in this process, then cancelled. */
async function promptOf(env: Environment, row: TaskRow): Promise<string> {
  const task = await env.startTask(row.id, row.args);
  try {
    return promptText(task.prompt.prompt);
  } finally {
    await task.cancel();
  }
}

/**
 * Each row's prompt: the task started twice in this process, then cancelled.
 * A prompt that differs between the two starts (a temporary directory, a
 * random code in it) is refused here, before anything is built: exported as
 * instruction.md it would never be the prompt the container's task gives.
 */
async function prompts(env: Environment, rows: TaskRow[]): Promise<string[]> {
  const out: string[] = [];
  await env.start();
  try {
    for (const row of rows) {
      const [first, second] = [await promptOf(env, row), await promptOf(env, row)];
      if (first !== second) {
        let at = 0;
        while (first[at] === second[at]) at++;
        throw new TypeError(
          `Cannot export Harbor tasks: template "${row.id}" gave two prompts for the same ` +
            `arguments (they differ from character ${at + 1}: ${
              JSON.stringify(first.slice(at, at + 24))
            } ` +
            `and ${JSON.stringify(second.slice(at, at + 24))}); export templates whose prompt ` +
            `depends only on their arguments (a fixed path in it, not a temporary one)`,
        );
      }
      out.push(first);
    }
  } finally {
    await env.stop();
  }
  return out;
}

interface ImagePaths {
  /** `deno run -A ... --config=...`: the start of every command. */
  deno: string[];
  cli: string;
  module: string;
  helper: string;
}

/** Where the image `hud image` built keeps Deno, the CLI and the module (from its CMD). */
async function imagePaths(engine: EngineClient, image: string, env: Environment) {
  let info: { Config?: { Cmd?: string[] | null; Labels?: Record<string, string> | null } };
  try {
    info = await engine.call("GET", `/images/${encodeURIComponent(image)}/json`) as typeof info;
  } catch (err) {
    if (err instanceof EngineError && err.status === 404) {
      fail(
        `image "${image}" is not on this engine; build it with "hud image" or leave out --image`,
      );
    }
    throw err;
  }
  const cmd = info.Config?.Cmd ?? [];
  const label = info.Config?.Labels?.[ENV_LABEL];
  const cli = cmd.at(-2) ?? "";
  if (label === undefined || cmd.length < 6 || !cli.endsWith("/cli.ts")) {
    fail(
      `image "${image}" was not built by "hud image"; build it with "hud image" or leave out --image`,
    );
  }
  if (label !== env.name) {
    fail(`image "${image}" serves environment "${label}", not "${env.name}"`);
  }
  const root = cli.slice(0, -"cli.ts".length);
  return {
    deno: cmd.slice(0, -3),
    cli,
    module: cmd.at(-1)!,
    helper: `${root}${HELPER.slice(SDK_ROOT.length)}`,
  } satisfies ImagePaths;
}

function entrypoint(paths: ImagePaths, envName: string, agentUser: string | null): string {
  const q = (args: string[]) => args.map(shellQuote).join(" ");
  // With an agent user, the environment's files are made readable for it as a
  // server's usually are (umask 022); its control files stay root's alone
  // (the 0700 directory, opened before the umask changes).
  const umask = agentUser === null ? "" : "umask 022; ";
  return [
    "#!/bin/bash",
    "# The entrypoint of an exported Harbor task (written by hud export-harbor, harbor/export.ts):",
    "# the environment's server on the container's loopback, its token where only root reads it,",
    "# the task started and parked, then Harbor's command.",
    "set -euo pipefail",
    "umask 077",
    `dir=${CONTROL_DIR}`,
    'rm -rf "$dir"',
    'mkdir -p "$dir"',
    `(${umask}exec ${
      q([
        ...paths.deno,
        paths.cli,
        "serve",
        paths.module,
        "--env",
        envName,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--parked-ttl",
        String(PARKED_TTL_S),
      ])
    }) </dev/null >"$dir/serve.out" 2>"$dir/serve.log" &`,
    'echo $! >"$dir/serve.pid"',
    q([...paths.deno, paths.helper, "start"]),
    'exec "$@"',
    "",
  ].join("\n");
}

function taskToml(
  env: Environment,
  row: TaskRow,
  image: string,
  options: ExportHarborOptions,
): string {
  return [
    `# Written by hud export-harbor: environment ${tomlString(env.name)} ${env.version}, template ${
      tomlString(row.id)
    }.`,
    `version = "1.0"`,
    "",
    "[metadata]",
    `hud_env = ${tomlString(env.name)}`,
    `hud_env_version = ${tomlString(env.version)}`,
    `hud_template = ${tomlString(row.id)}`,
    `hud_args = ${tomlString(JSON.stringify(row.args))}`,
    `hud_slug = ${tomlString(row.slug)}`,
    "",
    "[agent]",
    ...(options.agentUser === undefined ? [] : [`user = ${tomlString(options.agentUser)}`]),
    `timeout_sec = ${tomlNumber((options.agentTimeout ?? 600_000) / 1000)}`,
    "",
    "[verifier]",
    `timeout_sec = ${tomlNumber((options.verifierTimeout ?? 600_000) / 1000)}`,
    "",
    "[environment]",
    `docker_image = ${tomlString(image)}`,
    "",
    "# The image's entrypoint starts the task; the agent waits for it.",
    "[environment.healthcheck]",
    `command = ${tomlString(`test -f ${READY_FILE}`)}`,
    "interval_sec = 1.0",
    "start_interval_sec = 1.0",
    "start_period_sec = 120.0",
    "retries = 3",
    "",
  ].join("\n");
}

function testSh(answerFile: string | null): string {
  return [
    "#!/bin/bash",
    "# Written by hud export-harbor: grades the task the image's entrypoint started, through its",
    `# environment, with the agent's answer (${
      answerFile ?? "none: an empty one"
    }), and writes /logs/verifier/reward.json and reward.txt`,
    "# (removing first what the agent may have left there).",
    "exec bash /opt/hud-harbor/grade.sh",
    "",
  ].join("\n");
}

/**
 * Exports an environment's tasks as Harbor task folders in `outDir` (new or
 * empty): for each task `task.toml` (`docker_image`, a healthcheck that
 * waits for the task to be started, the template and arguments in
 * `[metadata]`), `instruction.md` (the task's prompt, from starting it once
 * in this process and cancelling it, and the line naming the answer file),
 * `environment/Dockerfile` (`FROM` the image, which Harbor's Docker
 * environment wants beside `docker_image`) and `tests/test.sh`. The
 * environment's image is built (FROM `options.from`) or given
 * (`options.image`); each task's image is a layer FROM it with the
 * entrypoint and the task's facts, tagged `REPO:TASK`.
 *
 * @param module the environment module
 * @param outDir the directory to write the task folders in
 * @param options the tasks, the images, the answer file, timeouts
 * @returns the environment's image and the folders written
 * @throws {Error} for an out directory that is not empty, neither `image` nor `from`, an image not built by `hud image` or of another environment: `Cannot export Harbor tasks: ...`
 * @throws {RangeError} for a task of an unknown template
 */
export async function exportHarborTasks(
  module: string,
  outDir: string,
  options: ExportHarborOptions = {},
): Promise<HarborExport> {
  await checkOutDir(outDir);
  if (options.image === undefined && options.from === undefined) {
    fail(
      `Harbor runs bash in the container: give a base image with bash to build from ` +
        `(--from; "hud image base" makes one) or an environment image (--image)`,
    );
  }
  const answerFile = options.answerFile === undefined ? DEFAULT_ANSWER_FILE : options.answerFile;
  const agentUser = options.agentUser ?? null;
  if (agentUser !== null && (!USER_NAME.test(agentUser) || agentUser === "root")) {
    throw new TypeError(
      `Cannot export Harbor tasks: agent user "${agentUser}" must be a user name other than root (lower-case letters, digits, "_" and "-", up to 32)`,
    );
  }
  if (answerFile !== null && !answerFile.startsWith("/")) {
    throw new TypeError(`Cannot export Harbor tasks: answer file "${answerFile}" must be absolute`);
  }
  const env = await loadEnvironment(module, { name: options.env });
  const rows = await rowsOf(module, env, options.tasks);
  const texts = await prompts(env, rows);
  const repo = options.repository ?? await defaultRepository(env.name, outDir);
  const envImage = options.image ?? `${repo}-env:latest`;
  if (options.image === undefined) {
    await buildEnvironmentImage(module, envImage, {
      from: options.from,
      envName: env.name,
      envVersion: env.version,
      socket: options.socket,
      signal: options.signal,
    });
  }
  using engine = await EngineClient.open(options.socket, options.signal);
  const paths = await imagePaths(engine, envImage, env);
  const tasks: ExportedHarborTask[] = [];
  const used = new Set<string>();
  await Deno.mkdir(outDir, { recursive: true });
  for (const [i, row] of rows.entries()) {
    options.signal?.throwIfAborted();
    let name = folderName(row.slug);
    for (let n = 2; used.has(name); n++) name = `${folderName(row.slug)}-${n}`;
    used.add(name);
    const image = `${repo}:${name.slice(0, 128)}`;
    const facts: ExportedTask = {
      id: row.id,
      args: row.args,
      prompt: texts[i],
      answerFile,
      agentUser,
    };
    const tar = taskLayer(paths, env.name, envImage, name, facts);
    await buildContext(tar, image, { socket: options.socket, signal: options.signal });
    const dir = `${outDir}/${name}`;
    await writeTaskFolder(dir, taskToml(env, row, image, options), texts[i], image, answerFile);
    tasks.push({ name, path: await Deno.realPath(dir), image, id: row.id, args: row.args });
  }
  return { envImage, tasks };
}

/** The layer of one task's image, FROM the environment's: its entrypoint, grade.sh and facts. */
function taskLayer(
  paths: ImagePaths,
  envName: string,
  envImage: string,
  name: string,
  facts: ExportedTask,
): TarWriter {
  const enc = new TextEncoder();
  const grade = [
    "#!/bin/bash",
    "# Grades the exported task (see harbor/_exported.ts).",
    `exec ${[...paths.deno, paths.helper, "grade"].map(shellQuote).join(" ")}`,
    "",
  ].join("\n");
  const tar = new TarWriter();
  tar.file(
    "root/opt/hud-harbor/entrypoint.sh",
    enc.encode(entrypoint(paths, envName, facts.agentUser ?? null)),
    0o755,
  );
  tar.file("root/opt/hud-harbor/grade.sh", enc.encode(grade), 0o755);
  tar.file(`root${EXPORTED_TASK_FILE}`, enc.encode(JSON.stringify(facts)));
  tar.file(
    "Dockerfile",
    enc.encode([
      `FROM ${envImage}`,
      "COPY root/ /",
      `LABEL "dev.hud.harbor.export"=${JSON.stringify(name)}`,
      ...(facts.agentUser ? [makeUser(facts.agentUser)] : []),
      `HEALTHCHECK --interval=1s --timeout=10s --retries=300 CMD ["test", "-f", ${
        JSON.stringify(READY_FILE)
      }]`,
      `ENTRYPOINT ["/bin/bash", "/opt/hud-harbor/entrypoint.sh"]`,
      `CMD ["sleep", "infinity"]`,
      "",
    ].join("\n")),
  );
  return tar;
}

/** The Dockerfile line that makes `name` (no privileges, a home of its own) unless the image has it. */
function makeUser(name: string): string {
  const home = `/home/${name}`;
  return `RUN id -u ${name} >/dev/null 2>&1 || { ` +
    `echo '${name}:x:${AGENT_UID}:${AGENT_UID}::${home}:/bin/bash' >> /etc/passwd && ` +
    `echo '${name}:x:${AGENT_UID}:' >> /etc/group; }; ` +
    `mkdir -p ${home} && chown "$(id -u ${name}):$(id -g ${name})" ${home}`;
}

/** Writes one task folder: task.toml, instruction.md, environment/Dockerfile, tests/test.sh. */
async function writeTaskFolder(
  dir: string,
  toml: string,
  text: string,
  image: string,
  answerFile: string | null,
): Promise<void> {
  await Deno.mkdir(`${dir}/environment`, { recursive: true });
  await Deno.mkdir(`${dir}/tests`, { recursive: true });
  await Deno.writeTextFile(`${dir}/task.toml`, toml);
  const prompt = text.endsWith("\n") ? text : `${text}\n`;
  await Deno.writeTextFile(
    `${dir}/instruction.md`,
    answerFile === null
      ? prompt
      : `${prompt}\nWhen you are done, write your final answer to ${answerFile}.\n`,
  );
  await Deno.writeTextFile(`${dir}/environment/Dockerfile`, `FROM ${image}\n`);
  await Deno.writeTextFile(`${dir}/tests/test.sh`, testSh(answerFile), { mode: 0o755 });
  await Deno.chmod(`${dir}/tests/test.sh`, 0o755);
}
