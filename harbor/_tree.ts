// A directory tree's files and their SHA-256, for the Harbor image layer's
// content hashes (harbor/image.ts) and for the check that the /tests the
// verifier runs is the tests/ the runner copied in (harbor/_task_env.ts).

/** A file under a tree: its relative path, mode, and bytes (a symlink's target, for a link). */
export interface TreeEntry {
  rel: string;
  mode: number;
  data: Uint8Array;
  /** Whether it is a symlink (its `data` is the target). */
  link: boolean;
}

/** SHA-256 of the parts, each length-prefixed, in hex. */
export async function sha256(parts: (string | Uint8Array)[]): Promise<string> {
  const enc = new TextEncoder();
  const chunks = parts.map((p) => typeof p === "string" ? enc.encode(p) : p);
  const all = new Uint8Array(chunks.reduce((n, c) => n + c.length + 8, 0));
  let at = 0;
  for (const c of chunks) {
    new DataView(all.buffer).setBigUint64(at, BigInt(c.length));
    all.set(c, at + 8);
    at += c.length + 8;
  }
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  return [...digest].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Every file under `dir` (dot-files too), by relative path, sorted, with its
 * mode; with `links`, symlinks too (not followed), else they are left out.
 */
export async function walk(
  dir: string,
  filter: (rel: string) => boolean = () => true,
  links = false,
): Promise<TreeEntry[]> {
  const out: TreeEntry[] = [];
  const enc = new TextEncoder();
  async function visit(rel: string): Promise<void> {
    for await (const entry of Deno.readDir(rel === "" ? dir : `${dir}/${rel}`)) {
      const r = rel === "" ? entry.name : `${rel}/${entry.name}`;
      if (!filter(r)) continue;
      const path = `${dir}/${r}`;
      if (entry.isSymlink) {
        if (links) {
          out.push({ rel: r, mode: 0, data: enc.encode(await Deno.readLink(path)), link: true });
        }
      } else if (entry.isDirectory) await visit(r);
      else if (entry.isFile) {
        const mode = (await Deno.stat(path)).mode! & 0o7777;
        out.push({ rel: r, mode, data: await Deno.readFile(path), link: false });
      }
    }
  }
  await visit("");
  return out.sort((a, b) => a.rel < b.rel ? -1 : a.rel > b.rel ? 1 : 0);
}

/** The SHA-256 of a tree's files: paths, modes and bytes (and symlinks, with `links`). */
export async function treeHash(
  dir: string,
  filter?: (rel: string) => boolean,
  links = false,
): Promise<string> {
  const parts: (string | Uint8Array)[] = [];
  for (const f of await walk(dir, filter, links)) {
    parts.push(f.link ? `link:${f.rel}` : f.rel, String(f.mode), f.data);
  }
  return await sha256(parts);
}

/** A tree's files by relative path: `MODE:SHA256` (octal mode; a symlink is `link:SHA256`). */
export async function treeFiles(dir: string, links = false): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const f of await walk(dir, undefined, links)) {
    const mode = f.link ? "link" : f.mode.toString(8).padStart(4, "0");
    out[f.rel] = `${mode}:${await sha256([f.data])}`;
  }
  return out;
}

/** The paths where two listings of {@linkcode treeFiles} differ: changed, missing or extra. */
export function treeDiff(want: Record<string, string>, got: Record<string, string>): string[] {
  const out: string[] = [];
  for (const [rel, v] of Object.entries(want)) {
    if (!(rel in got)) out.push(`${rel} (missing)`);
    else if (got[rel] !== v) out.push(`${rel} (changed)`);
  }
  for (const rel of Object.keys(got)) if (!(rel in want)) out.push(`${rel} (added)`);
  return out.sort();
}
