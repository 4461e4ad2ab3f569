// The workspace's SFTP server, run inside its sandbox as the agent's user
// (`ssh/_sftp_main.ts`, started by the SSH server's `sftpCommand`): its code
// and a cache of it compiled, staged for one episode in a directory the
// sandbox shows read-only, with the deno binary that runs it.

import { errorMessage } from "../_internal/util.ts";
import { SFTP_MAIN_URL } from "../ssh/_sftp_main.ts";
import {
  DEFAULT_PATH,
  findProgram,
  type Isolation,
  type SandboxMount,
  spawnInSandbox,
} from "./_sandbox.ts";
import { killTrees } from "./_processes.ts";
import { removeScratch, scratchDir } from "./_scratch.ts";

/** Where the sandboxed SFTP server's code, cache and deno binary are shown. */
const SFTP_DIR = "/run/hud/sftp";
const SFTP_DENO = "/run/hud/deno";
const SFTP_MAIN = "ssh/_sftp_main.ts";

/** The `sftpCommand` the workspace's spawner recognises and replaces with the real one. */
export const SFTP_MARKER = "hud-sftp-server";

/** Everything the workspace shows under this directory is its own (never a grader's). */
export const WORKSPACE_RUN_DIR = "/run/hud/";

/**
 * Copies the sandboxed SFTP server's module graph (`ssh/_sftp_main.ts` and
 * what it imports) into `dir`, keeping paths relative to the package root:
 * it runs the same from a checkout, a registry or an image.
 */
async function copySftpSources(dir: string): Promise<void> {
  const main = new URL(SFTP_MAIN_URL);
  const base = new URL("../", main);
  const queue = [main];
  const seen = new Set<string>();
  while (queue.length > 0) {
    const url = queue.pop()!;
    if (seen.has(url.href)) continue;
    seen.add(url.href);
    if (!url.href.startsWith(base.href)) {
      throw new Error(`Cannot copy the SFTP server: "${url.href}" is outside the package`);
    }
    const text = url.protocol === "file:"
      ? await Deno.readTextFile(url)
      : await (await fetch(url)).text();
    const rel = url.href.slice(base.href.length);
    const path = `${dir}/${rel}`;
    await Deno.mkdir(path.slice(0, path.lastIndexOf("/")), { recursive: true, mode: 0o755 });
    await Deno.writeTextFile(path, text, { mode: 0o644 });
    for (const m of text.matchAll(/(?:\bfrom|^import)\s+"(\.\.?\/[^"]+)"/gm)) {
      queue.push(new URL(m[1], url));
    }
  }
}

/** The deno binary that can run a module: this one, unless it is a compiled program. */
export function denoBinary(): string | null {
  const exec = Deno.execPath();
  return /(^|\/)deno(\.exe)?$/.test(exec) ? exec : findProgram("deno");
}

/** The SFTP server of one episode, staged on this host. */
export class SandboxedSftp {
  /** The host directory holding `src/` and `cache/`. */
  readonly #dir: string;
  /** The deno binary on this host. */
  readonly #deno: string;
  /** Whether the cache holds the compiled server. */
  #warm = false;
  #warming: Promise<void> | null = null;
  /** The process filling the cache, while it runs. */
  #warmer: Deno.ChildProcess | null = null;

  /** Use {@linkcode SandboxedSftp.stage}. */
  constructor(dir: string, deno: string) {
    this.#dir = dir;
    this.#deno = deno;
  }

  /**
   * Stages the server's code in a fresh directory, or returns null (SFTP is
   * then off) after saying why through `report`.
   */
  static async stage(report: (message: string) => void): Promise<SandboxedSftp | null> {
    const deno = denoBinary();
    if (deno === null) {
      report("SFTP is off: no deno binary here to run the sandboxed SFTP server");
      return null;
    }
    const dir = await scratchDir("hud-sftp-");
    try {
      await Deno.chmod(dir, 0o755);
      await copySftpSources(`${dir}/src`);
      await Deno.mkdir(`${dir}/cache`, { mode: 0o755 });
      return new SandboxedSftp(dir, deno);
    } catch (err) {
      await removeScratch(dir);
      report(`SFTP is off: cannot copy the sandboxed SFTP server: ${errorMessage(err)}`);
      return null;
    }
  }

  /** What the sandbox shows of it: the code, the cache (read-only) and deno. */
  get mounts(): SandboxMount[] {
    return this.#mounts(false);
  }

  #mounts(cacheWritable: boolean): SandboxMount[] {
    return [
      { src: `${this.#dir}/src`, dest: `${SFTP_DIR}/src` },
      { src: `${this.#dir}/cache`, dest: `${SFTP_DIR}/cache`, writable: cacheWritable },
      { src: this.#deno, dest: SFTP_DENO },
    ];
  }

  /**
   * Fills the cache (its code compiled) once, as this process's user, in
   * the background: a session then starts in a tenth of a second. Until
   * then sessions compile it into their private /tmp.
   */
  warm(isolation: Isolation): void {
    this.#warming = this.#fill(isolation);
  }

  async #fill(isolation: Isolation): Promise<void> {
    const sandboxed = isolation !== "none";
    try {
      const child = spawnInSandbox(
        [
          sandboxed ? SFTP_DENO : this.#deno,
          "cache",
          "--no-config",
          "--no-lock",
          "--quiet",
          this.#path(sandboxed, `src/${SFTP_MAIN}`),
        ],
        {
          cwd: "/",
          env: {
            PATH: DEFAULT_PATH,
            HOME: "/tmp",
            DENO_DIR: this.#path(sandboxed, "cache"),
            DENO_NO_UPDATE_CHECK: "1",
          },
          sandbox: {
            isolation,
            writable: [],
            mounts: this.#mounts(true),
            network: false,
            user: null,
          },
        },
      );
      await child.stdin.close().catch(() => {});
      this.#warmer = child;
      const out = await child.output();
      if (out.success) this.#warm = true;
    } catch {
      // Sessions compile it themselves.
    } finally {
      this.#warmer = null;
    }
  }

  /** `name` under the staging directory, as a command sees it. */
  #path(sandboxed: boolean, name: string): string {
    return sandboxed ? `${SFTP_DIR}/${name}` : `${this.#dir}/${name}`;
  }

  /** The command that serves one SFTP session on stdio. */
  argv(isolation: Isolation): string[] {
    const sandboxed = isolation !== "none";
    return [
      "env",
      // Read-only once filled; until then a private one.
      `DENO_DIR=${this.#warm ? this.#path(sandboxed, "cache") : "/tmp/.hud-deno"}`,
      "DENO_NO_UPDATE_CHECK=1",
      "NO_COLOR=1",
      sandboxed ? SFTP_DENO : this.#deno,
      "run",
      "--no-config",
      "--no-lock",
      "--quiet",
      "--allow-read",
      "--allow-write",
      "--allow-run=stat",
      this.#path(sandboxed, `src/${SFTP_MAIN}`),
      "/",
    ];
  }

  /** Stops filling the cache and removes the staging directory. */
  async remove(): Promise<void> {
    if (this.#warmer !== null) killTrees([this.#warmer.pid]);
    await this.#warming;
    await removeScratch(this.#dir);
  }
}
