// Pre-started sandboxes: a sandbox made ahead of its command (the cgroup
// joined, bubblewrap's namespaces and mounts, the shell that waits inside),
// so that a command pays only for reading its own words and starting. The
// command is each one's own, as when started at once: a PID namespace, a
// /tmp and a process group of its own, killed with it. It arrives on the
// sandbox's stdin, ahead of the command's own input: a count, then whether
// to hand root's files over ("1" or "0"), the working directory, the
// environment and the argv, each NUL-terminated. Root's files are handed
// over when it arrives, not before (the environment may add some
// meanwhile), unless the workspace has seen that nothing of root's can be
// new (`_handover.ts`); the environment is the command's only after
// privileges are dropped, as `spawnInSandbox` does it.

import {
  DEFAULT_PATH,
  enterStage,
  findProgram,
  HAND_OVER_FILES,
  sandboxArgvWith,
  type SandboxConfig,
} from "./_sandbox.ts";
import { killTrees } from "./_processes.ts";

const WAIT = `set -f
owner=$1; shift; dirs=()
while [ "$1" != -- ]; do dirs+=("$1"); shift; done; shift
IFS= read -r -d '' count && [[ $count =~ ^[0-9]+$ ]] && [ "$count" -ge 3 ] || exit 125
IFS= read -r -d '' hand || exit 125
words=()
for ((i = 1; i < count; i++)); do IFS= read -r -d '' w || exit 125; words+=("$w"); done
[ -z "$owner" ] || [ "$hand" = 0 ] || ${HAND_OVER_FILES}
exec "$@" env -i -C "\${words[0]}" -- "\${words[@]:1}"
`;

const encoder = new TextEncoder();

/** A sandbox waiting for its command. */
export class WaitingSandbox {
  /** What it was made with: a command for another configuration cannot use it. */
  readonly config: SandboxConfig;
  readonly #child: Deno.ChildProcess;
  #used = false;
  #exited = false;

  constructor(config: SandboxConfig, child: Deno.ChildProcess) {
    this.config = config;
    this.#child = child;
    child.status.then(() => this.#exited = true, () => this.#exited = true);
  }

  /**
   * Starts a sandbox of `config` that waits for its command.
   * @param cwd a directory that exists in it (the command chooses its own)
   * @returns null where nothing would be saved (no sandbox) or a tool is missing
   */
  static start(config: SandboxConfig, cwd: string): WaitingSandbox | null {
    if (config.isolation === "none") return null;
    const [name, ...args] = sandboxArgvWith(
      (userNs) => {
        const { owner, writable, prefix } = enterStage(config, userNs);
        const dirs = owner === "" ? [] : writable;
        return [
          "bash",
          "--noprofile",
          "--norc",
          "-c",
          WAIT,
          "hud-wait",
          owner,
          ...dirs,
          "--",
          ...prefix,
        ];
      },
      cwd,
      config,
    );
    const program = findProgram(name);
    if (program === null) return null;
    const child = new Deno.Command(program, {
      args,
      cwd: "/",
      env: { PATH: DEFAULT_PATH },
      clearEnv: true,
      detached: true,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    return new WaitingSandbox(config, child);
  }

  /** The sandbox's process, the command's once it runs. */
  get child(): Deno.ChildProcess {
    return this.#child;
  }

  /** Whether it can take a command: not used, not exited. */
  get ready(): boolean {
    return !this.#used && !this.#exited;
  }

  /**
   * Runs `argv` in it, in `cwd`, with exactly `env`.
   * @param handOver whether root's files in the writable directories are
   *   handed over first (false only where nothing of root's can be new)
   * @returns the child, now the command's (its stdin, stdout, stderr)
   * @throws {Error} when it was used or has exited
   */
  async run(
    argv: readonly string[],
    cwd: string,
    env: Readonly<Record<string, string>>,
    handOver = true,
  ): Promise<Deno.ChildProcess> {
    if (!this.ready) throw new Error("Cannot run in a waiting sandbox: it was used or exited");
    const words = [
      handOver ? "1" : "0",
      cwd,
      ...Object.entries(env).map(([k, v]) => `${k}=${v}`),
      ...argv,
    ];
    // As an argument list can hold none (spawnInSandbox's words are arguments).
    if (words.some((w) => w.includes("\0"))) {
      throw new TypeError("Cannot run in a sandbox: an argument or variable holds a NUL byte");
    }
    this.#used = true;
    const writer = this.#child.stdin.getWriter();
    try {
      await writer.write(encoder.encode(`${words.length}\0${words.join("\0")}\0`));
    } finally {
      writer.releaseLock();
    }
    return this.#child;
  }

  /** Kills it (unless a command took it) and waits for it to end. */
  async discard(): Promise<void> {
    if (this.#used) return;
    this.#used = true;
    killTrees([this.#child.pid]);
    await this.#child.status;
    await Promise.allSettled([
      this.#child.stdin.close(),
      this.#child.stdout.cancel(),
      this.#child.stderr.cancel(),
    ]);
  }
}

/** One waiting sandbox of a configuration, made again after each is taken. */
export class SpareSandbox {
  readonly #config: SandboxConfig;
  readonly #cwd: string;
  #spare: WaitingSandbox | null = null;
  #closed = false;
  #timer: ReturnType<typeof setTimeout> | null = null;

  constructor(config: SandboxConfig, cwd: string) {
    this.#config = config;
    this.#cwd = cwd;
  }

  /**
   * Starts one in `ms` ms, unless one is due sooner: off the path of what
   * runs now (a command's output, the grading after it), in the time an
   * agent takes between commands.
   */
  fillAfter(ms: number): void {
    if (this.#closed || this.#timer !== null) return;
    this.#timer = setTimeout(() => this.fill(), ms);
  }

  /** Starts one, unless one waits already (or it is closed). */
  fill(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    if (this.#closed || this.#spare !== null) return;
    try {
      this.#spare = WaitingSandbox.start(this.#config, this.#cwd);
    } catch {
      // Commands start the usual way.
    }
  }

  /** The waiting sandbox, if one is ready; the next is the caller's to ask for. */
  take(): WaitingSandbox | null {
    const spare = this.#spare;
    this.#spare = null;
    if (spare === null || spare.ready) return spare;
    void spare.discard();
    return null;
  }

  /** Discards the one waiting; none is made after. */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    const spare = this.#spare;
    this.#spare = null;
    await spare?.discard();
  }
}
