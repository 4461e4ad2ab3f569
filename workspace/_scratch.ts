// The temporary directories a workspace makes on this host for an episode
// (its HOME, its /etc files, its SSH key, each grading command's directory)
// and once per process (the SFTP server's staging). Each is removed when its
// episode or command ends, or the process exits; when this process dies
// first (SIGKILL, a signal nobody handles), they would stay, an SSH private
// key among them. So each is listed (in a 0700 directory of its own) for a
// watcher, started once and left running until this process ends, that
// removes those still there then (_watcher.ts). A normal exit removes them
// itself. The list is rewritten with only the live ones once it holds
// mostly removed ones.

import { readEnv } from "../_internal/util.ts";
import { watchExitDetached } from "./_watcher.ts";

/** Where the directories are made, by kind: the watcher removes only those so named. */
export type ScratchPrefix = "hud-etc-" | "hud-grade-" | "hud-home-" | "hud-sftp-" | "hud-ssh-";

const WATCHER = `list=$1
while IFS= read -r dir; do
  case \${dir##*/} in hud-etc-*|hud-grade-*|hud-home-*|hud-sftp-*|hud-ssh-*) ;; *) continue ;; esac
  [ -d "$dir" ] && rm -rf --one-file-system -- "$dir"
done < "$list/dirs"
rm -rf -- "$list"
`;

/** Lines written to the list before it is rewritten with the live ones alone. */
const REWRITE_AFTER = 256;

/** The list, and the directories it names that are still there. */
interface Scratch {
  readonly list: string;
  readonly live: Set<string>;
  /** Lines in the list now. */
  lines: number;
}

let current: Promise<Scratch> | null = null;

async function openScratch(): Promise<Scratch> {
  const list = await Deno.makeTempDir({ prefix: "hud-scratch-" });
  try {
    await Deno.chmod(list, 0o700);
    await Deno.writeTextFile(`${list}/dirs`, "", { mode: 0o600 });
    await watchExitDetached(WATCHER, "hud-scratch", [list]);
  } catch (err) {
    await Deno.remove(list, { recursive: true }).catch(() => {});
    throw err;
  }
  const s: Scratch = { list, live: new Set(), lines: 0 };
  globalThis.addEventListener("unload", () => removeAll(s));
  return s;
}

/** At a normal exit: what is still there, and the list. */
function removeAll(s: Scratch): void {
  for (const dir of [...s.live, s.list]) {
    try {
      Deno.removeSync(dir, { recursive: true });
    } catch {
      // gone, or the watcher's to do
    }
  }
}

/** The list, opened when none is. */
async function scratch(): Promise<Scratch> {
  const opening = current ??= openScratch();
  try {
    return await opening;
  } catch (err) {
    if (current === opening) current = null;
    throw err;
  }
}

/**
 * Makes a temporary directory named `prefix`...; remove it with
 * {@linkcode removeScratch}. If this process dies first, the watcher does.
 */
export async function scratchDir(prefix: ScratchPrefix): Promise<string> {
  let s = await scratch();
  const tmp = readEnv("TMPDIR") || "/tmp";
  for (let attempt = 0;; attempt++) {
    // Listed before it is made: a process killed between the two leaves
    // nothing unlisted (the watcher skips a name that was never made).
    const dir = `${tmp}/${prefix}${randomName()}`;
    try {
      note(s, dir);
    } catch (err) {
      // The list was removed (a cleaner of /tmp): a new one, with a watcher of its own.
      if (!(err instanceof Deno.errors.NotFound)) throw err;
      if (current !== null && (await current.catch(() => null)) === s) current = null;
      s = await scratch();
      note(s, dir);
    }
    try {
      await Deno.mkdir(dir, { mode: 0o700 });
      return dir;
    } catch (err) {
      s.live.delete(dir);
      if (!(err instanceof Deno.errors.AlreadyExists) || attempt >= 8) throw err;
    }
  }
}

/** 16 random hex digits, as Deno.makeTempDir names its directories. */
function randomName(): string {
  return [...crypto.getRandomValues(new Uint8Array(8))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Lists `dir` for the watcher. Synchronous, as the rewrite is: no line lands in a list being replaced. */
function note(s: Scratch, dir: string): void {
  Deno.writeTextFileSync(`${s.list}/dirs`, `${dir}\n`, { append: true });
  s.live.add(dir);
  s.lines++;
}

/** Removes `dir` (made by {@linkcode scratchDir}). Idempotent. */
export async function removeScratch(dir: string): Promise<void> {
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  const s = await current?.catch(() => null);
  if (!s?.live.delete(dir) || s.lines < REWRITE_AFTER || s.lines < 4 * s.live.size) return;
  try {
    const text = [...s.live].map((d) => `${d}\n`).join("");
    Deno.writeTextFileSync(`${s.list}/dirs.new`, text, { mode: 0o600 });
    Deno.renameSync(`${s.list}/dirs.new`, `${s.list}/dirs`);
    s.lines = s.live.size;
  } catch {
    // The longer list still names every live one.
  }
}
