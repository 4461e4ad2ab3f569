// The snapshot store: one private directory per process (0700, under the
// system's temporary directory, never shown in a sandbox) holding layers,
// the immutable directories snapshots are stacks of, and the writable
// upper directories of the overlays mounted at workspace roots. It is
// removed when nothing uses it any more, at exit (`unload`), and, when this
// process dies without either (SIGKILL, a signal nobody handles), by a
// watcher started with it in a session of its own, which unmounts what used
// the store and removes it.

import { DEFAULT_PATH } from "./_sandbox.ts";
import { unmount } from "./_mount.ts";
import { watchExit } from "./_watcher.ts";

/** The ids that mean "the agent" on disk in a layer (its files' owner). */
export interface Owner {
  readonly uid: number;
  readonly gid: number;
}

// Once the process has ended (_watcher.ts), unmounts, newest first, every
// mount that uses the store (binds under it, overlays whose options name it)
// and removes it, staying on its file system.
const WATCHER = `store=$1
[ -d "$store" ] || exit 0
tac /proc/self/mountinfo | while IFS= read -r line; do
  case $line in *"$store"*) ;; *) continue ;; esac
  set -f; set -- $line; set +f
  umount -l -- "$(printf '%b' "\${5//\\\\/\\\\0}")" 2>/dev/null
done
rm -rf --one-file-system -- "$store"
`;

/** The process's store, while something uses it. */
export class SnapshotStore {
  readonly dir: string;
  readonly #watcher: Deno.ChildProcess;
  /** Mount points that use the store, for the exit handler. */
  readonly #mounts = new Set<string>();
  #users = 0;
  #next = 0;
  readonly #onUnload = () => this.#removeSync();

  constructor(dir: string, watcher: Deno.ChildProcess) {
    this.dir = dir;
    this.#watcher = watcher;
    globalThis.addEventListener("unload", this.#onUnload);
  }

  /** A fresh path in the store: `l` layers, `w` overlays' upper and work, `b` binds. */
  path(kind: "l" | "w" | "b"): string {
    return `${this.dir}/${kind}${(this.#next++).toString(36)}`;
  }

  /** Counts a mount point that uses the store until {@linkcode unmounted}. */
  mounted(point: string): void {
    this.#mounts.add(point);
  }

  unmounted(point: string): void {
    this.#mounts.delete(point);
  }

  /** Counts one more user (a layer, a mounted root) until {@linkcode release}. */
  retain(): void {
    this.#users++;
  }

  /** One user fewer; the last one removes the store. */
  async release(): Promise<void> {
    if (--this.#users > 0) return;
    if (current === null || await current !== this) return;
    current = null;
    globalThis.removeEventListener("unload", this.#onUnload);
    try {
      this.#watcher.kill("SIGKILL");
    } catch {
      // gone
    }
    await this.#watcher.status;
    this.#removeSync();
  }

  /** Everything at once, synchronously: what exit leaves no time for otherwise. */
  #removeSync(): void {
    for (const point of [...this.#mounts].reverse()) {
      try {
        unmount(point);
      } catch {
        // The watcher's turn.
      }
    }
    this.#mounts.clear();
    try {
      Deno.removeSync(this.dir, { recursive: true });
    } catch {
      // already gone, or a mount still busy
    }
  }
}

let current: Promise<SnapshotStore> | null = null;

/** The parent of the store: TMPDIR where its path is safe in mount options, else /tmp. */
function storeParent(): string {
  const tmp = Deno.env.get("TMPDIR");
  return tmp !== undefined && /^\/[A-Za-z0-9._/-]*$/.test(tmp) ? tmp.replace(/\/+$/, "") : "/tmp";
}

async function openStore(): Promise<SnapshotStore> {
  const dir = await Deno.makeTempDir({ dir: storeParent(), prefix: "hud-snapshots-" });
  await Deno.chmod(dir, 0o700);
  let watcher: Deno.ChildProcess;
  try {
    watcher = watchExit(WATCHER, "hud-snapshots", [dir]);
  } catch (err) {
    await Deno.remove(dir, { recursive: true });
    throw err;
  }
  return new SnapshotStore(dir, watcher);
}

/** The process's store, opened on first use; the caller retains it. */
export async function snapshotStore(): Promise<SnapshotStore> {
  const opening = current ??= openStore();
  try {
    const store = await opening;
    store.retain();
    return store;
  } catch (err) {
    if (current === opening) current = null;
    throw err;
  }
}

/** An immutable directory of the store, counted by the snapshots and mounts that use it. */
export class Layer {
  readonly #store: SnapshotStore;
  readonly path: string;
  /** The ids meaning "the agent" in it; null when commands do not switch uid (not root). */
  readonly owner: Owner | null;
  /** Bytes of disk it took (0 for a tree of hard links). */
  readonly bytes: number;
  #refs = 1;

  /** Takes over one retain of `store`; the caller holds the first reference. */
  constructor(store: SnapshotStore, path: string, owner: Owner | null, bytes: number) {
    this.#store = store;
    this.path = path;
    this.owner = owner;
    this.bytes = bytes;
  }

  retain(): this {
    if (this.#refs === 0) throw new Error(`Cannot use layer "${this.path}": it was removed`);
    this.#refs++;
    return this;
  }

  /** Drops a reference; the last removes the directory. */
  async release(): Promise<void> {
    if (this.#refs === 0 || --this.#refs > 0) return;
    await Deno.remove(this.path, { recursive: true }).catch(() => {});
    await this.#store.release();
  }
}

/** What a tree holds, for the store's bounds. */
export interface TreeSize {
  /** Bytes of disk its files take (holes are free). */
  bytes: number;
  /** Entries, directories included. */
  entries: number;
  /** Paths (relative) of sockets and device nodes, which snapshots leave out. */
  special: string[];
}

/** What a tree may hold before measuring stops. */
export interface TreeBounds {
  bytes: number;
  entries: number;
}

/** Disk an entry takes besides its blocks: an inode (ext4's default size). */
const INODE_BYTES = 256;

/**
 * Measures `dir` without following links or opening files (a FIFO cannot
 * block it), stopping as soon as a bound is passed.
 * @returns its size, or the bound passed first
 */
export async function measureTree(
  dir: string,
  bounds: TreeBounds,
): Promise<TreeSize | { over: "bytes" | "entries" }> {
  const size: TreeSize = { bytes: 0, entries: 0, special: [] };
  const pending = [""];
  while (pending.length > 0) {
    const rel = pending.pop()!;
    for await (const e of Deno.readDir(rel === "" ? dir : `${dir}/${rel}`)) {
      const path = rel === "" ? e.name : `${rel}/${e.name}`;
      if (++size.entries > bounds.entries) return { over: "entries" };
      // Every entry takes an inode in a copy, a directory a block or more:
      // empty ones would otherwise fill the disk uncounted.
      const info = await Deno.lstat(`${dir}/${path}`);
      size.bytes += INODE_BYTES + (info.blocks ?? 0) * 512;
      if (size.bytes > bounds.bytes) return { over: "bytes" };
      if (e.isDirectory) pending.push(path);
      if (e.isDirectory || e.isFile || e.isSymlink || info.isFifo) continue;
      // A whiteout (a 0/0 character device) is how an overlay records a deletion.
      if (!(info.isCharDevice && info.rdev === 0)) size.special.push(path);
    }
  }
  return size;
}

/** Runs a coreutils command with a fixed environment; throws its first line of error. */
export async function coreutil(what: string, program: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(program, {
    args,
    clearEnv: true,
    env: { PATH: DEFAULT_PATH, LC_ALL: "C" },
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!out.success) {
    const why = new TextDecoder().decode(out.stderr).trim().split("\n")[0];
    throw new Error(`${what}: ${why || `${program} exited with ${out.code}`}`);
  }
}

/**
 * Copies the tree `src` to `dest` (which must not exist) as it is: modes,
 * owners, links as links, holes as holes, extended attributes (an overlay's
 * whiteouts and opaque directories), hard links within it. Never follows a
 * link, never opens a FIFO or a device.
 */
export async function copyTree(src: string, dest: string): Promise<void> {
  await coreutil(
    "Cannot copy the workspace",
    "cp",
    ["-a", "--reflink=auto", "--no-target-directory", "--", src, dest],
  );
}

/** `src`'s tree made again at `dest` of hard links to its files (cost: one link each). */
export async function linkTree(src: string, dest: string): Promise<void> {
  await coreutil("Cannot link the workspace", "cp", [
    "-al",
    "--no-target-directory",
    "--",
    src,
    dest,
  ]);
}
