// One start-to-stop episode of a workspace, made in steps, each its own
// function: the agent's uid (leased from a range, as root), the limits in
// force, the root handed to that uid, the sandbox's /etc naming it, the
// sandboxed SFTP server, the sandbox chosen; then the keys, the SSH server
// and the published capabilities. What an episode made is undone by
// `releaseEpisode()`.

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { formatHost } from "../_internal/net.ts";
import { errorMessage } from "../_internal/util.ts";
import { generateSshKeyPair } from "../ssh/keys.ts";
import { type SshServer, type SshSpawner, startSshServer } from "../ssh/server.ts";
import { startFileTracker } from "../filetracking/tracker.ts";
import type { FileTracker } from "../filetracking/tracker.ts";
import { chooseSandbox, DEFAULT_PATH, type SandboxConfig, type SandboxMount } from "./_sandbox.ts";
import {
  leaseUid,
  resolveLimits,
  type UidLease,
  type WorkspaceCgroup,
  type WorkspaceLimitsInForce,
} from "./_limits.ts";
import { denoBinary, SandboxedSftp, SFTP_MARKER } from "./_sftp.ts";
import { type EgressProxy, startEgressProxy } from "./_egress.ts";
import { inheritedProxyEnv, PROXY_ENV } from "./_egress_relay.ts";
import type { WorkspaceConfig } from "./_config.ts";
import type { SnapshotRoot } from "./_snapshot.ts";
import type { SpareSandbox } from "./_waiting.ts";
import type { PreparedGrading } from "./_grade.ts";
import type { Owner } from "./_layers.ts";
import { removeScratch, scratchDir } from "./_scratch.ts";
import { HandOverHint } from "./_handover.ts";

/** Unauthenticated SSH connections: random early drop from 32, all from 128. */
const WORKSPACE_STARTUPS = { start: 32, rate: 30, full: 128 };

/** The gid of commands given a `uid` but no `gid`, when this process is root: `nogroup`. */
const NOBODY = 65534;

/** Everything one start-to-stop episode holds. */
export interface Episode {
  sandbox: SandboxConfig;
  /** The agent's HOME, made for this episode. */
  home: string;
  /** The uid and gid commands run as (as root, unless that is root), or null. */
  user: { uid: number; gid: number } | null;
  /** HOME, USER and the author's variables. */
  commandEnv: Record<string, string>;
  cgroup: WorkspaceCgroup | null;
  lease: UidLease | null;
  limits: WorkspaceLimitsInForce;
  server: SshServer | null;
  tracker: FileTracker | null;
  /** The directory of the client key file, when one was written. */
  keyDir: string | null;
  sftp: SandboxedSftp | null;
  /** The sandbox's /etc/passwd and /etc/group, naming the agent's uid. */
  etc: string | null;
  /** The root, when it takes snapshots or is a fork. */
  root: SnapshotRoot | null;
  /** A sandbox started ahead for the agent's next command. */
  spare: SpareSandbox | null;
  /** The egress proxy of an allowlist, or null. */
  egress: EgressProxy | null;
  /** The next grading command's directory and sandbox, made ahead. */
  grading: Promise<PreparedGrading | null> | null;
  /** Whether a command must hand root's files over; null when commands never do. */
  handOver: HandOverHint | null;
}

/** The uid an earlier episode of a workspace leased, and whether all it ran has ended. */
export interface HeldUid {
  readonly uid: number;
  readonly gone: boolean;
}

/** A new episode, with its HOME made and nothing else yet. */
export async function newEpisode(): Promise<Episode> {
  return {
    sandbox: { isolation: "none", writable: [], network: false, user: null },
    home: await scratchDir("hud-home-"),
    user: null,
    commandEnv: {},
    cgroup: null,
    lease: null,
    limits: { memory: null, processes: null, tmpSize: null, fileSize: null },
    server: null,
    tracker: null,
    keyDir: null,
    sftp: null,
    etc: null,
    root: null,
    spare: null,
    egress: null,
    grading: null,
    handOver: null,
  };
}

/**
 * Makes the episode's sandbox, complete enough for commands: the agent's
 * uid, limits, the root and HOME handed over, /etc naming the uid, the SFTP
 * server staged, the mechanism chosen, the commands' variables.
 * @param report one line for each protection that could not be had here
 * @param held the uid an earlier episode leased, taken again when it is
 *   free, and whether every process it ran is known to have ended
 * @param diskOwner who the root's files belong to on disk when an earlier
 *   episode of an overlay root has shown them: they stay as they are (their
 *   inodes may be a snapshot's too, and chown(2) would change its owners and
 *   clear its setuid bits); the overlay shows them as the agent's
 */
export async function prepareSandbox(
  config: WorkspaceConfig,
  ep: Episode,
  report: (message: string) => void,
  held: HeldUid | null = null,
  diskOwner: Owner | null = null,
): Promise<void> {
  ep.user = await agentUser(config, ep, held);
  const nproc = applyLimits(config, ep, report);
  const mounts: SandboxMount[] = config.mounts.map((p) => ({ src: p, dest: p }));
  if (ep.user !== null) {
    const paths = diskOwner === null ? [config.root, ep.home] : [ep.home];
    await chownTree(paths, ep.user.uid, ep.user.gid);
    // What root added to such a root since is the agent's too, and so the
    // disk owner's: the sandbox's first command (the probe, before the
    // overlay is mounted) would give it to this uid, which the overlay shows
    // as the disk owner's.
    if (diskOwner !== null) await chownTree([config.root], diskOwner.uid, diskOwner.gid, true);
    mounts.push(...await nameUser(config.user, ep.user, ep));
  }
  ep.sftp = await SandboxedSftp.stage(report);
  if (ep.sftp !== null) mounts.push(...ep.sftp.mounts);
  const egress = await startEgress(config, ep);
  ep.sandbox = await chooseSandbox(
    config.isolation,
    {
      writable: [config.root, ep.home],
      mounts,
      network: config.network,
      ...(egress === null ? {} : { egress }),
      user: ep.user,
      keepCapabilities: config.keepCapabilities,
      protect: config.protect,
      limits: { tmpSize: ep.limits.tmpSize, fileSize: ep.limits.fileSize, processes: nproc },
      cgroups: ep.cgroup?.procs ?? [],
    },
    config.root,
    { what: "workspace", runs: "commands" },
  );
  if (ep.sandbox.isolation === "none") {
    config.onError(
      new Error(
        `Workspace "${config.name}" runs commands without a sandbox (isolation: "none"): they see this host's processes, files and network${
          ep.user === null ? " as this process's user" : ""
        }`,
      ),
    );
  }
  // Root's files are handed to the agent's uid before each command, in
  // the sandbox; the hint spares that where nothing of root's can be new.
  if (ep.user !== null && ep.sandbox.isolation !== "none") {
    ep.handOver = new HandOverHint([config.root, ep.home]);
  }
  // Without a proxy of its own, commands sharing this process's network
  // use its proxy (a container's with an allowlist: engines/_container_egress.ts).
  const proxyEnv = egress === null ? inheritedProxyEnv() : PROXY_ENV;
  ep.commandEnv = { HOME: ep.home, USER: config.user, ...proxyEnv, ...config.env };
}

/** An allowlist's egress proxy, started (and noted in `ep`); null for other policies. */
async function startEgress(
  config: WorkspaceConfig,
  ep: Episode,
): Promise<{ dir: string; deno: string } | null> {
  if (config.netPolicy.mode !== "allowlist") return null;
  const deno = denoBinary();
  if (deno === null) {
    throw new Error(
      "Cannot start workspace: its network allowlist needs a deno binary to run the relay in the sandbox (put deno on PATH)",
    );
  }
  ep.egress = await startEgressProxy(config.netPolicy, config.onError);
  return { dir: ep.egress.dir, deno };
}

/**
 * The uid and gid commands run as, when this process is root: those given,
 * else a uid leased from the range (its gid the same); null when not root
 * or when that is root itself.
 */
async function agentUser(
  config: WorkspaceConfig,
  ep: Episode,
  held: HeldUid | null,
): Promise<{ uid: number; gid: number } | null> {
  if (Deno.uid() !== 0) return null;
  let uid = config.uid;
  let gid = config.gid;
  if (uid === undefined) {
    const [first, last] = config.uidRange;
    ep.lease = await leaseUid(first, last, held?.uid ?? null, held?.gone ?? false);
    uid = ep.lease.uid;
    gid ??= uid;
  }
  gid ??= uid === 0 ? 0 : NOBODY;
  return uid === 0 ? null : { uid, gid };
}

/** Makes the cgroup and notes the limits in force; returns RLIMIT_NPROC to set, if any. */
function applyLimits(
  config: WorkspaceConfig,
  ep: Episode,
  report: (message: string) => void,
): number | null {
  const limits = resolveLimits(config.limits, `hud-${Deno.pid}`, ep.lease !== null);
  ep.cgroup = limits.cgroup;
  ep.limits = limits.inForce;
  for (const line of limits.notInForce) report(line);
  return limits.nproc;
}

/**
 * Gives `paths` (recursively, links not followed) to `uid`:`gid`, but for
 * files of several hard links: one may be a file outside the root (which
 * would become the agent's), or a snapshot's.
 * @param rootsOnly only what uid 0 owns (the rest is an earlier agent's)
 */
async function chownTree(
  paths: string[],
  uid: number,
  gid: number,
  rootsOnly = false,
): Promise<void> {
  // A small tree (a fresh HOME, most roots) here: find(1) costs a process
  // or two, milliseconds each on a small machine.
  if (chownSmall(paths, uid, gid, rootsOnly)) return;
  let out: Deno.CommandOutput;
  try {
    out = await findChown(paths, uid, gid, rootsOnly);
  } catch (err) {
    // An image without findutils (a container's, say): the same walk here.
    if (!(err instanceof Deno.errors.NotFound)) throw err;
    for (const path of paths) await chownWalk(path, uid, gid, rootsOnly);
    return;
  }
  if (!out.success) {
    const why = new TextDecoder().decode(out.stderr).trim().split("\n")[0];
    throw new Error(`Cannot start workspace: cannot give the root to uid ${uid}: ${why}`);
  }
}

/** Entries up to which {@linkcode chownSmall} walks a tree itself. */
const SMALL_TREE = 256;

/**
 * chownTree()'s walk for small trees, synchronous: the entries are listed
 * first, and only when there are at most {@linkcode SMALL_TREE} are they
 * changed.
 * @returns whether it did the work (false: the trees are larger; nothing changed)
 */
function chownSmall(paths: string[], uid: number, gid: number, rootsOnly: boolean): boolean {
  const todo: string[] = [];
  const stack = [...paths];
  let seen = 0;
  while (stack.length > 0) {
    const path = stack.pop()!;
    if (++seen > SMALL_TREE) return false;
    let info: Deno.FileInfo;
    try {
      info = Deno.lstatSync(path);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) continue;
      throw err;
    }
    if (info.isDirectory) {
      for (const e of Deno.readDirSync(path)) stack.push(`${path}/${e.name}`);
    } else if (info.nlink !== 1) continue;
    if (rootsOnly && info.uid !== 0) continue;
    if (info.uid === uid && info.gid === gid) continue;
    // A link to give: only find's `chown -h` can (Deno's chown follows it).
    if (info.isSymlink) return false;
    todo.push(path);
  }
  for (const path of todo) {
    try {
      Deno.chownSync(path, uid, gid);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) {
        throw new Error(
          `Cannot start workspace: cannot give the root to uid ${uid}: ${errorMessage(err)}`,
        );
      }
    }
  }
  return true;
}

/** chownTree()'s walk without find: directories and files of one link, links not followed. */
async function chownWalk(
  root: string,
  uid: number,
  gid: number,
  rootsOnly: boolean,
): Promise<void> {
  const stack = [root];
  while (stack.length > 0) {
    const path = stack.pop()!;
    let info: Deno.FileInfo;
    try {
      info = await Deno.lstat(path);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) continue;
      throw err;
    }
    // A link is left as it is: chown would follow it.
    if (info.isSymlink) continue;
    if (info.isDirectory) {
      for await (const e of Deno.readDir(path)) stack.push(`${path}/${e.name}`);
    } else if (info.nlink !== 1) continue;
    if (rootsOnly && info.uid !== 0) continue;
    await Deno.chown(path, uid, gid);
  }
}

/** chownTree()'s walk by find(1); throws NotFound when there is no find. */
function findChown(
  paths: string[],
  uid: number,
  gid: number,
  rootsOnly: boolean,
): Promise<Deno.CommandOutput> {
  return new Deno.Command("find", {
    args: [
      "-P",
      ...paths,
      ...(rootsOnly ? ["-user", "0"] : []),
      "(",
      "-type",
      "d",
      "-o",
      "-links",
      "1",
      ")",
      "-exec",
      "chown",
      "-h",
      `${uid}:${gid}`,
      "--",
      "{}",
      "+",
    ],
    clearEnv: true,
    env: { PATH: DEFAULT_PATH },
    stdout: "null",
    stderr: "piped",
  }).output();
}

/**
 * A uid without a name breaks scp, git and whoami: the sandbox's passwd
 * and group, this host's with a line for the agent added, name it.
 * @returns the mounts that show them
 */
async function nameUser(
  name: string,
  user: { uid: number; gid: number },
  ep: Episode,
): Promise<SandboxMount[]> {
  const etc = ep.etc = await scratchDir("hud-etc-");
  await Deno.chmod(etc, 0o755);
  const read = (f: string) => Deno.readTextFile(f).then((t) => t.replace(/\n?$/, "\n"), () => "");
  const passwd = `${name}:x:${user.uid}:${user.gid}::${ep.home}:/bin/bash\n`;
  await Deno.writeTextFile(`${etc}/passwd`, `${await read("/etc/passwd")}${passwd}`, {
    mode: 0o644,
  });
  await Deno.writeTextFile(`${etc}/group`, `${await read("/etc/group")}${name}:x:${user.gid}:\n`, {
    mode: 0o644,
  });
  return [
    { src: `${etc}/passwd`, dest: "/etc/passwd" },
    { src: `${etc}/group`, dest: "/etc/group" },
  ];
}

/**
 * Makes the episode's keys, starts its SSH server (commands through
 * `spawn`) and publishes the `ssh/2` capability, attached to the
 * environment so that a `tunnel.open` hands the control connection to the
 * server in this process: no loopback hop, one copy fewer each way.
 */
export async function publishShell(
  env: Environment,
  config: WorkspaceConfig,
  ep: Episode,
  spawn: SshSpawner,
): Promise<void> {
  const host = await generateSshKeyPair({ comment: `${env.name}-host` });
  const client = await generateSshKeyPair({ comment: `${env.name}-${config.user}` });
  let clientKeyPath: string | undefined;
  if (config.writeKeyFile) {
    ep.keyDir = await scratchDir("hud-ssh-");
    clientKeyPath = `${ep.keyDir}/id_ed25519`;
    await Deno.writeTextFile(clientKeyPath, client.privateKey, { mode: 0o600 });
  }
  const server = ep.server = startSshServer({
    hostname: config.hostname,
    port: config.port,
    hostKey: host.privateKey,
    authorizedKeys: [client.publicKey],
    user: config.user,
    cwd: config.root,
    env: ep.commandEnv,
    spawn,
    ...(ep.sftp === null ? { sftp: false } : { sftpCommand: [SFTP_MARKER] }),
    // Rollouts in parallel log in at once: OpenSSH's 10:30:100 would drop
    // some of a burst of twenty.
    maxStartups: WORKSPACE_STARTUPS,
    killOnClose: config.lifetime === "session",
    onError: config.onError,
  });
  const addr = server.addr;
  env.addCapability(
    Capability.ssh({
      name: config.name,
      url: `ssh://${formatHost(addr.hostname)}:${addr.port}`,
      user: config.user,
      hostPublicKey: server.hostPublicKey,
      clientKey: client.privateKey,
      clientKeyPath,
      cwd: config.root,
      isolation: ep.sandbox.isolation,
    }),
    { attach: (conn, head) => server.attach(conn, head) },
  );
}

/**
 * Starts a `filetracking/1` tracker of the root and publishes it, attached
 * to the environment: it has no port of its own.
 */
export async function publishTracker(
  env: Environment,
  config: WorkspaceConfig,
  ep: Episode,
): Promise<void> {
  const t = ep.tracker = await startFileTracker(config.root, {
    onError: config.onError,
    listen: false,
  });
  env.addCapability(t.capability(), { attach: (conn, head) => t.attach(conn, head) });
}

/**
 * Undoes what the episode made on this host (once its processes are gone):
 * the SFTP filling, the cgroup, the uid lease, the key, HOME and /etc.
 * @returns whether every process the episode ran is known to have ended
 *   (its cgroup was emptied and removed)
 */
export async function releaseEpisode(ep: Episode): Promise<boolean> {
  await ep.sftp?.remove();
  await ep.egress?.close();
  const gone = await ep.cgroup?.remove() ?? false;
  await ep.lease?.release();
  for (const dir of [ep.keyDir, ep.home, ep.etc]) {
    if (dir !== null) await removeScratch(dir);
  }
  return gone;
}
