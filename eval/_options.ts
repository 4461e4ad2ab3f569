// How the evaluation layer refuses an option: every check of rollout()'s
// and Taskset.run()'s options is written once, in their modules, in terms
// of an OptionSpelling. The library's own spelling names the options as
// their objects do (`agentTimeout (9000 ms)`); a command line passes its own
// (`--agent-timeout (9 s)`), so that the library's check is the one its
// usage error reports, in the words of the flags the user typed.

/** How a refused option is named in its message. */
export interface OptionSpelling {
  /** What each message starts with: `Cannot run taskset: `, or nothing. */
  readonly prefix: string;
  /** The option's name: `agentTimeout`, or a flag such as `--agent-timeout`. */
  name(option: string): string;
  /** The value as the caller gave it, for `got "..."`. */
  given(option: string, value: unknown): string;
  /** A duration in milliseconds, in the caller's unit: `9000 ms`, or `9 s`. */
  duration(ms: number): string;
}

/** The library's spelling: the options' own names, durations in ms, after `prefix: `. */
export function optionSpelling(prefix: string): OptionSpelling {
  return {
    prefix: `${prefix}: `,
    name: (option) => option,
    given: (_option, value) => String(value),
    duration: (ms) => `${ms} ms`,
  };
}

/** Refuses `value` unless it is an integer of at least 1. */
export function checkPositiveInteger(s: OptionSpelling, option: string, value: number): void {
  if (!Number.isInteger(value) || value < 1) {
    throw new RangeError(
      `${s.prefix}${s.name(option)} must be a positive integer, got "${s.given(option, value)}"`,
    );
  }
}

/** Refuses `value` unless it is a number above 0 (`undefined` passes: not set). */
export function checkPositive(s: OptionSpelling, option: string, value: number | undefined): void {
  if (value !== undefined && !(value > 0)) {
    throw new RangeError(
      `${s.prefix}${s.name(option)} must be a positive number, got "${s.given(option, value)}"`,
    );
  }
}

/** Refuses `option` set without `needed` (both booleans or values; set means not undefined/false). */
export function checkNeeds(
  s: OptionSpelling,
  option: string,
  set: boolean,
  needed: string,
  present: boolean,
): void {
  if (set && !present) throw new TypeError(`${s.prefix}${s.name(option)} needs ${s.name(needed)}`);
}
