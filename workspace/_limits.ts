// Per-workspace resources: a cgroup that holds everything the workspace runs
// (memory and process limits), and a uid of its own from a range, so that
// RLIMIT_NPROC, signals and file ownership never cross workspaces. Both need
// root; where they cannot be had, the caller is told why, in one line each.

import { findProgram } from "./_sandbox.ts";
import { reachableSync } from "../_internal/fs.ts";
import { errorMessage, readEnv } from "../_internal/util.ts";

const GiB = 1024 * 1024 * 1024;

/**
 * Limits on what a workspace's commands (or a browser) may use. Each is a
 * positive number, or `Infinity` for none. Where one cannot be enforced here
 * (no cgroup, not root), the workspace says so through `onError` at start
 * and in `Workspace.limits`.
 */
export interface WorkspaceLimits {
  /**
   * Bytes of memory (tmpfs pages included) everything the workspace runs may
   * use together: a cgroup; the kernel kills within it when it is full.
   * @default 4294967296 (4 GiB)
   */
  memory?: number;
  /**
   * Processes and threads at once, all commands together: a cgroup, else
   * RLIMIT_NPROC of the workspace's own uid.
   * @default 1024
   */
  processes?: number;
  /**
   * Bytes each private tmpfs (/tmp, /dev/shm, /run, /var) of a command holds.
   * @default 1073741824 (1 GiB)
   */
  tmpSize?: number;
  /**
   * Largest file a command may write anywhere, the root and HOME included
   * (RLIMIT_FSIZE), in bytes. The root and HOME have no total limit.
   * @default 4294967296 (4 GiB)
   */
  fileSize?: number;
}

/** The limits in force in a started workspace; null where none is. */
export interface WorkspaceLimitsInForce {
  /** Bytes of memory, or null. */
  memory: number | null;
  /** Processes and threads, or null. */
  processes: number | null;
  /** Bytes of each private tmpfs, or null. */
  tmpSize: number | null;
  /** Bytes of the largest file, or null. */
  fileSize: number | null;
}

/** A cgroup (v2, or v1 memory and pids hierarchies) made for one workspace. */
export interface WorkspaceCgroup {
  /** `cgroup.procs` files a process writes its pid to, to join. */
  readonly procs: readonly string[];
  /** Memory limit in force, bytes, or null. */
  readonly memory: number | null;
  /** Process (task) limit in force, or null. */
  readonly processes: number | null;
  /** SIGKILLs everything in it until it is empty (bounded). */
  kill(): Promise<void>;
  /**
   * Kills what is left and removes it.
   * @returns whether it is gone: then no process that was in it is left
   */
  remove(): Promise<boolean>;
}

interface Mount {
  root: string;
  point: string;
  fstype: string;
  superOptions: string[];
}

function mounts(): Mount[] {
  const out: Mount[] = [];
  for (const line of Deno.readTextFileSync("/proc/self/mountinfo").split("\n")) {
    const dash = line.indexOf(" - ");
    if (dash < 0) continue;
    const left = line.slice(0, dash).split(" ");
    const right = line.slice(dash + 3).split(" ");
    const unescape = (s: string) =>
      s.replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
    out.push({
      root: unescape(left[3]),
      point: unescape(left[4]),
      fstype: right[0],
      superOptions: (right[2] ?? "").split(","),
    });
  }
  return out;
}

/** This process's cgroup paths: "" for v2, else each v1 controller. */
function ownCgroups(): Map<string, string> {
  const map = new Map<string, string>();
  for (const line of Deno.readTextFileSync("/proc/self/cgroup").trim().split("\n")) {
    const [, controllers, path] = line.match(/^\d+:([^:]*):(.*)$/) ?? [];
    if (path === undefined) continue;
    if (controllers === "") map.set("", path);
    for (const c of controllers.split(",")) if (c !== "") map.set(c, path);
  }
  return map;
}

/** The directory of our own cgroup under a mount (a container's mount root is our path). */
function under(m: Mount, path: string): string {
  const rel = m.root !== "/" && (path === m.root || path.startsWith(`${m.root}/`))
    ? path.slice(m.root.length)
    : path;
  return `${m.point}${rel === "/" ? "" : rel}`;
}

function pidsIn(procsFile: string): number[] {
  try {
    return Deno.readTextFileSync(procsFile).split("\n").filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** Waits of 1, 2, 4... ms, then 50 ms each, until they add up to `total` ms. */
function* backoff(total: number): Generator<number> {
  let spent = 0;
  for (let wait = 1; spent < total; wait = Math.min(wait * 2, 50)) {
    yield wait;
    spent += wait;
  }
}

class Cgroup implements WorkspaceCgroup {
  readonly procs: readonly string[];
  readonly memory: number | null;
  readonly processes: number | null;
  readonly #dirs: string[];
  #removed = false;

  constructor(dirs: string[], memory: number | null, processes: number | null) {
    this.#dirs = dirs;
    this.procs = dirs.map((d) => `${d}/cgroup.procs`);
    this.memory = memory;
    this.processes = processes;
  }

  async kill(): Promise<void> {
    for (const dir of this.#dirs) {
      // cgroup v2 (Linux 5.14) kills a whole subtree at once.
      if (reachableSync(`${dir}/cgroup.kill`)) {
        await Deno.writeTextFile(`${dir}/cgroup.kill`, "1").catch(() => {});
      }
    }
    // Processes killed a moment ago leave within a millisecond or two:
    // checked again soon, then less often (5 s in all).
    for (const wait of backoff(5_000)) {
      const pids = this.procs.flatMap(pidsIn);
      if (pids.length === 0) return;
      for (const pid of pids) {
        try {
          Deno.kill(pid, "SIGKILL");
        } catch {
          // gone
        }
      }
      await new Promise((r) => setTimeout(r, wait));
    }
  }

  async remove(): Promise<boolean> {
    if (this.#removed) return false;
    this.#removed = true;
    await this.kill();
    let gone = true;
    for (const dir of this.#dirs) gone = await removeDir(dir) && gone;
    return gone;
  }
}

/** Removes a cgroup's directory, which fails while a process is in it; whether it went. */
async function removeDir(dir: string): Promise<boolean> {
  // A process killed a moment ago may hold it until it is reaped.
  for (const wait of backoff(5_000)) {
    try {
      await Deno.remove(dir);
      return true;
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) return true;
      await new Promise((r) => setTimeout(r, wait));
    }
  }
  return false;
}

/**
 * Makes `parent/name`, first removing what a process that died left there:
 * empty `hud-PID-*` cgroups whose PID is gone (rmdir fails on a busy one).
 */
function makeDir(parent: string, name: string): string {
  try {
    for (const e of Deno.readDirSync(parent)) {
      const pid = e.name.match(/^hud-(\d+)-[0-9a-f]+$/)?.[1];
      if (pid !== undefined && e.isDirectory && !reachableSync(`/proc/${pid}`)) {
        try {
          Deno.removeSync(`${parent}/${e.name}`);
        } catch {
          // busy, or not ours to remove
        }
      }
    }
  } catch {
    // unreadable: nothing to sweep
  }
  const dir = `${parent}/${name}`;
  Deno.mkdirSync(dir);
  return dir;
}

function tryV2(
  own: Map<string, string>,
  all: Mount[],
  name: string,
  memory: number | null,
  processes: number | null,
): Cgroup | null {
  const m = all.find((x) => x.fstype === "cgroup2");
  const path = own.get("");
  if (m === undefined || path === undefined) return null;
  const parent = under(m, path);
  const wanted = [...(memory === null ? [] : ["memory"]), ...(processes === null ? [] : ["pids"])];
  let enabled: string[];
  try {
    enabled = Deno.readTextFileSync(`${parent}/cgroup.subtree_control`).trim().split(/\s+/);
    const missing = wanted.filter((c) => !enabled.includes(c));
    // Enabling them works only where our cgroup holds no process (its root).
    if (missing.length > 0) {
      Deno.writeTextFileSync(
        `${parent}/cgroup.subtree_control`,
        missing.map((c) => `+${c}`).join(" "),
      );
    }
  } catch {
    return null;
  }
  let dir: string;
  try {
    dir = makeDir(parent, name);
  } catch {
    return null;
  }
  try {
    if (memory !== null) {
      Deno.writeTextFileSync(`${dir}/memory.max`, String(memory));
      if (reachableSync(`${dir}/memory.swap.max`)) {
        Deno.writeTextFileSync(`${dir}/memory.swap.max`, "0");
      }
    }
    if (processes !== null) Deno.writeTextFileSync(`${dir}/pids.max`, String(processes));
  } catch {
    try {
      Deno.removeSync(dir);
    } catch {
      // leave it to the kernel's release
    }
    return null;
  }
  return new Cgroup([dir], memory, processes);
}

function tryV1(
  controller: "memory" | "pids",
  own: Map<string, string>,
  all: Mount[],
  name: string,
  limit: number,
): string | null {
  const m = all.find((x) => x.fstype === "cgroup" && x.superOptions.includes(controller));
  const path = own.get(controller);
  if (m === undefined || path === undefined) return null;
  let dir: string;
  try {
    dir = makeDir(under(m, path), name);
  } catch {
    return null;
  }
  try {
    if (controller === "memory") {
      Deno.writeTextFileSync(`${dir}/memory.limit_in_bytes`, String(limit));
      // Memory plus swap: no more than memory (where swap accounting is on).
      if (reachableSync(`${dir}/memory.memsw.limit_in_bytes`)) {
        Deno.writeTextFileSync(`${dir}/memory.memsw.limit_in_bytes`, String(limit));
      }
    } else {
      Deno.writeTextFileSync(`${dir}/pids.max`, String(limit));
    }
  } catch {
    try {
      Deno.removeSync(dir);
    } catch {
      // leave it
    }
    return null;
  }
  return dir;
}

/**
 * Makes a cgroup limiting memory and processes (either may be null: not
 * asked for). cgroup v2 when our cgroup can delegate the controllers, else
 * the v1 hierarchies.
 * @returns the cgroup (null when neither limit could be set) and one line
 * per limit that could not be, saying why
 */
function createCgroup(
  name: string,
  memory: number | null,
  processes: number | null,
): { cgroup: WorkspaceCgroup | null; reasons: string[] } {
  if (memory === null && processes === null) return { cgroup: null, reasons: [] };
  if (Deno.build.os !== "linux") {
    return { cgroup: null, reasons: [`no cgroups on ${Deno.build.os}`] };
  }
  if (Deno.uid() !== 0) {
    return { cgroup: null, reasons: ["cgroups need this process to run as root"] };
  }
  let own: Map<string, string>;
  let all: Mount[];
  try {
    own = ownCgroups();
    all = mounts();
  } catch (err) {
    return { cgroup: null, reasons: [`cannot read /proc: ${errorMessage(err)}`] };
  }
  const v2 = tryV2(own, all, name, memory, processes);
  if (v2 !== null) return { cgroup: v2, reasons: [] };
  const dirs: string[] = [];
  const reasons: string[] = [];
  let mem: number | null = null;
  let pids: number | null = null;
  if (memory !== null) {
    const dir = tryV1("memory", own, all, name, memory);
    if (dir === null) reasons.push("no writable memory cgroup (v2 controller or v1 hierarchy)");
    else {
      dirs.push(dir);
      mem = memory;
    }
  }
  if (processes !== null) {
    const dir = tryV1("pids", own, all, name, processes);
    if (dir === null) reasons.push("no writable pids cgroup (v2 controller or v1 hierarchy)");
    else {
      dirs.push(dir);
      pids = processes;
    }
  }
  return { cgroup: dirs.length === 0 ? null : new Cgroup(dirs, mem, pids), reasons };
}

/** A uid held for one workspace until released. */
export interface UidLease {
  /** The uid (and gid). */
  readonly uid: number;
  /** Gives it back. */
  release(): Promise<void>;
}

function startTime(pid: number | "self"): string | null {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19] ?? null;
  } catch {
    return null;
  }
}

/** Real uids of live processes. */
function liveUids(): Set<number> {
  const uids = new Set<number>();
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const status = Deno.readTextFileSync(`/proc/${e.name}/status`);
      const m = status.match(/^Uid:\s+(\d+)/m);
      if (m) uids.add(Number(m[1]));
    } catch {
      // gone
    }
  }
  return uids;
}

function passwdUids(): Set<number> {
  const uids = new Set<number>();
  try {
    for (const line of Deno.readTextFileSync("/etc/passwd").split("\n")) {
      const uid = Number(line.split(":")[2]);
      if (Number.isInteger(uid)) uids.add(uid);
    }
  } catch {
    // no passwd: nothing to avoid
  }
  return uids;
}

/** Where leases live: /run (a tmpfs, emptied at boot) when there is one, else TMPDIR. */
function leaseDir(): string {
  if (reachableSync("/run")) return "/run/hud-uids";
  return `${readEnv("TMPDIR") ?? "/tmp"}/hud-uids`;
}

/**
 * Takes a uid from `[first, last]` that no live process, no /etc/passwd
 * entry and no other live lease holds. Leases are files named by uid in a
 * root-only directory, holding the owner's pid and start time, so a lease of
 * a process that died is taken over; a lock on the directory serialises
 * processes choosing at once.
 * @param prefer a uid to take first when it is free (a workspace's earlier one)
 * @param preferGone whether every process `prefer` ran as is known to have
 *   ended (its episode's cgroup was emptied and removed): it is then taken
 *   without a scan of every process, the 2 ms of a lease
 * @throws {Error} when every uid of the range is taken
 */
export async function leaseUid(
  first: number,
  last: number,
  prefer: number | null = null,
  preferGone = false,
): Promise<UidLease> {
  const dir = leaseDir();
  try {
    await Deno.mkdir(dir, { mode: 0o700 });
  } catch (err) {
    if (!(err instanceof Deno.errors.AlreadyExists)) throw err;
  }
  const info = await Deno.lstat(dir);
  if (!info.isDirectory || info.uid !== 0 || ((info.mode ?? 0) & 0o022) !== 0) {
    throw new Error(`Cannot lease a uid: "${dir}" is not a root-owned private directory`);
  }
  const me = `${Deno.pid} ${startTime("self")}`;
  const lock = await Deno.open(`${dir}/.lock`, { create: true, write: true, mode: 0o600 });
  try {
    await lock.lock(true);
    const named = passwdUids();
    let live: Set<number> | null = null;
    const preferred = prefer !== null && prefer >= first && prefer <= last ? [prefer] : [];
    for (const uid of [...preferred, ...range(first, last)]) {
      if (named.has(uid)) continue;
      if (!(uid === prefer && preferGone) && (live ??= liveUids()).has(uid)) continue;
      const file = `${dir}/${uid}`;
      const held = await Deno.readTextFile(file).catch(() => null);
      if (held !== null) {
        const [pid, start] = held.trim().split(" ");
        if (/^\d+$/.test(pid) && startTime(Number(pid)) === start) continue; // alive
      }
      await Deno.writeTextFile(file, `${me}\n`, { mode: 0o600 });
      return {
        uid,
        async release() {
          const now = await Deno.readTextFile(file).catch(() => null);
          if (now?.trim() === me) await Deno.remove(file).catch(() => {});
        },
      };
    }
  } finally {
    lock.close();
  }
  throw new Error(
    `Cannot lease a uid: all of ${first}-${last} are in use; widen uidRange or stop other workspaces`,
  );
}

function* range(first: number, last: number): Generator<number> {
  for (let uid = first; uid <= last; uid++) yield uid;
}

/**
 * Checks one of {@linkcode WorkspaceLimits} as given.
 * @param verb what is refused: "add workspace", "add browser"
 * @throws {RangeError} for a value that is not a positive integer or Infinity
 */
function checkLimit(verb: string, what: string, value: number | undefined): void {
  if (value === undefined || value === Infinity) return;
  if (!(Number.isInteger(value) && value > 0)) {
    throw new RangeError(
      `Cannot ${verb}: invalid limits.${what} "${value}" (a positive integer, or Infinity for none)`,
    );
  }
}

/**
 * Checks every one of {@linkcode WorkspaceLimits} as given.
 * @param verb what is refused: "add workspace", "add browser"
 * @throws {RangeError} for a value that is not a positive integer or Infinity
 */
export function checkLimits(verb: string, limits: WorkspaceLimits | undefined): void {
  for (const key of ["memory", "processes", "tmpSize", "fileSize"] as const) {
    checkLimit(verb, key, limits?.[key]);
  }
}

function limitOf(value: number | undefined, fallback: number): number | null {
  const v = value ?? fallback;
  return v === Infinity ? null : v;
}

/** What {@linkcode resolveLimits} could set up. */
export interface ResolvedLimits {
  /** The cgroup made (for memory and processes), or null. */
  cgroup: WorkspaceCgroup | null;
  /** What is in force. */
  inForce: WorkspaceLimitsInForce;
  /** RLIMIT_NPROC to set (no pids cgroup, and a uid of one's own), or null. */
  nproc: number | null;
  /** One line per limit asked for and not in force, saying why. */
  notInForce: string[];
}

/**
 * Applies the defaults (4 GiB of memory, 1024 processes, 1 GiB tmpfs, 4 GiB
 * files) and makes the cgroup, for a workspace or a browser.
 * @param limits what the author asked for
 * @param prefix the start of the cgroup's name
 * @param ownUid whether the processes run as a uid no one else uses (then
 *   RLIMIT_NPROC stands in for a pids cgroup)
 */
export function resolveLimits(
  limits: WorkspaceLimits | undefined,
  prefix: string,
  ownUid: boolean,
): ResolvedLimits {
  const l = limits ?? {};
  const memory = limitOf(l.memory, 4 * GiB);
  const processes = limitOf(l.processes, 1024);
  const { cgroup, reasons } = createCgroup(
    `${prefix}-${crypto.randomUUID().slice(0, 8)}`,
    memory,
    processes,
  );
  // Without a pids cgroup, RLIMIT_NPROC holds the processes of a uid of
  // one's own (and of no one else's).
  const nproc = processes !== null && cgroup?.processes == null && ownUid ? processes : null;
  const prlimit = findProgram("prlimit") !== null;
  const inForce = {
    memory: cgroup?.memory ?? null,
    processes: cgroup?.processes ?? (prlimit ? nproc : null),
    tmpSize: limitOf(l.tmpSize, GiB),
    fileSize: prlimit ? limitOf(l.fileSize, 4 * GiB) : null,
  };
  const notInForce: string[] = [];
  if (memory !== null && inForce.memory === null) {
    notInForce.push(
      `memory is not limited: ${reasons.find((r) => /memory|root|cgroups/.test(r))}`,
    );
  }
  if (processes !== null && inForce.processes === null) {
    const why = reasons.find((r) => /pids|root|cgroups/.test(r)) ?? "";
    notInForce.push(
      `processes are not limited: ${why}${
        ownUid ? "; and no prlimit" : "; and no uid of its own for RLIMIT_NPROC"
      }`,
    );
  }
  if (!prlimit && l.fileSize !== Infinity) {
    notInForce.push("file size is not limited: util-linux prlimit is not installed");
  }
  return { cgroup, inForce, nproc: prlimit ? nproc : null, notInForce };
}
