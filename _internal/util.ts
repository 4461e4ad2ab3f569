// Small checks shared across the SDK.

/** Whether `v` is a plain JSON object (not null, not an array). */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The message of an error, or the value as text. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * A variable of this process's environment, or undefined when it is unset
 * or may not be read (no `--allow-env`).
 */
export function readEnv(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

/** `err` itself when it is an Error, else an Error whose message is the value as text. */
export function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}

/**
 * Refuses options under names they had before 0.1.0 renamed them
 * (`timeoutMs` is `timeout` now): a caller the type checker does not see
 * would otherwise have the option ignored without a word.
 * @param verb what was being done, for the message: `run in workspace "shell"`
 * @param options the options object given
 * @param renamed old name to new name
 * @throws {TypeError} `Cannot <verb>: option "timeoutMs" is now "timeout"`
 */
export function refuseRenamed(
  verb: string,
  options: object | undefined,
  renamed: Readonly<Record<string, string>>,
): void {
  if (typeof options !== "object" || options === null) return;
  for (const [old, now] of Object.entries(renamed)) {
    if (Object.hasOwn(options, old)) {
      throw new TypeError(`Cannot ${verb}: option "${old}" is now "${now}"`);
    }
  }
}
