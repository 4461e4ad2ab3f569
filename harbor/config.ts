/**
 * {@linkcode parseHarborConfig}: a Harbor `task.toml`, its shapes checked,
 * with Harbor's own defaults (`harbor/models/task/config.py`: 600 s for the
 * agent, the verifier and the build, 1 CPU, 2048 MB of memory, 10240 MB of
 * storage, internet allowed), and `[environment.healthcheck]` with Harbor's
 * field names and defaults (interval and start interval 5 s, timeout 30 s,
 * no start period, 3 retries).
 *
 * @module
 */

import { parseToml, type TomlTable, type TomlValue } from "./toml.ts";
import { TomlDateTime } from "./toml_datetime.ts";
import { harborNetwork, type HarborNetworkPhases } from "./_network.ts";

export type { HarborNetworkMode, HarborNetworkPhases, HarborNetworkPolicy } from "./_network.ts";

/** `[environment.healthcheck]`: a command awaited before the agent starts (Docker's HEALTHCHECK semantics). */
export interface HarborHealthcheckConfig {
  /** `command`: run with `bash -c`; exit 0 means healthy. */
  command: string;
  /** `interval_sec`: seconds between attempts after the start period (default 5). */
  intervalSec: number;
  /** `timeout_sec`: seconds one attempt may take (default 30). */
  timeoutSec: number;
  /** `start_period_sec`: seconds during which failures do not count (default 0). */
  startPeriodSec: number;
  /** `start_interval_sec`: seconds between attempts in the start period (default 5). */
  startIntervalSec: number;
  /** `retries`: consecutive failures after the start period that fail the task (default 3). */
  retries: number;
}

/** The `[environment]` table of a `task.toml`. */
export interface HarborEnvironmentConfig {
  /** A prebuilt image to use instead of `environment/Dockerfile`, or null. */
  dockerImage: string | null;
  /** Seconds the image build may take. */
  buildTimeoutSec: number;
  /** CPUs the container may use. */
  cpus: number;
  /** Memory limit, in MB. */
  memoryMb: number;
  /** Disk the container may fill, in MB (not enforced on every engine). */
  storageMb: number;
  /** `allow_internet`: whether the container has a network (see {@linkcode HarborTaskConfig.network} for what each phase has). */
  allowInternet: boolean;
  /** The agent's and the verifier's working directory; null for the image's `WORKDIR`. */
  workdir: string | null;
  /** `[environment.env]`: variables of the container, over the image's `ENV` (the agent and the verifier see them). */
  env: Record<string, string>;
  /** `[environment.healthcheck]`, or null. */
  healthcheck: HarborHealthcheckConfig | null;
  /** `gpus`: GPUs the task needs (default 0). */
  gpus: number;
}

/** One entry of `artifacts`. */
export interface HarborArtifact {
  /** `source`: an absolute path in the agent's container (a relative one is taken from `/`). */
  source: string;
  /** `exclude`: patterns left out of a directory (empty: none). */
  exclude: string[];
  /** `service`: the compose service it is taken from, or null for the task's container. */
  service: string | null;
}

/** A Harbor `task.toml`, checked, with defaults filled in. */
export interface HarborTaskConfig {
  /** `version` (the format's), or null. */
  version: string | null;
  /** `[metadata]`, as written. */
  metadata: TomlTable;
  /** `[agent] timeout_sec`. */
  agentTimeoutSec: number;
  /** `[verifier] timeout_sec`. */
  verifierTimeoutSec: number;
  /** `[verifier] env`: variables for `tests/test.sh`. */
  verifierEnv: Record<string, string>;
  /** `[solution] env`: variables for `solution/solve.sh` (the oracle). */
  solutionEnv: Record<string, string>;
  /** `[agent] user` (`user`, `uid`, `user:group`), or null for the image's `USER` (root when none). */
  agentUser: string | null;
  /** `[verifier] user`, or null for the image's `USER` (root when none). */
  verifierUser: string | null;
  /** `[environment]`. */
  environment: HarborEnvironmentConfig;
  /**
   * `[verifier] environment_mode` (Harbor 0.22): "shared" runs the verifier
   * in the agent's container; "separate" (implied by `[verifier.environment]`)
   * in a container of its own.
   */
  verifierMode: "shared" | "separate";
  /**
   * The verifier's container in "separate" mode: `[verifier.environment]`,
   * else a copy of `[environment]` (Harbor's
   * `resolve_effective_verifier_env_config`); null in "shared" mode.
   */
  verifierEnvironment: HarborEnvironmentConfig | null;
  /**
   * `artifacts`: the paths of the agent's container that are collected when
   * the agent is done and, in "separate" mode, put at the same paths in the
   * verifier's container (after /logs/artifacts, always collected).
   */
  artifacts: HarborArtifact[];
  /**
   * How many `[[verifier.collect]]` hooks the task has (commands Harbor
   * runs once the agent is done, to snapshot state for a separate
   * verifier): this runner runs none, and skips such a separate-verifier task.
   */
  verifierCollectHooks: number;
  /**
   * The network of each phase (`network_mode`, `allowed_hosts` of
   * `[environment]`, `[agent]` and `[verifier]`; `allow_internet`), as
   * Harbor resolves it.
   */
  network: HarborNetworkPhases;
  /**
   * `[[steps]]` (Harbor's multi-step tasks), in order, or null for a task
   * of one step (`instruction.md`, `tests/`).
   */
  steps: HarborStepConfig[] | null;
  /**
   * `multi_step_reward_strategy`: how the steps' rewards make the task's:
   * `"mean"` (each key's mean over the steps that were verified, a key a
   * step lacks counting 0; Harbor's default) or `"final"` (the last step's).
   */
  multiStepRewardStrategy: "mean" | "final";
}

/** One `[[steps]]` table: a step's own settings, the task's where it gives none. */
export interface HarborStepConfig {
  /** `name`: the step's folder, `steps/NAME/` (its `instruction.md`, `tests/`, `solution/`). */
  name: string;
  /** `[steps.agent] timeout_sec`, else `[agent] timeout_sec`. */
  agentTimeoutSec: number;
  /** `[steps.verifier] timeout_sec`, else `[verifier] timeout_sec`. */
  verifierTimeoutSec: number;
  /** `[verifier] env` with `[steps.verifier] env` over it, as Harbor merges them. */
  verifierEnv: Record<string, string>;
  /** `[steps.verifier] user`, else `[verifier] user` (null: the image's `USER`). */
  verifierUser: string | null;
  /**
   * `min_reward`: when the step's rewards fall below it, the steps after it
   * do not run. A number gates the key `reward`; a table each key it names
   * (a key the step did not write counts as below). Null: no gate.
   */
  minReward: Record<string, number> | null;
  /** `[steps.healthcheck]`: awaited before the step's agent, after the task's own; or null. */
  healthcheck: HarborHealthcheckConfig | null;
  /**
   * The step's settings this runner does not carry out (`agent.user`,
   * `network_mode`, a verifier environment of its own), by key: the loader
   * skips the task naming them.
   */
  unsupported: string[];
}

/** A step's keys this runner does not carry out yet. */
const STEP_UNSUPPORTED = [
  "agent.user",
  "agent.network_mode",
  "agent.allowed_hosts",
  "verifier.network_mode",
  "verifier.allowed_hosts",
  "verifier.environment_mode",
  "verifier.environment",
];

function table(value: TomlValue | undefined, file: string, key: string): TomlTable {
  if (value === undefined) return {};
  if (
    typeof value !== "object" || value === null || Array.isArray(value) ||
    value instanceof TomlDateTime
  ) {
    throw new TypeError(`Cannot load Harbor task: ${file}: "${key}" must be a table`);
  }
  return value as TomlTable;
}

/** `[KEY]`'s table of variables: names to strings. */
function envTable(parent: TomlTable, file: string, key: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(table(parent.env, file, `${key}.env`))) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) {
      throw new TypeError(
        `Cannot load Harbor task: ${file}: "${key}.env.${k}": not a variable name (letters, digits, _)`,
      );
    }
    if (typeof v !== "string") {
      throw new TypeError(`Cannot load Harbor task: ${file}: "${key}.env.${k}" must be a string`);
    }
    env[k] = v;
  }
  return env;
}

function positive(t: TomlTable, file: string, key: string, fallback: number): number {
  const v = t[key.slice(key.lastIndexOf(".") + 1)];
  if (v === undefined) return fallback;
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !(n > 0) || !Number.isFinite(n)) {
    throw new TypeError(`Cannot load Harbor task: ${file}: "${key}" must be a positive number`);
  }
  return n;
}

function optionalString(t: TomlTable, file: string, key: string): string | null {
  const v = t[key.slice(key.lastIndexOf(".") + 1)];
  if (v === undefined) return null;
  if (typeof v !== "string" || v === "") {
    throw new TypeError(`Cannot load Harbor task: ${file}: "${key}" must be a non-empty string`);
  }
  return v;
}

function nonNegative(t: TomlTable, file: string, key: string, fallback: number): number {
  const v = t[key.slice(key.lastIndexOf(".") + 1)];
  if (v === undefined) return fallback;
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !(n >= 0) || !Number.isFinite(n)) {
    throw new TypeError(`Cannot load Harbor task: ${file}: "${key}" must be a number >= 0`);
  }
  return n;
}

/** A user as Harbor takes it (`str | int`): a name, a uid, or either with `:group`. */
function user(t: TomlTable, file: string, key: string): string | null {
  const v = t[key.slice(key.lastIndexOf(".") + 1)];
  if (v === undefined) return null;
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return String(v);
  if (typeof v === "string" && /^[^:\s]+(:[^:\s]+)?$/.test(v)) return v;
  throw new TypeError(
    `Cannot load Harbor task: ${file}: "${key}" must be a user name or uid, optionally with ":group"`,
  );
}

function count(t: TomlTable, file: string, key: string): number {
  const v = t[key.slice(key.lastIndexOf(".") + 1)];
  if (v === undefined) return 0;
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) {
    throw new TypeError(`Cannot load Harbor task: ${file}: "${key}" must be an integer >= 0`);
  }
  return n;
}

function verifierMode(verifier: TomlTable, file: string): "shared" | "separate" {
  const mode = verifier.environment_mode;
  if (mode !== undefined && mode !== "shared" && mode !== "separate") {
    throw new TypeError(
      `Cannot load Harbor task: ${file}: "verifier.environment_mode" must be "shared" or "separate"`,
    );
  }
  if (verifier.environment === undefined) return mode ?? "shared";
  table(verifier.environment, file, "verifier.environment");
  if (mode === "shared") {
    throw new TypeError(
      `Cannot load Harbor task: ${file}: "verifier.environment" needs environment_mode "separate" (it is "shared")`,
    );
  }
  return "separate";
}

function healthcheck(
  parent: TomlTable,
  file: string,
  key = "environment.healthcheck",
): HarborHealthcheckConfig | null {
  if (parent.healthcheck === undefined) return null;
  const t = table(parent.healthcheck, file, key);
  const command = t.command;
  if (typeof command !== "string" || command.trim() === "") {
    throw new TypeError(
      `Cannot load Harbor task: ${file}: "${key}.command" must be a non-empty string`,
    );
  }
  const retries = t.retries ?? 3;
  if (typeof retries !== "number" || !Number.isSafeInteger(retries) || retries < 0) {
    throw new TypeError(
      `Cannot load Harbor task: ${file}: "${key}.retries" must be an integer >= 0`,
    );
  }
  return {
    command,
    intervalSec: nonNegative(t, file, `${key}.interval_sec`, 5),
    timeoutSec: positive(t, file, `${key}.timeout_sec`, 30),
    startPeriodSec: nonNegative(t, file, `${key}.start_period_sec`, 0),
    startIntervalSec: nonNegative(t, file, `${key}.start_interval_sec`, 5),
    retries,
  };
}

/**
 * Parses and checks a Harbor `task.toml`.
 *
 * @param text the file's text
 * @param file the file's path, for messages
 * @returns the configuration with Harbor's defaults
 * @throws {TomlSyntaxError} for text that is not TOML (line and column in the message)
 * @throws {TypeError} for a key of the wrong shape: `Cannot load Harbor task: FILE: "agent.timeout_sec" must be a positive number`
 *
 * @example
 * ```ts
 * import { parseHarborConfig } from "./config.ts";
 * import assert from "node:assert/strict";
 *
 * const config = parseHarborConfig('[verifier]\ntimeout_sec = 30\n', "task.toml");
 * assert.equal(config.verifierTimeoutSec, 30);
 * assert.equal(config.agentTimeoutSec, 600);
 * ```
 */
export function parseHarborConfig(text: string, file: string): HarborTaskConfig {
  const doc = parseToml(text);
  const task = taskConfig(doc, file);
  return {
    ...task,
    steps: steps(doc.steps, task, file),
    multiStepRewardStrategy: rewardStrategy(doc.multi_step_reward_strategy, file),
  };
}

/** A step's name: a folder of `steps/`, as the task's files name it. */
const STEP_NAME = /^[A-Za-z0-9_][A-Za-z0-9._-]*$/;

/** `[[steps]]`, each checked, with the task's settings where a step gives none. */
function steps(
  value: TomlValue | undefined,
  task: Omit<HarborTaskConfig, "steps" | "multiStepRewardStrategy">,
  file: string,
): HarborStepConfig[] | null {
  if (value === undefined) return null;
  if (!Array.isArray(value) || value.length === 0) {
    throw new TypeError(
      `Cannot load Harbor task: ${file}: "steps" must be a non-empty array of tables ([[steps]])`,
    );
  }
  const seen = new Set<string>();
  return value.map((v, i) => {
    const step = table(v, file, `steps[${i}]`);
    const name = step.name;
    if (typeof name !== "string" || !STEP_NAME.test(name)) {
      throw new TypeError(
        `Cannot load Harbor task: ${file}: "steps[${i}].name" must be a folder name of steps/ (letters, digits, ".", "_", "-")`,
      );
    }
    if (seen.has(name)) {
      throw new TypeError(
        `Cannot load Harbor task: ${file}: "steps[${i}].name": "${name}" is named twice`,
      );
    }
    seen.add(name);
    const at = `steps[${i}]`;
    const agent = table(step.agent, file, `${at}.agent`);
    const verifier = table(step.verifier, file, `${at}.verifier`);
    return {
      name,
      agentTimeoutSec: positive(agent, file, `${at}.agent.timeout_sec`, task.agentTimeoutSec),
      verifierTimeoutSec: positive(
        verifier,
        file,
        `${at}.verifier.timeout_sec`,
        task.verifierTimeoutSec,
      ),
      verifierEnv: { ...task.verifierEnv, ...envTable(verifier, file, `${at}.verifier`) },
      verifierUser: user(verifier, file, `${at}.verifier.user`) ?? task.verifierUser,
      minReward: minReward(step.min_reward, file, `${at}.min_reward`),
      healthcheck: healthcheck(step, file, `${at}.healthcheck`),
      unsupported: STEP_UNSUPPORTED.filter((k) => {
        const [phase, field] = k.split(".");
        const v = (phase === "agent" ? agent : verifier)[field];
        return v !== undefined && !(field === "environment_mode" && v === "shared");
      }).map((k) => `${at}.${k}`),
    };
  });
}

/** `min_reward`: a number (the key `reward`'s) or a table of numbers by key. */
function minReward(
  value: TomlValue | undefined,
  file: string,
  key: string,
): Record<string, number> | null {
  if (value === undefined) return null;
  const finite = (v: TomlValue) => {
    const n = typeof v === "bigint" ? Number(v) : v;
    return typeof n === "number" && Number.isFinite(n) ? n : null;
  };
  const one = finite(value);
  if (one !== null) return { reward: one };
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(
      `Cannot load Harbor task: ${file}: "${key}" must be a number or a table of numbers`,
    );
  }
  const t = table(value, file, key);
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(t)) {
    const n = finite(v);
    if (n === null) {
      throw new TypeError(`Cannot load Harbor task: ${file}: "${key}.${k}" must be a number`);
    }
    out[k] = n;
  }
  return out;
}

function rewardStrategy(value: TomlValue | undefined, file: string): "mean" | "final" {
  if (value === undefined || value === "mean" || value === "final") return value ?? "mean";
  throw new TypeError(
    `Cannot load Harbor task: ${file}: "multi_step_reward_strategy" must be "mean" or "final"`,
  );
}

/** Everything but the steps. */
function taskConfig(
  doc: TomlTable,
  file: string,
): Omit<HarborTaskConfig, "steps" | "multiStepRewardStrategy"> {
  const agent = table(doc.agent, file, "agent");
  const verifier = table(doc.verifier, file, "verifier");
  const environment = table(doc.environment, file, "environment");
  const metadata = table(doc.metadata, file, "metadata");
  const solution = table(doc.solution, file, "solution");
  const network = harborNetwork(environment, agent, verifier, file);
  const mode = verifierMode(verifier, file);
  const taskEnvironment = environmentConfig(environment, file, "environment");
  const version = doc.version;
  if (version !== undefined && typeof version !== "string") {
    throw new TypeError(`Cannot load Harbor task: ${file}: "version" must be a string`);
  }
  return {
    version: version ?? null,
    metadata,
    agentTimeoutSec: positive(agent, file, "agent.timeout_sec", 600),
    verifierTimeoutSec: positive(verifier, file, "verifier.timeout_sec", 600),
    verifierEnv: envTable(verifier, file, "verifier"),
    solutionEnv: envTable(solution, file, "solution"),
    agentUser: user(agent, file, "agent.user"),
    verifierUser: user(verifier, file, "verifier.user"),
    verifierMode: mode,
    environment: taskEnvironment,
    verifierEnvironment: mode === "shared"
      ? null
      // Harbor's separate verifier: its own table, else a copy of [environment].
      : verifier.environment === undefined
      ? structuredClone(taskEnvironment)
      : environmentConfig(
        table(verifier.environment, file, "verifier.environment"),
        file,
        "verifier.environment",
      ),
    artifacts: artifacts(doc.artifacts, file),
    verifierCollectHooks: Array.isArray(verifier.collect) ? verifier.collect.length : 0,
    network,
  };
}

/** An environment table (`[environment]`, `[verifier.environment]`), checked, with Harbor's defaults. */
function environmentConfig(t: TomlTable, file: string, key: string): HarborEnvironmentConfig {
  return {
    dockerImage: optionalString(t, file, `${key}.docker_image`),
    buildTimeoutSec: positive(t, file, `${key}.build_timeout_sec`, 600),
    cpus: positive(t, file, `${key}.cpus`, 1),
    memoryMb: positive(t, file, `${key}.memory_mb`, 2048),
    storageMb: positive(t, file, `${key}.storage_mb`, 10240),
    allowInternet: t.allow_internet !== false,
    workdir: optionalString(t, file, `${key}.workdir`),
    env: envTable(t, file, key),
    healthcheck: healthcheck(t, file, `${key}.healthcheck`),
    gpus: count(t, file, `${key}.gpus`),
  };
}

/**
 * `artifacts` (top level): paths of the agent's container, each a string or
 * a table with `source` (and Harbor's `destination`, `exclude`, `service`).
 * A relative source is taken from `/`, as `docker cp` takes it; `..` is
 * refused, as Harbor refuses it.
 */
function artifacts(value: TomlValue | undefined, file: string): HarborArtifact[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) {
    throw new TypeError(
      `Cannot load Harbor task: ${file}: "artifacts" must be an array of paths or tables with a source`,
    );
  }
  return value.map((v, i) => {
    const at = `artifacts[${i}]`;
    const t = typeof v === "string" ? { source: v } : table(v, file, at);
    const source = optionalString(t, file, `${at}.source`);
    if (source === null) {
      throw new TypeError(
        `Cannot load Harbor task: ${file}: "${at}.source" must be a non-empty string`,
      );
    }
    if (source.split("/").includes("..")) {
      throw new TypeError(`Cannot load Harbor task: ${file}: "${at}.source" must not hold ".."`);
    }
    const exclude = t.exclude ?? [];
    if (!Array.isArray(exclude) || exclude.some((p) => typeof p !== "string")) {
      throw new TypeError(
        `Cannot load Harbor task: ${file}: "${at}.exclude" must be an array of patterns`,
      );
    }
    const path = `/${source.replace(/^\/+/, "").replace(/\/+$/, "")}`;
    return {
      source: path,
      exclude: exclude as string[],
      service: optionalString(t, file, `${at}.service`),
    };
  });
}
