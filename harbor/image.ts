/**
 * {@linkcode buildHarborImage}: the image a Harbor task runs in. First the
 * task's own image (`environment/Dockerfile` built with the local engine,
 * or `[environment] docker_image`), then a layer FROM it that adds Deno's
 * binary, this SDK's sources (under /opt/hud-sdk, away from the task's
 * files) and the task's facts, and serves the task's environment. When the
 * task's image has an ENTRYPOINT, Harbor's Docker environment keeps it and
 * gives it the command `sh -c "sleep infinity"`; so does this layer: its
 * ENTRYPOINT is a small init (/opt/hud-harbor-in/init.sh) that starts the
 * environment's server in the background and then execs the task image's
 * ENTRYPOINT with Harbor's command, as the image's USER, with the image's
 * own environment (the server's token and socket path removed). Both are
 * tagged by content hash, so a second run of the same task builds nothing.
 * `tests/` and `solution/` are not in either: the runner copies them in
 * when they are used.
 *
 * @module
 */

import { EngineClient, inspectImage } from "../engines/_engine.ts";
import { CONTROL_SOCKET_VAR } from "../engines/_constants.ts";
import { SERVE_TOKEN_VAR } from "../_internal/auth.ts";
import { TarWriter } from "../engines/_tar.ts";
import { buildEnvironmentImage, environmentImageFiles } from "../engines/image.ts";
import { buildContext as buildLayer } from "../engines/_base_image.ts";
import type { HarborTask } from "./loader.ts";
import { TASK_FILE } from "./_task_env_file.ts";
import type { HarborTaskFile } from "./_task_env_file.ts";
import { sha256, treeFiles, treeHash, walk } from "./_tree.ts";
import { errorMessage } from "../_internal/util.ts";
import { shellQuote } from "../_internal/shell.ts";

/** Where the SDK's sources go in a Harbor task's image. */
const SDK_DIR = "/opt/hud-sdk";
const TASK_ENV = new URL("./_task_env.ts", import.meta.url).pathname;
const SDK_ROOT = new URL("../", import.meta.url).pathname;
const INIT = "/opt/hud-harbor-in/init.sh";
/** Harbor's command for the task's container (`docker-compose-base.yaml` of its Docker environment). */
const HARBOR_COMMAND = ["sh", "-c", "sleep infinity"];
/** What the layer's Dockerfile sets in ENV (engines/image.ts), put back for the ENTRYPOINT. */
const LAYER_ENV = ["DENO_DIR", "HOME", "NO_COLOR"];

/** A task whose image could not be built (or found): `Cannot run Harbor task "x": build failed: ...`. */
export class HarborBuildError extends Error {
  /** Makes one; `cause` as for `Error`. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "HarborBuildError";
  }
}

/** Options for {@linkcode buildHarborImage}. */
export interface BuildHarborImageOptions {
  /**
   * Engine socket.
   * @default as `ContainerRuntimeOptions.socket`
   */
  socket?: string;
  /** Aborts the build. */
  signal?: AbortSignal;
}

/** What {@linkcode buildHarborImage} made. */
export interface HarborImage {
  /** The image to place (the layer serving the task's environment). */
  image: string;
  /** The task's own image. */
  taskImage: string;
  /** The agent's and verifier's working directory: `[environment] workdir`, else the image's `WORKDIR`, else `/`. */
  workdir: string;
  /** The task image's `USER` (empty: root). */
  user: string;
  /** The task image's ENTRYPOINT, kept (empty: none). */
  entrypoint: string[];
  /** Whether anything was built (false: both images were there already). */
  built: boolean;
}

/**
 * A tar of every file under `dir`, dot-files included, with their modes,
 * placed under `prefix` (for an engine build context, or a copy into a
 * container).
 */
export async function tarTree(dir: string, prefix = ""): Promise<Uint8Array<ArrayBuffer>> {
  const tar = new TarWriter();
  if (prefix !== "") tar.dir(prefix);
  for (const f of await walk(dir)) {
    tar.file(prefix === "" ? f.rel : `${prefix}/${f.rel}`, f.data, f.mode);
  }
  return tar.bytes();
}

export function slug(name: string): string {
  return name.toLowerCase().replace(/[^a-z0-9._-]+/g, "-").replace(/^[^a-z0-9]+/, "").slice(
    0,
    60,
  ) ||
    "task";
}

interface ImageInfo {
  Id: string;
  Config?: {
    WorkingDir?: string;
    Env?: string[] | null;
    User?: string;
    Entrypoint?: string[] | null;
    Cmd?: string[] | null;
  };
}

/**
 * The init of a layer on an image with an ENTRYPOINT: the server (`server`,
 * the layer's own CMD) in the background, then the ENTRYPOINT and Harbor's
 * command (its arguments) exec'd as `user` (the image's USER; `id` resolves
 * a name, setpriv switches) with the image's own variables.
 */
function initScript(server: string[], user: string, env: Record<string, string>): string {
  const restore = LAYER_ENV.map((k) =>
    env[k] !== undefined
      ? `export ${k}=${shellQuote(env[k])}`
      : k === "HOME"
      ? "export HOME=/root"
      : `unset ${k}`
  );
  const [name, group] = user.split(":");
  const drop = user === "" || /^(root|0)(:(root|0))?$/.test(user) ? [] : [
    `n=${shellQuote(name)}`,
    'case $n in *[!0-9]*) u=$(id -u "$n") || exit 1 ;; *) u=$n ;; esac',
    `g=${group === undefined ? '$(id -g "$n" 2>/dev/null || echo 0)' : shellQuote(group)}`,
    'set -- setpriv --reuid="$u" --regid="$g" --clear-groups -- "$@"',
  ];
  return [
    "#!/bin/sh",
    "# hud's Harbor layer (harbor/image.ts): the task environment's server beside the",
    "# task image's ENTRYPOINT, which runs with Harbor's command as its arguments.",
    `${server.map(shellQuote).join(" ")} </dev/null &`,
    `unset ${SERVE_TOKEN_VAR} ${CONTROL_SOCKET_VAR}`,
    ...restore,
    ...drop,
    'exec "$@"',
    "",
  ].join("\n");
}

function imageInfo(engine: EngineClient, ref: string): Promise<ImageInfo | null> {
  return inspectImage<ImageInfo>(engine, ref);
}

/**
 * Builds `build.dir` as `build.tag` (its `dockerfile`, else `Dockerfile`,
 * with `labels`), failing with the engine's message and the build's last lines.
 */
export async function buildContext(
  engine: EngineClient,
  task: HarborTask,
  build: {
    dir: string;
    tag: string;
    timeoutSec: number;
    key: string;
    dockerfile?: string;
    labels?: Record<string, string>;
  },
  signal: AbortSignal,
): Promise<void> {
  const { dir, tag } = build;
  const context = await tarTree(dir);
  const extra = (build.dockerfile ? `&dockerfile=${encodeURIComponent(build.dockerfile)}` : "") +
    (build.labels ? `&labels=${encodeURIComponent(JSON.stringify(build.labels))}` : "");
  let text: string;
  try {
    const res = await engine.raw(
      "POST",
      `/build?t=${encodeURIComponent(tag)}&rm=1&forcerm=1${extra}`,
      { body: context, headers: { "content-type": "application/x-tar" }, signal },
    );
    text = await res.text();
  } catch (err) {
    const why = signal.aborted
      ? `took longer than ${build.timeoutSec} s (${build.key} build_timeout_sec)`
      : errorMessage(err);
    throw new HarborBuildError(`Cannot run Harbor task "${task.name}": build failed: ${why}`, {
      cause: err,
    });
  }
  const log: string[] = [];
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    const msg = JSON.parse(line) as { error?: string; stream?: string };
    if (msg.stream) log.push(msg.stream);
    if (msg.error) {
      const last = log.join("").trim().split("\n").slice(-3).join(" | ");
      throw new HarborBuildError(
        `Cannot run Harbor task "${task.name}": build failed: ${msg.error.trim()}${
          last ? `; last output: ${last}` : ""
        }`,
      );
    }
  }
}

let sdkHash: Promise<string> | null = null;

/**
 * The hash of the SDK's files that go into a task's layer (the served
 * environment's module graph): a changed one makes a new layer, a file
 * beside them that the image does not hold (results, notes, a user's
 * module) does not, where hashing the whole folder rebuilt every task's
 * image. Once per process: it takes three `deno info` runs, and the SDK
 * this process runs does not change under it.
 */
function sdkFilesHash(): Promise<string> {
  sdkHash ??= (async () => {
    const parts: (string | Uint8Array)[] = [];
    for (const file of await environmentImageFiles(TASK_ENV)) {
      parts.push(file.startsWith(SDK_ROOT) ? file.slice(SDK_ROOT.length) : file);
      parts.push(await Deno.readFile(file));
    }
    return await sha256(parts);
  })();
  sdkHash.catch(() => {
    sdkHash = null;
  });
  return sdkHash;
}

/**
 * Builds (or finds, by content hash) the image a Harbor task runs in.
 *
 * @param task a task from `loadHarborTasks`
 * @param options engine socket, abort signal
 * @returns the image to place, the task's own image, the working directory, whether anything was built
 * @throws {HarborBuildError} when the Dockerfile does not build (with the engine's message and the build's last lines), the build outlasts `build_timeout_sec`, or `docker_image` is not on this engine
 */
export async function buildHarborImage(
  task: HarborTask,
  options: BuildHarborImageOptions = {},
): Promise<HarborImage> {
  const timeout = AbortSignal.timeout(task.config.environment.buildTimeoutSec * 1000);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  using engine = await EngineClient.open(options.socket, signal);
  const own = await taskImage(engine, task, signal);
  const info = await imageInfo(engine, own.image);
  if (info === null) {
    throw new HarborBuildError(
      `Cannot run Harbor task "${task.name}": build failed: image "${own.image}" is not on this engine; pull or build it first`,
    );
  }
  const facts = await taskFacts(task, info);
  const factsBytes = new TextEncoder().encode(JSON.stringify(facts));
  const sdk = await sdkFilesHash();
  const key = await sha256([info.Id, factsBytes, sdk, Deno.version.deno, INIT]);
  const image = `hud-harbor/${slug(task.name)}:${key.slice(0, 16)}`;
  const entrypoint = info.Config?.Entrypoint ?? [];
  let built = own.built;
  if (await imageInfo(engine, image) === null) {
    const layer = { image, from: own.image, facts, factsBytes, entrypoint };
    await buildServedImage(engine, task, layer, options.socket, signal);
    built = true;
  }
  const { workdir, imageUser: user } = facts;
  return { image, taskImage: own.image, workdir, user, entrypoint, built };
}

/**
 * The task's own image: `environment/Dockerfile` built (once per content
 * hash), or `[environment] docker_image`.
 */
async function taskImage(
  engine: EngineClient,
  task: HarborTask,
  signal: AbortSignal,
): Promise<{ image: string; built: boolean }> {
  if (task.buildContext === null) {
    return { image: task.config.environment.dockerImage!, built: false };
  }
  const hash = (await treeHash(task.buildContext)).slice(0, 16);
  const image = `hud-harbor-task/${slug(task.name)}:${hash}`;
  if (await imageInfo(engine, image) !== null) return { image, built: false };
  const timeoutSec = task.config.environment.buildTimeoutSec;
  const build = { dir: task.buildContext, tag: image, timeoutSec, key: "[environment]" };
  await buildContext(engine, task, build, signal);
  return { image, built: true };
}

/** {@linkcode treeFiles} of `dir`, or none when it does not exist (a multi-step task's `tests/`). */
async function filesOrNone(dir: string): Promise<Record<string, string>> {
  try {
    return await treeFiles(dir);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return {};
    throw err;
  }
}

/** What the server in the task's container needs to know of the task and its image. */
async function taskFacts(task: HarborTask, info: ImageInfo): Promise<HarborTaskFile> {
  const workdir = task.config.environment.workdir ?? (info.Config?.WorkingDir || "/");
  // The image's ENV, for the agent's and the verifier's commands (the
  // workspace gives them only what it is told).
  const env: Record<string, string> = {};
  for (const pair of info.Config?.Env ?? []) {
    const at = pair.indexOf("=");
    if (at > 0) env[pair.slice(0, at)] = pair.slice(at + 1);
  }
  // `[environment.env]` goes over it, as Harbor sets it on the container,
  // then the compose file's `environment` of main (merged after Harbor's).
  Object.assign(env, task.config.environment.env, task.compose?.main.environment);
  return {
    name: task.name,
    env,
    instruction: task.instruction,
    workdir,
    verifierTimeoutSec: task.config.verifierTimeoutSec,
    verifierEnv: task.config.verifierEnv,
    imageUser: info.Config?.User ?? "",
    agentUser: task.config.agentUser,
    // A separate verifier's user is its own image's, resolved there.
    verifierUser: task.config.verifierMode === "shared" ? task.config.verifierUser : null,
    healthcheck: task.config.environment.healthcheck,
    separate: task.config.verifierMode === "separate",
    // A separate verifier's tests never enter this container.
    tests: task.steps === null && task.config.verifierMode === "shared"
      ? await treeFiles(task.testsDir)
      : {},
    steps: task.steps === null ? null : await Promise.all(task.steps.map(async (step) => ({
      name: step.config.name,
      instruction: step.instruction,
      verifierTimeoutSec: step.config.verifierTimeoutSec,
      verifierEnv: step.config.verifierEnv,
      verifierUser: step.config.verifierUser,
      healthcheck: step.config.healthcheck,
      // Harbor uploads the task's tests/, then the step's over it.
      tests: {
        ...await filesOrNone(task.testsDir),
        ...(step.testsDir === null ? {} : await treeFiles(step.testsDir)),
      },
    }))),
  };
}

/** The layer that serves the task's environment, and what goes into it. */
interface ServedLayer {
  /** Its tag. */
  image: string;
  /** The task's own image. */
  from: string;
  facts: HarborTaskFile;
  factsBytes: Uint8Array;
  /** The task image's ENTRYPOINT. */
  entrypoint: string[];
}

/**
 * Builds the layer; over an image with an ENTRYPOINT, in two steps: the
 * served environment, then an init that starts its server beside the
 * ENTRYPOINT, which is kept.
 */
async function buildServedImage(
  engine: EngineClient,
  task: HarborTask,
  layer: ServedLayer,
  socket: string | undefined,
  signal: AbortSignal,
): Promise<void> {
  const { image, entrypoint } = layer;
  const served = entrypoint.length === 0 ? image : `${image}-served`;
  await buildEnvironmentImage(TASK_ENV, served, {
    from: layer.from,
    envName: `harbor-${task.name}`,
    envVersion: "1.0.0",
    appDir: SDK_DIR,
    files: { [TASK_FILE]: layer.factsBytes },
    socket,
    signal,
  });
  if (entrypoint.length === 0) return;
  const server = (await imageInfo(engine, served))?.Config?.Cmd ?? [];
  const tar = new TarWriter();
  const enc = new TextEncoder();
  const init = initScript(server, layer.facts.imageUser, layer.facts.env);
  tar.file(`root${INIT}`, enc.encode(init), 0o755);
  tar.file(
    "Dockerfile",
    enc.encode(
      [
        `FROM ${served}`,
        "COPY root/ /",
        `ENTRYPOINT ${JSON.stringify(["/bin/sh", INIT])}`,
        `CMD ${JSON.stringify([...entrypoint, ...HARBOR_COMMAND])}`,
        "",
      ].join("\n"),
    ),
  );
  try {
    await buildLayer(tar, image, { socket, signal });
  } finally {
    await engine.call("DELETE", `/images/${encodeURIComponent(served)}`).catch(() => {});
  }
}

/** What {@linkcode buildVerifierImage} made. */
export interface HarborVerifierImage {
  /** The verifier's image. */
  image: string;
  /** Whether it was built in this call (false: found by content hash, or `docker_image`). */
  built: boolean;
  /** The verifier's working directory: the verifier environment's `workdir`, else the image's `WORKDIR` (null: none). */
  workdir: string | null;
  /** Where tests/ is uploaded: the workdir, for an image taken as `docker_image` when tests/ holds files; else null. */
  testsInto: string | null;
}

/**
 * The image of a separate verifier (`[verifier] environment_mode =
 * "separate"`), as Harbor's trial makes it: `tests/` built as its context
 * when it holds a Dockerfile (tagged by content hash), else the verifier
 * environment's `docker_image`.
 *
 * @param task a task from `loadHarborTasks` in "separate" mode
 * @param options engine socket, abort signal
 * @throws {HarborBuildError} when tests/Dockerfile does not build, the build outlasts its `build_timeout_sec`, or `docker_image` is not on this engine
 */
export async function buildVerifierImage(
  task: HarborTask,
  options: BuildHarborImageOptions = {},
): Promise<HarborVerifierImage> {
  const env = task.config.verifierEnvironment;
  if (env === null) {
    throw new TypeError(
      `Cannot build a verifier image: task "${task.name}" verifies in the agent's container`,
    );
  }
  const timeout = AbortSignal.timeout(env.buildTimeoutSec * 1000);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  using engine = await EngineClient.open(options.socket, signal);
  const context = task.verifierBuildContext;
  let image = env.dockerImage!;
  let built = false;
  if (context !== null) {
    image = `hud-harbor-verifier/${slug(task.name)}:${(await treeHash(context)).slice(0, 16)}`;
    if (await imageInfo(engine, image) === null) {
      await buildContext(engine, task, {
        dir: context,
        tag: image,
        timeoutSec: env.buildTimeoutSec,
        key: "[verifier.environment]",
      }, signal);
      built = true;
    }
  }
  const info = await imageInfo(engine, image);
  if (info === null) {
    throw new HarborBuildError(
      `Cannot run Harbor task "${task.name}": build failed: the verifier's image "${image}" is not on this engine; pull or build it first`,
    );
  }
  const workdir = env.workdir ?? (info.Config?.WorkingDir || null);
  const hasTests = context === null && Object.keys(await filesOrNone(task.testsDir)).length > 0;
  return { image, built, workdir, testsInto: hasTests ? workdir ?? "/" : null };
}
