// The mounts snapshots are made of, through libc (Deno has no mount API):
// an overlay at a workspace's root, read-only binds of a directory, and
// idmapped binds, which show a layer's files as another uid's (a fork runs
// as a uid of its own, while the files it starts from belong to the uid of
// the workspace they were taken of). util-linux 2.38 (Debian 12) has no
// command for idmapped mounts, and spawning `mount` costs a process per
// mount; the calls themselves take microseconds. Loaded only when a
// workspace uses snapshots: it needs root, Linux and `--allow-ffi`.

import { errorMessage } from "../_internal/util.ts";

const AT_FDCWD = -100;
const AT_EMPTY_PATH = 0x1000;
const OPEN_TREE_CLONE = 1;
const O_CLOEXEC = 0o2000000;
const MOUNT_ATTR_RDONLY = 0x1n;
const MOUNT_ATTR_NOSUID = 0x2n;
const MOUNT_ATTR_NODEV = 0x4n;
const MOUNT_ATTR_IDMAP = 0x100000n;
const MOVE_MOUNT_F_EMPTY_PATH = 4;
const MS_NOSUID = 2n;
const MS_NODEV = 4n;
const MNT_DETACH = 2;
const EBUSY = 16;
const EINVAL = 22;
const ENOSYS = 38;
const EOVERFLOW = 75;
const EOPNOTSUPP = 95;

const SYMBOLS = {
  mount: { parameters: ["buffer", "buffer", "buffer", "u64", "buffer"], result: "i32" },
  umount2: { parameters: ["buffer", "i32"], result: "i32" },
  open_tree: { parameters: ["i32", "buffer", "u32"], result: "i32" },
  mount_setattr: { parameters: ["i32", "buffer", "u32", "buffer", "usize"], result: "i32" },
  move_mount: { parameters: ["i32", "buffer", "i32", "buffer", "u32"], result: "i32" },
  open: { parameters: ["buffer", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  lgetxattr: { parameters: ["buffer", "buffer", "buffer", "usize"], result: "isize" },
  name_to_handle_at: {
    parameters: ["i32", "buffer", "buffer", "buffer", "i32"],
    result: "i32",
  },
  strerror: { parameters: ["i32"], result: "pointer" },
  __errno_location: { parameters: [], result: "pointer" },
} as const;

type Libc = Deno.DynamicLibrary<typeof SYMBOLS>["symbols"];

let libc: Libc | null = null;
let unavailable: string | null = null;

/**
 * Loads libc's mount calls once.
 * @returns null when they can be used here, else why not (one line)
 */
export function mountsUnavailable(): string | null {
  if (libc !== null) return null;
  if (unavailable !== null) return unavailable;
  if (Deno.build.os !== "linux") return unavailable = `no overlay mounts on ${Deno.build.os}`;
  if (Deno.uid() !== 0) return unavailable = "mounting needs root";
  try {
    libc = Deno.dlopen("libc.so.6", SYMBOLS).symbols;
    return null;
  } catch (err) {
    return unavailable = err instanceof Deno.errors.NotCapable
      ? "calling libc's mount(2) needs --allow-ffi"
      : `cannot load libc: ${errorMessage(err)}`;
  }
}

function lib(): Libc {
  const why = mountsUnavailable();
  if (why !== null) throw new Error(`Cannot mount: ${why}`);
  return libc!;
}

/** `s` as a C string (NUL-terminated), for libc through FFI. */
export function cstr(s: string): Uint8Array<ArrayBuffer> {
  return new TextEncoder().encode(`${s}\0`);
}

/** The errno of the call just made, as an error naming what failed. */
function failure(what: string): Error & { errno: number } {
  const c = lib();
  const errno = new Deno.UnsafePointerView(c.__errno_location()!).getInt32();
  const text = new Deno.UnsafePointerView(c.strerror(errno)!).getCString();
  return Object.assign(new Error(`${what}: ${text}`), { errno });
}

/** Characters the overlay's option string cannot hold in a path. */
const UNSAFE_OPTION = /[,:\\\s]/;

/**
 * Mounts an overlay at `target` (nosuid, nodev): `lowers` top first, a
 * writable `upper` and its `work` directory on the same file system. Redirects,
 * metacopy, the index and xino are off, so that an upper directory holds
 * plain copies, whiteouts and opaque directories only.
 * @throws {Error} naming the errno when the kernel refuses
 */
export function mountOverlay(
  target: string,
  lowers: readonly string[],
  upper: string,
  work: string,
): void {
  for (const p of [...lowers, upper, work]) {
    if (UNSAFE_OPTION.test(p)) throw new Error(`Cannot mount an overlay on "${p}": unsafe path`);
  }
  const options = [
    `lowerdir=${lowers.join(":")}`,
    `upperdir=${upper}`,
    `workdir=${work}`,
    "redirect_dir=off",
    "index=off",
    "metacopy=off",
    "xino=off",
  ].join(",");
  const c = lib();
  const r = c.mount(
    cstr("hud-workspace"),
    cstr(target),
    cstr("overlay"),
    MS_NOSUID | MS_NODEV,
    cstr(options),
  );
  if (r !== 0) throw failure(`Cannot mount an overlay on "${target}"`);
}

/**
 * Unmounts `target`. A busy mount (a process of this host still has a file
 * or its directory there) is detached instead: it goes when they let go.
 * @returns false when nothing was mounted there
 */
export function unmount(target: string): boolean {
  const c = lib();
  if (c.umount2(cstr(target), 0) === 0) return true;
  const first = failure(`Cannot unmount "${target}"`);
  if (first.errno === EINVAL) return false;
  if (first.errno !== EBUSY) throw first;
  if (c.umount2(cstr(target), MNT_DETACH) === 0) return true;
  throw failure(`Cannot unmount "${target}"`);
}

/**
 * Whether `dir` is an overlay upper directory's opaque directory (it hides
 * what the layers below hold at its path): `trusted.overlay.opaque` is "y".
 */
export function isOpaque(dir: string): boolean {
  // Without libc's calls no overlay was mounted here: no layer has opaque directories.
  if (mountsUnavailable() !== null) return false;
  const buf = new Uint8Array(8);
  const n = lib().lgetxattr(cstr(dir), cstr("trusted.overlay.opaque"), buf, BigInt(buf.length));
  return Number(n) === 1 && buf[0] === 0x79;
}

/** Ids a bind shows as others: each pair swapped, every other id as it is. */
export interface IdSwap {
  /** On disk, and as shown. */
  uid: readonly [number, number];
  gid: readonly [number, number];
}

/**
 * Binds `src` at `dest` (an existing directory) read-only, nosuid and
 * nodev, and with `swap`, idmapped: files of one id show as the other's.
 * @param userns with `swap`, an open user namespace whose maps do the swap
 * @throws {Error} naming the errno when the kernel refuses
 */
export function bindReadOnly(src: string, dest: string, userns?: UserNamespace): void {
  const c = lib();
  const fd = c.open_tree(AT_FDCWD, cstr(src), OPEN_TREE_CLONE | O_CLOEXEC);
  if (fd < 0) throw failure(`Cannot bind "${src}"`);
  try {
    const set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
      (userns === undefined ? 0n : MOUNT_ATTR_IDMAP);
    const attr = new BigUint64Array([set, 0n, 0n, BigInt(userns?.fd ?? 0)]);
    if (c.mount_setattr(fd, cstr(""), AT_EMPTY_PATH, new Uint8Array(attr.buffer), 32n) !== 0) {
      throw failure(`Cannot bind "${src}" ${userns === undefined ? "read-only" : "idmapped"}`);
    }
    if (c.move_mount(fd, cstr(""), AT_FDCWD, cstr(dest), MOVE_MOUNT_F_EMPTY_PATH) !== 0) {
      throw failure(`Cannot bind "${src}" at "${dest}"`);
    }
  } finally {
    c.close(fd);
  }
}

const O_DIRECTORY = 0o200000;
const AT_SYMLINK_FOLLOW = 0x400;
/** MAX_HANDLE_SZ of <fcntl.h>. */
const MAX_HANDLE_BYTES = 128;

/**
 * The kernel's handle of the file at `path` (links followed), as hex: its
 * inode and the inode's generation on the file systems that have one
 * (ext4, xfs, btrfs, tmpfs), so that a file made later on a freed inode of
 * the same number has another handle. Unique on its file system.
 * @returns null where the file system gives no handles
 * @throws {Error} naming the errno when `path` cannot be reached
 */
export function fileHandle(path: string): string | null {
  const c = lib();
  // struct file_handle: u32 handle_bytes, i32 handle_type, the bytes.
  const buf = new Uint8Array(8 + MAX_HANDLE_BYTES);
  const view = new DataView(buf.buffer);
  view.setUint32(0, MAX_HANDLE_BYTES, true);
  const mountId = new Uint8Array(4);
  if (c.name_to_handle_at(AT_FDCWD, cstr(path), buf, mountId, AT_SYMLINK_FOLLOW) !== 0) {
    const err = failure(`Cannot identify "${path}"`);
    // EOVERFLOW: a handle it cannot make (older kernels say so for an overlay).
    if (err.errno === EOPNOTSUPP || err.errno === ENOSYS || err.errno === EOVERFLOW) return null;
    throw err;
  }
  const size = Math.min(view.getUint32(0, true), MAX_HANDLE_BYTES);
  const type = view.getInt32(4, true);
  const bytes = Array.from(buf.subarray(8, 8 + size), (b) => b.toString(16).padStart(2, "0"));
  return `${type}:${bytes.join("")}`;
}

/**
 * Opens the directory `path` (as it is now: a mount made there later does
 * not hide it from the descriptor): `/proc/self/fd/<fd>` then leads to it.
 * @returns the descriptor, for {@linkcode closeDescriptor}
 */
export function openDirectory(path: string): number {
  const fd = lib().open(cstr(path), O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw failure(`Cannot open "${path}"`);
  return fd;
}

export function closeDescriptor(fd: number): void {
  lib().close(fd);
}

/** `/proc/<pid>/[ug]id_map` lines mapping every id to itself but `a` and `b`, swapped. */
function swapMap([a, b]: readonly [number, number]): string {
  const max = 4294967295; // ids 0..2^32-2 (2^32-1 is "no id")
  if (a === b) return `0 0 ${max}\n`;
  const [lo, hi] = a < b ? [a, b] : [b, a];
  const lines: string[] = [];
  if (lo > 0) lines.push(`0 0 ${lo}`);
  lines.push(`${lo} ${hi} 1`);
  if (hi - lo > 1) lines.push(`${lo + 1} ${lo + 1} ${hi - lo - 1}`);
  lines.push(`${hi} ${lo} 1`);
  if (max - hi - 1 > 0) lines.push(`${hi + 1} ${hi + 1} ${max - hi - 1}`);
  return `${lines.join("\n")}\n`;
}

/** An open user namespace, for idmapped binds. */
export interface UserNamespace {
  readonly fd: number;
  close(): void;
}

/**
 * A user namespace whose maps swap `swap`'s ids: made by `unshare --user`
 * holding it while this process (root) writes its maps and opens it.
 * @throws {Error} when it cannot be made
 */
export async function swapNamespace(swap: IdSwap): Promise<UserNamespace> {
  const child = new Deno.Command("unshare", {
    args: ["--user", "--", "cat"],
    stdin: "piped",
    stdout: "null",
    stderr: "null",
    clearEnv: true,
    env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
  }).spawn();
  try {
    const own = Deno.readLinkSync("/proc/self/ns/user");
    // unshare(1) enters the namespace before it execs cat: wait for it (bounded).
    for (let i = 0;; i++) {
      const ns = await Deno.readLink(`/proc/${child.pid}/ns/user`).catch(() => own);
      if (ns !== own) break;
      if (i >= 2000) throw new Error("Cannot make a user namespace: unshare did not enter one");
      await new Promise((r) => setTimeout(r, i < 50 ? 0 : 1));
    }
    await Deno.writeTextFile(`/proc/${child.pid}/uid_map`, swapMap(swap.uid));
    await Deno.writeTextFile(`/proc/${child.pid}/gid_map`, swapMap(swap.gid));
    const c = lib();
    const fd = c.open(cstr(`/proc/${child.pid}/ns/user`), O_CLOEXEC);
    if (fd < 0) throw failure("Cannot open a user namespace");
    let open = true;
    return {
      fd,
      close() {
        if (open) c.close(fd);
        open = false;
      },
    };
  } finally {
    await child.stdin.close().catch(() => {});
    await child.status;
  }
}
