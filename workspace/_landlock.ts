// Paths an agent's commands cannot change, with Linux's Landlock: a
// workspace's `protect` option (isolation "none"), which a Harbor task uses
// for /logs/verifier and /tests, where the verifier writes its reward and
// keeps its tests while processes the agent left run on beside it, as they
// do under `docker exec`.
//
// Landlock is unprivileged, stacks, is inherited by every child and cannot
// be left: a process and all it starts lose the rights the ruleset handles
// except under the hierarchies a rule grants them. It grants, never denies,
// so "everything but P" is written as grants on every sibling of every
// directory on the way from / down to each protected path; the directories
// on that way keep their own entries but no new ones (nothing can be made,
// removed or renamed directly in them), and the protected paths get no
// right at all. An entry that is a link to a protected path or to a
// directory on the way gets no grant either (a grant follows the link). A
// domain also keeps its processes from tracing processes outside it (the
// server, the verifier), or opening their memory or their root through
// /proc; their environment stays readable to the same uid.
//
// This file is also the launcher (`deno run ... _landlock.ts --protect P --
// ARGV`): it restricts the thread Deno runs JavaScript on and execs ARGV
// from it (execvp(3) through FFI), so that the new program, a single thread,
// starts in the domain. restrict_self(2) acts on the calling thread only;
// the others go with the exec.

import { errorMessage } from "../_internal/util.ts";
import { isUnder } from "../_internal/fs.ts";
import { cstr } from "./_mount.ts";

/** The launcher's own path, for {@linkcode landlockArgv}. */
export const LANDLOCK_MAIN: string = new URL(import.meta.url).pathname;

// include/uapi/linux/landlock.h: filesystem access rights, by ABI version
// (EXECUTE, READ_FILE and READ_DIR, bits 0, 2 and 3, are not handled: reading stays free).
const WRITE_FILE = 1n << 1n;
const REMOVE_DIR = 1n << 4n;
const REMOVE_FILE = 1n << 5n;
const MAKE_CHAR = 1n << 6n;
const MAKE_DIR = 1n << 7n;
const MAKE_REG = 1n << 8n;
const MAKE_SOCK = 1n << 9n;
const MAKE_FIFO = 1n << 10n;
const MAKE_BLOCK = 1n << 11n;
const MAKE_SYM = 1n << 12n;
/** ABI 2: linking or renaming a file into another directory. */
const REFER = 1n << 13n;
/** ABI 3: truncate(2), ftruncate(2), O_TRUNC. */
const TRUNCATE = 1n << 14n;

/** Rights that only mean something on a directory (a rule on a file may not hold them). */
const DIRECTORY_ONLY = REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK |
  MAKE_FIFO | MAKE_BLOCK | MAKE_SYM | REFER;

/** The rights handled (and so taken away outside the grants) at `abi`: every kind of change. */
export function handledRights(abi: number): bigint {
  let rights = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG |
    MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM;
  if (abi >= 2) rights |= REFER;
  if (abi >= 3) rights |= TRUNCATE;
  return rights;
}

/** One grant: every handled right beneath `path` (a file's: those a file can hold). */
export interface LandlockGrant {
  path: string;
  directory: boolean;
}

/** What {@linkcode landlockGrants} reads of the file system; Deno's by default. */
export interface GrantsFs {
  /** The names in directory `dir`. */
  names(dir: string): string[];
  /** Whether `path` is a directory (links followed; false when it is gone). */
  isDirectory(path: string): boolean;
  /** Where `path` leads, links resolved; null when it leads nowhere. */
  realPath(path: string): string | null;
}

const denoFs: GrantsFs = {
  names: (dir) => [...Deno.readDirSync(dir)].map((e) => e.name),
  isDirectory: (path) => {
    try {
      return Deno.statSync(path).isDirectory;
    } catch {
      return false;
    }
  },
  realPath: (path) => {
    try {
      return Deno.lstatSync(path).isSymlink ? Deno.realPathSync(path) : path;
    } catch {
      return null;
    }
  },
};

/** `path` without a trailing slash, checked: absolute, no `.` or `..`, not `/`. */
export function protectedPath(path: string): string {
  const clean = path.replace(/\/+$/, "").replace(/\/+/g, "/");
  const parts = clean.split("/").slice(1);
  if (!clean.startsWith("/") || clean === "" || parts.some((p) => p === "." || p === "..")) {
    throw new TypeError(
      `Cannot protect "${path}": give an absolute path without "." or ".." below /`,
    );
  }
  return clean;
}

/**
 * The grants that leave `protect` (absolute paths) and nothing else
 * unchangeable: every entry of each directory on the way from / to a
 * protected path, except the protected paths and the way itself.
 */
export function landlockGrants(
  protect: readonly string[],
  fs: GrantsFs = denoFs,
): LandlockGrant[] {
  const shut = new Set(protect.map(protectedPath));
  // The directories on the way: / and every ancestor of a protected path.
  const way = new Set<string>(["/"]);
  for (const p of shut) {
    const parts = p.split("/").slice(1, -1);
    for (let i = 1; i <= parts.length; i++) way.add(`/${parts.slice(0, i).join("/")}`);
  }
  const grants: LandlockGrant[] = [];
  for (const dir of [...way].sort()) {
    let names: string[];
    try {
      names = fs.names(dir);
    } catch {
      continue; // not there: nothing in it to grant, nothing can be made in it
    }
    for (const name of names.sort()) {
      const path = dir === "/" ? `/${name}` : `${dir}/${name}`;
      if (shut.has(path) || way.has(path)) continue;
      // A grant follows a link: none for one that leads nowhere, into a protected path, or to
      // a directory on the way (whose grant would cover the protected path).
      const real = fs.realPath(path);
      if (real === null || way.has(real) || [...shut].some((p) => isUnder(real, p))) continue;
      grants.push({ path, directory: fs.isDirectory(path) });
    }
  }
  return grants;
}

/** The rights a grant gives at `abi`. */
function grantRights(grant: LandlockGrant, abi: number): bigint {
  const all = handledRights(abi);
  return grant.directory ? all : all & ~DIRECTORY_ONLY;
}

/**
 * The command line that runs `argv` with `protect` unchangeable for it and
 * all it starts: this file run by this process's `deno`.
 */
export function landlockArgv(protect: readonly string[], argv: readonly string[]): string[] {
  return [
    Deno.execPath(),
    "run",
    "--no-config",
    "--no-lock",
    "--quiet",
    // FFI is all permissions anyway; and Deno lets only -A stat /dev, /proc and /sys.
    "-A",
    LANDLOCK_MAIN,
    ...protect.flatMap((p) => ["--protect", protectedPath(p)]),
    "--",
    ...argv,
  ];
}

let abiVersion: Promise<number> | null = null;

/**
 * The kernel's Landlock ABI version, 0 when it has none (asked of the
 * launcher once per process: this process needs no FFI permission).
 */
export function landlockAbi(): Promise<number> {
  abiVersion ??= (async () => {
    if (Deno.build.os !== "linux") return 0;
    // The launcher's command line, "--" replaced by "--abi".
    const [deno, ...args] = landlockArgv([], []).slice(0, -1);
    const out = await new Deno.Command(deno, {
      args: [...args, "--abi"],
      stdout: "piped",
      stderr: "null",
    }).output().catch(() => null);
    const v = out?.success ? Number(new TextDecoder().decode(out.stdout).trim()) : 0;
    return Number.isSafeInteger(v) && v > 0 ? v : 0;
  })();
  return abiVersion;
}

// The launcher (`import.meta.main`): FFI into libc.

const LIBC_SYMBOLS = {
  // syscall(2) is variadic: every argument passed as a 64-bit integer.
  syscall: { parameters: ["i64", "i64", "i64", "i64", "i64"], result: "i64" },
  prctl: { parameters: ["i32", "u64", "u64", "u64", "u64"], result: "i32" },
  open: { parameters: ["buffer", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  execvp: { parameters: ["buffer", "buffer"], result: "i32" },
  __errno_location: { parameters: [], result: "pointer" },
} as const;

type Libc = Deno.DynamicLibrary<typeof LIBC_SYMBOLS>;

// The system call numbers of the unified table (x86_64 and arm64 alike).
const SYS_CREATE_RULESET = 444n;
const SYS_ADD_RULE = 445n;
const SYS_RESTRICT_SELF = 446n;
const CREATE_RULESET_VERSION = 1n;
const RULE_PATH_BENEATH = 1n;
const PR_SET_NO_NEW_PRIVS = 38;
const O_PATH = 0o10000000;
const O_CLOEXEC = 0o2000000;

function errno(libc: Libc): number {
  const at = libc.symbols.__errno_location();
  return at === null ? 0 : new Deno.UnsafePointerView(at).getInt32();
}

/** The address of `buf`, as syscall(2) takes it. */
function address(buf: BufferSource): bigint {
  return BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(buf)));
}

/** The kernel's Landlock ABI version, or 0 when it has none (or it is disabled). */
function abiOf(libc: Libc): number {
  const v = libc.symbols.syscall(SYS_CREATE_RULESET, 0n, 0n, CREATE_RULESET_VERSION, 0n);
  return v > 0n ? Number(v) : 0;
}

/** Restricts the calling thread: `protect` unchangeable, beneath the grants anything goes. */
function restrictSelf(libc: Libc, abi: number, protect: readonly string[]): void {
  const fail = (what: string): never => {
    throw new Error(`Cannot protect ${protect.join(", ")}: ${what} failed (errno ${errno(libc)})`);
  };
  // struct landlock_ruleset_attr, its first field (the kernel takes a shorter struct).
  const attr = new BigUint64Array([handledRights(abi)]);
  const ruleset = libc.symbols.syscall(SYS_CREATE_RULESET, address(attr), 8n, 0n, 0n);
  if (ruleset < 0n) fail("landlock_create_ruleset");
  // struct landlock_path_beneath_attr { u64 allowed_access; s32 parent_fd; } packed: 12 bytes.
  const rule = new Uint8Array(12);
  const view = new DataView(rule.buffer);
  for (const grant of landlockGrants(protect)) {
    const fd = libc.symbols.open(cstr(grant.path), O_PATH | O_CLOEXEC);
    if (fd < 0) continue; // gone meanwhile: nothing to grant
    view.setBigUint64(0, grantRights(grant, abi), true);
    view.setInt32(8, fd, true);
    const added = libc.symbols.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, address(rule), 0n);
    libc.symbols.close(fd);
    if (added < 0n) fail(`landlock_add_rule on ${grant.path}`);
  }
  if (libc.symbols.prctl(PR_SET_NO_NEW_PRIVS, 1n, 0n, 0n, 0n) !== 0) fail("prctl(NO_NEW_PRIVS)");
  if (libc.symbols.syscall(SYS_RESTRICT_SELF, ruleset, 0n, 0n, 0n) < 0n) {
    fail("landlock_restrict_self");
  }
  libc.symbols.close(Number(ruleset));
}

/** execvp(3) of `argv`; returns only when it failed. */
function execvp(libc: Libc, argv: readonly string[]): never {
  const strings = argv.map(cstr);
  const vector = new BigUint64Array(strings.length + 1);
  strings.forEach((s, i) => vector[i] = address(s));
  libc.symbols.execvp(strings[0], vector);
  throw new Error(`Cannot run "${argv[0]}": execvp failed (errno ${errno(libc)})`);
}

/** `--abi`: prints the ABI version; `--protect P... -- ARGV`: runs ARGV with P unchangeable. */
function main(args: string[]): void {
  const libc = Deno.dlopen("libc.so.6", LIBC_SYMBOLS);
  const abi = abiOf(libc);
  if (args[0] === "--abi") {
    console.log(abi);
    return;
  }
  const protect: string[] = [];
  let i = 0;
  while (args[i] === "--protect" && i + 1 < args.length) {
    protect.push(protectedPath(args[i + 1]));
    i += 2;
  }
  if (args[i] !== "--" || i + 1 >= args.length) {
    throw new TypeError("Usage: _landlock.ts (--abi | --protect PATH... -- PROGRAM [ARG...])");
  }
  if (abi === 0) {
    throw new Error(
      `Cannot protect ${
        protect.join(", ")
      }: this kernel has no Landlock (Linux 5.13 or later, with landlock among its LSMs)`,
    );
  }
  restrictSelf(libc, abi, protect);
  execvp(libc, args.slice(i + 1));
}

if (import.meta.main) {
  try {
    main(Deno.args);
  } catch (err) {
    console.error(errorMessage(err));
    // As a shell says of a command it could not run.
    Deno.exit(126);
  }
}
