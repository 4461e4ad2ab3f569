// The workspace's sandbox: every command (and anything else the SSH server
// starts, through its `spawn` hook: the SFTP server, a browser) runs in
// bubblewrap, or util-linux `unshare` where bwrap is missing. It gets a
// fresh PID namespace with its own /proc, no network unless asked, and a
// file system of its own: the system's directories (/usr, /etc and the /bin,
// /lib links) read-only, the workspace root and a private HOME writable,
// size-capped private tmpfs at /tmp, /dev/shm, /run and /var, a minimal /dev
// and an empty /sys; nothing else of the host (no /home, /root, /run, /var or
// /sys, so no unix socket the host listens on). Under root it runs as an
// unprivileged uid with no capabilities. Resource limits come from cgroups
// (joined before the sandbox starts) and rlimits (prlimit). We use these
// tools rather than write a sandbox: they are what Flatpak and agent
// sandboxes rely on.

import type { SshSpawnOptions } from "../ssh/server.ts";
import { errorMessage, readEnv } from "../_internal/util.ts";
import { landlockArgv } from "./_landlock.ts";
import { isUnder } from "../_internal/fs.ts";
import { EGRESS_DENO, EGRESS_DIR, relayArgv } from "./_egress_relay.ts";

/** A sandbox mechanism; "none" runs commands as they are. */
export type Isolation = "bwrap" | "unshare" | "none";

/**
 * Checks an `isolation` option as given.
 * @param verb what is refused: "add workspace", "add browser"
 * @throws {RangeError} for anything but "auto", "bwrap", "unshare" or "none"
 */
export function checkIsolation(verb: string, wanted: unknown): void {
  if (!["auto", "bwrap", "unshare", "none"].includes(wanted as string)) {
    throw new RangeError(
      `Cannot ${verb}: unknown isolation "${wanted}" (use "auto", "bwrap", "unshare" or "none")`,
    );
  }
}

/** A host path shown at `dest` inside the sandbox. */
export interface SandboxMount {
  /** The host path (a directory or a file). */
  src: string;
  /** Where the sandbox sees it (absolute). */
  dest: string;
  /** Whether the sandbox may write it; read-only when unset. */
  writable?: boolean;
}

/** Rlimits and tmpfs sizes of a sandbox; null leaves one unset. */
export interface SandboxLimits {
  /** Bytes of each private tmpfs (/tmp, /dev/shm, /run, /var). */
  tmpSize: number | null;
  /** Largest file a process may write, in bytes (RLIMIT_FSIZE). */
  fileSize: number | null;
  /** Processes and threads of the command's uid (RLIMIT_NPROC): a uid of its own only. */
  processes: number | null;
}

/** What the sandbox lets a command reach. */
export interface SandboxConfig {
  /** The mechanism. */
  isolation: Isolation;
  /** Directories the command may write (the workspace root, its HOME), at their own paths. */
  writable: readonly string[];
  /** More host paths (the SFTP server's code, a grader's files, the author's `mounts`). */
  mounts?: readonly SandboxMount[];
  /** Whether the command keeps this host's network. */
  network: boolean;
  /**
   * An allowlist's egress proxy (with `network` false): its directory on
   * this host and the deno binary that runs the relay inside the sandbox.
   */
  egress?: { dir: string; deno: string };
  /** Uid and gid to switch to (only when this process is root), or null. */
  user: { uid: number; gid: number } | null;
  /** With isolation "none": commands keep this process's capabilities (none are dropped). */
  keepCapabilities?: boolean;
  /** With isolation "none": paths commands cannot change (Landlock, `_landlock.ts`). */
  protect?: readonly string[];
  /** Rlimits and tmpfs sizes. */
  limits?: SandboxLimits;
  /** `cgroup.procs` files the command joins before the sandbox starts (as root). */
  cgroups?: readonly string[];
}

export const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/**
 * The host's system directories the sandbox shows read-only: what programs
 * need to run, and nothing where services keep their sockets (/run, /var)
 * or users their files (/home, /root). Merged-/usr links stay links.
 */
const SYSTEM_PATHS = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/**
 * The absolute path of `program` on this process's PATH, or null. Looked up
 * here, not on the command's PATH, which the agent's `env` requests set.
 */
export function findProgram(program: string): string | null {
  const path = readEnv("PATH") ?? DEFAULT_PATH;
  const key = `${program}\0${path}`;
  // Found before: looked at again alone (each directory it is not in costs
  // a failed stat, and an error made of it, several times per command).
  const known = found.get(key);
  if (known !== undefined && isProgram(known)) return known;
  for (const dir of path.split(":")) {
    if (!dir.startsWith("/")) continue;
    if (isProgram(`${dir}/${program}`)) {
      found.set(key, `${dir}/${program}`);
      return `${dir}/${program}`;
    }
  }
  found.delete(key);
  return null;
}

/** Programs found by {@linkcode findProgram}, by name and PATH. */
const found = new Map<string, string>();

function isProgram(path: string): boolean {
  try {
    const info = Deno.statSync(path);
    return info.isFile && ((info.mode ?? 0) & 0o111) !== 0;
  } catch {
    return false; // not there
  }
}

/**
 * Whether the sandbox shows `path` (absolute, links resolved) anyway: it
 * lies in one of the system's directories. Anything else a program needs
 * (a browser installed under /opt or a cache) must be mounted.
 */
export function systemShows(path: string): boolean {
  return SYSTEM_PATHS.some((dir) => isUnder(path, dir));
}

/** One step of building the sandbox's file system, in order. */
type MountOp =
  | { op: "ro-bind" | "bind"; src: string; dest: string }
  | { op: "symlink"; target: string; dest: string }
  | { op: "tmpfs"; dest: string; mode: string; size: number | null }
  | { op: "dir"; dest: string; mode: string }
  | { op: "dev" | "proc" | "remount-ro"; dest: string };

let systemOps: MountOp[] | null = null;

function systemMounts(): MountOp[] {
  if (systemOps !== null) return systemOps;
  const ops: MountOp[] = [];
  for (const path of SYSTEM_PATHS) {
    let info: Deno.FileInfo;
    try {
      info = Deno.lstatSync(path);
    } catch {
      continue;
    }
    if (info.isSymlink) ops.push({ op: "symlink", target: Deno.readLinkSync(path), dest: path });
    else if (info.isDirectory) ops.push({ op: "ro-bind", src: path, dest: path });
  }
  return systemOps = ops;
}

/** The egress proxy's directory, the deno running the relay, and resolv.conf naming it. */
function egressMounts(config: SandboxConfig): MountOp[] {
  const e = config.egress;
  if (e === undefined) return [];
  return [
    { op: "ro-bind", src: e.dir, dest: EGRESS_DIR },
    { op: "ro-bind", src: e.deno, dest: EGRESS_DENO },
    { op: "ro-bind", src: `${e.dir}/resolv.conf`, dest: "/etc/resolv.conf" },
  ];
}

/** The sandbox's file system: the system read-only, private tmpfs, then the binds. */
function mountPlan(config: SandboxConfig): MountOp[] {
  const size = config.limits?.tmpSize ?? null;
  const ops: MountOp[] = [
    ...systemMounts(),
    { op: "dev", dest: "/dev" },
    { op: "proc", dest: "/proc" },
    { op: "tmpfs", dest: "/tmp", mode: "1777", size },
    { op: "tmpfs", dest: "/dev/shm", mode: "1777", size },
    { op: "tmpfs", dest: "/run", mode: "0755", size },
    { op: "tmpfs", dest: "/var", mode: "0755", size },
    { op: "dir", dest: "/var/tmp", mode: "1777" },
    { op: "symlink", target: "../run", dest: "/var/run" },
    { op: "symlink", target: "../run/lock", dest: "/var/lock" },
    { op: "dir", dest: "/sys", mode: "0555" },
  ];
  const binds: MountOp[] = [
    ...egressMounts(config),
    ...config.writable.map((dir) => ({ op: "bind" as const, src: dir, dest: dir })),
    ...(config.mounts ?? []).map((m) => ({
      op: m.writable ? "bind" as const : "ro-bind" as const,
      src: m.src,
      dest: m.dest,
    })),
  ].sort((a, b) => a.dest.split("/").length - b.dest.split("/").length);
  // The directories leading to each bind: made 0755 (walkable by the
  // sandbox's user) where they lie in a tmpfs or in the empty root; taken as
  // they are inside a bind of the host's own tree.
  const mounted: MountOp[] = ops.filter((o) => o.op !== "symlink");
  const made = new Set<string>(["/", ...ops.map((o) => o.dest)]);
  for (const bind of binds) {
    const parts = bind.dest.split("/").filter(Boolean);
    for (let i = 1; i < parts.length; i++) {
      const dir = `/${parts.slice(0, i).join("/")}`;
      if (made.has(dir)) continue;
      const under = mounted.filter((o) => isUnder(dir, o.dest)).pop();
      if (under?.op === "bind" || under?.op === "ro-bind") continue;
      ops.push({ op: "dir", dest: dir, mode: "0755" });
      made.add(dir);
    }
    ops.push(bind);
    mounted.push(bind);
    made.add(bind.dest);
  }
  // The empty root itself: nothing may be added to it.
  ops.push({ op: "remount-ro", dest: "/" });
  return ops;
}

/**
 * As root: `setpriv` switching to `user` (if any) with no supplementary
 * groups and no capabilities (an empty bounding set keeps even root from
 * regaining them at exec). As anyone else: nothing, unless the sandbox made
 * us root of a user namespace (`userNs`), whose capabilities go too.
 */
function dropArgv(
  user: { uid: number; gid: number } | null,
  userNs = false,
  keep = false,
): string[] {
  if (Deno.uid() !== 0 && !userNs) return [];
  if (keep) {
    // As `docker exec -u`: another uid loses root's capabilities by itself.
    return user === null
      ? []
      : ["setpriv", `--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups", "--"];
  }
  return [
    "setpriv",
    ...(user === null ? [] : [`--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups"]),
    "--inh-caps=-all",
    "--bounding-set=-all",
    "--no-new-privs",
    "--",
  ];
}

/** `prlimit` setting the rlimits, soft and hard (lowering needs no privilege). */
function limitArgv(config: SandboxConfig): string[] {
  const l = config.limits;
  if (l === undefined) return [];
  const args: string[] = [];
  if (l.fileSize !== null) args.push(`--fsize=${l.fileSize}`);
  // RLIMIT_NPROC counts every process of the uid: only a uid of its own.
  if (l.processes !== null && config.user !== null) args.push(`--nproc=${l.processes}`);
  return args.length === 0 ? [] : ["prlimit", ...args, "--"];
}

// Files this process (root) adds to the workspace after start would be
// read-only for the agent's uid: before each command, still root but inside
// the sandbox, where everything but the writable directories is mounted
// read-only (so no link can lead chown anywhere else), hand root's entries
// there to the agent.
// Files of several hard links are left alone: one may be a file outside
// the root (a link made before the sandbox, which refuses to make one).
export const HAND_OVER_FILES =
  `find -P "\${dirs[@]}" -user 0 \\( -type d -o -links 1 \\) -exec chown -h "$owner" -- {} + 2>/dev/null || :`;
const HANDOVER = `owner=$1; shift; dirs=()
while [ "$1" != -- ]; do dirs+=("$1"); shift; done; shift
${HAND_OVER_FILES}
exec "$@"
`;

/**
 * What a command's last stage inside the sandbox needs: the uid:gid that
 * root's files in the writable directories are handed to (empty when none
 * are), and the limits and the drop that come before the command.
 */
export interface EnterStage {
  owner: string;
  writable: readonly string[];
  prefix: string[];
}

/** The hand-over, limits and drop of `config` (`userNs`: we are root of a user namespace). */
export function enterStage(config: SandboxConfig, userNs = false): EnterStage {
  const drop = dropArgv(
    config.user,
    userNs,
    config.isolation === "none" && config.keepCapabilities === true,
  );
  const protect = config.isolation === "none" ? config.protect ?? [] : [];
  const prefix = [
    ...limitArgv(config),
    ...(protect.length === 0 ? [] : landlockArgv(protect, [])),
    ...drop,
  ];
  const handOver = config.user !== null && drop.length > 0 && config.isolation !== "none";
  return {
    owner: handOver ? `${config.user!.uid}:${config.user!.gid}` : "",
    writable: config.writable,
    prefix,
  };
}

/** What runs inside the sandbox before `argv`: hand-over, limits, then the drop. */
function enterArgv(config: SandboxConfig, userNs = false): string[] {
  const { owner, writable, prefix } = enterStage(config, userNs);
  if (owner === "") return prefix;
  return [
    "bash",
    "--noprofile",
    "--norc",
    "-c",
    HANDOVER,
    "hud-handover",
    owner,
    ...writable,
    "--",
    ...prefix,
  ];
}

function bwrapArgv(inner: readonly string[], cwd: string, config: SandboxConfig): string[] {
  const args = [
    "bwrap",
    "--die-with-parent",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-cgroup-try",
    ...(config.network ? [] : ["--unshare-net"]),
  ];
  for (const o of mountPlan(config)) {
    switch (o.op) {
      case "ro-bind":
      case "bind":
        args.push(`--${o.op}`, o.src, o.dest);
        break;
      case "symlink":
        args.push("--symlink", o.target, o.dest);
        break;
      case "tmpfs":
        args.push("--perms", o.mode, ...(o.size === null ? [] : ["--size", String(o.size)]));
        args.push("--tmpfs", o.dest);
        break;
      case "dir":
        args.push("--perms", o.mode, "--dir", o.dest);
        break;
      default:
        args.push(`--${o.op}`, o.dest);
    }
  }
  // No --new-session: Deno's `detached` already gave the sandbox a session
  // without a terminal, and staying in one process group lets the server
  // signal the command itself, not only bwrap. Root keeps its capabilities
  // in bwrap until setpriv drops them with the uid.
  args.push("--chdir", cwd, "--", ...inner);
  return args;
}

// unshare(1) makes the namespaces but no file system: this script builds the
// same one bwrap would in a tmpfs and chroots into it. Bind sources are held
// open first (the new root covers this namespace's /tmp, where a workspace
// may live). Arguments: cwd, then mount ops (as encoded by unshareArgv), "--",
// then the command.
const UNSHARE_SETUP = `set -e
umask 022
cwd=$1; shift
ops=(); fds=()
while [ "$1" != -- ]; do
  case $1 in
    ro-bind | bind) exec {fd}<"$2"; fds+=("$fd"); ops+=("$1" "/proc/self/fd/$fd" "$3"); shift 3 ;;
    symlink | dir) ops+=("$1" "$2" "$3"); shift 3 ;;
    tmpfs) ops+=("$1" "$2" "$3" "$4"); shift 4 ;;
    *) ops+=("$1" "$2"); shift 2 ;;
  esac
done
shift
r=/tmp
mount -t tmpfs -o mode=0755 hud-root "$r"
i=0
while [ $i -lt \${#ops[@]} ]; do
  op=\${ops[i]}
  case $op in
    ro-bind | bind)
      src=\${ops[i+1]}; d=$r\${ops[i+2]}; i=$((i + 3))
      if [ -d "$src" ]; then mkdir -p "$d"; elif [ ! -e "$d" ]; then mkdir -p "\${d%/*}"; : > "$d"; fi
      mount --no-canonicalize --bind "$src" "$d"
      [ "$op" = bind ] || mount --no-canonicalize -o remount,bind,ro "$d" ;;
    symlink) d=$r\${ops[i+2]}; mkdir -p "\${d%/*}"; ln -s "\${ops[i+1]}" "$d"; i=$((i + 3)) ;;
    dir) d=$r\${ops[i+1]}; mkdir -p "$d"; chmod "\${ops[i+2]}" "$d"; i=$((i + 3)) ;;
    tmpfs)
      d=$r\${ops[i+1]}; mkdir -p "$d"; size=\${ops[i+3]}
      mount -t tmpfs -o "mode=\${ops[i+2]}\${size:+,size=$size}" hud-tmp "$d"; i=$((i + 4)) ;;
    proc) d=$r\${ops[i+1]}; mkdir -p "$d"; mount -t proc proc "$d"; i=$((i + 2)) ;;
    dev)
      d=$r\${ops[i+1]}; i=$((i + 2)); mkdir -p "$d"
      mount -t tmpfs -o mode=0755,size=1m hud-dev "$d"
      for n in null zero full random urandom tty; do : > "$d/$n"; mount --bind "/dev/$n" "$d/$n"; done
      mkdir "$d/pts" "$d/shm"
      mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$d/pts" 2>/dev/null &&
        ln -s pts/ptmx "$d/ptmx"
      ln -s /proc/self/fd "$d/fd"
      ln -s /proc/self/fd/0 "$d/stdin"; ln -s /proc/self/fd/1 "$d/stdout"; ln -s /proc/self/fd/2 "$d/stderr" ;;
    remount-ro) mount -o remount,bind,ro "$r\${ops[i+1]%/}"; i=$((i + 2)) ;;
  esac
done
for fd in "\${fds[@]}"; do exec {fd}<&-; done
exec chroot "$r" "$BASH" --noprofile --norc -c 'cd -- "$1" || exit 126; shift; exec "$@"' hud-chdir "$cwd" "$@"
`;

// A new network namespace starts with its loopback down: bring it up, so
// that pages and servers inside the sandbox reach each other on 127.0.0.1
// (bwrap does this itself).
const LOOPBACK_UP = "ip link set lo up 2>/dev/null || :\n";

function unshareArgv(inner: readonly string[], cwd: string, config: SandboxConfig): string[] {
  const root = Deno.uid() === 0;
  const ops: string[] = [];
  for (const o of mountPlan(config)) {
    switch (o.op) {
      case "ro-bind":
      case "bind":
        ops.push(o.op, o.src, o.dest);
        break;
      case "symlink":
        ops.push(o.op, o.target, o.dest);
        break;
      case "dir":
        ops.push(o.op, o.dest, o.mode);
        break;
      case "tmpfs":
        ops.push(o.op, o.dest, o.mode, o.size === null ? "" : String(o.size));
        break;
      default:
        ops.push(o.op, o.dest);
    }
  }
  return [
    "unshare",
    ...(root ? [] : ["--user", "--map-root-user"]),
    "--mount",
    "--propagation",
    "private",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
    "--ipc",
    ...(config.network ? [] : ["--net"]),
    "--",
    "bash",
    "--noprofile",
    "--norc",
    "-c",
    config.network ? UNSHARE_SETUP : LOOPBACK_UP + UNSHARE_SETUP,
    "hud-sandbox",
    cwd,
    ...ops,
    "--",
    ...inner,
  ];
}

// Joining cgroups happens on the host side, as root, before the sandbox
// starts: everything the command starts is born inside them.
const JOIN_CGROUPS = `while [ "$1" != -- ]; do printf '%s\\n' $$ > "$1" || exit 125; shift; done
shift; exec "$@"
`;

/**
 * The full command line that runs `argv` in `cwd` under `config`.
 * @param argv the program and its arguments
 * @param cwd the working directory (inside a writable directory)
 * @param config what the sandbox lets through
 * @returns the command line to execute
 */
export function sandboxArgv(
  argv: readonly string[],
  cwd: string,
  config: SandboxConfig,
): string[] {
  return sandboxArgvWith((userNs) => [...enterArgv(config, userNs), ...argv], cwd, config);
}

/**
 * The full command line that runs `stage(userNs)` in `cwd` under `config`:
 * what runs inside the sandbox (as root there, or root of a user namespace
 * when `userNs`), the hand-over, limits and drop included.
 */
export function sandboxArgvWith(
  own: (userNs: boolean) => string[],
  cwd: string,
  config: SandboxConfig,
): string[] {
  // With an allowlist the relay starts first, inside, as the sandbox's root.
  const stage = config.egress === undefined || config.isolation === "none"
    ? own
    : (userNs: boolean) => [...relayArgv(userNs || Deno.uid() === 0), ...own(userNs)];
  let inner: string[];
  switch (config.isolation) {
    case "bwrap":
      inner = bwrapArgv(stage(false), cwd, config);
      break;
    case "unshare":
      inner = unshareArgv(stage(Deno.uid() !== 0), cwd, config);
      break;
    case "none":
      inner = stage(false);
      break;
  }
  const cgroups = config.cgroups ?? [];
  if (cgroups.length === 0) return inner;
  return [
    "bash",
    "--noprofile",
    "--norc",
    "-c",
    JOIN_CGROUPS,
    "hud-cgroup",
    ...cgroups,
    "--",
    ...inner,
  ];
}

/** Whether `config` wraps commands at all (a sandbox, a uid switch, limits or cgroups). */
function wraps(config: SandboxConfig): boolean {
  return config.isolation !== "none" || Deno.uid() === 0 || (config.protect ?? []).length > 0 ||
    (config.cgroups ?? []).length > 0 || limitArgv(config).length > 0;
}

/**
 * Starts `argv` in the sandbox: the SSH server's `spawn` hook, for commands
 * and for anything else a session runs. The child leads its own process
 * group; its environment is exactly `options.env`.
 * @param argv the program and its arguments
 * @param options working directory, environment and sandbox
 * @returns the child, with piped stdio
 */
export function spawnInSandbox(
  argv: readonly string[],
  options: SshSpawnOptions & { sandbox: SandboxConfig },
): Deno.ChildProcess {
  const wrapped = wraps(options.sandbox);
  // The command's environment holds what the client sent (LD_PRELOAD, PATH,
  // BASH_ENV...): the wrappers, which may run as root, get a fixed one, and
  // env(1) sets the command's only at the end, after privileges are gone.
  const inner = wrapped
    ? ["env", "-i", "--", ...Object.entries(options.env).map(([k, v]) => `${k}=${v}`), ...argv]
    : argv;
  const [name, ...args] = sandboxArgv(inner, options.cwd, options.sandbox);
  // The sandbox's own tools come from this process's PATH.
  const program = wrapped && !name.startsWith("/") ? findProgram(name) : name;
  if (program === null) throw new Deno.errors.NotFound(`Cannot sandbox: "${name}" not found`);
  return new Deno.Command(program, {
    args,
    // bwrap and unshare chdir inside; the host side starts from a directory
    // that exists for certain.
    cwd: options.sandbox.isolation === "none" ? options.cwd : "/",
    env: wrapped ? { PATH: DEFAULT_PATH } : options.env,
    clearEnv: true,
    // setsid(): the sandbox leads its own process group, which we kill; with
    // the PID namespace, killing its first process ends every process in it.
    detached: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

/**
 * Runs `true` under `config` to see whether the mechanism works here.
 * @returns null when it works, else what went wrong (one line)
 */
async function probeSandbox(config: SandboxConfig, cwd: string): Promise<string | null> {
  try {
    const child = spawnInSandbox(["true"], { cwd, env: { PATH: DEFAULT_PATH }, sandbox: config });
    await child.stdin.close().catch(() => {});
    const out = await child.output();
    if (out.success) return null;
    const text = new TextDecoder().decode(out.stderr).trim().split("\n").pop() ?? "";
    return text || `exit status ${out.code}`;
  } catch (err) {
    return err instanceof Deno.errors.NotFound
      ? `"${config.isolation}" is not installed`
      : errorMessage(err);
  }
}

/** What bwrap and unshare say when this user may not make namespaces. */
const NO_USERNS =
  /namespace|uid map|Operation not permitted|No space left on device|Permission denied/i;

/**
 * The mechanism that worked for each shape of sandbox: a later sandbox of
 * the same shape (another episode's, whose paths differ) skips the probe
 * (29 of a workspace's 50 ms start, on a quiet 2-core machine). The shape
 * is everything a mechanism can fail on here: the user switch, the network,
 * limits, cgroups, Landlock and where each mount lands (a mount whose
 * source is gone by then fails the command that needs it, with bwrap's own
 * message).
 */
const chosen = new Map<string, Promise<Isolation | string[]>>();

/** The first of `wanted`'s mechanisms under which `true` runs, or each one's failure. */
async function probeMechanisms(
  wanted: "bwrap" | "unshare" | "auto",
  base: Omit<SandboxConfig, "isolation">,
  cwd: string,
): Promise<Isolation | string[]> {
  const failures: string[] = [];
  for (const isolation of wanted === "auto" ? ["bwrap", "unshare"] as const : [wanted]) {
    const failure = await probeSandbox({ ...base, isolation }, cwd);
    if (failure === null) return isolation;
    failures.push(`${isolation}: ${failure}`);
  }
  return failures;
}

function probeKey(wanted: Isolation | "auto", base: Omit<SandboxConfig, "isolation">): string {
  return JSON.stringify([
    wanted,
    Deno.uid(),
    base.user === null,
    base.network,
    base.egress === undefined,
    base.keepCapabilities ?? false,
    base.protect ?? [],
    base.limits ?? null,
    (base.cgroups ?? []).length > 0,
    base.writable.length,
    (base.mounts ?? []).map((m) => [m.dest, m.writable ?? false]),
  ]);
}

/** Who asks {@linkcode chooseSandbox}, for its one-line refusal. */
export interface SandboxSubject {
  /** What cannot start: "workspace", "browser". */
  what: string;
  /** What `isolation: "none"` would run unconfined: "commands", "Chromium". */
  runs: string;
}

/**
 * The first mechanism of `wanted` ("auto": bubblewrap, then `unshare`)
 * under which `true` runs here with `base`: the one chooser of the
 * workspace and the browser.
 * @param wanted the mechanism, or "auto"
 * @param base the rest of the sandbox
 * @param cwd the directory the probe runs in
 * @param subject who asks, for the error
 * @returns the working configuration
 * @throws {Error} one line saying why none works here and naming the way out
 */
export async function chooseSandbox(
  wanted: Isolation | "auto",
  base: Omit<SandboxConfig, "isolation">,
  cwd: string,
  subject: SandboxSubject,
): Promise<SandboxConfig> {
  const { what, runs } = subject;
  if (wanted === "none") {
    const chosen: SandboxConfig = { ...base, isolation: "none" };
    if ((base.protect ?? []).length === 0) return chosen;
    // The launcher says why it cannot protect (no Landlock in this kernel).
    const why = await probeSandbox(chosen, cwd);
    if (why !== null) throw new Error(`Cannot start ${what}: ${why}`);
    return chosen;
  }
  const none = `set isolation: "none" to run ${runs} unconfined`;
  if (Deno.build.os !== "linux") {
    throw new Error(
      `Cannot start ${what}: no sandbox on ${Deno.build.os} (it is made of Linux namespaces); run the environment on Linux (a container or a VM), or ${none}`,
    );
  }
  // Sandboxes of one shape starting at once (a taskset's first wave) share one probe.
  const key = probeKey(wanted, base);
  let probing = chosen.get(key);
  if (probing === undefined) {
    probing = probeMechanisms(wanted, base, cwd);
    chosen.set(key, probing);
  }
  const found = await probing;
  if (typeof found === "string") return { ...base, isolation: found };
  // Not kept: what failed may work later (bwrap installed meanwhile).
  if (chosen.get(key) === probing) chosen.delete(key);
  const failures = found;
  const installed = failures.filter((f) => !f.endsWith("is not installed"));
  const refused = installed.length > 0 && installed.every((f) => NO_USERNS.test(f));
  if (refused && Deno.uid() === 0) {
    // Root refused namespaces: a container's seccomp profile (Docker's default), or the kernel.
    throw new Error(
      `Cannot start ${what}: no sandbox works here: user namespaces are not allowed here (${
        failures.join("; ")
      }); run it where they are (an environment placed in a container of its own by ContainerRuntime, or a container started with a seccomp profile that allows them), or ${none}`,
    );
  }
  if (refused) {
    throw new Error(
      `Cannot start ${what}: no sandbox works here: this user may not create user namespaces (${
        failures.join("; ")
      }); run as root, allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04), or ${none}`,
    );
  }
  throw new Error(
    `Cannot start ${what}: no sandbox works here (${
      failures.join("; ")
    }); install bubblewrap, or ${none}`,
  );
}
