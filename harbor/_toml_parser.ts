/**
 * The TOML 1.0 parser behind `parseToml()` (`toml.ts`): one pass over
 * the text, building the root table as it goes and checking the
 * specification's rules on keys, tables and values. The tokens (keys,
 * strings, numbers, dates) come from {@linkcode TomlLexer}; this file
 * holds the structure: headers, dotted keys, arrays, inline tables.
 *
 * @module
 */

import { setOwn } from "../schema.ts";
import { TomlDateTime } from "./toml_datetime.ts";
import type { TomlTable, TomlValue } from "./_toml_value.ts";
import { keyText, TomlLexer } from "./_toml_lexer.ts";

/** How a table came to be, for the specification's redefinition rules. */
interface TableMeta {
  /** Defined by a `[header]` (or is an element of an `[[array]]`). */
  header: boolean;
  /** The section whose dotted keys created or extended it, if any. */
  dotted: number | null;
}

function isTable(v: unknown): v is TomlTable {
  return typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof TomlDateTime);
}

/** Reads one document: `new Parser(text).parse()`. */
export class Parser {
  readonly #lex: TomlLexer;
  readonly #root: TomlTable = {};
  #current: TomlTable;
  #currentPath: string[] = [];
  #section = 0;
  #inlineIds = 0;
  readonly #meta = new WeakMap<TomlTable, TableMeta>();
  /** Inline tables and static arrays: nothing may be added to them. */
  readonly #frozen = new WeakSet<object>();
  /** Arrays made by `[[header]]`s. */
  readonly #tableArrays = new WeakSet<TomlValue[]>();

  constructor(src: string) {
    this.#lex = new TomlLexer(src);
    this.#current = this.#root;
    this.#meta.set(this.#root, { header: true, dotted: null });
  }

  // ---------------------------------------------------------- document

  parse(): TomlTable {
    const lex: TomlLexer = this.#lex;
    while (!lex.done) {
      lex.skipWhitespace();
      const ch = lex.peek();
      if (ch === undefined) break;
      if (ch === "#" || ch === "\n" || ch === "\r") {
        lex.endOfLine();
        continue;
      }
      if (ch === "[") {
        if (lex.peek(1) === "[") this.#tableArrayHeader();
        else this.#tableHeader();
      } else {
        this.#keyValue(this.#current, this.#currentPath, this.#section);
      }
      lex.skipWhitespace();
      lex.endOfLine();
    }
    return this.#root;
  }

  /** `key = value`, set in `table` (at `base`) as a line of `section`. */
  #keyValue(table: TomlTable, base: string[], section: number): void {
    const lex: TomlLexer = this.#lex;
    const at = lex.pos;
    const key = lex.key();
    lex.skipWhitespace();
    lex.expect("=", `"=" after the key ${keyText(key)}`);
    lex.skipWhitespace();
    const value = this.#value();
    this.#assign(table, base, key, value, section, at);
  }

  // ------------------------------------------------------------ tables

  #tableHeader(): void {
    const lex: TomlLexer = this.#lex;
    const at = lex.pos;
    lex.skip();
    lex.skipWhitespace();
    const path = lex.key();
    lex.skipWhitespace();
    lex.expect("]", `"]" to close the table header`);
    const parent = this.#navigate(path.slice(0, -1), at);
    const last = path[path.length - 1];
    const existing = Object.hasOwn(parent, last) ? parent[last] : undefined;
    let table: TomlTable;
    if (existing === undefined) {
      table = {};
      this.#meta.set(table, { header: true, dotted: null });
      setOwn(parent, last, table);
    } else if (isTable(existing) && !this.#frozen.has(existing)) {
      const meta = this.#meta.get(existing)!;
      if (meta.header) lex.fail(`table [${keyText(path)}] is defined twice`, at);
      if (meta.dotted !== null) {
        lex.fail(`table [${keyText(path)}] is already defined by dotted keys`, at);
      }
      meta.header = true;
      table = existing;
    } else {
      lex.fail(`cannot define table [${keyText(path)}]: it is ${this.#kindOf(existing)}`, at);
    }
    this.#enter(table, path);
  }

  #tableArrayHeader(): void {
    const lex: TomlLexer = this.#lex;
    const at = lex.pos;
    lex.skip(2);
    lex.skipWhitespace();
    const path = lex.key();
    lex.skipWhitespace();
    lex.expect("]]", `"]]" to close the array of tables header`);
    const parent = this.#navigate(path.slice(0, -1), at);
    const last = path[path.length - 1];
    const existing = Object.hasOwn(parent, last) ? parent[last] : undefined;
    const element: TomlTable = {};
    this.#meta.set(element, { header: true, dotted: null });
    if (existing === undefined) {
      const array: TomlValue[] = [element];
      this.#tableArrays.add(array);
      setOwn(parent, last, array);
    } else if (Array.isArray(existing) && this.#tableArrays.has(existing)) {
      existing.push(element);
    } else {
      lex.fail(
        `cannot define array of tables [[${keyText(path)}]]: it is ${this.#kindOf(existing)}`,
        at,
      );
    }
    this.#enter(element, path);
  }

  #enter(table: TomlTable, path: string[]): void {
    this.#current = table;
    this.#currentPath = path;
    this.#section++;
  }

  /** What `value` is, for messages: "an inline table", "a string"... */
  #kindOf(value: TomlValue | undefined): string {
    if (isTable(value)) return this.#frozen.has(value) ? "an inline table" : "a table";
    if (Array.isArray(value)) {
      return this.#tableArrays.has(value) ? "an array of tables" : "an array";
    }
    if (value instanceof TomlDateTime) return "a date-time";
    return typeof value === "string"
      ? "a string"
      : typeof value === "boolean"
      ? "a boolean"
      : "a number";
  }

  /** Walks a header's leading keys, creating implicit tables. */
  #navigate(path: string[], at: number): TomlTable {
    let table = this.#root;
    for (let i = 0; i < path.length; i++) {
      const key = path[i];
      const existing = Object.hasOwn(table, key) ? table[key] : undefined;
      if (existing === undefined) {
        const created: TomlTable = {};
        this.#meta.set(created, { header: false, dotted: null });
        setOwn(table, key, created);
        table = created;
      } else if (isTable(existing) && !this.#frozen.has(existing)) {
        table = existing;
      } else if (Array.isArray(existing) && this.#tableArrays.has(existing)) {
        table = existing[existing.length - 1] as TomlTable;
      } else {
        this.#lex.fail(
          `cannot define a table under ${keyText(path.slice(0, i + 1))}: it is ${
            this.#kindOf(existing)
          }`,
          at,
        );
      }
    }
    return table;
  }

  /**
   * Sets `key` (dotted, relative to `table` at `base`) to `value`, with the
   * rules for dotted keys: they may create and extend tables of their own
   * section, never one a header defined or an inline table.
   */
  #assign(
    table: TomlTable,
    base: string[],
    key: string[],
    value: TomlValue,
    section: number,
    at: number,
  ): void {
    let t = table;
    for (let i = 0; i < key.length - 1; i++) {
      const part = key[i];
      const existing = Object.hasOwn(t, part) ? t[part] : undefined;
      const here = () => keyText([...base, ...key.slice(0, i + 1)]);
      if (existing === undefined) {
        const created: TomlTable = {};
        this.#meta.set(created, { header: false, dotted: section });
        setOwn(t, part, created);
        t = created;
        continue;
      }
      if (!isTable(existing) || this.#frozen.has(existing)) {
        this.#lex.fail(`cannot set ${keyText(key)}: ${here()} is ${this.#kindOf(existing)}`, at);
      }
      const meta = this.#meta.get(existing)!;
      if (meta.header) {
        this.#lex.fail(
          `cannot set ${
            keyText(key)
          }: table [${here()}] is defined by a header, not by dotted keys`,
          at,
        );
      }
      if (meta.dotted !== null && meta.dotted !== section) {
        this.#lex.fail(
          `cannot set ${keyText(key)}: table ${here()} was defined in another section`,
          at,
        );
      }
      meta.dotted = section;
      t = existing;
    }
    const last = key[key.length - 1];
    if (Object.hasOwn(t, last)) this.#lex.fail(`duplicate key ${keyText([...base, ...key])}`, at);
    setOwn(t, last, value);
  }

  // ------------------------------------------------------------ values

  #value(): TomlValue {
    const ch = this.#lex.peek();
    if (ch === "[") return this.#array();
    if (ch === "{") return this.#inlineTable();
    return this.#lex.atom();
  }

  #array(): TomlValue[] {
    const lex: TomlLexer = this.#lex;
    const array: TomlValue[] = [];
    lex.skip();
    for (;;) {
      lex.skipBlank();
      if (lex.peek() === "]") break;
      array.push(this.#value());
      lex.skipBlank();
      if (lex.peek() === ",") {
        lex.skip();
        continue;
      }
      if (lex.peek() === "]") break;
      lex.unexpected(`"," or "]" in the array`);
    }
    lex.skip();
    this.#frozen.add(array);
    return array;
  }

  #inlineTable(): TomlTable {
    const lex: TomlLexer = this.#lex;
    const table: TomlTable = {};
    this.#meta.set(table, { header: false, dotted: null });
    const section = --this.#inlineIds;
    lex.skip();
    lex.skipWhitespace();
    if (lex.peek() === "}") {
      lex.skip();
      this.#frozen.add(table);
      return table;
    }
    const oneLine = () => {
      if (lex.peek() === "\n" || lex.peek() === "\r") {
        lex.fail("an inline table must be on one line");
      }
    };
    for (;;) {
      lex.skipWhitespace();
      if (lex.peek() === "}") lex.fail("a trailing comma is not allowed in an inline table");
      oneLine();
      this.#keyValue(table, [], section);
      lex.skipWhitespace();
      if (lex.peek() === ",") {
        lex.skip();
        continue;
      }
      if (lex.peek() === "}") break;
      oneLine();
      lex.unexpected(`"," or "}" in the inline table`);
    }
    lex.skip();
    this.#frozen.add(table);
    return table;
  }
}
