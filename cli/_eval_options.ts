// The flags of `hud eval` that set library options, read into those
// options and checked by the library, whose refusals are then usage errors
// in the flags' words: Taskset.run()'s (tasksetRunConfig; `eval FILE` and
// `eval harbor:PATH` both read them here), and the recording model proxy's
// (proxyConfig).

import {
  type TasksetRunConfig,
  tasksetRunConfig,
  type TasksetRunOptions,
} from "../eval/taskset.ts";
import type { OptionSpelling } from "../eval/_options.ts";
import type { ModelProxyOptions, ProxyConfig } from "../proxy/_config.ts";
import { decimalNumber, stringOption, UsageError, type Values } from "./_common.ts";

/**
 * The flags that set {@linkcode TasksetRunOptions} numbers: the option
 * each sets, the factor from its unit to the library's (seconds to ms),
 * and its default here where it is not the library's. Taskset's checks
 * refuse bad values, naming these flags (see {@linkcode runOptions}).
 * A new numeric flag of `eval` that sets an option is a line here (and
 * its parseArgs entry and help line in cli/eval.ts).
 */
const RUN_FLAGS: readonly {
  flag: string;
  option: keyof TasksetRunOptions;
  scale?: number;
  default?: number;
}[] = [
  { flag: "group", option: "group" },
  { flag: "max-concurrent", option: "maxConcurrent", default: 4 },
  { flag: "retries", option: "retries" },
  { flag: "token-limit", option: "tokenLimit" },
  { flag: "cost-limit", option: "costLimit" },
  { flag: "timeout", option: "rolloutTimeout", scale: 1000, default: 600 },
  { flag: "agent-timeout", option: "agentTimeout", scale: 1000 },
];

/**
 * The Taskset.run() options the flags set, checked by the library
 * ({@linkcode tasksetRunConfig}) in the flags' words: its refusal of
 * `group: 0` reads `--group must be a positive integer, got "0"`.
 * @throws {UsageError} for what the library refuses
 */
export function runOptions(
  values: Values,
): { options: TasksetRunOptions; config: TasksetRunConfig } {
  const options: Record<string, unknown> = {
    out: stringOption(values, "out"),
    resume: values.resume === true,
    force: values.force === true,
  };
  const flags: Record<string, string> = { out: "--out", resume: "--resume", force: "--force" };
  const texts: Record<string, string> = {};
  for (const { flag, option, scale = 1, default: fallback } of RUN_FLAGS) {
    flags[option] = `--${flag}`;
    const text = stringOption(values, flag);
    if (text !== undefined) texts[option] = text;
    const value = text === undefined ? fallback : decimalNumber(text);
    if (value !== undefined) options[option] = value * scale;
  }
  const spelling = flagSpelling(flags, texts);
  return asUsageError(() => ({ options, config: tasksetRunConfig(options, spelling) }));
}

/**
 * The spelling of a command line: `flags` names each option's flag,
 * `texts` holds the values as typed; durations in seconds.
 */
function flagSpelling(
  flags: Readonly<Record<string, string>>,
  texts: Readonly<Record<string, string>>,
): OptionSpelling {
  return {
    prefix: "",
    name: (option) => flags[option] ?? option,
    given: (option, value) => texts[option] ?? String(value),
    duration: (ms) => `${ms / 1000} s`,
  };
}

/** What `check` returns; what the library refuses in it (a RangeError or TypeError) as a usage error. */
function asUsageError<T>(check: () => T): T {
  try {
    return check();
  } catch (err) {
    if (err instanceof RangeError || err instanceof TypeError) throw new UsageError(err.message);
    throw err;
  }
}

/** The flags that set {@linkcode ModelProxyOptions}, and the option each sets. */
const PROXY_FLAGS: Readonly<Record<string, keyof ModelProxyOptions>> = {
  "model-proxy": "upstream",
  "model-server": "server",
  "proxy-model": "model",
};

/**
 * The recording model proxy's config that `--model-proxy URL` (with
 * `--model-server KIND` and `--proxy-model NAME`) asks for, checked by the
 * library (`proxyConfig()`) in the flags' words; `null` without
 * `--model-proxy`. Its module loads only then.
 * @throws {UsageError} for what the library refuses, or a proxy flag without `--model-proxy`
 */
export async function proxyOptions(values: Values): Promise<ProxyConfig | null> {
  const options: Record<string, string> = {};
  const flags: Record<string, string> = {};
  for (const [flag, option] of Object.entries(PROXY_FLAGS)) {
    flags[option] = `--${flag}`;
    const text = stringOption(values, flag);
    if (text !== undefined) options[option] = text;
  }
  if (options.upstream === undefined) {
    const stray = Object.keys(options)[0];
    if (stray !== undefined) throw new UsageError(`${flags[stray]} needs --model-proxy`);
    return null;
  }
  const { proxyConfig } = await import("../proxy/_config.ts");
  const spelling = flagSpelling(flags, options);
  return asUsageError(() => proxyConfig(options as unknown as ModelProxyOptions, spelling));
}
