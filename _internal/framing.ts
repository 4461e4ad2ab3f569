// Newline-delimited JSON framing: a bounded line reader (which also splits
// Chromium's NUL-delimited pipe), frame encoding and parsing. Reading
// replies is the caller's (_internal/rpc.ts).

// Small to start with: a server holds one reader per session, and at 64 KiB
// each, 10,000 held sessions needed 650 MiB. Long frames grow the buffer.
const INITIAL_BUFFER = 4 * 1024;
const NEWLINE = 10;

/** One frame from {@linkcode LineReader.read}. */
export type LineResult =
  /** A complete line, without its `\n`; valid until the next `read()`. */
  | { kind: "line"; line: Uint8Array }
  /**
   * A line longer than the limit (`size` is at least its length). Its bytes
   * were dropped and the reader may be mid-line: close the stream.
   */
  /**
   * `overBudget`: the line was not over the limit, but would have needed
   * more buffer than the shared {@linkcode ByteBudget} has left. `head`: a
   * copy of the line's first bytes (at most {@linkcode OVERSIZED_HEAD}), to
   * read the request's id from.
   */
  | { kind: "oversized"; size: number; overBudget?: true; head: Uint8Array };

/** How many first bytes of an oversized line {@linkcode LineReader} keeps. */
const OVERSIZED_HEAD = 1024;

/**
 * Bytes of line buffers shared by many readers (a server's connections), so
 * that many unfinished long lines cannot add up without bound. Each reader
 * takes what its buffer grows by beyond the initial size and gives it back
 * when the buffer shrinks or the reader is released.
 */
export class ByteBudget {
  readonly limit: number;
  #used = 0;

  constructor(limit: number) {
    this.limit = limit;
  }

  /** Bytes currently taken. */
  get used(): number {
    return this.#used;
  }

  /** Takes `n` bytes if they fit; returns whether they did. */
  tryTake(n: number): boolean {
    if (this.#used + n > this.limit) return false;
    this.#used += n;
    return true;
  }

  /** Gives `n` bytes back. */
  give(n: number): void {
    this.#used = Math.max(0, this.#used - n);
  }
}

function oversized(
  line: Uint8Array,
  size: number,
): { kind: "oversized"; size: number; head: Uint8Array } {
  return { kind: "oversized", size, head: line.slice(0, OVERSIZED_HEAD) };
}

/** Buffers larger than this shrink back once they hold little. */
const SHRINK_ABOVE = 64 * 1024;

/**
 * Reads `\n`-terminated lines from a byte reader with a bounded buffer.
 *
 * Lines up to `maxLine` bytes are returned as views of an internal buffer
 * (no copy, no string building); a longer line is reported as `oversized`
 * as soon as the limit is passed, so memory stays bounded.
 */
export class LineReader {
  #reader: { read(p: Uint8Array): Promise<number | null> };
  #maxLine: number;
  #buf: Uint8Array;
  #start = 0;
  #end = 0;
  #eof = false;
  /** Where the search for `\n` goes on: bytes before it were scanned. */
  #scanFrom = 0;
  /** The next call starts a new line. */
  #fresh = true;
  readonly #budget: ByteBudget | undefined;
  /** Bytes taken from the budget: the buffer's size beyond the initial one. */
  #taken = 0;
  readonly #initial: number;
  readonly #delimiter: number;

  /**
   * `initial` is the buffer's starting (and resting) size: a server holding
   * thousands of idle connections whose frames are short passes a small one,
   * and the buffer grows for a long frame and shrinks back after it.
   * `delimiter` is the byte that ends a line (`\n`; 0 for Chromium's
   * `--remote-debugging-pipe`).
   */
  constructor(
    reader: { read(p: Uint8Array): Promise<number | null> },
    maxLine: number,
    budget?: ByteBudget,
    initial: number = INITIAL_BUFFER,
    delimiter: number = NEWLINE,
  ) {
    this.#reader = reader;
    this.#delimiter = delimiter;
    this.#maxLine = maxLine;
    this.#budget = budget;
    this.#initial = Math.max(1, Math.min(initial, maxLine + 1));
    this.#buf = new Uint8Array(this.#initial);
  }

  /** The longest accepted line; may be changed between reads. */
  get maxLine(): number {
    return this.#maxLine;
  }

  set maxLine(n: number) {
    this.#maxLine = n;
  }

  /** Gives every byte taken from the budget back; call once the stream is done. */
  release(): void {
    this.#budget?.give(this.#taken);
    this.#taken = 0;
  }

  /** Next line, or `null` at end of stream. A final line without its delimiter counts. */
  async read(): Promise<LineResult | null> {
    while (true) {
      const line = this.next();
      if (line !== undefined) return line;
      this.filled(await this.#reader.read(this.space()));
    }
  }

  /**
   * The next line if the bytes read so far hold one (or `null` at end of
   * stream, as {@linkcode read}), else `undefined`: then read into
   * {@linkcode space} and pass the count to {@linkcode filled}. For a caller
   * that reads the stream itself, so that a connection waiting for its next
   * frame holds one suspended function (its own) rather than two.
   */
  next(): LineResult | null | undefined {
    if (this.#fresh) {
      this.#fresh = false;
      // Everything read was returned: read into the whole buffer again.
      if (this.#start === this.#end) this.#start = this.#end = 0;
      this.#shrink();
      this.#scanFrom = this.#start;
    }
    const nl = this.#buf.subarray(this.#scanFrom, this.#end).indexOf(this.#delimiter);
    if (nl >= 0) {
      const lineEnd = this.#scanFrom + nl;
      const line = this.#buf.subarray(this.#start, lineEnd);
      this.#start = lineEnd + 1;
      this.#fresh = true;
      if (line.length > this.#maxLine) return oversized(line, line.length);
      return { kind: "line", line };
    }
    const pending = this.#end - this.#start;
    if (this.#eof) {
      if (pending === 0) return null;
      const line = this.#buf.subarray(this.#start, this.#end);
      this.#start = this.#end;
      this.#fresh = true;
      if (line.length > this.#maxLine) return oversized(line, line.length);
      return { kind: "line", line };
    }
    if (pending > this.#maxLine) {
      // Report at once rather than reading the rest of a line of unknown
      // length; the stream is mid-line afterwards, so callers close it.
      const result = oversized(this.#buf.subarray(this.#start, this.#end), pending);
      this.#start = this.#end = 0;
      this.#fresh = true;
      return result;
    }
    // Only the bytes about to arrive need scanning; makeRoom may move the
    // pending bytes, so keep the offset relative to the line start.
    if (!this.#makeRoom()) {
      const result = oversized(this.#buf.subarray(this.#start, this.#end), pending);
      this.#start = this.#end = 0;
      this.#fresh = true;
      return { ...result, overBudget: true };
    }
    this.#scanFrom = this.#end;
    return undefined;
  }

  /** Where the next read goes, after {@linkcode next} returned `undefined`. */
  space(): Uint8Array {
    // The buffer itself when empty: an idle reader holds no extra view.
    return this.#end === 0 ? this.#buf : this.#buf.subarray(this.#end);
  }

  /** Counts the bytes a read put into {@linkcode space}; `null` is end of stream. */
  filled(n: number | null): void {
    if (n === null) this.#eof = true;
    else this.#end += n;
  }

  /** Bytes read past the last returned line; clears them from the reader. */
  takeBuffered(): Uint8Array {
    const rest = this.#buf.slice(this.#start, this.#end);
    this.#start = this.#end = 0;
    this.#fresh = true;
    return rest;
  }

  /** Makes room to read into; `false` when growing would overrun the budget. */
  #makeRoom(): boolean {
    if (this.#end < this.#buf.length) return true;
    const pending = this.#end - this.#start;
    if (this.#start > 0 && pending < this.#buf.length / 2) {
      this.#buf.copyWithin(0, this.#start, this.#end);
    } else {
      const size = Math.min(this.#buf.length * 2, this.#maxLine + 1 + INITIAL_BUFFER);
      const grown = Math.max(size, pending + INITIAL_BUFFER);
      if (!this.#resize(grown)) return false;
      return true;
    }
    this.#start = 0;
    this.#end = pending;
    return true;
  }

  /** Moves the pending bytes into a buffer of `size`, settling with the budget. */
  #resize(size: number): boolean {
    const taken = Math.max(0, size - this.#initial);
    if (taken > this.#taken && !(this.#budget?.tryTake(taken - this.#taken) ?? true)) {
      return false;
    }
    if (taken < this.#taken) this.#budget?.give(this.#taken - taken);
    this.#taken = taken;
    const pending = this.#end - this.#start;
    const next = new Uint8Array(size);
    next.set(this.#buf.subarray(this.#start, this.#end));
    this.#buf = next;
    this.#start = 0;
    this.#end = pending;
    return true;
  }

  /** After a long line: back to a small buffer, so idle readers hold little. */
  #shrink(): void {
    // A reader that starts small goes back to its size after any frame
    // that grew it past the default; others only after a very long one.
    const above = this.#initial < INITIAL_BUFFER ? INITIAL_BUFFER : SHRINK_ABOVE;
    if (this.#buf.length <= above) return;
    const pending = this.#end - this.#start;
    if (pending > INITIAL_BUFFER) return;
    this.#resize(Math.max(this.#initial, pending));
  }
}

const encoder = new TextEncoder();

// V8 ships JSON.rawJSON with JSON.parse's source text access; TypeScript's
// lib does not declare it yet.
const rawJSON = (JSON as unknown as { rawJSON(text: string): unknown }).rawJSON;

// Python's json module writes NaN, Infinity and -Infinity (HUD's client and
// server do, by default); JSON has no such tokens. They are read, and
// written, through sentinel strings that a peer cannot guess.
const SENTINEL = `\u0000hud-${crypto.randomUUID()}:`;
const NON_FINITE_TOKENS = ["NaN", "Infinity", "-Infinity"] as const;
/** Each token as its sentinel string comes out of `JSON.stringify`. */
const QUOTED_SENTINELS = NON_FINITE_TOKENS.map((t) => [JSON.stringify(SENTINEL + t), t] as const);

/** How {@linkcode stringifyJson} and {@linkcode encodeFrame} write numbers. */
export interface WriteOptions {
  /**
   * NaN, Infinity and -Infinity are written as Python's json module writes
   * them (`NaN`, `Infinity`, `-Infinity`, which strict JSON lacks) rather
   * than as `null`.
   * @default false
   */
  nonFinite?: boolean;
}

/**
 * The replacer for what a plain stringify cannot write: a `bigint` as its
 * digits, and (with `nonFinite`) a non-finite number as a sentinel string,
 * to be replaced by its token. `found` tells whether any was.
 */
function pythonNumbers(nonFinite: boolean) {
  const state = {
    found: false,
    replacer(_key: string, value: unknown): unknown {
      if (typeof value === "bigint") return rawJSON(value.toString());
      if (nonFinite && typeof value === "number" && !Number.isFinite(value)) {
        state.found = true;
        return SENTINEL + String(value);
      }
      return value;
    },
  };
  return state;
}

/** `value` written through {@linkcode pythonNumbers}. */
function stringifyReplaced(value: unknown, nonFinite: boolean): string {
  const numbers = pythonNumbers(nonFinite);
  let text = JSON.stringify(value, numbers.replacer);
  if (!numbers.found) return text;
  for (const [quoted, token] of QUOTED_SENTINELS) text = text.replaceAll(quoted, token);
  return text;
}

/**
 * `JSON.stringify` that also writes a `bigint` (an integer
 * {@linkcode parseLine} kept exact) as a JSON number, and with `nonFinite`
 * a non-finite number as Python's token. The common case costs nothing
 * extra: the replacer runs only after a plain stringify met a bigint, or
 * (with `nonFinite`) wrote a `null`, which is what it makes of NaN.
 */
export function stringifyJson(value: unknown, options?: WriteOptions): string {
  const nonFinite = options?.nonFinite === true;
  let text: string;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    if (!(err instanceof TypeError) || !/BigInt/i.test(err.message)) throw err;
    return stringifyReplaced(value, nonFinite);
  }
  // JSON.stringify gives undefined for undefined or a function: left as is.
  if (nonFinite && text !== undefined && text.includes("null")) {
    return stringifyReplaced(value, true);
  }
  return text;
}

/** Compact JSON plus `\n`, as bytes: one write per frame. */
export function encodeFrame(value: unknown, options?: WriteOptions): Uint8Array {
  return encoder.encode(stringifyJson(value, options) + "\n");
}

const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * Default deepest nesting of arrays and objects a frame may have, once a
 * connection has authenticated: what HUD's server reads (Python's parser
 * stops at about 990 levels), with a margin below the depth where the
 * recursive paths here exhaust the stack (about 2,700 for a reply written
 * with a replacer, 3,400 for a frame parsed with a reviver; bench/json_depth.ts).
 */
export const MAX_JSON_DEPTH = 1000;

/**
 * Deepest nesting of a connection's first frame when the server requires a
 * token: a `hello` or `tunnel.open` nests two levels, and a stranger's frame
 * should cost little to refuse.
 */
export const PRE_AUTH_MAX_JSON_DEPTH = 64;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_ARRAY = 0x5b;
const OPEN_OBJECT = 0x7b;
const CLOSE_ARRAY = 0x5d;
const CLOSE_OBJECT = 0x7d;
const DIGIT_0 = 0x30;
const DIGIT_9 = 0x39;

/** {@linkcode scanFrame}: the frame nests deeper than the limit. */
const TOO_DEEP = 1;
/**
 * {@linkcode scanFrame}: a run of 16 or more digits outside strings, so a
 * number that may not fit a double exactly (2^53 has 16 digits).
 */
const LONG_NUMBER = 2;

/**
 * One pass over the raw bytes (brackets and digits inside strings do not
 * count): whether the text nests arrays and objects deeper than `max`
 * (stopping there, before `JSON.parse` spends time on it), and whether it
 * holds a number long enough to need exact parsing.
 */
function scanFrame(bytes: Uint8Array, max: number): number {
  let depth = 0;
  let digits = 0;
  let flags = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (inString) {
      if (b === BACKSLASH) i++;
      else if (b === QUOTE) inString = false;
    } else if (b <= DIGIT_9 && b >= DIGIT_0) {
      if (++digits === 16) flags |= LONG_NUMBER;
    } else {
      digits = 0;
      if (b === QUOTE) {
        inString = true;
      } else if (b === OPEN_ARRAY || b === OPEN_OBJECT) {
        if (++depth > max) return flags | TOO_DEEP;
      } else if (b === CLOSE_ARRAY || b === CLOSE_OBJECT) {
        depth--;
      }
    }
  }
  return flags;
}

const INTEGER_SOURCE = /^-?\d+$/;

/** Keeps integers a double cannot hold exactly as `bigint` (JSON.parse source text access). */
function exactIntegers(_key: string, value: unknown, context?: { source?: string }): unknown {
  if (typeof value !== "number" || Number.isSafeInteger(value)) return value;
  const source = context?.source;
  return source !== undefined && INTEGER_SOURCE.test(source) ? BigInt(source) : value;
}

const NON_FINITE = /NaN|Infinity/;

/**
 * `text` with each bare `NaN`, `Infinity` and `-Infinity` (outside strings)
 * replaced by a sentinel string, or `null` when it has none.
 */
function quoteNonFinite(text: string): string | null {
  let out = "";
  let from = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
      continue;
    }
    if (c === QUOTE) {
      inString = true;
      continue;
    }
    for (const token of NON_FINITE_TOKENS) {
      if (text.startsWith(token, i)) {
        out += text.slice(from, i) + JSON.stringify(SENTINEL + token);
        i += token.length - 1;
        from = i + 1;
        break;
      }
    }
  }
  return from === 0 ? null : out + text.slice(from);
}

function nonFiniteValues(exact: boolean) {
  return (key: string, value: unknown, context?: { source?: string }): unknown => {
    if (typeof value === "string" && value.startsWith(SENTINEL)) {
      return Number(value.slice(SENTINEL.length));
    }
    return exact ? exactIntegers(key, value, context) : value;
  };
}

/** How {@linkcode parseLine} reads numbers. */
export interface ParseOptions {
  /**
   * Integers a double cannot hold exactly (beyond ±(2^53−1)) become
   * `bigint`, never a rounded number.
   * @default false
   */
  exactIntegers?: boolean;
  /** Python's `NaN`, `Infinity` and `-Infinity` tokens are read as those numbers. @default false */
  nonFinite?: boolean;
}

/**
 * Decodes and parses one line.
 * @throws {SyntaxError} for bad UTF-8 or JSON
 * @throws {RangeError} when the frame nests deeper than `maxDepth`
 */
export function parseLine(
  line: Uint8Array,
  maxDepth: number = MAX_JSON_DEPTH,
  options?: ParseOptions,
): unknown {
  const flags = scanFrame(line, maxDepth);
  if (flags & TOO_DEEP) {
    throw new RangeError(`frame nests arrays and objects deeper than the limit of ${maxDepth}`);
  }
  let text: string;
  try {
    text = decoder.decode(line);
  } catch {
    throw new SyntaxError("Invalid UTF-8 in frame");
  }
  const exact = options?.exactIntegers === true && (flags & LONG_NUMBER) !== 0;
  try {
    return exact ? JSON.parse(text, exactIntegers) : JSON.parse(text);
  } catch (err) {
    if (!options?.nonFinite || !NON_FINITE.test(text)) throw err;
    const quoted = quoteNonFinite(text);
    if (quoted === null) throw err;
    return JSON.parse(quoted, nonFiniteValues(options?.exactIntegers === true));
  }
}

const WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);

/**
 * The top-level `"id"` of a frame that could not be parsed whole (too deep,
 * not JSON further on, cut off), when it can be read: a string, a number or
 * `null` in the first object's own members. `undefined` when it cannot.
 */
export function peekId(bytes: Uint8Array): unknown {
  let i = 0;
  const skip = () => {
    while (i < bytes.length && WHITESPACE.has(bytes[i])) i++;
  };
  skip();
  if (bytes[i] !== OPEN_OBJECT) return undefined;
  let depth = 0;
  for (; i < bytes.length; i++) {
    const b = bytes[i];
    if (b === QUOTE) {
      const start = i;
      for (i++; i < bytes.length && bytes[i] !== QUOTE; i++) if (bytes[i] === BACKSLASH) i++;
      if (
        depth !== 1 || i - start !== 3 || bytes[start + 1] !== 0x69 || bytes[start + 2] !== 0x64
      ) {
        continue;
      }
      i++;
      skip();
      if (bytes[i] !== 0x3a) continue; // "id" as a value, not a key
      i++;
      skip();
      return readScalar(bytes, i);
    }
    if (b === OPEN_ARRAY || b === OPEN_OBJECT) depth++;
    else if (b === CLOSE_ARRAY || b === CLOSE_OBJECT) depth--;
  }
  return undefined;
}

/** The string, number or `null` starting at `i`, else `undefined`. */
function readScalar(bytes: Uint8Array, i: number): unknown {
  let end = i;
  if (bytes[i] === QUOTE) {
    for (end++; end < bytes.length && bytes[end] !== QUOTE; end++) {
      if (bytes[end] === BACKSLASH) end++;
    }
    end++;
  } else {
    while (end < bytes.length && /[-+.\deEnul]/.test(String.fromCharCode(bytes[end]))) end++;
  }
  try {
    const value = JSON.parse(decoder.decode(bytes.subarray(i, end)), exactIntegers);
    return value === null || typeof value !== "object" ? value : undefined;
  } catch {
    return undefined;
  }
}
