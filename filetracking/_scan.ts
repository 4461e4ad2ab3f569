// Workspace scanning for the file tracker: walk the tree under the ignore
// rules, stat every file, and read only the files whose size, times or inode
// changed since the previous scan.

import { redactSecrets } from "../_internal/redact.ts";
import {
  type IgnoreRule,
  isCredentialPath,
  isIgnored,
  NOISE_DIRS,
  NOISE_FILES,
  parseGitignore,
} from "./_rules.ts";

/** How a file is tracked. */
export type EntryKind = "text" | "binary" | "large" | "credential" | "symlink";

/** What the tracker knows about one file. Immutable: scans share entries. */
export interface Entry {
  readonly size: number;
  readonly mtime: number;
  readonly ctime: number;
  readonly ino: number;
  readonly kind: EntryKind;
  /** sha256 hex; `null` for a credential or a file the budget left unread. */
  readonly hash: string | null;
  /** Content of a text file, or a symlink's target. */
  readonly text: string | null;
  /** Modified so recently that a same-size rewrite could keep its mtime: re-read next time. */
  readonly racy: boolean;
}

/** A path a scan could not track, and why. */
export interface ScanIssue {
  /** Path relative to the root, `/`-separated (cut short when very long). */
  readonly path: string;
  /** What went wrong, one line. */
  readonly reason: string;
}

/** One scan of the workspace. */
export interface Scan {
  /** Path (relative, `/`-separated) to entry. */
  readonly files: ReadonlyMap<string, Entry>;
  /** Paths skipped because they failed (at most {@linkcode MAX_ISSUES}). */
  readonly issues: readonly ScanIssue[];
  readonly timestamp: Date;
  readonly durationMs: number;
  /** Some files were left unread because the content budget ran out. */
  readonly truncated: boolean;
}

/** Limits for {@linkcode Scanner}. */
export interface ScanLimits {
  /** Files over this size are hashed but not diffed. */
  maxFileSize: number;
  /** Bytes read per scan. */
  scanBudget: number;
}

// Filesystems with coarse timestamps (1 s, 2 s on FAT) can hide a rewrite.
const RACY_WINDOW_MS = 2_000;
// A macrotask yield costs about 2 ms here: yield rarely, still keep the loop live.
const YIELD_EVERY_MS = 25;
const READERS = 64;
const SYNC_READ_MAX = 256 * 1024;
const BINARY_PROBE = 8_000;
/** Issues kept per scan: a tree of a million broken entries reports the first ones. */
const MAX_ISSUES = 100;
/** Deeper paths are reported, not walked: past this, system calls fail with ENAMETOOLONG. */
const MAX_PATH_LENGTH = 3_500;
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const encoder = new TextEncoder();

/** sha256 of `bytes` as lowercase hex. */
export async function sha256Hex(bytes: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  let hex = "";
  for (const b of digest) hex += b.toString(16).padStart(2, "0");
  return hex;
}

/** Whether two entries hold the same content, as far as the tracker can tell. */
export function sameContent(a: Entry, b: Entry): boolean {
  if (a === b) return true;
  if (a.kind !== b.kind && (a.kind === "symlink" || b.kind === "symlink")) return false;
  if (a.hash !== null && b.hash !== null) return a.hash === b.hash;
  return a.size === b.size && a.mtime === b.mtime;
}

/** Runs `fn` over `items` with at most `limit` in flight. */
async function pool<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await fn(items[next++]);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

interface Found {
  path: string;
  abs: string;
  symlink: boolean;
  info: Deno.FileInfo;
}

/** Scans one root; keeps the last scan to skip unchanged files next time. */
export class Scanner {
  readonly #root: string;
  readonly #limits: ScanLimits;
  #cache: ReadonlyMap<string, Entry> = new Map();

  /** @param root an absolute, resolved directory */
  constructor(root: string, limits: ScanLimits) {
    this.#root = root;
    this.#limits = limits;
  }

  /** Absolute path of a tracked file. */
  resolve(path: string): string {
    return `${this.#root}/${path}`;
  }

  /** Walks, stats and reads what changed. Not reentrant: the caller serialises scans. */
  async scan(): Promise<Scan> {
    const started = performance.now();
    const timestamp = new Date();
    const issues: ScanIssue[] = [];
    const found = await this.#walk(issues);
    const racyAfter = timestamp.getTime() - RACY_WINDOW_MS;
    found.sort((x, y) => x.path < y.path ? -1 : x.path > y.path ? 1 : 0);
    // Entries in path order: reused from the last scan, or read below.
    const entries: (Entry | undefined)[] = new Array(found.length);
    const toRead: { index: number; budgeted: boolean }[] = [];
    let budget = this.#limits.scanBudget;
    let truncated = false;
    for (let i = 0; i < found.length; i++) {
      const f = found[i];
      const cached = this.#cache.get(f.path);
      if (cached && unchanged(cached, f.info, f.symlink)) {
        entries[i] = cached;
        continue;
      }
      let budgeted = true;
      if (!f.symlink && !isCredentialPath(f.path)) {
        budgeted = f.info.size <= budget;
        if (budgeted) budget -= f.info.size;
        else truncated = true;
      }
      toRead.push({ index: i, budgeted });
    }
    await pool(toRead, READERS, async ({ index, budgeted }) => {
      try {
        entries[index] = await this.#read(found[index], budgeted, racyAfter);
      } catch (err) {
        // An entry that fails is skipped and reported; it never fails the scan.
        if (!isVanished(err)) addIssue(issues, found[index].path, err);
      }
    });
    const files = new Map<string, Entry>();
    for (let i = 0; i < found.length; i++) {
      const entry = entries[i];
      if (entry) files.set(found[i].path, entry);
    }
    this.#cache = files;
    return { files, issues, timestamp, durationMs: performance.now() - started, truncated };
  }

  async #read(f: Found, budgeted: boolean, racyAfter: number): Promise<Entry> {
    const info = f.info;
    const base = {
      size: info.size,
      mtime: info.mtime?.getTime() ?? 0,
      ctime: info.ctime?.getTime() ?? 0,
      ino: info.ino ?? 0,
    };
    // Any later write moves an old mtime; only a recent one can repeat.
    const racy = base.mtime >= racyAfter;
    if (f.symlink) {
      const target = await Deno.readLink(f.abs);
      return {
        ...base,
        kind: "symlink",
        hash: await sha256Hex(encoder.encode(target)),
        text: target,
        racy,
      };
    }
    if (isCredentialPath(f.path)) {
      // Metadata only: the content is never read.
      return { ...base, kind: "credential", hash: null, text: null, racy };
    }
    const large = info.size > this.#limits.maxFileSize;
    if (!budgeted) {
      return { ...base, kind: large ? "large" : "binary", hash: null, text: null, racy };
    }
    const bytes = info.size <= SYNC_READ_MAX
      ? readSameFileSync(f.abs, info)
      : await readSameFile(f.abs, info);
    const hash = await sha256Hex(bytes);
    const size = bytes.length;
    if (large || size > this.#limits.maxFileSize) {
      return { ...base, size, kind: "large", hash, text: null, racy };
    }
    const decoded = decodeText(bytes);
    const text = decoded === null ? null : redactSecrets(decoded);
    return { ...base, size, kind: text === null ? "binary" : "text", hash, text, racy };
  }

  /**
   * Walks the tree with synchronous readDir and lstat calls: several times
   * faster than their async forms for many small directories (measured on
   * Deno 2.9), and the loop yields to the event loop every few milliseconds.
   */
  async #walk(issues: ScanIssue[]): Promise<Found[]> {
    const found: Found[] = [];
    const stack: Pending[] = [{ dir: "", rules: [] }];
    let lastYield = performance.now();
    while (stack.length > 0) {
      this.#visit(stack.pop()!, stack, found, issues);
      if (performance.now() - lastYield > YIELD_EVERY_MS) {
        await new Promise((resolve) => setTimeout(resolve, 0));
        lastYield = performance.now();
      }
    }
    return found;
  }

  /**
   * Lists one directory: the subdirectories to walk go on `stack`, the
   * files and symlinks to track (with their lstat) on `found`.
   */
  #visit(pending: Pending, stack: Pending[], found: Found[], issues: ScanIssue[]): void {
    const { dir } = pending;
    const absDir = dir === "" ? this.#root : `${this.#root}/${dir}`;
    let entries: Deno.DirEntry[];
    try {
      entries = [...Deno.readDirSync(absDir)];
    } catch (err) {
      if (!isVanished(err)) addIssue(issues, dir, err);
      return;
    }
    const rules = entries.some((e) => e.name === ".gitignore" && e.isFile)
      ? withGitignore(pending, absDir, issues)
      : pending.rules;
    for (const e of entries) {
      const path = dir === "" ? e.name : `${dir}/${e.name}`;
      if (path.length > MAX_PATH_LENGTH) {
        addIssue(issues, path, `path longer than ${MAX_PATH_LENGTH} characters: not tracked`);
        continue;
      }
      if (e.isDirectory) {
        if (NOISE_DIRS.has(e.name) || isIgnored(rules, path, e.name, true)) continue;
        stack.push({ dir: path, rules });
      } else if (e.isFile || e.isSymlink) {
        if (NOISE_FILES.has(e.name) || isIgnored(rules, path, e.name, false)) continue;
        const abs = `${absDir}/${e.name}`;
        let info: Deno.FileInfo;
        try {
          info = Deno.lstatSync(abs);
        } catch (err) {
          if (!isVanished(err)) addIssue(issues, path, err);
          continue;
        }
        found.push({ path, abs, symlink: e.isSymlink, info });
      }
    }
  }
}

/** A directory still to walk, with the ignore rules of its parents. */
interface Pending {
  dir: string;
  rules: IgnoreRule[];
}

/** The rules of `pending` and of its own `.gitignore` (at `absDir`). */
function withGitignore(pending: Pending, absDir: string, issues: ScanIssue[]): IgnoreRule[] {
  const { dir, rules } = pending;
  try {
    const text = Deno.readTextFileSync(`${absDir}/.gitignore`);
    return [...rules, ...parseGitignore(text, dir)];
  } catch (err) {
    if (!isVanished(err)) addIssue(issues, `${dir === "" ? "" : dir + "/"}.gitignore`, err);
    return rules;
  }
}

/** A file that went away between listing and reading: skipped silently. */
function isVanished(err: unknown): boolean {
  return err instanceof Deno.errors.NotFound || err instanceof Deno.errors.NotADirectory;
}

function addIssue(issues: ScanIssue[], path: string, err: unknown): void {
  if (issues.length >= MAX_ISSUES) return;
  const reason = typeof err === "string"
    ? err
    : err instanceof Error
    ? `${err.name}: ${err.message.split("\n")[0]}`
    : String(err);
  issues.push({ path: path.length > 300 ? `${path.slice(0, 300)}…` : path, reason });
}

/**
 * The file `lstat` saw is replaced (by a symlink to a file outside the
 * root, say) between the walk and the read: opening follows the new link.
 * Reading through the opened handle and checking that it is the same inode
 * on the same device closes that window; at most the size seen is read.
 */
class FileChanged extends Error {
  constructor(path: string) {
    super(`${path} was replaced while being read: skipped`);
    this.name = "FileChanged";
  }
}

function sameFile(seen: Deno.FileInfo, opened: Deno.FileInfo): boolean {
  return opened.isFile && seen.ino === opened.ino && seen.dev === opened.dev;
}

export function readSameFileSync(path: string, seen: Deno.FileInfo): Uint8Array<ArrayBuffer> {
  using file = Deno.openSync(path, { read: true });
  if (!sameFile(seen, file.statSync())) throw new FileChanged(path);
  const out = new Uint8Array(seen.size);
  let n = 0;
  while (n < out.length) {
    const r = file.readSync(out.subarray(n));
    if (r === null || r === 0) break;
    n += r;
  }
  return n === out.length ? out : out.slice(0, n);
}

async function readSameFile(path: string, seen: Deno.FileInfo): Promise<Uint8Array<ArrayBuffer>> {
  using file = await Deno.open(path, { read: true });
  if (!sameFile(seen, await file.stat())) throw new FileChanged(path);
  const out = new Uint8Array(seen.size);
  let n = 0;
  while (n < out.length) {
    const r = await file.read(out.subarray(n));
    if (r === null || r === 0) break;
    n += r;
  }
  return n === out.length ? out : out.slice(0, n);
}

function unchanged(cached: Entry, info: Deno.FileInfo, symlink: boolean): boolean {
  return !cached.racy &&
    (cached.kind === "symlink") === symlink &&
    (cached.hash !== null || cached.kind === "credential") &&
    cached.size === info.size &&
    cached.mtime === (info.mtime?.getTime() ?? 0) &&
    cached.ctime === (info.ctime?.getTime() ?? 0) &&
    cached.ino === (info.ino ?? 0);
}

/** The text of a file, or `null` when it looks binary (a NUL byte, or not UTF-8). */
function decodeText(bytes: Uint8Array): string | null {
  if (bytes.subarray(0, BINARY_PROBE).includes(0)) return null;
  try {
    return utf8.decode(bytes);
  } catch {
    return null;
  }
}
