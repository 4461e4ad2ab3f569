// A workspace root that can be snapshotted, restored and forked, for one
// episode. As root, where overlayfs and libc's mount calls can be had, the
// root is an overlay: its files live in layers of the snapshot store (below)
// and an upper directory of the episode's changes (on top). A snapshot
// copies the upper directory (the changes since the episode began, or since
// the last restore) into a new layer and stacks it on the layers below; a
// fork mounts a snapshot's stack under an empty upper directory; a restore
// swaps the stack. The root's own files (of a workspace that is not a fork)
// are the bottom of the stack: a read-only bind at first, frozen as a tree
// of hard links into a layer in the background, so that a snapshot holds
// nothing the root can change. At stop the changes are applied to the root
// (a fork's root is left empty: its files were the snapshot's).
//
// Elsewhere (not root, no overlayfs, no --allow-ffi) snapshots copy the
// whole root, and forks and restores copy it back.

import { errorMessage } from "../_internal/util.ts";
import { applyLayer, clearDir } from "./_apply.ts";
import {
  copyTree,
  coreutil,
  Layer,
  linkTree,
  measureTree,
  type Owner,
  type SnapshotStore,
  snapshotStore,
  type TreeSize,
} from "./_layers.ts";
import {
  bindReadOnly,
  closeDescriptor,
  fileHandle,
  mountOverlay,
  mountsUnavailable,
  openDirectory,
  swapNamespace,
  unmount,
  type UserNamespace,
} from "./_mount.ts";

/** How a workspace's snapshots are made here. */
export type SnapshotMethod = "overlay" | "copy";

/** How a workspace's snapshots are made, and their bounds. */
export interface WorkspaceSnapshotOptions {
  /**
   * "auto" mounts the root as an overlay where this process can (root,
   * overlayfs, `--allow-ffi`), so that a snapshot copies only what changed
   * and a fork shares the rest, and copies the whole root elsewhere;
   * "copy" always copies (a root on a file system an overlay cannot sit
   * on, or a root that must stay a plain directory while the workspace
   * runs).
   * @default "auto"
   */
  method?: "auto" | "copy";
  /**
   * Snapshots of the workspace alive at once.
   * @default 32
   */
  maxCount?: number;
  /**
   * Bytes of disk its snapshots may take together (a snapshot takes what
   * changed since the layer below it: its blocks, directories' included,
   * and 256 bytes of inode per entry; holes in sparse files are free).
   * @default 8589934592 (8 GiB)
   */
  maxBytes?: number;
}

/** {@linkcode WorkspaceSnapshotOptions} with the defaults applied. */
export interface SnapshotPolicy {
  readonly method: "auto" | "copy";
  readonly maxCount: number;
  readonly maxBytes: number;
}

/** Entries a snapshot may hold (a bound on the time it takes). */
const MAX_ENTRIES = 1_000_000;

const GiB = 1024 ** 3;

/**
 * Checks `snapshots` as given and applies the defaults.
 * @returns null when snapshots are off
 * @throws {RangeError} for a bound that is not a positive integer
 */
export function snapshotPolicy(
  verb: string,
  snapshots: boolean | WorkspaceSnapshotOptions | undefined,
): SnapshotPolicy | null {
  if (snapshots === undefined || snapshots === false) return null;
  const limits = snapshots === true ? {} : snapshots;
  if (typeof limits !== "object" || limits === null) {
    throw new TypeError(
      `Cannot ${verb}: snapshots must be a boolean or { method, maxCount, maxBytes }`,
    );
  }
  const method = limits.method ?? "auto";
  if (method !== "auto" && method !== "copy") {
    throw new RangeError(
      `Cannot ${verb}: unknown snapshots.method "${method}" (use "auto" or "copy")`,
    );
  }
  for (const key of ["maxCount", "maxBytes"] as const) {
    const v = limits[key];
    if (v !== undefined && !(Number.isSafeInteger(v) && v > 0)) {
      throw new RangeError(`Cannot ${verb}: invalid snapshots.${key} "${v}" (a positive integer)`);
    }
  }
  return { method, maxCount: limits.maxCount ?? 32, maxBytes: limits.maxBytes ?? 8 * GiB };
}

let method: Promise<{ method: SnapshotMethod; why: string | null }> | null = null;

/**
 * How snapshots are made in this process (tried once): "overlay", or
 * "copy" and why not the overlay.
 */
export function snapshotMethod(): Promise<{ method: SnapshotMethod; why: string | null }> {
  return method ??= (async () => {
    const why = mountsUnavailable();
    if (why !== null) return { method: "copy", why };
    // A kernel without overlayfs, or a container without CAP_SYS_ADMIN.
    const store = await snapshotStore();
    const dir = store.path("w");
    try {
      for (const d of ["", "/l", "/u", "/w", "/m"]) await Deno.mkdir(`${dir}${d}`);
      mountOverlay(`${dir}/m`, [`${dir}/l`], `${dir}/u`, `${dir}/w`);
      unmount(`${dir}/m`);
      return { method: "overlay" as const, why: null };
    } catch (err) {
      return { method: "copy" as const, why: errorMessage(err) };
    } finally {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
      await store.release();
    }
  })();
}

/**
 * Who the files of each root an overlay has shown belong to on disk, by
 * the root directory's identity: they may share inodes with snapshots from
 * then on (the root's frozen layer, a restore's links), so later episodes
 * in this process show them through an idmapped bind instead of giving them
 * to their own uid. A new process starts with no snapshot to share with.
 */
const ROOT_OWNERS = new Map<string, Owner>();

/**
 * The root directory's identity: its device and kernel handle (the inode
 * and its generation). Not the inode number alone: a root removed frees
 * it, and ext4 gives it to the next directory made there, often at once; a
 * new root taken for the old one would keep its files' owner, which is not
 * theirs (its agent's view, and its forks', would show them as another
 * uid's). Where the file system has no handles, the inode and its birth time.
 */
async function rootKey(root: string): Promise<string> {
  const info = await Deno.stat(root);
  const handle = fileHandle(root);
  return handle !== null
    ? `${info.dev}:${handle}`
    : `${info.dev}:${info.ino}@${info.birthtime?.getTime() ?? "?"}`;
}

/** Who `root`'s files belong to on disk, when an overlay root of this process has shown them. */
export async function sharedRootOwner(root: string): Promise<Owner | null> {
  return ROOT_OWNERS.get(await rootKey(root)) ?? null;
}

/** Notes who `root`'s files belong to on disk from now on. */
export async function noteRootOwner(root: string, owner: Owner): Promise<void> {
  ROOT_OWNERS.set(await rootKey(root), owner);
}

/** What a snapshot holds, kept apart from its public face. */
const STACKS = new WeakMap<WorkspaceSnapshot, readonly Layer[]>();

/**
 * A workspace's files at one moment: contents, modes, owners (as the
 * sandbox shows them: the agent's files are the agent's in whichever
 * workspace restores or forks it), links, empty directories. Processes are
 * not part of it. It stays until removed or until this process exits;
 * forks running from it keep what they need.
 */
export class WorkspaceSnapshot implements AsyncDisposable {
  /** What it holds: a workspace's files (a `ForkRuntime` places from it). */
  readonly kind = "workspace";
  /** Its id, unique in this process. */
  readonly id: string;
  /** The name of the workspace it was taken of. */
  readonly workspace: string;
  /** The snapshot that workspace's files started from (by fork or restore), or null. */
  readonly parent: string | null;
  /**
   * Its ancestry, nearest first: its parent, that snapshot's parent, and
   * so on to the first (empty when it has no parent).
   */
  readonly lineage: readonly string[];
  /** Bytes of disk it took. */
  readonly bytes: number;
  /** Paths (relative to the root) of sockets and device nodes it left out. */
  readonly skipped: readonly string[];
  #removed = false;
  readonly #onRemove: (s: WorkspaceSnapshot) => void;

  /** Made by `Workspace.snapshot()`. */
  constructor(
    info: {
      workspace: string;
      parent: WorkspaceSnapshot | null;
      bytes: number;
      skipped: string[];
    },
    stack: readonly Layer[],
    onRemove: (s: WorkspaceSnapshot) => void,
  ) {
    const bytes = crypto.getRandomValues(new Uint8Array(6));
    this.id = `snap-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
    this.workspace = info.workspace;
    this.parent = info.parent?.id ?? null;
    this.lineage = Object.freeze(
      info.parent === null ? [] : [info.parent.id, ...info.parent.lineage],
    );
    this.bytes = info.bytes;
    this.skipped = info.skipped;
    this.#onRemove = onRemove;
    STACKS.set(this, stack);
  }

  /** Whether it was removed. */
  get removed(): boolean {
    return this.#removed;
  }

  /** Removes it; its files stay while a fork of it runs. Idempotent. */
  async remove(): Promise<void> {
    if (this.#removed) return;
    this.#removed = true;
    this.#onRemove(this);
    const stack = STACKS.get(this) ?? [];
    STACKS.delete(this);
    for (const layer of stack) await layer.release();
  }

  /** Removes it, as {@linkcode WorkspaceSnapshot.remove}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.remove();
  }
}

/**
 * The layers of `snapshot`, retained for the caller.
 * @throws {Error} when it was removed
 */
function retainStack(snapshot: WorkspaceSnapshot, verb: string): Layer[] {
  const stack = STACKS.get(snapshot);
  if (stack === undefined || snapshot.removed) {
    throw new Error(`Cannot ${verb}: snapshot "${snapshot?.id}" was removed`);
  }
  return stack.map((l) => l.retain());
}

/** Checks that `from` is a snapshot made here, for a fork. */
export function checkSnapshot(verb: string, from: unknown): WorkspaceSnapshot {
  if (!(from instanceof WorkspaceSnapshot)) {
    throw new TypeError(
      `Cannot ${verb}: not a snapshot (use one that Workspace.snapshot() returned)`,
    );
  }
  return from;
}

/** What a snapshot is taken with. */
export interface SnapshotRequest {
  readonly workspace: string;
  readonly policy: SnapshotPolicy;
  /** Bytes the workspace's other snapshots take. */
  readonly used: number;
  readonly onRemove: (s: WorkspaceSnapshot) => void;
}

/** A workspace root, for one episode, that can be snapshotted and restored. */
export interface SnapshotRoot {
  readonly method: SnapshotMethod;
  /** The snapshot its files started from (a fork's, or the last restore's), or null. */
  readonly parent: WorkspaceSnapshot | null;
  /** Takes a snapshot (the caller holds the agent stopped). */
  snapshot(request: SnapshotRequest): Promise<WorkspaceSnapshot>;
  /** Makes the root the snapshot's (the caller has killed the agent's processes). */
  restore(snapshot: WorkspaceSnapshot): Promise<void>;
  /** Ends the episode: the root keeps its files (a fork's is left empty). */
  close(): Promise<void>;
}

/** Options for {@linkcode openSnapshotRoot}. */
export interface SnapshotRootOptions {
  /** The ids the agent runs as in this episode (as root), or null. */
  owner: Owner | null;
  /**
   * The agent's ids that the root's own files have on disk (an earlier
   * episode's): shown as `owner`'s, and its changes given to them at the end.
   */
  diskOwner: Owner | null;
  /** A fork's snapshot: the root must be empty and starts as it. */
  from: WorkspaceSnapshot | null;
  /** How: "overlay" (where it works here) or "copy". */
  method: SnapshotMethod;
}

/**
 * Makes `root` snapshottable for an episode.
 * @throws {Error} when a fork's root is not empty, its snapshot was removed, or a mount fails
 */
export async function openSnapshotRoot(
  root: string,
  options: SnapshotRootOptions,
): Promise<SnapshotRoot> {
  if (options.from !== null) {
    for await (const _ of Deno.readDir(root)) {
      throw new Error(`Cannot start workspace: the root "${root}" of a fork must be empty`);
    }
  }
  return options.method === "overlay"
    ? await OverlayRoot.open(root, options)
    : await CopyRoot.open(root, options);
}

function overBound(over: "bytes" | "entries", request: SnapshotRequest): Error {
  const { workspace, policy, used } = request;
  return new Error(
    over === "bytes"
      ? `Cannot snapshot workspace "${workspace}": its changes need more than the ${
        policy.maxBytes - used
      } bytes left of snapshots.maxBytes (${policy.maxBytes}); remove snapshots or raise it`
      : `Cannot snapshot workspace "${workspace}": more than ${MAX_ENTRIES} files`,
  );
}

/**
 * Copies `src` into a new layer of `store`, leaving out sockets and device
 * nodes, within the request's bounds.
 */
async function copyLayer(
  store: SnapshotStore,
  src: string,
  owner: Owner | null,
  request: SnapshotRequest,
): Promise<{ layer: Layer; size: TreeSize }> {
  const size = await measureTree(src, {
    bytes: request.policy.maxBytes - request.used,
    entries: MAX_ENTRIES,
  });
  if ("over" in size) throw overBound(size.over, request);
  const path = store.path("l");
  store.retain();
  try {
    await copyTree(src, path);
    for (const p of size.special) await Deno.remove(`${path}/${p}`).catch(() => {});
  } catch (err) {
    await Deno.remove(path, { recursive: true }).catch(() => {});
    await store.release();
    throw err;
  }
  return { layer: new Layer(store, path, owner, size.bytes), size };
}

function sameOwner(a: Owner | null, b: Owner | null): boolean {
  return a === null || b === null || (a.uid === b.uid && a.gid === b.gid);
}

/**
 * Gives what `from` owns under `dir` to `to` (links themselves, not what
 * they name), with its modes: chown(2) clears a file's set-user-ID and
 * set-group-ID bits, root's too, so those are set again (the snapshot's
 * file, now the new owner's, as the source agent's was its own).
 */
async function reown(dir: string, from: Owner | null, to: Owner | null): Promise<void> {
  if (from === null || to === null || sameOwner(from, to)) return;
  const what = "Cannot give the snapshot's files to the workspace's uid";
  const kept = await setIdFiles(dir, from);
  const base = ["-R", "-P", "-h"];
  await coreutil(what, "chown", [...base, `--from=${from.uid}`, String(to.uid), "--", dir]);
  await coreutil(what, "chown", [...base, `--from=:${from.gid}`, `:${to.gid}`, "--", dir]);
  for (const [path, mode] of kept) await Deno.chmod(path, mode);
}

/** The regular files under `dir` of `owner`'s uid or gid with a set-ID bit, and their modes. */
async function setIdFiles(dir: string, owner: Owner): Promise<[string, number][]> {
  const out: [string, number][] = [];
  const pending = [dir];
  while (pending.length > 0) {
    const at = pending.pop()!;
    for await (const e of Deno.readDir(at)) {
      const path = `${at}/${e.name}`;
      if (e.isDirectory) pending.push(path);
      if (!e.isFile) continue;
      const info = await Deno.lstat(path);
      const mode = (info.mode ?? 0) & 0o7777;
      if ((mode & 0o6000) !== 0 && (info.uid === owner.uid || info.gid === owner.gid)) {
        out.push([path, mode]);
      }
    }
  }
  return out;
}

/** The overlay's writable side: `u` (the changes), `w` (its work directory). */
async function makeUpper(
  store: SnapshotStore,
  root: string,
  diskOwner: Owner | null,
  owner: Owner | null,
): Promise<string> {
  const dir = store.path("w");
  await Deno.mkdir(`${dir}/w`, { recursive: true, mode: 0o700 });
  await Deno.mkdir(`${dir}/u`);
  // The root of the merged view is the upper directory: the root's own mode
  // and owner, as the lowers show it (the disk owner's files are the agent's
  // when an earlier workspace of this root had another uid).
  const info = await Deno.stat(root);
  await Deno.chmod(`${dir}/u`, (info.mode ?? 0o755) & 0o7777);
  if (info.uid !== null && info.gid !== null) {
    const shown = diskOwner !== null && owner !== null && info.uid === diskOwner.uid &&
        info.gid === diskOwner.gid
      ? owner
      : { uid: info.uid, gid: info.gid };
    await Deno.chown(`${dir}/u`, shown.uid, shown.gid);
  }
  return dir;
}

/** A root that is an overlay mount over layers of the store. */
class OverlayRoot implements SnapshotRoot {
  readonly method = "overlay" as const;
  readonly #store: SnapshotStore;
  readonly #root: string;
  readonly #owner: Owner | null;
  /** The owner of the root's own files on disk (its first episode's uid), or null. */
  readonly #diskOwner: Owner | null;
  /** Whether the root is a fork's, left empty at the end. */
  readonly #scratch: boolean;
  #parent: WorkspaceSnapshot | null;
  /** The stack under the changes, bottom first (empty while the root's own files are). */
  #stack: Layer[] = [];
  /**
   * The root's own files (not a fork's): a descriptor of the directory
   * under the overlay, what the overlay shows of it, and a layer of links
   * to them, being made.
   */
  #base: { fd: number } | null = null;
  /** This episode's layer of the root's own files, while it is being made and after. */
  #frozen: Promise<Layer> | null = null;
  /** Idmapped binds of the stack's layers, mounted for this root. */
  #binds: string[] = [];
  /** The store directory holding `u` and `w`. */
  #upper = "";
  /** Whether the overlay is mounted at the root now. */
  #mounted = false;

  constructor(store: SnapshotStore, root: string, options: SnapshotRootOptions) {
    this.#store = store;
    this.#root = root;
    this.#owner = options.owner;
    this.#diskOwner = options.diskOwner;
    this.#scratch = options.from !== null;
    this.#parent = options.from;
  }

  get parent(): WorkspaceSnapshot | null {
    return this.#parent;
  }

  static async open(root: string, options: SnapshotRootOptions): Promise<OverlayRoot> {
    const store = await snapshotStore();
    const self = new OverlayRoot(store, root, options);
    try {
      if (options.from === null) self.#openBase();
      else self.#stack = retainStack(options.from, "start workspace");
      await self.#mount();
    } catch (err) {
      await self.close();
      throw err;
    }
    return self;
  }

  /**
   * Holds the root's own directory open (the overlay goes over it) and
   * starts freezing its files into a layer of hard links (copies when the
   * store is on another file system), in the background.
   */
  #openBase(): void {
    const fd = openDirectory(this.#root);
    const path = this.#store.path("l");
    const src = `/proc/${Deno.pid}/fd/${fd}/.`;
    this.#store.retain();
    const frozen = linkTree(src, path).then(
      () => 0,
      async (err) => {
        if (!/cross-device/i.test(String(err))) throw err;
        await Deno.remove(path, { recursive: true }).catch(() => {});
        await copyTree(src, path);
        const size = await measureTree(path, { bytes: Infinity, entries: Infinity });
        return "over" in size ? 0 : size.bytes;
      },
    ).then(
      (bytes) => new Layer(this.#store, path, this.#diskOwner, bytes),
      async (err) => {
        await Deno.remove(path, { recursive: true }).catch(() => {});
        await this.#store.release();
        throw err;
      },
    );
    frozen.catch(() => {}); // awaited by snapshot() and close()
    this.#base = { fd };
    this.#frozen = frozen;
  }

  /** A read-only bind of `src` in the store, idmapped from `from` to this root's owner. */
  async #bindAs(
    src: string,
    from: Owner | null,
    spaces: Map<string, UserNamespace>,
  ): Promise<string> {
    if (sameOwner(from, this.#owner)) return src;
    const to = this.#owner!;
    const key = `${from!.uid}:${from!.gid}`;
    let ns = spaces.get(key);
    if (ns === undefined) {
      ns = await swapNamespace({ uid: [from!.uid, to.uid], gid: [from!.gid, to.gid] });
      spaces.set(key, ns);
    }
    const bind = this.#store.path("b");
    await Deno.mkdir(bind, { mode: 0o700 });
    bindReadOnly(src, bind, ns);
    this.#store.mounted(bind);
    this.#binds.push(bind);
    return bind;
  }

  /** Mounts the overlay: the stack (idmapped where its owner is another uid), a fresh upper. */
  async #mount(): Promise<void> {
    const lowers: string[] = [];
    const spaces = new Map<string, UserNamespace>();
    try {
      if (this.#base !== null) {
        lowers.push(await this.#bindAs(`/proc/self/fd/${this.#base.fd}`, this.#diskOwner, spaces));
      }
      for (const layer of this.#stack) {
        lowers.unshift(await this.#bindAs(layer.path, layer.owner, spaces));
      }
    } finally {
      for (const ns of spaces.values()) ns.close();
    }
    this.#upper = await makeUpper(this.#store, this.#root, this.#diskOwner, this.#owner);
    mountOverlay(this.#root, lowers, `${this.#upper}/u`, `${this.#upper}/w`);
    this.#mounted = true;
    this.#store.mounted(this.#root);
  }

  /** Unmounts the overlay and the binds of its stack. */
  #unmount(): void {
    if (this.#mounted) {
      this.#mounted = false;
      this.#store.unmounted(this.#root);
      unmount(this.#root);
    }
    for (const bind of this.#binds.splice(0)) {
      unmount(bind);
      this.#store.unmounted(bind);
    }
  }

  async snapshot(request: SnapshotRequest): Promise<WorkspaceSnapshot> {
    const below = this.#base !== null
      ? [(await this.#frozen!).retain()]
      : this.#stack.map((l) => l.retain());
    try {
      const { layer, size } = await copyLayer(
        this.#store,
        `${this.#upper}/u`,
        this.#owner,
        request,
      );
      return new WorkspaceSnapshot(
        {
          workspace: request.workspace,
          parent: this.#parent,
          bytes: layer.bytes,
          skipped: size.special,
        },
        [...below, layer],
        request.onRemove,
      );
    } catch (err) {
      for (const l of below) await l.release();
      throw err;
    }
  }

  async restore(snapshot: WorkspaceSnapshot): Promise<void> {
    const stack = retainStack(snapshot, `restore workspace`);
    this.#unmount();
    await this.#dropUpper();
    this.#dropBase();
    for (const l of this.#stack.splice(0)) await l.release();
    this.#stack = stack;
    this.#parent = snapshot;
    await this.#mount();
  }

  async #dropUpper(): Promise<void> {
    if (this.#upper === "") return;
    await Deno.remove(this.#upper, { recursive: true }).catch(() => {});
    this.#upper = "";
  }

  /** Lets the root's own directory go (the overlay no longer shows it). */
  #dropBase(): void {
    const base = this.#base;
    if (base === null) return;
    this.#base = null;
    closeDescriptor(base.fd);
  }

  async close(): Promise<void> {
    try {
      this.#unmount();
      if (this.#upper !== "" && !this.#scratch) await this.#keepChanges();
    } finally {
      await this.#dropUpper();
      this.#dropBase();
      for (const l of this.#stack.splice(0)) await l.release();
      await (await this.#frozen?.catch(() => null))?.release();
      await this.#store.release();
    }
  }

  /**
   * The root, unmounted, becomes what it showed: its own files with the
   * changes applied; after a restore, the stack's files (a layer of another
   * owner's copied and given to the root's owner) and the changes on top.
   * When the stack stands on this episode's frozen layer, the root holds
   * its files already: only the layers above it are applied.
   */
  async #keepChanges(): Promise<void> {
    const target = this.#diskOwner;
    if (this.#base === null) {
      const frozen = await this.#frozen?.catch(() => null);
      let above = this.#stack;
      if (frozen === undefined || frozen === null || this.#stack[0] !== frozen) {
        await clearDir(this.#root);
        const [bottom, ...rest] = this.#stack;
        await fillRoot(bottom, this.#root, target, true);
        above = rest;
      } else {
        above = this.#stack.slice(1);
      }
      for (const layer of above) await this.#applyAs(layer, target);
    }
    await reown(`${this.#upper}/u`, this.#owner, target);
    await applyLayer(`${this.#upper}/u`, this.#root, "move");
  }

  /** Applies `layer` to the root: linked, or copied and given to `target` when another's. */
  async #applyAs(layer: Layer, target: Owner | null): Promise<void> {
    if (sameOwner(layer.owner, target)) await applyLayer(layer.path, this.#root, "link");
    else await applyCopy(this.#store, layer, this.#root, target);
  }
}

/** Applies a copy of `layer`, given to `target`, to `root` (the layer stays as it is). */
async function applyCopy(
  store: SnapshotStore,
  layer: Layer,
  root: string,
  target: Owner | null,
): Promise<void> {
  const copy = store.path("w");
  await copyTree(layer.path, copy);
  try {
    await reown(copy, layer.owner, target);
    await applyLayer(copy, root, "move");
  } finally {
    await Deno.remove(copy, { recursive: true }).catch(() => {});
  }
}

/**
 * Puts a stack's bottom layer (a whole tree) into the empty `root`, given
 * to `target`: with `link`, hard links where it can (its owner's, on one
 * file system), else a copy.
 */
async function fillRoot(
  bottom: Layer,
  root: string,
  target: Owner | null,
  link: boolean,
): Promise<void> {
  if (link && sameOwner(bottom.owner, target)) {
    try {
      await linkTree(bottom.path, root);
      return;
    } catch (err) {
      if (!/cross-device/i.test(String(err))) throw err;
      await clearDir(root);
    }
  }
  await coreutil("Cannot fill the workspace", "cp", [
    "-a",
    "--reflink=auto",
    "--no-target-directory",
    "--",
    bottom.path,
    root,
  ]);
  await reown(root, bottom.owner, target);
}

/** A root whose snapshots are copies of it (where overlays cannot be had). */
class CopyRoot implements SnapshotRoot {
  readonly method = "copy" as const;
  readonly #store: SnapshotStore;
  readonly #root: string;
  readonly #owner: Owner | null;
  readonly #scratch: boolean;
  #parent: WorkspaceSnapshot | null;

  constructor(store: SnapshotStore, root: string, options: SnapshotRootOptions) {
    this.#store = store;
    this.#root = root;
    this.#owner = options.owner;
    this.#scratch = options.from !== null;
    this.#parent = options.from;
  }

  get parent(): WorkspaceSnapshot | null {
    return this.#parent;
  }

  static async open(root: string, options: SnapshotRootOptions): Promise<CopyRoot> {
    const self = new CopyRoot(await snapshotStore(), root, options);
    try {
      if (options.from !== null) await self.#fill(options.from, "start workspace");
    } catch (err) {
      await self.close();
      throw err;
    }
    return self;
  }

  /**
   * Copies the snapshot's files into the (empty) root, given to this
   * root's owner: the bottom layer whole, each layer above it (an
   * overlay's changes, from a workspace of the other method) applied.
   */
  async #fill(snapshot: WorkspaceSnapshot, verb: string): Promise<void> {
    const [bottom, ...above] = retainStack(snapshot, verb);
    try {
      // Copies: a plain root is given to each episode's uid whole, which
      // would change a layer that shared its files.
      await fillRoot(bottom, this.#root, this.#owner, false);
      for (const layer of above) await applyCopy(this.#store, layer, this.#root, this.#owner);
    } finally {
      for (const l of [bottom, ...above]) await l.release();
    }
  }

  async snapshot(request: SnapshotRequest): Promise<WorkspaceSnapshot> {
    const { layer, size } = await copyLayer(this.#store, this.#root, this.#owner, request);
    return new WorkspaceSnapshot(
      {
        workspace: request.workspace,
        parent: this.#parent,
        bytes: layer.bytes,
        skipped: size.special,
      },
      [layer],
      request.onRemove,
    );
  }

  async restore(snapshot: WorkspaceSnapshot): Promise<void> {
    if (snapshot.removed) {
      throw new Error(`Cannot restore workspace: snapshot "${snapshot.id}" was removed`);
    }
    await clearDir(this.#root);
    await this.#fill(snapshot, "restore workspace");
    this.#parent = snapshot;
  }

  async close(): Promise<void> {
    try {
      if (this.#scratch) await clearDir(this.#root);
    } finally {
      await this.#store.release();
    }
  }
}
