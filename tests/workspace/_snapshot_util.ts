// Helpers of the snapshot tests: a tree's every entry, as a sorted list of
// lines, to compare two states byte for byte.

/**
 * One line per entry under `dir` (the root's own mode and owner first):
 * path, type, mode (with setuid bits), uid, gid, and the SHA-256 of a
 * file's content (the size of one over 64 MiB) or a link's target. Never
 * follows links or opens a FIFO.
 */
export async function treeManifest(dir: string): Promise<string[]> {
  const lines: string[] = [];
  const describe = async (path: string, rel: string) => {
    const info = await Deno.lstat(path);
    const mode = ((info.mode ?? 0) & 0o7777).toString(8);
    let kind = "other", data = "";
    if (info.isSymlink) {
      kind = "link";
      data = await Deno.readLink(path);
    } else if (info.isDirectory) {
      kind = "dir";
    } else if (info.isFifo) {
      kind = "fifo";
    } else if (info.isFile && info.size > 64 * 1024 * 1024) {
      kind = "file"; // a sparse giant: its size, not 20 GiB of reading
      data = `size ${info.size}`;
    } else if (info.isFile) {
      kind = "file";
      const digest = await crypto.subtle.digest("SHA-256", await Deno.readFile(path));
      data = Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
    }
    lines.push(`${rel} ${kind} ${mode} ${info.uid}:${info.gid} ${data}`);
    if (info.isDirectory) {
      for await (const e of Deno.readDir(path)) {
        await describe(`${path}/${e.name}`, rel === "." ? e.name : `${rel}/${e.name}`);
      }
    }
  };
  await describe(dir, ".");
  return lines.sort();
}

/** The store directory the overlay at `root` uses (from this process's mount table), or null. */
export function storeOf(root: string): string | null {
  for (const line of Deno.readTextFileSync("/proc/self/mountinfo").split("\n")) {
    const fields = line.split(" ");
    if (fields[4] !== root) continue;
    const m = /upperdir=([^,]*)\/w[0-9a-z]+\/u/.exec(line);
    if (m) return m[1];
  }
  return null;
}

/** The mount table's lines that name `text`. */
export function mountsNaming(text: string): string[] {
  return Deno.readTextFileSync("/proc/self/mountinfo").split("\n").filter((l) => l.includes(text));
}

/** Bytes of disk `dir` takes (`du`), holes excluded. */
export async function diskUse(dir: string): Promise<number> {
  const out = await new Deno.Command("du", { args: ["-s", "-B1", dir], stdout: "piped" }).output();
  return Number(new TextDecoder().decode(out.stdout).split("\t")[0]);
}
