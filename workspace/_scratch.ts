// The temporary directories a workspace makes on this host for an episode
// (its HOME, its /etc files, its SSH key, its SFTP server's sources, each
// grading command's directory). Each is removed when its episode or command
// ends; when this process dies first (SIGKILL, a signal nobody handles),
// they would stay, an SSH private key among them. So while any is there,
// they are listed (in a 0700 directory of their own) for a watcher that
// removes those still there once this process has ended (_watcher.ts); the
// last one removed stops the watcher and removes the list.

import { watchExit } from "./_watcher.ts";

/** Where the directories are made, by kind: the watcher removes only those so named. */
export type ScratchPrefix = "hud-etc-" | "hud-grade-" | "hud-home-" | "hud-sftp-" | "hud-ssh-";

const WATCHER = `list=$1
while IFS= read -r dir; do
  case \${dir##*/} in hud-etc-*|hud-grade-*|hud-home-*|hud-sftp-*|hud-ssh-*) ;; *) continue ;; esac
  [ -d "$dir" ] && rm -rf --one-file-system -- "$dir"
done < "$list/dirs"
rm -rf -- "$list"
`;

/** The list and its watcher, while a directory it names is there. */
interface Scratch {
  readonly list: string;
  readonly watcher: Deno.ChildProcess;
  readonly live: Set<string>;
  closed: boolean;
}

let current: Promise<Scratch> | null = null;

async function openScratch(): Promise<Scratch> {
  const list = await Deno.makeTempDir({ prefix: "hud-scratch-" });
  try {
    await Deno.chmod(list, 0o700);
    await Deno.writeTextFile(`${list}/dirs`, "", { mode: 0o600 });
    const watcher = watchExit(WATCHER, "hud-scratch", [list]);
    return { list, watcher, live: new Set(), closed: false };
  } catch (err) {
    await Deno.remove(list, { recursive: true }).catch(() => {});
    throw err;
  }
}

/** The open list, opened when none is. */
async function scratch(): Promise<Scratch> {
  for (;;) {
    const opening = current ??= openScratch();
    try {
      const s = await opening;
      if (!s.closed) return s;
    } catch (err) {
      if (current === opening) current = null;
      throw err;
    }
  }
}

/**
 * Makes a temporary directory named `prefix`...; remove it with
 * {@linkcode removeScratch}. If this process dies first, the watcher does.
 */
export async function scratchDir(prefix: ScratchPrefix): Promise<string> {
  const s = await scratch();
  const dir = await Deno.makeTempDir({ prefix });
  s.live.add(dir);
  try {
    await Deno.writeTextFile(`${s.list}/dirs`, `${dir}\n`, { append: true });
  } catch (err) {
    await removeScratch(dir);
    throw err;
  }
  return dir;
}

/** Removes `dir` (made by {@linkcode scratchDir}); the last one stops the watcher. Idempotent. */
export async function removeScratch(dir: string): Promise<void> {
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  const opening = current;
  if (opening === null) return;
  const s = await opening.catch(() => null);
  if (s === null || !s.live.delete(dir) || s.live.size > 0 || s.closed) return;
  s.closed = true;
  if (current === opening) current = null;
  try {
    s.watcher.kill("SIGKILL");
  } catch {
    // gone
  }
  await s.watcher.status;
  await Deno.remove(s.list, { recursive: true }).catch(() => {});
}
