/**
 * A TOML 1.0 reader, for Harbor's `task.toml`: tables, arrays of tables,
 * dotted keys, every kind of string and escape, integers in all bases,
 * floats (`inf` and `nan` too), booleans, offset and local date-times,
 * dates, times, arrays and inline tables. Duplicate keys and table
 * redefinitions are refused as the specification says. An error names the
 * line and column: `Cannot parse TOML: line 3, column 7: ...`.
 *
 * Integers come out as numbers when they fit a double exactly, as `bigint`
 * beyond ±2^53 − 1; date-times as {@linkcode TomlDateTime}.
 *
 * @example
 * ```ts
 * import { parseToml } from "./toml.ts";
 * import assert from "node:assert/strict";
 *
 * const task = parseToml(`
 * version = "1.0"
 * [agent]
 * timeout_sec = 600.0
 * [environment]
 * cpus = 2
 * allow_internet = false
 * `);
 * assert.deepEqual(task, {
 *   version: "1.0",
 *   agent: { timeout_sec: 600 },
 *   environment: { cpus: 2, allow_internet: false },
 * });
 * ```
 *
 * @module
 */

import { Parser } from "./_toml_parser.ts";
import { errorAt, type TomlTable } from "./_toml_value.ts";

export { TomlSyntaxError, type TomlTable, type TomlValue } from "./_toml_value.ts";

/** The offset of the first byte that breaks UTF-8 in `bytes`, or -1. */
function firstBadUtf8(bytes: Uint8Array): number {
  for (let i = 0; i < bytes.length;) {
    const b = bytes[i];
    let n: number, min: number;
    if (b < 0x80) {
      i++;
      continue;
    } else if (b >= 0xc2 && b <= 0xdf) [n, min] = [1, 0x80];
    else if (b >= 0xe0 && b <= 0xef) [n, min] = [2, 0x800];
    else if (b >= 0xf0 && b <= 0xf4) [n, min] = [3, 0x10000];
    else return i;
    let cp = b & (0x3f >> n);
    for (let k = 1; k <= n; k++) {
      const c = bytes[i + k];
      if (c === undefined || (c & 0xc0) !== 0x80) return i;
      cp = (cp << 6) | (c & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += n + 1;
  }
  return -1;
}

/**
 * Reads a TOML document.
 *
 * @param source the text, or its UTF-8 bytes (a leading byte order mark is skipped)
 * @returns the document's root table
 * @throws {TomlSyntaxError} for a document that is not TOML 1.0, naming the line and column
 * @throws {TypeError} when `source` is neither a string nor bytes
 *
 * @example Errors name the line and column
 * ```ts
 * import { parseToml } from "./toml.ts";
 * import assert from "node:assert/strict";
 *
 * assert.throws(
 *   () => parseToml("[agent]\ntimeout_sec = 1\ntimeout_sec = 2\n"),
 *   { message: "Cannot parse TOML: line 3, column 1: duplicate key agent.timeout_sec" },
 * );
 * ```
 */
export function parseToml(source: string | Uint8Array): TomlTable {
  let text: string;
  if (typeof source === "string") {
    text = source;
    if (!text.isWellFormed()) {
      const at = text.search(/\p{Cs}/u);
      throw errorAt(text, at, "a lone surrogate is not Unicode");
    }
  } else if (source instanceof Uint8Array) {
    const bad = firstBadUtf8(source);
    if (bad >= 0) {
      const before = new TextDecoder().decode(source.subarray(0, bad));
      throw errorAt(before, before.length, "the document is not valid UTF-8");
    }
    text = new TextDecoder().decode(source);
  } else {
    throw new TypeError(`Cannot parse TOML: expected a string or bytes, got ${typeof source}`);
  }
  return new Parser(text).parse();
}
