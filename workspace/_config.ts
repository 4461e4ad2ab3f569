// A workspace's options resolved once (as `server.ts` bind() does with
// `_server/control.ts`): checked when `addWorkspace` is called, every
// default applied in one place, into the record the handle and the steps of
// each start read.

import { checkIsolation } from "./_sandbox.ts";
import { protectedPath } from "./_landlock.ts";
import { errorMessage } from "../_internal/util.ts";
import { type ParsedPolicy, parseNetworkPolicy } from "./_netpolicy.ts";
import { checkLimits, type WorkspaceLimits } from "./_limits.ts";
import type { WorkspaceIsolation, WorkspaceLifetime, WorkspaceOptions } from "./_types.ts";
import {
  checkSnapshot,
  type SnapshotPolicy,
  snapshotPolicy,
  type WorkspaceSnapshot,
} from "./_snapshot.ts";

/** The uids workspaces take one each of, by default (no system or package uses them). */
const UID_RANGE: readonly [number, number] = [59000, 59999];

/** {@linkcode WorkspaceOptions} checked, with every default applied. */
export interface WorkspaceConfig {
  /** The capability name. */
  readonly name: string;
  /** The root, absolute. */
  readonly root: string;
  /** The one user name the agent logs in as. */
  readonly user: string;
  /** The author's variables for commands. */
  readonly env: Readonly<Record<string, string>>;
  readonly isolation: WorkspaceIsolation;
  /** Whether commands keep this host's network (the policy is "public"). */
  readonly network: boolean;
  /** The network policy, parsed. */
  readonly netPolicy: ParsedPolicy;
  readonly lifetime: WorkspaceLifetime;
  /** Whether commands keep this process's capabilities (as root, isolation "none"). */
  readonly keepCapabilities: boolean;
  /** Paths commands cannot change (Landlock; isolation "none"). */
  readonly protect: readonly string[];
  /** The uid and gid asked for; when not given, decided at each start (as root). */
  readonly uid: number | undefined;
  readonly gid: number | undefined;
  readonly uidRange: readonly [number, number];
  /** As asked for: each start makes its cgroup and says what is not in force. */
  readonly limits: WorkspaceLimits | undefined;
  /** Host paths shown read-only at the same place. */
  readonly mounts: readonly string[];
  readonly hostname: string;
  readonly port: number;
  readonly writeKeyFile: boolean;
  readonly trackFiles: boolean;
  /** Bounds of its snapshots, or null when it takes none. */
  readonly snapshots: SnapshotPolicy | null;
  /** A fork's snapshot, or null. */
  readonly from: WorkspaceSnapshot | null;
  readonly onError: (error: unknown) => void;
}

/** `path` made absolute against this process's working directory. */
export function absolute(path: string): string {
  if (path.startsWith("/")) return path;
  const cwd = Deno.cwd();
  return path === "." ? cwd : `${cwd.replace(/\/$/, "")}/${path.replace(/^\.\//, "")}`;
}

function checkId(what: string, id: number | undefined): void {
  if (id !== undefined && !(Number.isInteger(id) && id >= 0 && id < 2 ** 32 - 1)) {
    throw new RangeError(`Cannot add workspace: invalid ${what} "${id}"`);
  }
}

function checkUidRange(range: readonly [number, number] | undefined): void {
  if (
    range !== undefined &&
    !(Array.isArray(range) && range.length === 2 &&
      range.every((u) => Number.isInteger(u) && u > 0) &&
      range[0] <= range[1] && range[1] < 2 ** 32 - 1)
  ) {
    throw new RangeError(`Cannot add workspace: invalid uidRange "${range}" ([first, last] uids)`);
  }
}

/**
 * Checks `options` and applies the defaults.
 * @throws {TypeError} when `root` is not a non-empty string, a mount is not absolute, or `from` is not a snapshot
 * @throws {RangeError} when `isolation`, `uid`, `gid`, `uidRange`, a limit or a snapshot bound is out of range
 */
export function workspaceConfig(root: string, options: WorkspaceOptions): WorkspaceConfig {
  if (typeof root !== "string" || root === "") {
    throw new TypeError("Cannot add workspace: root must be a non-empty string");
  }
  const isolation = options.isolation ?? "auto";
  checkIsolation("add workspace", isolation);
  const lifetime = options.lifetime ?? "session";
  if (lifetime !== "session" && lifetime !== "workspace") {
    throw new RangeError(
      `Cannot add workspace: unknown lifetime "${lifetime}" (use "session" or "workspace")`,
    );
  }
  const capabilities = options.capabilities ?? "none";
  if (capabilities !== "none" && capabilities !== "inherit") {
    throw new RangeError(
      `Cannot add workspace: unknown capabilities "${capabilities}" (use "none" or "inherit")`,
    );
  }
  if (capabilities === "inherit" && isolation !== "none") {
    throw new RangeError(
      'Cannot add workspace: capabilities "inherit" needs isolation "none" (a sandbox runs commands without capabilities)',
    );
  }
  const protect = checkProtect(options.protect ?? [], isolation);
  checkId("uid", options.uid);
  checkId("gid", options.gid);
  checkUidRange(options.uidRange);
  checkLimits("add workspace", options.limits);
  const mounts = options.mounts ?? [];
  for (const p of mounts) {
    if (typeof p !== "string" || !p.startsWith("/")) {
      throw new TypeError(`Cannot add workspace: mounts must be absolute paths, got "${p}"`);
    }
  }
  const netPolicy = checkNetwork(options.network ?? false, isolation);
  const from = options.from === undefined ? null : checkSnapshot("add workspace", options.from);
  const snapshots = snapshotPolicy("add workspace", options.snapshots ?? from !== null);
  return {
    name: options.name ?? "shell",
    root: absolute(root),
    user: options.user ?? "agent",
    env: options.env ?? {},
    isolation,
    network: netPolicy.mode === "public",
    netPolicy,
    lifetime,
    keepCapabilities: capabilities === "inherit",
    protect,
    uid: options.uid,
    gid: options.gid,
    uidRange: options.uidRange ?? UID_RANGE,
    limits: options.limits,
    mounts,
    hostname: options.hostname ?? "127.0.0.1",
    port: options.port ?? 0,
    writeKeyFile: options.writeKeyFile ?? true,
    trackFiles: options.trackFiles ?? true,
    snapshots,
    from,
    onError: options.onError ?? (() => {}),
  };
}

/** `protect` checked: absolute paths, and isolation "none". */
function checkProtect(protect: readonly string[], isolation: WorkspaceIsolation): string[] {
  if (!Array.isArray(protect)) {
    throw new TypeError("Cannot add workspace: protect must be an array of absolute paths");
  }
  if (protect.length > 0 && isolation !== "none") {
    throw new RangeError(
      'Cannot add workspace: protect needs isolation "none" (a sandbox decides itself what commands may write)',
    );
  }
  return protect.map((p) => {
    if (typeof p !== "string") {
      throw new TypeError(
        `Cannot add workspace: protect must hold paths, got ${JSON.stringify(p)}`,
      );
    }
    try {
      return protectedPath(p);
    } catch (err) {
      throw new TypeError(`Cannot add workspace: ${errorMessage(err)}`);
    }
  });
}

/** The network policy parsed; an allowlist needs a sandbox to hold commands to it. */
function checkNetwork(
  network: NonNullable<WorkspaceOptions["network"]>,
  isolation: WorkspaceIsolation,
): ParsedPolicy {
  let policy: ParsedPolicy;
  try {
    policy = parseNetworkPolicy(network);
  } catch (err) {
    throw new TypeError(`Cannot add workspace: ${errorMessage(err)}`);
  }
  if (policy.mode === "allowlist" && isolation === "none") {
    throw new RangeError(
      'Cannot add workspace: a network allowlist needs a sandbox (isolation "auto", "bwrap" or "unshare"); with isolation "none" commands share this host\'s network',
    );
  }
  return policy;
}
