// Files that may hold secrets (results files, reports: traces hold what
// agents read and wrote) are their owner's alone: created 0600 whatever the
// umask. Created with mode 0600, which a umask can only narrow, then set to
// exactly that, so that the file is never wider at any moment.

import { exists } from "./fs.ts";

/** Opens `path` for appending; a file it creates is 0600. An existing file keeps its mode. */
export async function openPrivate(path: string): Promise<Deno.FsFile> {
  const existed = await exists(path);
  const file = await Deno.open(path, { append: true, create: true, mode: 0o600 });
  if (!existed) {
    try {
      await Deno.chmod(path, 0o600);
    } catch (err) {
      file.close();
      throw err;
    }
  }
  return file;
}

/** Writes `text` to `path`, replacing it; a file it creates is 0600. */
export async function writePrivateText(path: string, text: string): Promise<void> {
  const existed = await exists(path);
  await Deno.writeTextFile(path, text, { mode: 0o600 });
  if (!existed) await Deno.chmod(path, 0o600);
}
