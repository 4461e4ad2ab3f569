/**
 * Any external program as an agent.
 *
 * ## The contract
 *
 * For each run, {@linkcode CommandAgent} starts the command once, in its own
 * process group, with the working directory and environment below, and:
 *
 * - writes the prompt to its **stdin**, then closes stdin. A string prompt
 *   is written as is; any other prompt as JSON.
 * - sets these **environment variables** (beside `PATH`, `HOME` and the
 *   variables given in the options; nothing else of this process leaks in):
 *   - `HUD_PROMPT`: the prompt, as on stdin
 *   - `HUD_TASK_ID`, `HUD_TASK_SLUG`, `HUD_TASK_ARGS` (JSON)
 *   - `HUD_SESSION_ID`, `HUD_CONTROL_URL`
 *   - `HUD_BINDINGS`: JSON object of the start frame's per-episode bindings
 *   - `HUD_CAPABILITIES`: JSON array of capabilities `{name, protocol, url,
 *     params}`, urls pointing at local forwarders
 *   - for each capability, with its name upper-cased and every other
 *     character than A-Z and 0-9 turned into `_`:
 *     `HUD_CAP_<NAME>_URL` (the forwarded url), and, for an SSH capability
 *     that publishes a client key, `HUD_CAP_<NAME>_KEY_FILE` (a 0600 file
 *     holding the private key, removed after the run) and
 *     `HUD_CAP_<NAME>_USER`
 * - reads its **stdout** to the end: that text, less one trailing newline,
 *   is the answer.
 * - keeps the last 64 KiB of its **stderr** for the trace.
 * - a **non-zero exit** (or death by a signal) is recorded as an agent
 *   error; the stdout it wrote is still graded.
 * - when the agent's time is up or the rollout is cancelled, the whole
 *   process group gets SIGTERM, then SIGKILL after a grace period.
 *
 * @module
 */

import type { AgentContext, Run } from "./run.ts";
import type { Agent } from "./run.ts";
import { killProcessGroup } from "../_internal/process.ts";
import { concat } from "../_internal/io.ts";

/** Options for {@linkcode CommandAgent}. */
export interface CommandAgentOptions {
  /** Extra environment variables for the command. */
  env?: Record<string, string>;
  /** Working directory. @default the current directory */
  cwd?: string;
  /**
   * Time between SIGTERM and SIGKILL when the agent is stopped, in ms.
   * @default 2_000
   */
  killGrace?: number;
}

/** Result of the last run, as recorded in the trace. */
export interface CommandAgentRecord {
  /** Exit code (128 + n for death by signal n). */
  code: number;
  /** The signal that ended it, if any. */
  signal: string | null;
  /** The tail of stderr. */
  stderr: string;
}

const STDERR_TAIL = 64 * 1024;

function envName(name: string): string {
  return name.toUpperCase().replace(/[^A-Z0-9]/g, "_");
}

/** An external program as an {@linkcode Agent}; see the module docs for its contract. */
export class CommandAgent implements Agent {
  readonly #argv: string[];
  readonly #options: CommandAgentOptions;

  /**
   * Makes an agent of a command.
   * @param command an argv array, or a shell command line run with `bash -c`
   * @throws {TypeError} for an empty command
   */
  constructor(command: string | string[], options: CommandAgentOptions = {}) {
    const argv = typeof command === "string" ? ["bash", "-c", command] : [...command];
    if (argv.length === 0 || argv.some((a) => typeof a !== "string") || argv[0] === "") {
      throw new TypeError(
        "Cannot create command agent: command must be a non-empty string or argv",
      );
    }
    if (typeof command === "string" && command.trim() === "") {
      throw new TypeError(
        "Cannot create command agent: command must be a non-empty string or argv",
      );
    }
    this.#argv = argv;
    this.#options = options;
  }

  /** The argv that is run. */
  get argv(): readonly string[] {
    return this.#argv;
  }

  /** Runs the command for `run`, as the module docs describe. */
  async run(run: Run, context: AgentContext): Promise<void> {
    const prompt = typeof run.prompt === "string" ? run.prompt : JSON.stringify(run.prompt);
    const keyFiles: string[] = [];
    try {
      const env: Record<string, string> = {
        PATH: Deno.env.get("PATH") ?? "/usr/local/bin:/usr/bin:/bin",
        HOME: Deno.env.get("HOME") ?? "/",
        HUD_PROMPT: prompt,
        HUD_TASK_ID: run.task.id,
        HUD_TASK_SLUG: run.task.slug,
        HUD_TASK_ARGS: JSON.stringify(run.task.args),
        HUD_SESSION_ID: run.client.sessionId,
        HUD_CONTROL_URL: run.client.url,
        HUD_BINDINGS: JSON.stringify(run.bindings),
        HUD_CAPABILITIES: JSON.stringify(run.capabilities.map((c) => c.toManifest())),
      };
      for (const cap of run.capabilities) {
        const key = envName(cap.name);
        env[`HUD_CAP_${key}_URL`] = cap.url;
        if (cap.family === "ssh" && typeof cap.params.client_key === "string") {
          const file = await Deno.makeTempFile({ prefix: "hud-key-" });
          keyFiles.push(file);
          await Deno.writeTextFile(file, cap.params.client_key, { mode: 0o600 });
          await Deno.chmod(file, 0o600);
          env[`HUD_CAP_${key}_KEY_FILE`] = file;
          env[`HUD_CAP_${key}_USER`] = String(cap.params.user ?? "agent");
        }
      }
      Object.assign(env, this.#options.env ?? {});
      const record = await this.#spawn(env, prompt, run, context.signal);
      run.trace.record("command", null, { ...record });
      if (record.code !== 0) {
        const tail = record.stderr.trim().split("\n").slice(-3).join(" | ");
        throw new Error(
          `Agent command exited with ${
            record.signal ? `signal ${record.signal}` : `code ${record.code}`
          }${tail ? `: ${tail}` : ""}`,
        );
      }
    } finally {
      for (const f of keyFiles) await Deno.remove(f).catch(() => {});
    }
  }

  async #spawn(
    env: Record<string, string>,
    prompt: string,
    run: Run,
    signal: AbortSignal,
  ): Promise<CommandAgentRecord> {
    signal.throwIfAborted();
    // A detached child gets a session and process group of its own, so that
    // stopping it also stops whatever it started.
    const child = new Deno.Command(this.#argv[0], {
      args: this.#argv.slice(1),
      detached: true,
      cwd: this.#options.cwd,
      env,
      clearEnv: true,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const onAbort = () =>
      void killProcessGroup(child.pid, this.#options.killGrace ?? 2_000, child.status);
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      const writer = child.stdin.getWriter();
      const writing = writer.write(new TextEncoder().encode(prompt))
        .then(() => writer.close())
        .catch(() => {}); // the command may exit without reading its input
      // The answer is updated as output arrives, so that an agent stopped
      // at its deadline is graded on what it had written.
      const decoder = new TextDecoder();
      let text = "";
      const reading = (async () => {
        for await (const chunk of child.stdout) {
          text += decoder.decode(chunk, { stream: true });
          run.answer = text.endsWith("\n") ? text.slice(0, -1) : text;
        }
        text += decoder.decode();
        run.answer = text.endsWith("\n") ? text.slice(0, -1) : text;
      })();
      let stderr: Uint8Array = new Uint8Array(0);
      const errReading = (async () => {
        for await (const chunk of child.stderr) {
          const next = concat([stderr, chunk]);
          stderr = next.length > STDERR_TAIL ? next.slice(next.length - STDERR_TAIL) : next;
        }
      })();
      const [status] = await Promise.all([child.status, writing, reading, errReading]);
      return {
        code: status.code,
        signal: status.signal ?? null,
        stderr: new TextDecoder().decode(stderr),
      };
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }
}
