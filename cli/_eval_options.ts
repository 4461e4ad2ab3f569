// The flags of `hud eval` that set Taskset.run() options, read into those
// options and checked by the library (tasksetRunConfig), whose refusals are
// then usage errors in the flags' words. `eval FILE` and `eval harbor:PATH`
// both read them here.

import {
  type TasksetRunConfig,
  tasksetRunConfig,
  type TasksetRunOptions,
} from "../eval/taskset.ts";
import type { OptionSpelling } from "../eval/_options.ts";
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
  const spelling: OptionSpelling = {
    prefix: "",
    name: (option) => flags[option] ?? option,
    given: (option, value) => texts[option] ?? String(value),
    duration: (ms) => `${ms / 1000} s`,
  };
  try {
    return { options, config: tasksetRunConfig(options, spelling) };
  } catch (err) {
    if (err instanceof RangeError || err instanceof TypeError) throw new UsageError(err.message);
    throw err;
  }
}
