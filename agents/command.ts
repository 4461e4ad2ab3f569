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
 * - a **non-zero exit** (or death by a signal other than a SIGKILL from
 *   outside, which is not the agent's doing: not graded) is recorded as an agent
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
import { type ExitStatus, succeeded } from "../_internal/exit.ts";
import { errorMessage } from "../_internal/util.ts";
import { delay } from "../_internal/async.ts";
import { concat } from "../_internal/io.ts";
import { stringifyJson } from "../_internal/framing.ts";
import { addSecretValue, isSecretEnvName } from "../_internal/secret_values.ts";

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

/**
 * How the last run's command ended, and the tail of its stderr, as recorded
 * in the trace: `code` is `null` when a signal ended it.
 */
export interface CommandAgentRecord extends ExitStatus {
  /** The tail of stderr. */
  readonly stderr: string;
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

/** Every option of {@linkcode CommandAgent}, checked, with its default. */
interface CommandConfig {
  readonly env: Readonly<Record<string, string>>;
  readonly passEnv: readonly string[];
  readonly envFile: string | undefined;
  readonly cwd: string | undefined;
  readonly killGrace: number;
  readonly maxOutputBytes: number;
  readonly modelProxy: ModelRouter | undefined;
}

/**
 * Checks `options` and resolves every default, once.
 * @throws {RangeError} for a `maxOutputBytes` or `killGrace` out of range
 * @throws {TypeError} for a `passEnv` that is not an array
 */
function commandConfig(options: CommandAgentOptions): CommandConfig {
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
  return {
    env: options.env ?? {},
    passEnv: options.passEnv ?? [],
    envFile: options.envFile,
    cwd: options.cwd,
    killGrace: options.killGrace ?? 2_000,
    maxOutputBytes: max,
    modelProxy: options.modelProxy,
  };
}

/** An external program as an {@linkcode Agent}; see the module docs for its contract. */
export class CommandAgent implements Agent {
  readonly #argv: string[];
  readonly #config: CommandConfig;
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
    this.#config = commandConfig(options);
    this.#argv = argv;
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
    const settings: Record<string, unknown> = { max_output_bytes: this.#config.maxOutputBytes };
    if (words.length > 1) settings.hidden_words = words.length - 1;
    if (this.#config.passEnv.length) settings.pass_env = [...this.#config.passEnv];
    if (this.#config.modelProxy) settings.model_proxy = true;
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

  /** The variables of this process the command gets: PATH, HOME, `passEnv`, `envFile`. */
  async #environment(): Promise<Record<string, string>> {
    const env: Record<string, string> = {
      PATH: Deno.env.get("PATH") ?? "/usr/local/bin:/usr/bin:/bin",
      HOME: Deno.env.get("HOME") ?? "/",
    };
    const pass = this.#config.passEnv;
    if (pass.length > 0) {
      const match = globMatcher(pass);
      for (const [name, value] of Object.entries(Deno.env.toObject())) {
        if (match(name)) env[name] = value;
      }
    }
    const file = this.#config.envFile;
    if (file !== undefined) Object.assign(env, await readEnvFile(file));
    return env;
  }

  async #run(run: Run, context: AgentContext): Promise<void> {
    const prompt = typeof run.prompt === "string" ? run.prompt : stringifyJson(run.prompt);
    const privateFiles: string[] = [];
    let route: ModelRoute | null = null;
    try {
      const env = await this.#environment();
      const promptBytes = new TextEncoder().encode(prompt);
      Object.assign(env, await runEnvironment(run, prompt, promptBytes, privateFiles));
      Object.assign(env, this.#config.env);
      // The secret-named values it is given (from envFile, env) never reach
      // results written here; those of this process are held already.
      for (const [name, value] of Object.entries(env)) {
        if (isSecretEnvName(name)) addSecretValue(value, `value of ${name}`);
      }
      route = await this.#config.modelProxy?.open(run, context) ?? null;
      const spawnEnv = route === null ? env : route.environment(env);
      const record = await this.#spawn(spawnEnv, promptBytes, run, context.signal);
      run.trace.record("command", null, { ...record });
      checkExit(record);
    } finally {
      await route?.close();
      for (const f of privateFiles) await Deno.remove(f).catch(() => {});
    }
  }

  /**
   * Runs the command in a process group of its own, stopping the group when
   * `signal` aborts; returns once the whole group is gone.
   */
  async #spawn(
    env: Record<string, string>,
    prompt: Uint8Array,
    run: Run,
    signal: AbortSignal,
  ): Promise<CommandAgentRecord> {
    signal.throwIfAborted();
    const child = spawnDetached(this.#argv, this.#config.cwd, env);
    const pid = child.pid;
    this.#live.add(pid);
    const grace = () => this.#hurry ? 0 : this.#config.killGrace;
    let stopping: Promise<void> | null = null;
    const stop = () => stopping ??= killProcessGroup(pid, grace(), child.status);
    const onAbort = () => void stop();
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      return await this.#collect(child, prompt, run, () => void stop());
    } finally {
      signal.removeEventListener("abort", onAbort);
      if (stopping) await stopping;
      await child.status.catch(() => {});
      await groupGone(pid);
      this.#live.delete(pid);
    }
  }

  /**
   * Writes the prompt, reads the answer and the stderr tail, and waits for
   * the command to exit.
   * @throws {NotGradedError} when the answer went over `maxOutputBytes`
   */
  async #collect(
    child: Deno.ChildProcess,
    prompt: Uint8Array,
    run: Run,
    stop: () => void,
  ): Promise<CommandAgentRecord> {
    const max = this.#config.maxOutputBytes;
    const writing = writePrompt(child.stdin, prompt);
    const reading = readAnswer(child.stdout, run, max, stop);
    const errReading = readTail(child.stderr, STDERR_TAIL);
    const status = await child.status;
    // What the command left behind in its group goes with it; that also
    // closes pipes a background child may hold open.
    trySignalGroup(child.pid, "SIGKILL");
    const [, overflow, stderr] = await Promise.all([writing, reading, errReading]);
    if (overflow) throw new NotGradedError(`answer exceeds ${max} bytes`);
    const signal = status.signal ?? null;
    return { code: signal === null ? status.code : null, signal, stderr };
  }
}

/**
 * The `HUD_*` variables of the contract; the prompt file and the key files
 * it writes (0600) are pushed on `privateFiles`, for the caller to remove.
 */
async function runEnvironment(
  run: Run,
  prompt: string,
  promptBytes: Uint8Array,
  privateFiles: string[],
): Promise<Record<string, string>> {
  const env: Record<string, string> = {
    HUD_PROMPT_FILE: await privateFile("hud-prompt-", promptBytes, privateFiles),
    HUD_TASK_ID: run.task.id,
    HUD_TASK_SLUG: run.task.slug,
    HUD_TASK_ARGS: stringifyJson(run.task.args),
    HUD_SESSION_ID: run.client.sessionId,
    HUD_CONTROL_URL: run.client.url,
    HUD_BINDINGS: stringifyJson(run.bindings),
    HUD_CAPABILITIES: stringifyJson(run.capabilities.map((c) => c.toManifest())),
  };
  if (promptBytes.length < PROMPT_ENV_LIMIT) env.HUD_PROMPT = prompt;
  for (const cap of run.capabilities) {
    const key = envName(cap.name);
    env[`HUD_CAP_${key}_URL`] = cap.url;
    if (cap.family === "ssh" && typeof cap.params.client_key === "string") {
      const keyBytes = new TextEncoder().encode(cap.params.client_key);
      env[`HUD_CAP_${key}_KEY_FILE`] = await privateFile("hud-key-", keyBytes, privateFiles);
      env[`HUD_CAP_${key}_USER`] = String(cap.params.user ?? "agent");
    }
  }
  return env;
}

/** A new temporary file holding `data`, made 0600 before anything is written. */
async function privateFile(prefix: string, data: Uint8Array, files: string[]): Promise<string> {
  const file = await Deno.makeTempFile({ prefix });
  files.push(file);
  await Deno.chmod(file, 0o600);
  await Deno.writeFile(file, data, { mode: 0o600 });
  return file;
}

/**
 * The variables of an env file.
 * @throws {NotGradedError} when it cannot be read, or a line is not `NAME=value`
 */
async function readEnvFile(file: string): Promise<Record<string, string>> {
  let text: string;
  try {
    text = await Deno.readTextFile(file);
  } catch (err) {
    throw new NotGradedError(
      `Cannot start agent: cannot read env file "${file}": ${errorMessage(err)}`,
      { cause: err },
    );
  }
  try {
    return parseEnvFile(text, `env file "${file}"`);
  } catch (err) {
    throw new NotGradedError(errorMessage(err), { cause: err });
  }
}

/**
 * The agent's process was killed from outside (SIGKILL that this agent did
 * not send: the machine's memory limit, an operator): not the agent's
 * doing, so the rollout is not graded (class `infrastructure_lost`, which a
 * job retries).
 */
class AgentKilledError extends Error {
  /** How a rollout that failed with it is classed. */
  readonly errorClass: string = "infrastructure_lost";
  constructor(message: string) {
    super(message);
    this.name = "AgentKilledError";
  }
}

/**
 * Throws for a command that did not succeed: one that could not start (126,
 * 127) is not graded, nor one killed from outside (SIGKILL it was not sent
 * by this agent: its own stops come only with the rollout's abort, which
 * ends the rollout first); any other failure is the agent's error.
 */
function checkExit(record: CommandAgentRecord): void {
  const tail = record.stderr.trim().split("\n").slice(-3).join(" | ");
  const detail = tail ? `: ${tail}` : "";
  if (record.code === 126 || record.code === 127) {
    throw new NotGradedError(`Agent command could not start (exit code ${record.code})${detail}`);
  }
  if (record.signal === "SIGKILL") {
    throw new AgentKilledError(
      `Agent command was killed (SIGKILL) from outside, not by its deadline: the machine's memory limit or another process${detail}`,
    );
  }
  if (!succeeded(record)) {
    const how = record.signal !== null ? `signal ${record.signal}` : `code ${record.code}`;
    throw new Error(`Agent command exited with ${how}${detail}`);
  }
}

/**
 * Starts `argv` detached: a session and process group of its own, so that
 * stopping it also stops whatever it started.
 * @throws {NotGradedError} when it cannot start
 */
function spawnDetached(
  argv: readonly string[],
  cwd: string | undefined,
  env: Record<string, string>,
): Deno.ChildProcess {
  try {
    return new Deno.Command(argv[0], {
      args: argv.slice(1),
      detached: true,
      cwd,
      env,
      clearEnv: true,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
  } catch (err) {
    throw new NotGradedError(
      `Agent command could not start: "${argv[0]}": ${errorMessage(err)}`,
      { cause: err },
    );
  }
}

/** Writes the prompt and closes stdin; the command may exit without reading it. */
async function writePrompt(stdin: WritableStream<Uint8Array>, prompt: Uint8Array): Promise<void> {
  const writer = stdin.getWriter();
  try {
    await writer.write(prompt);
    await writer.close();
  } catch {
    // not read: the command's business
  }
}

/**
 * Reads stdout into `run.answer` as it arrives, so that an agent stopped at
 * its deadline is graded on what it had written. Past `max` bytes the
 * answer is dropped and `stop` called; the rest is drained until the group
 * is gone.
 * @returns whether the output went over `max`
 */
async function readAnswer(
  stdout: ReadableStream<Uint8Array>,
  run: Run,
  max: number,
  stop: () => void,
): Promise<boolean> {
  const decoder = new TextDecoder();
  const answer = (text: string) => text.endsWith("\n") ? text.slice(0, -1) : text;
  let text = "";
  let bytes = 0;
  let overflow = false;
  for await (const chunk of stdout) {
    if (overflow) continue;
    bytes += chunk.length;
    if (bytes > max) {
      overflow = true;
      run.answer = null;
      stop();
      continue;
    }
    text += decoder.decode(chunk, { stream: true });
    run.answer = answer(text);
  }
  if (overflow) return true;
  text += decoder.decode();
  run.answer = answer(text);
  return false;
}

/** The last `limit` bytes of a stream, as text. */
async function readTail(stream: ReadableStream<Uint8Array>, limit: number): Promise<string> {
  let tail: Uint8Array = new Uint8Array(0);
  for await (const chunk of stream) {
    const next = concat([tail, chunk]);
    tail = next.length > limit ? next.slice(next.length - limit) : next;
  }
  return new TextDecoder().decode(tail);
}

/** Waits (boundedly) until no live process of group `pid` is left, killing what is. */
async function groupGone(pid: number): Promise<void> {
  const bound = Date.now() + GROUP_GONE_BOUND_MS;
  while (groupAlive(pid) && Date.now() < bound) await delay(10);
}
