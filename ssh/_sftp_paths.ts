// Where the SFTP server (`_sftp.ts`) may reach: one root directory. A
// client's path is made absolute (relative ones from a starting directory),
// checked to lie under the root, or under its alias (the same directory as
// the commands see it, through links), and then by its real path, symbolic
// links followed, so that a link cannot lead out.

import { FX } from "./_sftp_wire.ts";
import { denied, SftpStatus } from "./_sftp_fs.ts";

/** The root an SFTP session is confined to, and the paths it resolves. */
export class SftpPaths {
  readonly #root: string;
  readonly #alias: string;
  readonly #start: string;

  /**
   * `root` must be a real path (no symbolic links in it); `alias` is the
   * same directory as the commands see it (their working directory, which
   * may go through links), accepted in paths too. Relative paths start at
   * `start` (inside the root).
   */
  constructor(root: string, alias: string, start: string) {
    const trim = (p: string) => p.length > 1 ? p.replace(/\/+$/, "") : p;
    this.#root = trim(root);
    this.#alias = trim(alias);
    this.#start = trim(start);
  }

  /** The root, a real path. */
  get root(): string {
    return this.#root;
  }

  #inRoot(p: string, root = this.#root): boolean {
    return p === root || p.startsWith(root === "/" ? "/" : `${root}/`);
  }

  /** Before links are resolved: under the root or its alias. */
  inRootLexical(p: string): boolean {
    return this.#inRoot(p) || this.#inRoot(p, this.#alias);
  }

  /** The client's path made absolute and normalised (no symbolic links resolved). */
  absolute(path: string): string {
    if (path.includes("\0")) throw new SftpStatus(FX.BAD_MESSAGE, "Bad path");
    const full = path.startsWith("/") ? path : `${this.#start}/${path}`;
    const parts: string[] = [];
    for (const part of full.split("/")) {
      if (part === "" || part === ".") continue;
      if (part === "..") parts.pop();
      else parts.push(part);
    }
    return `/${parts.join("/")}`;
  }

  /** The real path of `path` with every symbolic link followed; must exist. */
  async followed(path: string): Promise<string> {
    const abs = this.absolute(path);
    if (!this.inRootLexical(abs)) throw denied();
    const real = await Deno.realPath(abs);
    if (!this.#inRoot(real)) throw denied();
    return real;
  }

  /**
   * A path whose last component is used as it is (lstat, remove, rename,
   * create): its directory resolved and checked, the name kept. Opening it
   * with O_CREAT must not follow a dangling link out, so a last component
   * that is a link is resolved too when `follow` is set.
   */
  async parentChecked(path: string, follow = false): Promise<string> {
    const abs = this.absolute(path);
    if (!this.inRootLexical(abs)) throw denied();
    if (abs === this.#root || abs === this.#alias) return this.#root;
    const slash = abs.lastIndexOf("/");
    const dir = await Deno.realPath(abs.slice(0, slash) || "/");
    if (!this.#inRoot(dir)) throw denied();
    const full = `${dir === "/" ? "" : dir}/${abs.slice(slash + 1)}`;
    return follow ? await this.#lastLinkFollowed(full) : full;
  }

  /** `full` itself, or where it leads when it is a symbolic link (which must stay inside). */
  async #lastLinkFollowed(full: string): Promise<string> {
    let info: Deno.FileInfo | null = null;
    try {
      info = await Deno.lstat(full);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    }
    if (!info?.isSymlink) return full;
    let real: string;
    try {
      real = await Deno.realPath(full);
    } catch {
      throw denied(); // a dangling link: where it leads is not checked
    }
    if (!this.#inRoot(real)) throw denied();
    return real;
  }
}
