// The public types of the workspace face (`workspace.ts` re-exports them):
// its options, the handle `addWorkspace` returns and what that handle's
// exec, spawn and grading take and give. Kept apart from the code so that
// every module of the folder can name them without an import cycle
// (tests/layout_test.ts counts type imports too).

import type { ExitStatus } from "../_internal/exit.ts";
import type { NetworkPolicy } from "./_netpolicy.ts";
import type { WorkspaceLimits, WorkspaceLimitsInForce } from "./_limits.ts";
import type { WorkspaceSnapshot, WorkspaceSnapshotOptions } from "./_snapshot.ts";

/**
 * How commands are isolated: bubblewrap, util-linux `unshare`, nothing, or
 * "auto" for the first of bubblewrap and `unshare` that works here.
 */
export type WorkspaceIsolation = "auto" | "bwrap" | "unshare" | "none";

/** How long what a workspace command starts lives (see {@linkcode WorkspaceOptions.lifetime}). */
export type WorkspaceLifetime = "session" | "workspace";

/** Options for {@linkcode addWorkspace}. */
export interface WorkspaceOptions {
  /**
   * Capability name.
   * @default "shell"
   */
  name?: string;
  /**
   * User name the agent logs in as (only this one is accepted).
   * @default "agent"
   */
  user?: string;
  /**
   * Variables for commands, on top of PATH and LANG from this process, HOME
   * (a private directory made for each episode) and USER (the login `user`);
   * nothing else of this process's environment reaches commands. A HOME
   * given here replaces the private one and is only writable in the sandbox
   * when it lies inside the root.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * How commands are isolated. "auto" takes bubblewrap (`bwrap`), else
   * util-linux `unshare`, and refuses to start when neither works here
   * (macOS, Windows, no user namespaces); "none" runs commands unconfined,
   * publishes `isolation: "none"` and reports one warning line through
   * `onError`.
   * @default "auto"
   */
  isolation?: WorkspaceIsolation;
  /**
   * What commands may reach. `false` (or "none"): an empty network
   * namespace, not even this host's loopback (where the control port and
   * the SSH port listen). `true` (or "public"): this host's network. An
   * allowlist (`{ allow, deny, nameServer }`): the empty namespace with an
   * egress proxy as the only way out, which lets through only the names and
   * addresses the list allows (HTTP_PROXY and the other variables name it,
   * /etc/resolv.conf its resolver); needs a sandbox.
   * @default false
   */
  network?: boolean | NetworkPolicy;
  /**
   * How long what a command starts lives: "session" kills the command's
   * process group when its SSH channel closes (its background jobs with
   * it); "workspace" leaves what it started running until the workspace
   * stops, as `docker exec` leaves what a command started running in its
   * container.
   * @default "session"
   */
  lifetime?: WorkspaceLifetime;
  /**
   * The capabilities commands keep, when this process is root: "none" (an
   * empty bounding set, root included) or "inherit" (this process's own,
   * as `docker exec` gives root the container's set; what bounds this
   * process bounds them). "inherit" needs `isolation: "none"`.
   * @default "none"
   */
  capabilities?: "none" | "inherit";
  /**
   * Paths that commands, and every process they start, can neither change
   * nor make, remove or rename anything under (absolute; they need not
   * exist yet), whatever their uid and capabilities, also after the command
   * ended. Enforced with Linux's Landlock (5.13 or later): nothing can be
   * made, removed or renamed either directly in the directories on the way
   * from / to a protected path (existing entries there stay writable), and
   * the commands cannot trace this process or read its memory. Needs
   * `isolation: "none"` (a sandbox decides itself what commands may write);
   * the workspace refuses to start, in one line, on a kernel without
   * Landlock.
   * @default []
   */
  protect?: readonly string[];
  /**
   * Uid commands run as when this process is root; 0 keeps root (without
   * capabilities). The root's tree is given to this uid at start so the
   * agent can edit it, and in a sandbox what this process adds there as
   * root is handed over before each command. Ignored when this process is
   * not root.
   * @default a uid of this workspace's own, from `uidRange`
   */
  uid?: number;
  /**
   * Gid commands run as when this process is root.
   * @default the uid taken from `uidRange`; with `uid` given, 65534 (nogroup), or 0 when `uid` is 0
   */
  gid?: number;
  /**
   * The uids workspaces take one each of (when this process is root and no
   * `uid` is given), skipping any /etc/passwd names or a live process holds,
   * so that limits, signals and files never cross workspaces.
   * @default [59000, 59999]
   */
  uidRange?: readonly [number, number];
  /**
   * Limits on memory, processes and disk.
   * @default { memory: 4 GiB, processes: 1024, tmpSize: 1 GiB, fileSize: 4 GiB }
   */
  limits?: WorkspaceLimits;
  /**
   * More host paths commands see, read-only, at the same place (a toolchain
   * under /opt, say): the sandbox shows only the system's directories (/usr,
   * /etc, /bin, /lib...), the root and HOME.
   * @default []
   */
  mounts?: readonly string[];
  /**
   * Address the SSH server listens on.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Port the SSH server listens on; 0 picks a free one.
   * @default 0
   */
  port?: number;
  /**
   * Also write the client key to a private temporary file and publish its
   * path as `client_key_path` (for `ssh -i`). The file is removed at stop.
   * @default true
   */
  writeKeyFile?: boolean;
  /**
   * Also serve a `filetracking/1` tracker of the root and publish it as the
   * `filetracking` capability, so that rollouts record what the agent
   * changed as unified diffs in their traces. The tracker has no port of
   * its own: it is attached to the environment, so only the control
   * server's authenticated `tunnel.open` reaches it.
   * @default true
   */
  trackFiles?: boolean;
  /**
   * Lets the workspace take snapshots of its files
   * ({@linkcode Workspace.snapshot}) and restore them, bounded by
   * `maxCount` and `maxBytes`. As root, where overlayfs works, the root is
   * an overlay mount while the workspace runs, and a snapshot copies only
   * what changed; elsewhere (or with `method: "copy"`) a snapshot copies
   * the whole root (`onError` says why, at start).
   * @default false (true when `from` is given)
   */
  snapshots?: boolean | WorkspaceSnapshotOptions;
  /**
   * A fork: the workspace's files start as this snapshot's (of this or any
   * workspace of this process), sharing what neither changes. The root must
   * be an empty directory; it shows the snapshot's files while the
   * workspace runs and is left empty at stop (snapshot it to keep them).
   * @default none
   */
  from?: WorkspaceSnapshot;
  /**
   * Called with unexpected server errors, and with one line for each
   * protection that could not be had here (no sandbox, a limit not
   * enforced).
   * @default ignores them
   */
  onError?: (error: unknown) => void;
}

/** Options for {@linkcode Workspace.exec}. */
export interface WorkspaceExecOptions {
  /**
   * Working directory, inside the root.
   * @default the root
   */
  cwd?: string;
  /**
   * Milliseconds after which the command (all of it) is killed.
   * @default 600000
   */
  timeout?: number;
  /**
   * Variables on top of PATH, HOME (a fresh directory for this command),
   * USER, LANG, the workspace's `env` and `HUD_GRADER_FILES`.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * Standard input; closed at once when unset.
   * @default nothing
   */
  stdin?: string | Uint8Array;
  /** Kills the command when aborted. */
  signal?: AbortSignal;
  /**
   * Files for this command only (hidden tests, a check script), by relative
   * path: written into a fresh directory the agent never saw and shown
   * read-only at `/grader` in the sandbox (`$HUD_GRADER_FILES` names it; a
   * host directory under isolation "none").
   * @default {}
   */
  files?: Record<string, string | Uint8Array>;
  /**
   * Bytes kept of each of stdout and stderr; the rest is read and dropped.
   * @default 1048576
   */
  maxOutput?: number;
  /**
   * This command's network, in place of the workspace's `network` (the
   * environment's own code, trusted: a setup step that downloads what the
   * agent may not reach, a grader that needs none). An allowlist gets an
   * egress proxy of its own for the command.
   * @default the workspace's
   */
  network?: boolean | NetworkPolicy;
}

/**
 * What {@linkcode Workspace.exec} returns: how the command ended (its exit
 * code, or the signal that killed it), its output, whether it timed out.
 */
export interface WorkspaceExecResult extends ExitStatus {
  /** Standard output as text (at most `maxOutput` bytes of it). */
  readonly stdout: string;
  /** Standard error as text (at most `maxOutput` bytes of it). */
  readonly stderr: string;
  /** Whether `timeout` ran out (the command was killed). */
  readonly timedOut: boolean;
  /** Milliseconds from start to exit. */
  readonly durationMs: number;
}

/**
 * A grading phase, from {@linkcode Workspace.grading}: every process of the
 * agent stays stopped, and new ones wait, until it ends.
 */
export interface WorkspaceGrading extends AsyncDisposable {
  /** Runs a grading command (as {@linkcode Workspace.exec}, within this phase). */
  exec(argv: readonly string[], options?: WorkspaceExecOptions): Promise<WorkspaceExecResult>;
  /** Ends the phase: the agent's processes run again. Idempotent. */
  end(): Promise<void>;
}

/** Options for {@linkcode Workspace.spawn}. */
export interface WorkspaceSpawnOptions {
  /**
   * Working directory, inside the sandbox's view.
   * @default the root
   */
  cwd?: string;
  /**
   * Variables on top of the commands' (PATH, HOME, USER, LANG, `env`).
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * More host paths this process sees, read-only, at the same place (a
   * browser's install directory, say), on top of the workspace's `mounts`.
   * @default []
   */
  mounts?: readonly string[];
}

/** The handle {@linkcode addWorkspace} returns. */
export interface Workspace {
  /** The capability name. */
  readonly name: string;
  /** The root, absolute. */
  readonly root: string;
  /** The mechanism in force, once started; null before. */
  readonly isolation: Exclude<WorkspaceIsolation, "auto"> | null;
  /** Whether commands keep this host's network (the `network` option). */
  readonly network: boolean;
  /** The uid commands run as, when this process is root and started; else null. */
  readonly uid: number | null;
  /** The limits in force, once started; null before. */
  readonly limits: WorkspaceLimitsInForce | null;
  /**
   * Runs a grading command in the workspace's sandbox, as the agent's user,
   * while every process of the agent is stopped (SIGSTOP of each of its
   * process trees; new commands and SFTP sessions wait): nothing the agent
   * left running can race it. It sees the root as the agent left it, a
   * fresh HOME and /tmp (nothing the agent planted in its own HOME steers
   * it), and `files` the agent never saw. Whatever the agent wrote is data
   * to it, and runs with no more privilege than the agent had.
   * @param argv the program and its arguments (from the environment's code, never a file the agent wrote)
   * @param options working directory, timeout, environment, stdin, hidden files
   * @returns exit code or signal, output, whether it timed out, how long it took
   * @throws {Error} when the workspace is not started
   * @throws {TypeError} for a bad `argv` or `files`
   * @throws {RangeError} for a `cwd` outside the root or a bad `timeout`
   */
  exec(argv: readonly string[], options?: WorkspaceExecOptions): Promise<WorkspaceExecResult>;
  /**
   * Starts a grading phase spanning several commands: the agent is stopped
   * from now until the phase ends (`end()` or disposal). `exec()` is one
   * command in a phase of its own.
   */
  grading(): Promise<WorkspaceGrading>;
  /**
   * Starts a long-lived process on the agent's side of the sandbox (a
   * browser the agent drives, say): the same view of the file system,
   * network policy, uid and limits as the agent's commands; stopped during
   * grading like them, and killed at stop. Its stdio is piped, it leads its
   * own process group, and its environment is exactly PATH, HOME, USER,
   * LANG, the workspace's `env` and `options.env`.
   * @throws {Error} when the workspace is not started
   */
  spawn(argv: readonly string[], options?: WorkspaceSpawnOptions): Promise<Deno.ChildProcess>;
  /**
   * Takes a snapshot of the workspace's files: contents, modes, owners,
   * links and empty directories, not processes. The agent's processes are
   * stopped while it is taken (as for grading) and run on after. Sockets and
   * device nodes are left out (`skipped` names them).
   * @returns the snapshot, to restore or fork from; remove it when done
   * @throws {Error} when the workspace is not started, was added without
   *   `snapshots`, or the snapshot would pass `maxCount` or `maxBytes`
   */
  snapshot(): Promise<WorkspaceSnapshot>;
  /**
   * Makes the workspace's files the snapshot's (of this or another
   * workspace of this process). The agent's processes are killed (their
   * state is not in the snapshot); its SSH sessions stay and run new
   * commands on the restored files.
   * @throws {Error} when the workspace is not started, was added without
   *   `snapshots`, or the snapshot was removed
   */
  restore(snapshot: WorkspaceSnapshot): Promise<void>;
}
