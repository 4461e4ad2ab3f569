// Whether root may have added entries to a workspace's writable trees since
// a command last looked: the hint that lets a command skip the hand-over
// (a find(1) of the trees as root in its sandbox, `_sandbox.ts`), a process
// of a millisecond or two, where nothing of root's can be new.
//
// Every entry made in a directory, removed or renamed into it changes the
// directory's ctime, which nobody can set back. So a directory whose ctime
// is as it was, seen after that ctime had passed, holds the entries it
// held; only changed directories are listed again, their entries checked
// for root's. Deno gives ctime in whole seconds: a directory changed in the
// second before it was seen is listed again each time until that second
// has passed (its mtime, in milliseconds, catches most changes sooner, but
// can be set back). What is not covered: root giving an existing entry of
// the agent's to itself (chown), which changes that entry's ctime only. The
// hint only ever skips work: a wrong "yes" costs a find, and the trees are
// read here with lstat, never followed or changed.

/** Directories the hint keeps; past that many it answers "yes" always. */
const MAX_DIRS = 256;

/**
 * How long after its ctime's second a directory must be seen for that
 * ctime to be trusted to change with the next entry: the second itself,
 * and a tick of the kernel's coarse clock (up to 10 ms) to spare.
 */
const SETTLE_MS = 1_000 + 20;

/** A directory as last seen: its times, whether they were settled, its subdirectories. */
interface Seen {
  ctime: number;
  mtime: number;
  settled: boolean;
  subdirs: string[];
}

/** One episode's view of its writable trees (the root, HOME). */
export class HandOverHint {
  readonly #roots: readonly string[];
  #dirs = new Map<string, Seen>();
  /** Set when the trees have more directories than are kept. */
  #large = false;

  /** @param roots the writable trees, as this host sees them */
  constructor(roots: readonly string[]) {
    this.#roots = roots;
  }

  /**
   * Whether root may own an entry a hand-over would give away (a directory,
   * or anything of one link) in the trees, having been made since the last
   * call that said no. Reads the trees' directories; lists only those that
   * changed.
   */
  needed(): boolean {
    if (this.#large) return true;
    const now = Date.now();
    const next = new Map<string, Seen>();
    const stack = [...this.#roots];
    while (stack.length > 0) {
      const dir = stack.pop()!;
      if (next.size >= MAX_DIRS) {
        this.#large = true;
        this.#dirs.clear();
        return true;
      }
      let info: Deno.FileInfo;
      try {
        info = Deno.lstatSync(dir);
      } catch {
        continue; // gone: nothing of root's there
      }
      const before = this.#dirs.get(dir);
      const ctime = info.ctime?.getTime() ?? NaN;
      const mtime = info.mtime?.getTime() ?? NaN;
      const same = before !== undefined && before.settled && before.ctime === ctime &&
        before.mtime === mtime;
      const seen = !info.isDirectory || info.uid === 0
        ? null
        : same
        ? before
        : this.#list(dir, ctime, mtime, now);
      if (seen === null) {
        // Root's, or holding root's: a hand-over. What was seen so far
        // holds; this directory is listed again next time.
        for (const [d, v] of next) this.#dirs.set(d, v);
        this.#dirs.delete(dir);
        return true;
      }
      next.set(dir, seen);
      stack.push(...seen.subdirs);
    }
    this.#dirs = next;
    return false;
  }

  /** Lists `dir`: its subdirectories, or null when an entry of root's is there (or it cannot be read). */
  #list(dir: string, ctime: number, mtime: number, now: number): Seen | null {
    const subdirs: string[] = [];
    let rootOwned = false;
    try {
      for (const e of Deno.readDirSync(dir)) {
        const path = `${dir}/${e.name}`;
        let info: Deno.FileInfo;
        try {
          info = Deno.lstatSync(path);
        } catch {
          continue;
        }
        if (info.isDirectory) subdirs.push(path);
        else if (info.uid === 0 && info.nlink === 1) rootOwned = true;
      }
    } catch {
      return null;
    }
    if (rootOwned) return null;
    return { ctime, mtime, settled: now - ctime >= SETTLE_MS, subdirs };
  }
}
