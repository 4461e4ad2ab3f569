// The workspace's SFTP server, run inside its sandbox as the agent's user
// (`ssh/_sftp_main.ts`, started by the SSH server's `sftpCommand`): its code
// and a cache of it compiled, staged once for this process in a directory
// every sandbox shows read-only, with the deno binary that runs it.

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

/** How long an episode's stop waits for the cache being filled before it kills the filling. */
const FILL_BOUND = 5_000;

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

/**
 * The server's code and its compiled cache, staged once for this process
 * and shared by every episode: the sandbox shows them read-only. The
 * directory goes when this process ends (`_scratch.ts`).
 */
interface Staging {
  /** The host directory holding `src/` and `cache/`. */
  readonly dir: string;
  /** The deno binary on this host. */
  readonly deno: string;
  /** Whether the cache holds the server compiled, for sandboxed paths (true) or this host's. */
  readonly warm: Set<boolean>;
  /** Whether an episode fills the cache now. */
  filling: boolean;
}

let staging: Promise<Staging> | null = null;

async function stageOnce(deno: string): Promise<Staging> {
  const dir = await scratchDir("hud-sftp-");
  try {
    await Deno.chmod(dir, 0o755);
    await copySftpSources(`${dir}/src`);
    await Deno.mkdir(`${dir}/cache`, { mode: 0o755 });
    return { dir, deno, warm: new Set(), filling: false };
  } catch (err) {
    await removeScratch(dir);
    throw err;
  }
}

/** The SFTP server as one episode uses it: the process's staging, warmed by the first episode. */
export class SandboxedSftp {
  readonly #staging: Staging;
  #warming: Promise<void> | null = null;
  /** The process filling the cache for this episode, while it runs. */
  #warmer: Deno.ChildProcess | null = null;

  /** Use {@linkcode SandboxedSftp.stage}. */
  constructor(staging: Staging) {
    this.#staging = staging;
  }

  get #dir(): string {
    return this.#staging.dir;
  }

  get #deno(): string {
    return this.#staging.deno;
  }

  /**
   * The server staged for this process (once), or null (SFTP is then off)
   * after saying why through `report`.
   */
  static async stage(
    report: (message: string) => void,
    again = true,
  ): Promise<SandboxedSftp | null> {
    const deno = denoBinary();
    if (deno === null) {
      report("SFTP is off: no deno binary here to run the sandboxed SFTP server");
      return null;
    }
    const opening = staging ??= stageOnce(deno);
    try {
      const staged = await opening;
      // Something removed it (a cleaner of /tmp): staged again.
      const gone = await Deno.lstat(`${staged.dir}/src/${SFTP_MAIN}`).then(() => false, () => true);
      if (gone && again) {
        if (staging === opening) staging = null;
        return await SandboxedSftp.stage(report, false);
      }
      return new SandboxedSftp(staged);
    } catch (err) {
      if (staging === opening) staging = null;
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
   * Fills the cache (its code compiled), as this process's user, in the
   * background, unless it is filled or being filled: a session then starts
   * in a tenth of a second. Until then sessions compile it into their
   * private /tmp.
   */
  warm(isolation: Isolation): void {
    if (this.#staging.warm.has(isolation !== "none") || this.#staging.filling) return;
    this.#staging.filling = true;
    this.#warming = this.#fill(isolation).finally(() => this.#staging.filling = false);
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
      if (out.success) this.#staging.warm.add(sandboxed);
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
      `DENO_DIR=${
        this.#staging.warm.has(sandboxed) ? this.#path(sandboxed, "cache") : "/tmp/.hud-deno"
      }`,
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

  /**
   * Lets this episode's filling of the cache end (once per process, some
   * tens of ms), killing it after {@linkcode FILL_BOUND} ms; the staging
   * stays for the next episode.
   */
  async remove(): Promise<void> {
    const warming = this.#warming;
    if (warming === null) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const bound = new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        if (this.#warmer !== null) killTrees([this.#warmer.pid]);
        resolve();
      }, FILL_BOUND);
    });
    try {
      await Promise.race([warming, bound]);
      await warming;
    } finally {
      clearTimeout(timer);
    }
  }
}
