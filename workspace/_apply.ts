// Applying an overlay's layer onto a plain directory: what a workspace root
// becomes at stop (the upper directory's changes moved onto it, or, after a
// restore, every layer linked in and the changes moved on top). Whiteouts
// delete, opaque directories replace, files replace: never written in place,
// so a file that a layer shares (a hard link) keeps its content. Only this
// process touches either side by then: the overlay is unmounted and the
// agent's processes are gone. Links are never followed: each path's parent
// was checked (or made) a real directory on the way down.

import { isOpaque } from "./_mount.ts";
import { coreutil } from "./_layers.ts";

/** How a layer's files reach the target: hard links (the layer stays), or moved (it empties). */
export type ApplyHow = "link" | "move";

/** Removes `path` whatever it is (a link itself, not what it points to). */
async function removeEntry(path: string): Promise<void> {
  await Deno.remove(path, { recursive: true }).catch((err) => {
    if (!(err instanceof Deno.errors.NotFound)) throw err;
  });
}

async function lstatOrNull(path: string): Promise<Deno.FileInfo | null> {
  return await Deno.lstat(path).catch((err) => {
    if (err instanceof Deno.errors.NotFound) return null;
    throw err;
  });
}

/** Gives `dest` (a real directory) `info`'s mode and owner. */
async function copyDirMeta(dest: string, info: Deno.FileInfo): Promise<void> {
  if (info.uid !== null && info.gid !== null) await Deno.chown(dest, info.uid, info.gid);
  await Deno.chmod(dest, (info.mode ?? 0o755) & 0o7777);
}

/**
 * Applies the layer `src` onto the directory `dest`: what `src` holds
 * replaces what `dest` holds at the same path, its whiteouts delete, its
 * opaque directories replace whole; other entries of `dest` stay. Sockets
 * and device nodes (other than whiteouts) are skipped.
 * @param how hard links to `src`'s files, or `src`'s files moved
 */
export async function applyLayer(src: string, dest: string, how: ApplyHow): Promise<void> {
  await copyDirMeta(dest, await Deno.lstat(src));
  const pending: string[] = [""];
  while (pending.length > 0) {
    const rel = pending.pop()!;
    for await (const e of Deno.readDir(rel === "" ? src : `${src}/${rel}`)) {
      const path = rel === "" ? e.name : `${rel}/${e.name}`;
      const from = `${src}/${path}`;
      const to = `${dest}/${path}`;
      const info = await Deno.lstat(from);
      if (info.isDirectory) {
        const there = await lstatOrNull(to);
        if (there === null || !there.isDirectory || isOpaque(from)) {
          if (there !== null) await removeEntry(to);
          await Deno.mkdir(to);
        }
        await copyDirMeta(to, info);
        pending.push(path);
      } else if (info.isCharDevice && info.rdev === 0) {
        await removeEntry(to); // a whiteout
      } else if (info.isFile || info.isSymlink || info.isFifo) {
        await removeEntry(to);
        if (how === "link") await Deno.link(from, to);
        else await moveEntry(from, to);
      }
    }
  }
}

/** Moves a file, a link or a FIFO; copies it across file systems (a root that is a mount of its own). */
async function moveEntry(from: string, to: string): Promise<void> {
  try {
    await Deno.rename(from, to);
  } catch (err) {
    if (!/EXDEV|cross-device/i.test(String(err))) throw err;
    await coreutil("Cannot keep the workspace's changes", "cp", [
      "-a",
      "--no-target-directory",
      "--",
      from,
      to,
    ]);
  }
}

/** Empties the directory `dir` (its entries, links not followed). */
export async function clearDir(dir: string): Promise<void> {
  for await (const e of Deno.readDir(dir)) await removeEntry(`${dir}/${e.name}`);
}
