// Newline-delimited JSON framing: a bounded line reader, frame encoding and
// parsing. Reading replies is the caller's (_internal/rpc.ts).

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
   * more buffer than the shared {@linkcode ByteBudget} has left.
   */
  | { kind: "oversized"; size: number; overBudget?: true };

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

  /**
   * `initial` is the buffer's starting (and resting) size: a server holding
   * thousands of idle connections whose frames are short passes a small one,
   * and the buffer grows for a long frame and shrinks back after it.
   */
  constructor(
    reader: { read(p: Uint8Array): Promise<number | null> },
    maxLine: number,
    budget?: ByteBudget,
    initial: number = INITIAL_BUFFER,
  ) {
    this.#reader = reader;
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

  /** Next line, or `null` at end of stream. A final line without `\n` counts. */
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
    const nl = this.#buf.subarray(this.#scanFrom, this.#end).indexOf(NEWLINE);
    if (nl >= 0) {
      const lineEnd = this.#scanFrom + nl;
      const line = this.#buf.subarray(this.#start, lineEnd);
      this.#start = lineEnd + 1;
      this.#fresh = true;
      if (line.length > this.#maxLine) return { kind: "oversized", size: line.length };
      return { kind: "line", line };
    }
    const pending = this.#end - this.#start;
    if (this.#eof) {
      if (pending === 0) return null;
      const line = this.#buf.subarray(this.#start, this.#end);
      this.#start = this.#end;
      this.#fresh = true;
      if (line.length > this.#maxLine) return { kind: "oversized", size: line.length };
      return { kind: "line", line };
    }
    if (pending > this.#maxLine) {
      // Report at once rather than reading the rest of a line of unknown
      // length; the stream is mid-line afterwards, so callers close it.
      this.#start = this.#end = 0;
      this.#fresh = true;
      return { kind: "oversized", size: pending };
    }
    // Only the bytes about to arrive need scanning; makeRoom may move the
    // pending bytes, so keep the offset relative to the line start.
    if (!this.#makeRoom()) {
      this.#start = this.#end = 0;
      this.#fresh = true;
      return { kind: "oversized", size: pending, overBudget: true };
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

/** Compact JSON plus `\n`, as bytes: one write per frame. */
export function encodeFrame(value: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(value) + "\n");
}

const decoder = new TextDecoder("utf-8", { fatal: true });

/** Default deepest nesting of arrays and objects a frame may have. */
export const MAX_JSON_DEPTH = 64;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_ARRAY = 0x5b;
const OPEN_OBJECT = 0x7b;
const CLOSE_ARRAY = 0x5d;
const CLOSE_OBJECT = 0x7d;

/**
 * Whether the JSON text in `bytes` nests arrays and objects deeper than
 * `max`, judged on the raw bytes (brackets inside strings do not count), so
 * that a deep frame is refused before `JSON.parse` spends time on it. Stops
 * at the first level past `max`.
 */
export function nestsDeeperThan(bytes: Uint8Array, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (inString) {
      if (b === BACKSLASH) i++;
      else if (b === QUOTE) inString = false;
    } else if (b === QUOTE) {
      inString = true;
    } else if (b === OPEN_ARRAY || b === OPEN_OBJECT) {
      if (++depth > max) return true;
    } else if (b === CLOSE_ARRAY || b === CLOSE_OBJECT) {
      depth--;
    }
  }
  return false;
}

/**
 * Decodes and parses one line.
 * @throws {SyntaxError} for bad UTF-8 or JSON
 * @throws {RangeError} when the frame nests deeper than `maxDepth`
 */
export function parseLine(line: Uint8Array, maxDepth: number = MAX_JSON_DEPTH): unknown {
  if (nestsDeeperThan(line, maxDepth)) {
    throw new RangeError(`frame nests arrays and objects deeper than the limit of ${maxDepth}`);
  }
  let text: string;
  try {
    text = decoder.decode(line);
  } catch {
    throw new SyntaxError("Invalid UTF-8 in frame");
  }
  return JSON.parse(text);
}
