/**
 * What the TOML reader (`toml.ts`) gives and throws: values, tables and
 * {@linkcode TomlSyntaxError}, which names the line and column.
 *
 * @module
 */

import type { TomlDateTime } from "./toml_datetime.ts";

/** A TOML value as this reader gives it. */
export type TomlValue =
  | string
  | number
  | bigint
  | boolean
  | TomlDateTime
  | TomlValue[]
  | TomlTable;

/** A TOML table: a plain object. */
export interface TomlTable {
  /** Each key's value. */
  [key: string]: TomlValue;
}

/** A TOML syntax error, with the 1-based line and column where it was found. */
export class TomlSyntaxError extends SyntaxError {
  /** The line, from 1. */
  readonly line: number;
  /** The column, in characters, from 1. */
  readonly column: number;

  /** Makes one: `Cannot parse TOML: line L, column C: detail`. */
  constructor(detail: string, line: number, column: number) {
    super(`Cannot parse TOML: line ${line}, column ${column}: ${detail}`);
    this.name = "TomlSyntaxError";
    this.line = line;
    this.column = column;
  }
}

/** An error at offset `at` of `text`; columns count code points, not UTF-16 units. */
export function errorAt(text: string, at: number, detail: string): TomlSyntaxError {
  const before = text.slice(0, at);
  const line = before.split("\n").length;
  const column = [...before.slice(before.lastIndexOf("\n") + 1)].length + 1;
  return new TomlSyntaxError(detail, line, column);
}
