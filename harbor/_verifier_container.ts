// The verifier of a Harbor task in a container of its own (`[verifier]
// environment_mode = "separate"`), placed as Harbor's trial places it
// (trial/trial.py `_run_separate_verifier`): a fresh container of the
// verifier's image with Harbor's command (`sh -c "sleep infinity"`, the
// image's ENTRYPOINT kept), the verifier environment's CPUs and memory, and
// the verifier phase's network. What crosses from the agent's container is
// what Harbor's artifact handler re-materialises: /logs/artifacts and the
// task's `artifacts`, each at its own path. /logs/verifier is emptied as
// root; then `/tests/test.sh` (the image's own: Harbor does not upload
// tests/ to a separate verifier) runs as `docker exec` runs it, as the
// verifier's user (`[verifier] user`, else the image's USER) in the
// verifier environment's workdir (else the image's WORKDIR), with its `env`
// and `[verifier] env` over it, within `[verifier] timeout_sec`. The reward
// is read back through the engine, reward.json before reward.txt; the
// container is removed however it ended. Everything goes through the
// engine's API (create, exec, GET and PUT /containers/{id}/archive).

import { BodyTooLargeError, readCapped } from "../_internal/body.ts";
import { EngineClient, EngineError, removeContainer } from "../engines/_engine.ts";
import { CREATED_LABEL, OWNER_LABEL } from "../engines/_constants.ts";
import { type Reward, rewardOf, VERIFIER_LOGS } from "./_reward.ts";
import { errorMessage } from "../_internal/util.ts";
import { Deadline } from "../_internal/async.ts";
import { shellQuote } from "../_internal/shell.ts";

/** Docker's default capabilities (moby's `oci/caps/defaults.go`): what `docker exec` gives root. */
export const DOCKER_DEFAULT_CAPS: readonly string[] = [
  "CHOWN",
  "DAC_OVERRIDE",
  "FOWNER",
  "FSETID",
  "KILL",
  "SETGID",
  "SETUID",
  "SETPCAP",
  "NET_BIND_SERVICE",
  "NET_RAW",
  "SYS_CHROOT",
  "MKNOD",
  "AUDIT_WRITE",
  "SETFCAP",
];

/** Harbor's convention directory: what the agent publishes for the verifier. */
export const ARTIFACTS_DIR = "/logs/artifacts";
/** The most the artifacts of one rollout may weigh, in bytes (they are held in memory). */
const ARTIFACT_LIMIT = 1 << 30;
/** The most a reward file may weigh, in bytes. */
const FILE_LIMIT = 1 << 20;
/** The most test.sh's output may weigh for its tail to be shown, in bytes. */
const OUTPUT_LIMIT = 1 << 24;
const OUTPUT_SHOWN = 16_384;

/** How the verifier's container is made and the verifier run in it. */
export interface VerifierSpec {
  /** The verifier's image. */
  image: string;
  /** The task's name and folder (labels, as on the agent's container). */
  task: { name: string; path: string };
  /** `[verifier] user`, or null for the image's USER. */
  user: string | null;
  /** The verifier environment's `workdir`, or null for the image's WORKDIR. */
  workdir: string | null;
  /** The verifier environment's `env` with `[verifier] env` over it. */
  env: Record<string, string>;
  timeoutSec: number;
  cpus: number;
  memoryMb: number;
  /** Whether the verifier phase has a network (`public`), else loopback alone. */
  network: boolean;
  /**
   * Where tests/ goes, for an image taken as `docker_image` (no
   * tests/Dockerfile): Harbor uploads the environment folder to the
   * workdir; null when the image was built from tests/.
   */
  testsInto: { dir: string; tar: Uint8Array } | null;
}

/** A path of the agent's container, as the engine archived it. */
export interface Collected {
  /** Its path. */
  source: string;
  /** The engine's archive of it (its last component at the archive's root). */
  tar: Uint8Array;
  /** Whether it is a directory. */
  dir: boolean;
}

/** What the verifier gave: the reward, and how test.sh ended (`info.verifier`). */
export interface Verdict {
  score: number;
  subscores: Record<string, number>;
  info: { verifier: { exit_code: number | null; stdout: string; timed_out: boolean } };
}

/** One entry of a tar archive, as far as the reader needs it. */
interface TarEntry {
  type: string;
  data: Uint8Array;
}

/** The first entry of a tar that is not a PAX or GNU long-name header. */
function firstEntry(tar: Uint8Array): TarEntry | null {
  let at = 0;
  while (at + 512 <= tar.length) {
    const header = tar.subarray(at, at + 512);
    if (header.every((b) => b === 0)) return null;
    const sizeText = new TextDecoder().decode(header.subarray(124, 136)).replace(/\0.*$/s, "");
    const size = parseInt(sizeText.trim() || "0", 8);
    const type = String.fromCharCode(header[156] || 0x30);
    const data = tar.subarray(at + 512, at + 512 + size);
    if (!"xgLK".includes(type)) return { type, data };
    at += 512 + Math.ceil(size / 512) * 512;
  }
  return null;
}

/** The engine's archive of `path` in container `id`, or null when it is not there. */
async function archive(
  engine: EngineClient,
  id: string,
  path: string,
  limit: number,
  signal?: AbortSignal,
): Promise<Uint8Array | null> {
  try {
    const res = await engine.raw(
      "GET",
      `/containers/${id}/archive?path=${encodeURIComponent(path)}`,
      { signal },
    );
    return await readCapped(res.body, limit, path).catch((err) => {
      if (!(err instanceof BodyTooLargeError)) throw err;
      throw new Error(`Cannot grade Harbor task: ${err.message}`, { cause: err });
    });
  } catch (err) {
    if (err instanceof EngineError && err.status === 404) return null;
    throw err;
  }
}

/**
 * Collects `sources` from the agent's container (Harbor's artifact
 * collection, taken as the engine's root): those not there are left out.
 */
export async function collectArtifacts(
  engine: EngineClient,
  agentId: string,
  sources: readonly string[],
  signal?: AbortSignal,
): Promise<Collected[]> {
  const out: Collected[] = [];
  let left = ARTIFACT_LIMIT;
  for (const source of sources) {
    const tar = await archive(engine, agentId, source, left, signal);
    if (tar === null) continue;
    left -= tar.length;
    out.push({ source, tar, dir: firstEntry(tar)?.type === "5" });
  }
  return out;
}

/**
 * Runs `cmd` in container `id` through the engine (`docker exec`) and
 * waits for it: its exit code.
 */
async function exec(
  engine: EngineClient,
  id: string,
  cmd: string[],
  as: { user?: string; workdir?: string; env?: Record<string, string> },
  signal?: AbortSignal,
): Promise<number> {
  const created = await engine.call("POST", `/containers/${id}/exec`, {
    Cmd: cmd,
    ...(as.user !== undefined ? { User: as.user } : {}),
    ...(as.workdir !== undefined ? { WorkingDir: as.workdir } : {}),
    Env: Object.entries(as.env ?? {}).map(([k, v]) => `${k}=${v}`),
    AttachStdout: true,
    AttachStderr: true,
  }, signal) as { Id: string };
  // Attached, the reply streams the output until the command ends (a
  // detached one stays "Running" in Podman 4.3's inspect); the output is
  // not kept (test.sh writes its own to a file).
  const res = await engine.raw("POST", `/exec/${created.Id}/start`, {
    body: JSON.stringify({ Detach: false, Tty: false }),
    headers: { "content-type": "application/json" },
    signal,
  });
  for await (const _ of res.body ?? []) {
    // drained
  }
  const info = await engine.call("GET", `/exec/${created.Id}/json`, undefined, signal) as {
    ExitCode?: number | null;
  };
  if (typeof info.ExitCode !== "number") {
    throw new Error(
      `Cannot grade Harbor task: the engine gave no exit code for "${cmd.join(" ")}"`,
    );
  }
  return info.ExitCode;
}

/** Runs a shell command as root in container `id`; throws when it fails. */
async function asRoot(engine: EngineClient, id: string, script: string, signal?: AbortSignal) {
  const code = await exec(engine, id, ["sh", "-c", script], { user: "0" }, signal);
  if (code !== 0) {
    throw new Error(
      `Cannot grade Harbor task: in the verifier's container, "${script}" exited ${code}`,
    );
  }
}

/**
 * Harbor's `empty_dirs`: `dir` made empty and opened to every user (made
 * anew: unlike Harbor's, nothing here is a mount point whose root must stay).
 */
function emptyDir(dir: string): string {
  const q = shellQuote(dir);
  return `rm -rf ${q} && mkdir -p ${q} && chmod 777 ${q}`;
}

function parentOf(path: string): string {
  return path.slice(0, path.lastIndexOf("/")) || "/";
}

async function put(
  engine: EngineClient,
  id: string,
  dir: string,
  tar: Uint8Array,
  signal?: AbortSignal,
) {
  const res = await engine.raw("PUT", `/containers/${id}/archive?path=${encodeURIComponent(dir)}`, {
    body: tar as Uint8Array<ArrayBuffer>,
    headers: { "content-type": "application/x-tar" },
    signal,
  });
  await res.body?.cancel();
}

/**
 * Puts the collected artifacts at their paths (Harbor's `upload_artifacts`:
 * a directory emptied first, a file's parent made), and tests/ where an
 * image taken as `docker_image` gets it.
 */
async function materialise(
  engine: EngineClient,
  id: string,
  spec: VerifierSpec,
  collected: readonly Collected[],
  signal?: AbortSignal,
): Promise<void> {
  if (spec.testsInto !== null) {
    await asRoot(engine, id, `mkdir -p ${shellQuote(spec.testsInto.dir)}`, signal);
    await put(engine, id, "/", spec.testsInto.tar, signal);
  }
  await asRoot(engine, id, emptyDir(VERIFIER_LOGS), signal);
  for (const c of collected) {
    const parent = parentOf(c.source);
    await asRoot(
      engine,
      id,
      c.dir
        ? emptyDir(c.source)
        : `mkdir -p ${shellQuote(parent)} && chmod 777 ${shellQuote(parent)}`,
      signal,
    );
    await put(engine, id, parent, c.tar, signal);
  }
}

/** A file's text in container `id`, or null when it is not there (a symlink or directory is refused). */
async function readText(
  engine: EngineClient,
  id: string,
  path: string,
  signal?: AbortSignal,
  limit = FILE_LIMIT,
): Promise<string | null> {
  const tar = await archive(engine, id, path, limit + 4096, signal);
  if (tar === null) return null;
  const entry = firstEntry(tar);
  if (entry === null || (entry.type !== "0" && entry.type !== "\0")) {
    throw new Error(`Cannot grade Harbor task: ${path} is not a regular file`);
  }
  return new TextDecoder().decode(entry.data);
}

/** The body of `POST /containers/create` for the verifier's container. */
function containerSpec(spec: VerifierSpec): unknown {
  return {
    Image: spec.image,
    // Harbor's command for its containers (docker-compose-build.yaml), the ENTRYPOINT kept.
    Cmd: ["sh", "-c", "sleep infinity"],
    Labels: {
      [OWNER_LABEL]: String(Deno.pid),
      [CREATED_LABEL]: new Date().toISOString(),
      "dev.hud.harbor.task": spec.task.name,
      "dev.hud.harbor.path": spec.task.path,
      "dev.hud.harbor.role": "verifier",
    },
    HostConfig: {
      NetworkMode: spec.network ? "bridge" : "none",
      CapDrop: ["ALL"],
      CapAdd: [...DOCKER_DEFAULT_CAPS],
      SecurityOpt: ["no-new-privileges"],
      NanoCpus: Math.round(spec.cpus * 1e9),
      Memory: spec.memoryMb * 1024 * 1024,
    },
  };
}

/** Runs test.sh in container `id` within the time limit; how it ended. */
async function runTests(
  engine: EngineClient,
  id: string,
  spec: VerifierSpec,
  signal?: AbortSignal,
): Promise<{ code: number | null; timedOut: boolean }> {
  // Harbor makes the script executable as root, then runs it as the verifier.
  await exec(engine, id, ["sh", "-c", "chmod +x /tests/test.sh"], { user: "0" }, signal);
  using limit = new Deadline(spec.timeoutSec * 1000, signal, "verifier");
  try {
    const code = await exec(
      engine,
      id,
      ["bash", "-c", `(/tests/test.sh) > ${VERIFIER_LOGS}/test-stdout.txt 2>&1`],
      {
        ...(spec.user !== null ? { user: spec.user } : {}),
        ...(spec.workdir !== null ? { workdir: spec.workdir } : {}),
        env: spec.env,
      },
      limit.signal,
    );
    return { code, timedOut: false };
  } catch (err) {
    if (limit.signal.aborted && !signal?.aborted) return { code: null, timedOut: true };
    throw err;
  }
}

/** The reward test.sh wrote in container `id`, and how it ended; or why there is none. */
async function verdictIn(
  engine: EngineClient,
  id: string,
  spec: VerifierSpec,
  ran: { code: number | null; timedOut: boolean },
  signal?: AbortSignal,
): Promise<Verdict> {
  const stdout = await readText(
    engine,
    id,
    `${VERIFIER_LOGS}/test-stdout.txt`,
    signal,
    OUTPUT_LIMIT,
  )
    .catch(() => null);
  const output = (stdout ?? "").slice(-OUTPUT_SHOWN);
  const last = output.trim().split("\n").slice(-3).join(" | ");
  if (ran.timedOut) {
    throw new Error(
      `Cannot grade Harbor task: verifier timed out after ${spec.timeoutSec} s ([verifier] timeout_sec); last output: ${last}`,
    );
  }
  let reward: Reward;
  try {
    reward = await rewardOf(VERIFIER_LOGS, (path) => readText(engine, id, path, signal));
  } catch (err) {
    const said = `in the verifier's container; exit ${ran.code}; last output: ${last}`;
    throw new Error(`${errorMessage(err)} (${said})`, { cause: err });
  }
  return {
    score: reward.score,
    subscores: reward.subscores,
    info: { verifier: { exit_code: ran.code, stdout: output, timed_out: false } },
  };
}

/**
 * Places the verifier's container, puts `collected` in it, runs the
 * verifier and reads its reward; removes the container however it ended.
 *
 * @throws {Error} when the container cannot be made or started, the
 * verifier outlasts `[verifier] timeout_sec`, or wrote no reward (each
 * saying so, with its output's last lines)
 */
export async function verifyInContainer(
  socket: string | undefined,
  spec: VerifierSpec,
  collected: readonly Collected[],
  signal?: AbortSignal,
): Promise<Verdict> {
  using engine = await EngineClient.open(socket, signal);
  const { Id: id } = await engine.call(
    "POST",
    "/containers/create",
    containerSpec(spec),
    signal,
  ) as {
    Id: string;
  };
  try {
    await engine.call("POST", `/containers/${id}/start`, undefined, signal);
    await materialise(engine, id, spec, collected, signal);
    const ran = await runTests(engine, id, spec, signal);
    return await verdictIn(engine, id, spec, ran, signal);
  } finally {
    // Also when aborted: the engine is asked without the signal.
    await removeContainer(engine, id, 0).catch(() => {});
  }
}
