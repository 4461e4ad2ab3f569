// The workspace's sandbox: every command (and anything else the SSH server
// starts, through its `spawn` hook) runs in bubblewrap, or util-linux
// `unshare` where bwrap is missing. It gets a fresh PID namespace with its
// own /proc, the workspace root and a private HOME writable, the rest of the
// file system read-only, a private /tmp, and no network unless asked. Under
// root it runs as an unprivileged uid. We use these tools rather than write
// a sandbox: they are what Flatpak and agent sandboxes rely on.

import type { SshSpawnOptions } from "../ssh/server.ts";

/** A sandbox mechanism; "none" runs commands as they are. */
export type Isolation = "bwrap" | "unshare" | "none";

/** What the sandbox lets a command reach. */
export interface SandboxConfig {
  /** The mechanism. */
  isolation: Isolation;
  /** Directories the command may write (the workspace root, its HOME). */
  writable: readonly string[];
  /** Whether the command keeps this host's network. */
  network: boolean;
  /** Uid and gid to switch to (only when this process is root), or null. */
  user: { uid: number; gid: number } | null;
}

const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/**
 * The absolute path of `program` on this process's PATH, or null. Looked up
 * here, not on the command's PATH, which the agent's `env` requests set.
 */
export function findProgram(program: string): string | null {
  let path: string | undefined;
  try {
    path = Deno.env.get("PATH");
  } catch {
    path = undefined;
  }
  for (const dir of (path ?? DEFAULT_PATH).split(":")) {
    if (!dir.startsWith("/")) continue;
    try {
      const info = Deno.statSync(`${dir}/${program}`);
      if (info.isFile && (info.mode ?? 0) & 0o111) return `${dir}/${program}`;
    } catch {
      // not there
    }
  }
  return null;
}

function isUnder(path: string, dir: string): boolean {
  return path === dir || path.startsWith(`${dir}/`);
}

/**
 * As root: `setpriv` switching to `user` (if any) with no supplementary
 * groups and no capabilities (an empty bounding set keeps even root from
 * regaining them at exec). As anyone else: nothing, unless the sandbox made
 * us root of a user namespace (`userNs`), whose capabilities go too.
 */
function dropArgv(user: { uid: number; gid: number } | null, userNs = false): string[] {
  if (Deno.uid() !== 0 && !userNs) return [];
  return [
    "setpriv",
    ...(user === null ? [] : [`--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups"]),
    "--inh-caps=-all",
    "--bounding-set=-all",
    "--no-new-privs",
    "--",
  ];
}

// Files this process (root) adds to the workspace after start would be
// read-only for the agent's uid: before each command, still root but inside
// the sandbox, where everything but the writable directories is mounted
// read-only (so no link can lead chown anywhere else), hand root's entries
// there to the agent.
const HANDOVER = `owner=$1; shift; n=0
for d in "$@"; do [ "$d" = -- ] && break; n=$((n + 1)); done
chown -R -P -h --from=0 "$owner" -- "\${@:1:$n}" 2>/dev/null || :
shift $((n + 1)); exec "$@"
`;

/** As root switching to a user: hand the writable directories over first, then drop. */
function enterArgv(config: SandboxConfig): string[] {
  const drop = dropArgv(config.user);
  if (config.user === null || drop.length === 0) return drop;
  const { uid, gid } = config.user;
  return [
    "bash",
    "--noprofile",
    "--norc",
    "-c",
    HANDOVER,
    "hud-handover",
    `${uid}:${gid}`,
    ...config.writable,
    "--",
    ...drop,
  ];
}

function bwrapArgv(argv: readonly string[], cwd: string, config: SandboxConfig): string[] {
  const args = [
    "bwrap",
    "--die-with-parent",
    "--unshare-pid",
    "--unshare-ipc",
    ...(config.network ? [] : ["--unshare-net"]),
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--perms",
    "1777",
    "--tmpfs",
    "/tmp",
    "--perms",
    "1777",
    "--tmpfs",
    "/dev/shm",
  ];
  for (const dir of config.writable) {
    // bwrap makes missing mount points 0700 root; an unprivileged user must
    // be able to walk through the ones it makes inside the private /tmp.
    if (isUnder(dir, "/tmp")) {
      const parts = dir.split("/").filter(Boolean);
      for (let i = 2; i < parts.length; i++) {
        args.push("--perms", "0755", "--dir", `/${parts.slice(0, i).join("/")}`);
      }
    }
    args.push("--bind", dir, dir);
  }
  // No --new-session: Deno's `detached` already gave the sandbox a session
  // without a terminal, and staying in one process group lets the server
  // signal the command itself, not only bwrap. Root keeps its capabilities
  // in bwrap until setpriv drops them with the uid.
  args.push("--chdir", cwd, "--", ...enterArgv(config), ...argv);
  return args;
}

// unshare(1) has no bind or read-only options: a small script does the
// mounts inside the new namespaces, then drops privileges and runs argv.
const UNSHARE_SETUP = `set -e
cwd=$1; shift
n=0; while [ "$1" != -- ]; do eval "w$n=\\$1; exec $((n + 3))<\\"\\$1\\""; n=$((n + 1)); shift; done; shift
awk '{print $5}' /proc/self/mountinfo | while IFS= read -r mp; do
  case $mp in *\\*) mp=$(printf '%b' "$mp") ;; esac
  mount -o remount,bind,ro "$mp" 2>/dev/null || true
done
case $(awk '$5 == "/" {o = $6} END {print o}' /proc/self/mountinfo) in ro,* | ro) ;; *)
  echo "Cannot sandbox: / stayed writable" >&2; exit 126 ;; esac
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm 2>/dev/null || true
i=0; while [ $i -lt $n ]; do
  eval "d=\\$w$i"; mkdir -p -m 0755 "$d"
  mount --no-canonicalize --bind "/proc/self/fd/$((i + 3))" "$d"; mount -o remount,bind,rw "$d"
  eval "exec $((i + 3))<&-"; i=$((i + 1))
done
cd "$cwd"
exec "$@"
`;

// A new network namespace starts with its loopback down: bring it up, so
// that pages and servers inside the sandbox reach each other on 127.0.0.1
// (bwrap does this itself).
const LOOPBACK_UP = "ip link set lo up 2>/dev/null || :\n";

function unshareArgv(argv: readonly string[], cwd: string, config: SandboxConfig): string[] {
  const root = Deno.uid() === 0;
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
    ...config.writable,
    "--",
    ...(root ? enterArgv(config) : dropArgv(null, true)),
    ...argv,
  ];
}

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
  switch (config.isolation) {
    case "bwrap":
      return bwrapArgv(argv, cwd, config);
    case "unshare":
      return unshareArgv(argv, cwd, config);
    case "none":
      return [...dropArgv(config.user), ...argv];
  }
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
  const wrapped = options.sandbox.isolation !== "none" || Deno.uid() === 0;
  // The command's environment holds what the client sent (LD_PRELOAD, PATH,
  // BASH_ENV...): the wrappers, which may run as root, get a fixed one, and
  // env(1) sets the command's only at the end, after privileges are gone.
  const inner = wrapped
    ? ["env", "-i", "--", ...Object.entries(options.env).map(([k, v]) => `${k}=${v}`), ...argv]
    : argv;
  const [name, ...args] = sandboxArgv(inner, options.cwd, options.sandbox);
  // The sandbox's own tools come from this process's PATH.
  const program = wrapped ? findProgram(name) : name;
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
export async function probeSandbox(config: SandboxConfig, cwd: string): Promise<string | null> {
  try {
    const child = spawnInSandbox(["true"], {
      cwd,
      env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
      sandbox: config,
    });
    await child.stdin.close().catch(() => {});
    const out = await child.output();
    if (out.success) return null;
    const text = new TextDecoder().decode(out.stderr).trim().split("\n").pop() ?? "";
    return text || `exit status ${out.code}`;
  } catch (err) {
    return err instanceof Deno.errors.NotFound
      ? `"${config.isolation}" is not installed`
      : String(err instanceof Error ? err.message : err);
  }
}

/**
 * The first mechanism of `wanted` ("auto": bubblewrap, then `unshare`)
 * under which `true` runs here with `base`, or why each one failed.
 * @param wanted the mechanism, or "auto"
 * @param base the rest of the sandbox
 * @param cwd the directory the probe runs in
 * @returns the working configuration, or one line per mechanism tried
 */
export async function chooseSandbox(
  wanted: Isolation | "auto",
  base: Omit<SandboxConfig, "isolation">,
  cwd: string,
): Promise<SandboxConfig | { failures: string[] }> {
  if (wanted === "none") return { ...base, isolation: "none" };
  const failures: string[] = [];
  for (const isolation of wanted === "auto" ? ["bwrap", "unshare"] as const : [wanted]) {
    const config = { ...base, isolation };
    const failure = await probeSandbox(config, cwd);
    if (failure === null) return config;
    failures.push(`${isolation}: ${failure}`);
  }
  return { failures };
}
