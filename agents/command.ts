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
 * - sets these **environment variables**. By default the agent gets only
 *   `PATH`, `HOME` and the `HUD_*` variables below; nothing else of this
 *   process leaks in unless asked for with `passEnv` (names or globs such
 *   as `OPENAI_*`), `envFile` (a `NAME=value` file) or `env`:
 *   - `HUD_PROMPT_FILE`: a private (0600) file holding the prompt, removed
 *     after the run
 *   - `HUD_PROMPT`: the prompt, as on stdin, only when it is under 64 KiB
 *     (the kernel refuses larger environments)
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
 *   is the answer. Output over `maxOutputBytes` (16 MiB) stops the agent,
 *   and the run errors with `answer exceeds N bytes`, ungraded.
 * - keeps the last 64 KiB of its **stderr** for the trace.
 * - a **non-zero exit** (or death by a signal) is recorded as an agent
 *   error; the stdout it wrote is still graded. A command that cannot
 *   start (not found, not executable: exit 126 or 127) is an error of its
 *   own, {@linkcode NotGradedError}: nothing is graded.
 * - when the agent's time is up or the rollout is cancelled, the whole
 *   process group gets SIGTERM, then SIGKILL after a grace period. When
 *   the command exits, whatever it left running in its group is killed;
 *   a run returns only once its process group is gone.
 *
 * @module
 */

import type { Run } from "../eval/run.ts";
import { type Agent, type AgentContext, type AgentInfo, NotGradedError } from "../eval/agent.ts";
import { killProcessGroup, liveGroupMembers, trySignalGroup } from "../_internal/process.ts";
import { delay } from "../_internal/async.ts";
import { concat } from "../_internal/io.ts";
import { stringifyJson } from "../_internal/framing.ts";

/** Options for {@linkcode CommandAgent}. */
export interface CommandAgentOptions {
  /** Extra environment variables for the command (they win over the others). */
  env?: Record<string, string>;
  /**
   * Variables of this process passed on to the command: names, or globs
   * with `*` (`OPENAI_*`).
   * @default [] (only `PATH` and `HOME`)
   */
  passEnv?: string[];
  /**
   * A file of `NAME=value` lines (`#` comments, optional `export `, quotes
   * stripped) whose variables the command gets, read at each run.
   */
  envFile?: string;
  /** Working directory. @default the current directory */
  cwd?: string;
  /**
   * Time between SIGTERM and SIGKILL when the agent is stopped, in ms.
   * @default 2_000
   */
  killGrace?: number;
  /**
   * The most the agent may write on stdout, in bytes; past it the agent is
   * stopped and the run errors, ungraded.
   * @default 16_777_216 (16 MiB)
   */
  maxOutputBytes?: number;
  /**
   * A recording model proxy: each run gets a route of its own, whose
   * `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL` and
   * `ANTHROPIC_API_KEY` the command gets (over any others; no variable
   * holding the model server's key is passed on), and every model call it
   * makes there is recorded into the run's trace.
   */
  modelProxy?: ModelRouter;
}

/**
 * What gives each run of a {@linkcode CommandAgent} its own way to the
 * model: a recording model proxy (`serveModelProxy()` of `@hud/sdk/proxy`).
 */
export interface ModelRouter {
  /** Opens the run's route; it is closed when the command has ended. */
  open(run: Run, context: AgentContext): ModelRoute | Promise<ModelRoute>;
}

/** One run's route to the model (see {@linkcode ModelRouter}). */
export interface ModelRoute {
  /**
   * The command's environment: `base` without any variable that holds the
   * model server's key, with the route's variables set over it.
   */
  environment(base: Readonly<Record<string, string>>): Record<string, string>;
  /** Ends the route: its credential is refused from then on. */
  close(): Promise<void>;
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
/** Environments near 128 KiB fail to spawn (E2BIG); the file always carries the prompt. */
const PROMPT_ENV_LIMIT = 64 * 1024;
const DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024;
/** How long to wait for a killed group's last members to be reaped. */
const GROUP_GONE_BOUND_MS = 10_000;

function envName(name: string): string {
  return name.toUpperCase().replace(/[^A-Z0-9]/g, "_");
}

function globMatcher(patterns: readonly string[]): (name: string) => boolean {
  const res = patterns.map((p) =>
    new RegExp(`^${p.split("*").map((s) => s.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`)
  );
  return (name) => res.some((re) => re.test(name));
}

/**
 * Parses a `NAME=value` env file: blank lines and `#` comments skipped,
 * `export ` allowed, one pair of surrounding quotes stripped.
 * @throws {TypeError} naming the line that is not `NAME=value`
 */
export function parseEnvFile(text: string, path = "env file"): Record<string, string> {
  const out: Record<string, string> = {};
  text.split("\n").forEach((raw, i) => {
    const line = raw.replace(/\r$/, "").trim();
    if (line === "" || line.startsWith("#")) return;
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$/.exec(line);
    if (!m) {
      // The line may hold a secret: name only its number.
      throw new TypeError(`Cannot read ${path}: line ${i + 1} is not NAME=value`);
    }
    let value = m[2];
    if (value.length >= 2 && /^(["']).*\1$/.test(value)) value = value.slice(1, -1);
    out[m[1]] = value;
  });
  return out;
}

/**
 * Whether a live process of group `pgid` is left, killing what is. Zombies
 * do not count: an orphan's zombie waits for an init that may never reap it.
 */
function groupAlive(pgid: number): boolean {
  if (!trySignalGroup(pgid, "SIGKILL")) return false;
  if (Deno.build.os !== "linux") return true;
  return liveGroupMembers(pgid).length > 0;
}

/** An external program as an {@linkcode Agent}; see the module docs for its contract. */
export class CommandAgent implements Agent {
  readonly #argv: string[];
  readonly #options: CommandAgentOptions;
  readonly #maxOutput: number;
  readonly #live = new Set<number>();
  readonly #runs = new Set<Promise<unknown>>();
  #hurry = false;

  /**
   * Makes an agent of a command.
   * @param command an argv array, or a shell command line run with `bash -c`
   * @throws {TypeError} for an empty command
   * @throws {RangeError} for a `maxOutputBytes` or `killGrace` that is not a
   *   positive number
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
    const max = options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
    if (!Number.isInteger(max) || max < 1) {
      throw new RangeError(
        `Cannot create command agent: maxOutputBytes must be a positive integer, got "${max}"`,
      );
    }
    if (options.killGrace !== undefined && !(options.killGrace >= 0)) {
      throw new RangeError(
        `Cannot create command agent: killGrace must not be negative, got "${options.killGrace}"`,
      );
    }
    if (options.passEnv !== undefined && !Array.isArray(options.passEnv)) {
      throw new TypeError("Cannot create command agent: passEnv must be an array of names");
    }
    this.#argv = argv;
    this.#options = options;
    this.#maxOutput = max;
  }

  /** The argv that is run. */
  get argv(): readonly string[] {
    return this.#argv;
  }

  /**
   * What ran, for results files and the viewer: the program's name only
   * (its arguments may hold secrets, so they are counted, not shown), and
   * the limits.
   */
  get info(): AgentInfo {
    const words = this.#argv[0] === "bash" && this.#argv[1] === "-c" && this.#argv.length === 3
      ? this.#argv[2].trim().split(/\s+/).filter((w) => !/^[A-Za-z_][A-Za-z0-9_]*=/.test(w))
      : this.#argv;
    const settings: Record<string, unknown> = { max_output_bytes: this.#maxOutput };
    if (words.length > 1) settings.hidden_words = words.length - 1;
    if (this.#options.passEnv?.length) settings.pass_env = [...this.#options.passEnv];
    if (this.#options.modelProxy) settings.model_proxy = true;
    return { kind: "command", name: words[0] ?? "", settings };
  }

  /** Runs in flight now. */
  get running(): number {
    return this.#runs.size;
  }

  /**
   * Resolves once no run is in flight: every process group this agent
   * started is gone and every key and prompt file removed. A rollout that
   * was aborted returns before its agent is stopped; wait here before the
   * process exits.
   */
  async whenIdle(): Promise<void> {
    while (this.#runs.size > 0) await Promise.allSettled([...this.#runs]);
  }

  /**
   * Kills every process group of a run in flight at once (SIGKILL), and
   * makes later stops skip the grace period. For a second Ctrl-C.
   */
  kill(): void {
    this.#hurry = true;
    for (const pid of this.#live) trySignalGroup(pid, "SIGKILL");
  }

  /** Runs the command for `run`, as the module docs describe. */
  run(run: Run, context: AgentContext): Promise<void> {
    const p = this.#run(run, context);
    this.#runs.add(p);
    const done = () => this.#runs.delete(p);
    p.then(done, done);
    return p;
  }

  async #environment(): Promise<Record<string, string>> {
    const env: Record<string, string> = {
      PATH: Deno.env.get("PATH") ?? "/usr/local/bin:/usr/bin:/bin",
      HOME: Deno.env.get("HOME") ?? "/",
    };
    const pass = this.#options.passEnv ?? [];
    if (pass.length > 0) {
      const match = globMatcher(pass);
      for (const [name, value] of Object.entries(Deno.env.toObject())) {
        if (match(name)) env[name] = value;
      }
    }
    const file = this.#options.envFile;
    if (file !== undefined) {
      let text: string;
      try {
        text = await Deno.readTextFile(file);
      } catch (err) {
        throw new NotGradedError(
          `Cannot start agent: cannot read env file "${file}": ${(err as Error).message}`,
          { cause: err },
        );
      }
      try {
        Object.assign(env, parseEnvFile(text, `env file "${file}"`));
      } catch (err) {
        throw new NotGradedError((err as Error).message, { cause: err });
      }
    }
    return env;
  }

  async #run(run: Run, context: AgentContext): Promise<void> {
    const prompt = typeof run.prompt === "string" ? run.prompt : stringifyJson(run.prompt);
    const privateFiles: string[] = [];
    let route: ModelRoute | null = null;
    try {
      const env = await this.#environment();
      const promptBytes = new TextEncoder().encode(prompt);
      const promptFile = await Deno.makeTempFile({ prefix: "hud-prompt-" });
      privateFiles.push(promptFile);
      await Deno.chmod(promptFile, 0o600);
      await Deno.writeFile(promptFile, promptBytes, { mode: 0o600 });
      Object.assign(env, {
        HUD_PROMPT_FILE: promptFile,
        HUD_TASK_ID: run.task.id,
        HUD_TASK_SLUG: run.task.slug,
        HUD_TASK_ARGS: stringifyJson(run.task.args),
        HUD_SESSION_ID: run.client.sessionId,
        HUD_CONTROL_URL: run.client.url,
        HUD_BINDINGS: stringifyJson(run.bindings),
        HUD_CAPABILITIES: stringifyJson(run.capabilities.map((c) => c.toManifest())),
      });
      if (promptBytes.length < PROMPT_ENV_LIMIT) env.HUD_PROMPT = prompt;
      for (const cap of run.capabilities) {
        const key = envName(cap.name);
        env[`HUD_CAP_${key}_URL`] = cap.url;
        if (cap.family === "ssh" && typeof cap.params.client_key === "string") {
          const file = await Deno.makeTempFile({ prefix: "hud-key-" });
          privateFiles.push(file);
          await Deno.chmod(file, 0o600);
          await Deno.writeTextFile(file, cap.params.client_key, { mode: 0o600 });
          env[`HUD_CAP_${key}_KEY_FILE`] = file;
          env[`HUD_CAP_${key}_USER`] = String(cap.params.user ?? "agent");
        }
      }
      Object.assign(env, this.#options.env ?? {});
      route = await this.#options.modelProxy?.open(run, context) ?? null;
      const record = await this.#spawn(
        route === null ? env : route.environment(env),
        promptBytes,
        run,
        context.signal,
      );
      run.trace.record("command", null, { ...record });
      const tail = record.stderr.trim().split("\n").slice(-3).join(" | ");
      if (record.signal === null && (record.code === 126 || record.code === 127)) {
        throw new NotGradedError(
          `Agent command could not start (exit code ${record.code})${tail ? `: ${tail}` : ""}`,
        );
      }
      if (record.code !== 0) {
        throw new Error(
          `Agent command exited with ${
            record.signal ? `signal ${record.signal}` : `code ${record.code}`
          }${tail ? `: ${tail}` : ""}`,
        );
      }
    } finally {
      await route?.close();
      for (const f of privateFiles) await Deno.remove(f).catch(() => {});
    }
  }

  async #spawn(
    env: Record<string, string>,
    prompt: Uint8Array,
    run: Run,
    signal: AbortSignal,
  ): Promise<CommandAgentRecord> {
    signal.throwIfAborted();
    // A detached child gets a session and process group of its own, so that
    // stopping it also stops whatever it started.
    let child: Deno.ChildProcess;
    try {
      child = new Deno.Command(this.#argv[0], {
        args: this.#argv.slice(1),
        detached: true,
        cwd: this.#options.cwd,
        env,
        clearEnv: true,
        stdin: "piped",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
    } catch (err) {
      throw new NotGradedError(
        `Agent command could not start: "${this.#argv[0]}": ${(err as Error).message}`,
        { cause: err },
      );
    }
    const pid = child.pid;
    this.#live.add(pid);
    const grace = () => this.#hurry ? 0 : this.#options.killGrace ?? 2_000;
    let stopping: Promise<void> | null = null;
    const stop = () => stopping ??= killProcessGroup(pid, grace(), child.status);
    const onAbort = () => void stop();
    signal.addEventListener("abort", onAbort, { once: true });
    let overflow = false;
    try {
      const writer = child.stdin.getWriter();
      const writing = writer.write(prompt)
        .then(() => writer.close())
        .catch(() => {}); // the command may exit without reading its input
      // The answer is updated as output arrives, so that an agent stopped
      // at its deadline is graded on what it had written.
      const decoder = new TextDecoder();
      let text = "";
      let bytes = 0;
      const reading = (async () => {
        for await (const chunk of child.stdout) {
          if (overflow) continue; // drain until the group is gone
          bytes += chunk.length;
          if (bytes > this.#maxOutput) {
            overflow = true;
            run.answer = null;
            void stop();
            continue;
          }
          text += decoder.decode(chunk, { stream: true });
          run.answer = text.endsWith("\n") ? text.slice(0, -1) : text;
        }
        if (overflow) return;
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
      const status = await child.status;
      // What the command left behind in its group goes with it; that also
      // closes pipes a background child may hold open.
      trySignalGroup(pid, "SIGKILL");
      await Promise.all([writing, reading, errReading]);
      if (overflow) {
        throw new NotGradedError(`answer exceeds ${this.#maxOutput} bytes`);
      }
      return {
        code: status.code,
        signal: status.signal ?? null,
        stderr: new TextDecoder().decode(stderr),
      };
    } finally {
      signal.removeEventListener("abort", onAbort);
      if (stopping) await stopping;
      await child.status.catch(() => {});
      // The leader is reaped; wait until the rest of its group is too.
      const bound = Date.now() + GROUP_GONE_BOUND_MS;
      while (groupAlive(pid) && Date.now() < bound) await delay(10);
      this.#live.delete(pid);
    }
  }
}
