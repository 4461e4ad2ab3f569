// The lexical half of the TOML parser (`_toml_parser.ts`): a position in
// the text, and the tokens read there (whitespace and comments, keys,
// strings with their escapes, numbers, booleans, dates and times), each
// checked against the specification as it is read. The parser builds the
// tables from them.

import { readDateTime, TomlDateTime } from "./toml_datetime.ts";
import { errorAt, type TomlValue } from "./_toml_value.ts";

const BARE_KEY = /[A-Za-z0-9_-]/;
const TOKEN = /[0-9A-Za-z_+\-.:]/;
const HEX_INT = /^0x[0-9A-Fa-f](?:_?[0-9A-Fa-f])*$/;
const OCT_INT = /^0o[0-7](?:_?[0-7])*$/;
const BIN_INT = /^0b[01](?:_?[01])*$/;
const DEC_INT = /^[+-]?(?:0|[1-9](?:_?\d)*)$/;
const FLOAT = /^[+-]?(?:0|[1-9](?:_?\d)*)(?:\.\d(?:_?\d)*)?(?:[eE][+-]?\d(?:_?\d)*)?$/;
const INT_MIN = -(2n ** 63n);
const INT_MAX = 2n ** 63n - 1n;

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

/** A key path as TOML writes it, for messages: `a."b c".d`. */
export function keyText(path: readonly string[]): string {
  return path.map((k) => (/^[A-Za-z0-9_-]+$/.test(k) ? k : JSON.stringify(k))).join(".");
}

/** Reads the tokens of one document, from its start (past a byte order mark). */
export class TomlLexer {
  readonly #src: string;
  #pos = 0;

  constructor(src: string) {
    this.#src = src;
    if (src.charCodeAt(0) === 0xfeff) this.#pos = 1;
  }

  /** Where the next token starts. */
  get pos(): number {
    return this.#pos;
  }

  /** Whether the whole text is read. */
  get done(): boolean {
    return this.#pos >= this.#src.length;
  }

  /** The character `offset` after the position, or `undefined` past the end. */
  peek(offset = 0): string | undefined {
    return this.#src[this.#pos + offset];
  }

  /** Whether the text at the position starts with `text`. */
  at(text: string): boolean {
    return this.#src.startsWith(text, this.#pos);
  }

  /** Moves past `n` characters. */
  skip(n = 1): void {
    this.#pos += n;
  }

  /**
   * Moves past `text`, or fails saying that `what` was expected there.
   * @throws {TomlSyntaxError} when the text is not there
   */
  expect(text: string, what: string): void {
    if (!this.at(text)) this.unexpected(what);
    this.#pos += text.length;
  }

  /** A string, boolean, number or date-time, by its first character. */
  atom(): TomlValue {
    const ch = this.#src[this.#pos];
    if (ch === '"') return this.at('"""') ? this.#multilineBasicString() : this.#basicString();
    if (ch === "'") {
      return this.at("'''") ? this.#multilineLiteralString() : this.#literalString();
    }
    if (this.at("true")) {
      this.#pos += 4;
      return true;
    }
    if (this.at("false")) {
      this.#pos += 5;
      return false;
    }
    if (ch !== undefined && TOKEN.test(ch)) return this.#scalar();
    this.unexpected("a value");
  }

  // ------------------------------------------------------------- errors

  fail(detail: string, at = this.#pos): never {
    throw errorAt(this.#src, at, detail);
  }

  unexpected(what: string): never {
    const ch = this.#src[this.#pos];
    if (ch === undefined) this.fail(`expected ${what}, got the end of the document`);
    if (ch === "\n" || (ch === "\r" && this.#src[this.#pos + 1] === "\n")) {
      this.fail(`expected ${what}, got the end of the line`);
    }
    this.fail(
      `expected ${what}, got ${show(String.fromCodePoint(this.#src.codePointAt(this.#pos)!))}`,
    );
  }

  skipWhitespace(): void {
    const src = this.#src;
    while (src[this.#pos] === " " || src[this.#pos] === "\t") this.#pos++;
  }

  /** An optional comment, then a newline or the end. */
  endOfLine(): void {
    const src = this.#src;
    if (src[this.#pos] === "#") {
      this.#pos++;
      while (this.#pos < src.length) {
        const ch = src[this.#pos];
        if (ch === "\n" || (ch === "\r" && src[this.#pos + 1] === "\n")) break;
        if (isControl(ch)) this.fail(`${show(ch)} is not allowed in a comment`);
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
    if (src[this.#pos] === "\r") this.fail("a carriage return must be followed by a line feed");
    this.unexpected("the end of the line");
  }

  /** Whitespace, comments and newlines, as arrays allow between values. */
  skipBlank(): void {
    for (;;) {
      this.skipWhitespace();
      const ch = this.#src[this.#pos];
      if (ch === "#" || ch === "\n" || ch === "\r") this.endOfLine();
      else return;
    }
  }

  // -------------------------------------------------------------- keys

  key(): string[] {
    const parts = [this.#simpleKey()];
    for (;;) {
      const save = this.#pos;
      this.skipWhitespace();
      if (this.#src[this.#pos] !== ".") {
        this.#pos = save;
        return parts;
      }
      this.#pos++;
      this.skipWhitespace();
      parts.push(this.#simpleKey());
    }
  }

  #simpleKey(): string {
    const src = this.#src;
    const ch = src[this.#pos];
    if (ch === '"') {
      if (src.startsWith('"""', this.#pos)) this.fail("a key cannot be a multi-line string");
      return this.#basicString();
    }
    if (ch === "'") {
      if (src.startsWith("'''", this.#pos)) this.fail("a key cannot be a multi-line string");
      return this.#literalString();
    }
    const start = this.#pos;
    while (this.#pos < src.length && BARE_KEY.test(src[this.#pos])) this.#pos++;
    if (this.#pos === start) this.unexpected("a key");
    return src.slice(start, this.#pos);
  }

  // ----------------------------------------------------- numbers, dates

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
      if (n < INT_MIN || n > INT_MAX) this.fail(`integer ${text} does not fit in 64 bits`, start);
      return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER)
        ? Number(n)
        : n;
    }
    if (FLOAT.test(text)) return Number(text.replaceAll("_", ""));
    if (/^[+-]?inf$/.test(text)) return text[0] === "-" ? -Infinity : Infinity;
    if (/^[+-]?nan$/.test(text)) return NaN;
    if (/^\d{4}-|^\d{2}:/.test(text)) {
      const read = readDateTime(text);
      if (typeof read === "string") this.fail(`invalid date-time ${text}: ${read}`, start);
      return new TomlDateTime(text);
    }
    this.fail(`invalid value ${JSON.stringify(text)}`, start);
  }

  // ----------------------------------------------------------- strings

  #basicString(): string {
    const src = this.#src;
    this.#pos++;
    let out = "";
    let start = this.#pos;
    for (;;) {
      const ch = src[this.#pos];
      if (ch === undefined) this.fail("unterminated string");
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
      if (ch === "\n" || ch === "\r") this.fail("a newline is not allowed in a one-line string");
      if (isControl(ch)) this.fail(`${show(ch)} must be escaped in a string`);
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
      if (ch === undefined) this.fail("unterminated multi-line string");
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
            this.fail("only a line ending may follow a backslash and whitespace");
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
      if (ch === undefined) this.fail("unterminated multi-line string");
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
    if (n > 5) this.fail(`${n} quotes in a row cannot end a multi-line string`, this.#pos + 5);
    this.#pos += n;
    return n < 3 ? { text: q.repeat(n), closed: false } : { text: q.repeat(n - 3), closed: true };
  }

  /** One character of a multi-line string's content (CRLF becomes LF). */
  #multilineChar(ch: string): string {
    const src = this.#src;
    if (ch === "\r") {
      if (src[this.#pos + 1] !== "\n") {
        this.fail("a carriage return must be followed by a line feed");
      }
      this.#pos += 2;
      return "\n";
    }
    if (ch !== "\n" && isControl(ch)) this.fail(`${show(ch)} must be escaped in a string`);
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
      if (ch === undefined) this.fail("unterminated string");
      if (ch === "'") {
        this.#pos++;
        return src.slice(start, this.#pos - 1);
      }
      if (ch === "\n" || ch === "\r") this.fail("a newline is not allowed in a one-line string");
      if (isControl(ch)) this.fail(`${show(ch)} is not allowed in a literal string`);
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
          this.fail(`\\${ch} needs ${size} hexadecimal digits`, at);
        }
        const cp = parseInt(hex, 16);
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
          this.fail(`\\${ch}${hex} is not a Unicode scalar value`, at);
        }
        this.#pos += size;
        return String.fromCodePoint(cp);
      }
      case undefined:
        this.fail("unterminated string", at);
    }
    this.fail(`invalid escape \\${ch}`, at);
  }
}
