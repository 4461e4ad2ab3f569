/**
 * The TOML 1.0 parser behind `parseToml()` (`toml.ts`): one pass over
 * the text, building the root table as it goes and checking the
 * specification's rules on keys, tables and values.
 *
 * @module
 */

import { setOwn } from "../schema.ts";
import { readDateTime, TomlDateTime } from "./toml_datetime.ts";
import { errorAt, type TomlTable, type TomlValue } from "./_toml_value.ts";

/** How a table came to be, for the specification's redefinition rules. */
interface TableMeta {
  /** Defined by a `[header]` (or is an element of an `[[array]]`). */
  header: boolean;
  /** The section whose dotted keys created or extended it, if any. */
  dotted: number | null;
}

const BARE_KEY = /[A-Za-z0-9_-]/;
const TOKEN = /[0-9A-Za-z_+\-.:]/;
const HEX_INT = /^0x[0-9A-Fa-f](?:_?[0-9A-Fa-f])*$/;
const OCT_INT = /^0o[0-7](?:_?[0-7])*$/;
const BIN_INT = /^0b[01](?:_?[01])*$/;
const DEC_INT = /^[+-]?(?:0|[1-9](?:_?\d)*)$/;
const FLOAT = /^[+-]?(?:0|[1-9](?:_?\d)*)(?:\.\d(?:_?\d)*)?(?:[eE][+-]?\d(?:_?\d)*)?$/;
const INT_MIN = -(2n ** 63n);
const INT_MAX = 2n ** 63n - 1n;

function isTable(v: unknown): v is TomlTable {
  return typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof TomlDateTime);
}

/** A character for a message: printable ones as a JSON string, others as U+XXXX. */
function show(ch: string): string {
  const cp = ch.codePointAt(0)!;
  return cp < 0x20 || cp === 0x7f || (cp >= 0x80 && cp <= 0x9f)
    ? `U+${cp.toString(16).toUpperCase().padStart(4, "0")}`
    : JSON.stringify(ch);
}

/** Whether a character may not appear raw in a comment or string (tab may). */
function isControl(ch: string): boolean {
  const c = ch.charCodeAt(0);
  return (c < 0x20 && c !== 0x09) || c === 0x7f;
}

function keyText(path: readonly string[]): string {
  return path.map((k) => (/^[A-Za-z0-9_-]+$/.test(k) ? k : JSON.stringify(k))).join(".");
}

/** Reads one document: `new Parser(text).parse()`. */
export class Parser {
  readonly #src: string;
  #pos = 0;
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
    this.#src = src;
    this.#current = this.#root;
    this.#meta.set(this.#root, { header: true, dotted: null });
  }

  // ------------------------------------------------------------- errors

  #fail(detail: string, at = this.#pos): never {
    throw errorAt(this.#src, at, detail);
  }

  #unexpected(what: string): never {
    const ch = this.#src[this.#pos];
    if (ch === undefined) this.#fail(`expected ${what}, got the end of the document`);
    if (ch === "\n" || (ch === "\r" && this.#src[this.#pos + 1] === "\n")) {
      this.#fail(`expected ${what}, got the end of the line`);
    }
    this.#fail(
      `expected ${what}, got ${show(String.fromCodePoint(this.#src.codePointAt(this.#pos)!))}`,
    );
  }

  // ---------------------------------------------------------- document

  parse(): TomlTable {
    const src = this.#src;
    if (src.charCodeAt(0) === 0xfeff) this.#pos = 1;
    while (this.#pos < src.length) {
      this.#skipWhitespace();
      const ch = src[this.#pos];
      if (ch === undefined) break;
      if (ch === "#" || ch === "\n" || ch === "\r") {
        this.#endOfLine();
        continue;
      }
      if (ch === "[") {
        if (src[this.#pos + 1] === "[") this.#tableArrayHeader();
        else this.#tableHeader();
      } else {
        const at = this.#pos;
        const key = this.#key();
        this.#skipWhitespace();
        if (src[this.#pos] !== "=") this.#unexpected(`"=" after the key ${keyText(key)}`);
        this.#pos++;
        this.#skipWhitespace();
        const value = this.#value();
        this.#assign(this.#current, this.#currentPath, key, value, this.#section, at);
      }
      this.#skipWhitespace();
      this.#endOfLine();
    }
    return this.#root;
  }

  #skipWhitespace(): void {
    const src = this.#src;
    while (src[this.#pos] === " " || src[this.#pos] === "\t") this.#pos++;
  }

  /** An optional comment, then a newline or the end. */
  #endOfLine(): void {
    const src = this.#src;
    if (src[this.#pos] === "#") {
      this.#pos++;
      while (this.#pos < src.length) {
        const ch = src[this.#pos];
        if (ch === "\n" || (ch === "\r" && src[this.#pos + 1] === "\n")) break;
        if (isControl(ch)) this.#fail(`${show(ch)} is not allowed in a comment`);
        this.#pos++;
      }
    }
    if (this.#pos >= src.length) return;
    if (src[this.#pos] === "\n") {
      this.#pos++;
      return;
    }
    if (src[this.#pos] === "\r" && src[this.#pos + 1] === "\n") {
      this.#pos += 2;
      return;
    }
    if (src[this.#pos] === "\r") this.#fail("a carriage return must be followed by a line feed");
    this.#unexpected("the end of the line");
  }

  /** Whitespace, comments and newlines, as arrays allow between values. */
  #skipBlank(): void {
    for (;;) {
      this.#skipWhitespace();
      const ch = this.#src[this.#pos];
      if (ch === "#" || ch === "\n" || ch === "\r") this.#endOfLine();
      else return;
    }
  }

  // ------------------------------------------------------------ tables

  #tableHeader(): void {
    const at = this.#pos;
    this.#pos++;
    this.#skipWhitespace();
    const path = this.#key();
    this.#skipWhitespace();
    if (this.#src[this.#pos] !== "]") this.#unexpected(`"]" to close the table header`);
    this.#pos++;
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
      if (meta.header) this.#fail(`table [${keyText(path)}] is defined twice`, at);
      if (meta.dotted !== null) {
        this.#fail(`table [${keyText(path)}] is already defined by dotted keys`, at);
      }
      meta.header = true;
      table = existing;
    } else {
      this.#fail(`cannot define table [${keyText(path)}]: it is ${this.#kindOf(existing)}`, at);
    }
    this.#enter(table, path);
  }

  #tableArrayHeader(): void {
    const at = this.#pos;
    this.#pos += 2;
    this.#skipWhitespace();
    const path = this.#key();
    this.#skipWhitespace();
    if (this.#src[this.#pos] !== "]" || this.#src[this.#pos + 1] !== "]") {
      this.#unexpected(`"]]" to close the array of tables header`);
    }
    this.#pos += 2;
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
      this.#fail(
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
        this.#fail(
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
        this.#fail(`cannot set ${keyText(key)}: ${here()} is ${this.#kindOf(existing)}`, at);
      }
      const meta = this.#meta.get(existing)!;
      if (meta.header) {
        this.#fail(
          `cannot set ${
            keyText(key)
          }: table [${here()}] is defined by a header, not by dotted keys`,
          at,
        );
      }
      if (meta.dotted !== null && meta.dotted !== section) {
        this.#fail(
          `cannot set ${keyText(key)}: table ${here()} was defined in another section`,
          at,
        );
      }
      meta.dotted = section;
      t = existing;
    }
    const last = key[key.length - 1];
    if (Object.hasOwn(t, last)) this.#fail(`duplicate key ${keyText([...base, ...key])}`, at);
    setOwn(t, last, value);
  }

  // -------------------------------------------------------------- keys

  #key(): string[] {
    const parts = [this.#simpleKey()];
    for (;;) {
      const save = this.#pos;
      this.#skipWhitespace();
      if (this.#src[this.#pos] !== ".") {
        this.#pos = save;
        return parts;
      }
      this.#pos++;
      this.#skipWhitespace();
      parts.push(this.#simpleKey());
    }
  }

  #simpleKey(): string {
    const src = this.#src;
    const ch = src[this.#pos];
    if (ch === '"') {
      if (src.startsWith('"""', this.#pos)) this.#fail("a key cannot be a multi-line string");
      return this.#basicString();
    }
    if (ch === "'") {
      if (src.startsWith("'''", this.#pos)) this.#fail("a key cannot be a multi-line string");
      return this.#literalString();
    }
    const start = this.#pos;
    while (this.#pos < src.length && BARE_KEY.test(src[this.#pos])) this.#pos++;
    if (this.#pos === start) this.#unexpected("a key");
    return src.slice(start, this.#pos);
  }

  // ------------------------------------------------------------ values

  #value(): TomlValue {
    const src = this.#src;
    const ch = src[this.#pos];
    switch (ch) {
      case '"':
        return src.startsWith('"""', this.#pos)
          ? this.#multilineBasicString()
          : this.#basicString();
      case "'":
        return src.startsWith("'''", this.#pos)
          ? this.#multilineLiteralString()
          : this.#literalString();
      case "[":
        return this.#array();
      case "{":
        return this.#inlineTable();
      case "t":
        if (src.startsWith("true", this.#pos)) {
          this.#pos += 4;
          return true;
        }
        break;
      case "f":
        if (src.startsWith("false", this.#pos)) {
          this.#pos += 5;
          return false;
        }
        break;
    }
    if (ch !== undefined && TOKEN.test(ch)) return this.#scalar();
    this.#unexpected("a value");
  }

  /** A number, date or time: one token (a date and a time may be spaced). */
  #scalar(): TomlValue {
    const src = this.#src;
    const start = this.#pos;
    while (this.#pos < src.length && TOKEN.test(src[this.#pos])) this.#pos++;
    if (
      src[this.#pos] === " " && /^\d{4}-\d{2}-\d{2}$/.test(src.slice(start, this.#pos)) &&
      /^\d{2}:/.test(src.slice(this.#pos + 1, this.#pos + 4))
    ) {
      this.#pos++;
      while (this.#pos < src.length && TOKEN.test(src[this.#pos])) this.#pos++;
    }
    const text = src.slice(start, this.#pos);
    if (DEC_INT.test(text) || HEX_INT.test(text) || OCT_INT.test(text) || BIN_INT.test(text)) {
      const n = BigInt(text.replaceAll("_", ""));
      if (n < INT_MIN || n > INT_MAX) this.#fail(`integer ${text} does not fit in 64 bits`, start);
      return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER)
        ? Number(n)
        : n;
    }
    if (FLOAT.test(text)) return Number(text.replaceAll("_", ""));
    if (/^[+-]?inf$/.test(text)) return text[0] === "-" ? -Infinity : Infinity;
    if (/^[+-]?nan$/.test(text)) return NaN;
    if (/^\d{4}-|^\d{2}:/.test(text)) {
      const read = readDateTime(text);
      if (typeof read === "string") this.#fail(`invalid date-time ${text}: ${read}`, start);
      return new TomlDateTime(text);
    }
    this.#fail(`invalid value ${JSON.stringify(text)}`, start);
  }

  #array(): TomlValue[] {
    const array: TomlValue[] = [];
    this.#pos++;
    for (;;) {
      this.#skipBlank();
      if (this.#src[this.#pos] === "]") break;
      array.push(this.#value());
      this.#skipBlank();
      if (this.#src[this.#pos] === ",") {
        this.#pos++;
        continue;
      }
      if (this.#src[this.#pos] === "]") break;
      this.#unexpected(`"," or "]" in the array`);
    }
    this.#pos++;
    this.#frozen.add(array);
    return array;
  }

  #inlineTable(): TomlTable {
    const table: TomlTable = {};
    this.#meta.set(table, { header: false, dotted: null });
    const section = --this.#inlineIds;
    const src = this.#src;
    this.#pos++;
    this.#skipWhitespace();
    if (src[this.#pos] === "}") {
      this.#pos++;
      this.#frozen.add(table);
      return table;
    }
    for (;;) {
      this.#skipWhitespace();
      if (src[this.#pos] === "}") this.#fail("a trailing comma is not allowed in an inline table");
      if (src[this.#pos] === "\n" || src[this.#pos] === "\r") {
        this.#fail("an inline table must be on one line");
      }
      const at = this.#pos;
      const key = this.#key();
      this.#skipWhitespace();
      if (src[this.#pos] !== "=") this.#unexpected(`"=" after the key ${keyText(key)}`);
      this.#pos++;
      this.#skipWhitespace();
      const value = this.#value();
      this.#assign(table, [], key, value, section, at);
      this.#skipWhitespace();
      if (src[this.#pos] === ",") {
        this.#pos++;
        continue;
      }
      if (src[this.#pos] === "}") break;
      if (src[this.#pos] === "\n" || src[this.#pos] === "\r") {
        this.#fail("an inline table must be on one line");
      }
      this.#unexpected(`"," or "}" in the inline table`);
    }
    this.#pos++;
    this.#frozen.add(table);
    return table;
  }

  // ----------------------------------------------------------- strings

  #basicString(): string {
    const src = this.#src;
    this.#pos++;
    let out = "";
    let start = this.#pos;
    for (;;) {
      const ch = src[this.#pos];
      if (ch === undefined) this.#fail("unterminated string");
      if (ch === '"') {
        out += src.slice(start, this.#pos);
        this.#pos++;
        return out;
      }
      if (ch === "\\") {
        out += src.slice(start, this.#pos) + this.#escape();
        start = this.#pos;
        continue;
      }
      if (ch === "\n" || ch === "\r") this.#fail("a newline is not allowed in a one-line string");
      if (isControl(ch)) this.#fail(`${show(ch)} must be escaped in a string`);
      this.#pos++;
    }
  }

  #multilineBasicString(): string {
    const src = this.#src;
    this.#pos += 3;
    this.#skipFirstNewline();
    let out = "";
    for (;;) {
      const ch = src[this.#pos];
      if (ch === undefined) this.#fail("unterminated multi-line string");
      if (ch === '"') {
        const run = this.#quoteRun('"');
        out += run.text;
        if (run.closed) return out;
        continue;
      }
      if (ch === "\\") {
        const next = src[this.#pos + 1];
        if (next === " " || next === "\t" || next === "\n" || next === "\r") {
          // A line-ending backslash trims the newline and the whitespace after it.
          let i = this.#pos + 1;
          while (src[i] === " " || src[i] === "\t") i++;
          if (src[i] !== "\n" && !(src[i] === "\r" && src[i + 1] === "\n")) {
            this.#fail("only a line ending may follow a backslash and whitespace");
          }
          this.#pos = i;
          while (
            src[this.#pos] === " " || src[this.#pos] === "\t" || src[this.#pos] === "\n" ||
            (src[this.#pos] === "\r" && src[this.#pos + 1] === "\n")
          ) this.#pos++;
          continue;
        }
        out += this.#escape();
        continue;
      }
      out += this.#multilineChar(ch);
    }
  }

  #multilineLiteralString(): string {
    const src = this.#src;
    this.#pos += 3;
    this.#skipFirstNewline();
    let out = "";
    for (;;) {
      const ch = src[this.#pos];
      if (ch === undefined) this.#fail("unterminated multi-line string");
      if (ch === "'") {
        const run = this.#quoteRun("'");
        out += run.text;
        if (run.closed) return out;
        continue;
      }
      out += this.#multilineChar(ch);
    }
  }

  /**
   * At a run of quote characters in a multi-line string: fewer than three
   * are content; three to five close it, the extra ones being content; six
   * or more are an error.
   */
  #quoteRun(q: string): { text: string; closed: boolean } {
    const src = this.#src;
    let n = 0;
    while (src[this.#pos + n] === q) n++;
    if (n > 5) this.#fail(`${n} quotes in a row cannot end a multi-line string`, this.#pos + 5);
    this.#pos += n;
    return n < 3 ? { text: q.repeat(n), closed: false } : { text: q.repeat(n - 3), closed: true };
  }

  /** One character of a multi-line string's content (CRLF becomes LF). */
  #multilineChar(ch: string): string {
    const src = this.#src;
    if (ch === "\r") {
      if (src[this.#pos + 1] !== "\n") {
        this.#fail("a carriage return must be followed by a line feed");
      }
      this.#pos += 2;
      return "\n";
    }
    if (ch !== "\n" && isControl(ch)) this.#fail(`${show(ch)} must be escaped in a string`);
    this.#pos++;
    return ch;
  }

  #skipFirstNewline(): void {
    const src = this.#src;
    if (src[this.#pos] === "\n") this.#pos++;
    else if (src[this.#pos] === "\r" && src[this.#pos + 1] === "\n") this.#pos += 2;
  }

  #literalString(): string {
    const src = this.#src;
    this.#pos++;
    const start = this.#pos;
    for (;;) {
      const ch = src[this.#pos];
      if (ch === undefined) this.#fail("unterminated string");
      if (ch === "'") {
        this.#pos++;
        return src.slice(start, this.#pos - 1);
      }
      if (ch === "\n" || ch === "\r") this.#fail("a newline is not allowed in a one-line string");
      if (isControl(ch)) this.#fail(`${show(ch)} is not allowed in a literal string`);
      this.#pos++;
    }
  }

  /** At a backslash in a basic string: the character it stands for. */
  #escape(): string {
    const src = this.#src;
    const at = this.#pos;
    const ch = src[this.#pos + 1];
    this.#pos += 2;
    switch (ch) {
      case "b":
        return "\b";
      case "t":
        return "\t";
      case "n":
        return "\n";
      case "f":
        return "\f";
      case "r":
        return "\r";
      case '"':
        return '"';
      case "\\":
        return "\\";
      case "u":
      case "U": {
        const size = ch === "u" ? 4 : 8;
        const hex = src.slice(this.#pos, this.#pos + size);
        if (!new RegExp(`^[0-9A-Fa-f]{${size}}$`).test(hex)) {
          this.#fail(`\\${ch} needs ${size} hexadecimal digits`, at);
        }
        const cp = parseInt(hex, 16);
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
          this.#fail(`\\${ch}${hex} is not a Unicode scalar value`, at);
        }
        this.#pos += size;
        return String.fromCodePoint(cp);
      }
      case undefined:
        this.#fail("unterminated string", at);
    }
    this.#fail(`invalid escape \\${ch}`, at);
  }
}
