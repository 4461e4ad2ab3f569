/**
 * TOML's date-time values: {@linkcode TomlDateTime}, and the check that
 * `harbor/toml.ts` runs on a date-time token.
 *
 * @module
 */

/** Which of TOML's four date-time types a {@linkcode TomlDateTime} is. */
export type TomlDateTimeKind =
  | "offset-date-time"
  | "local-date-time"
  | "local-date"
  | "local-time";

const DATE_TIME =
  /^(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|z|[+-]\d{2}:\d{2})?)?$/;
const TIME = /^(\d{2}):(\d{2}):(\d{2})(\.\d+)?$/;

function daysInMonth(year: number, month: number): number {
  if (month === 2) return year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0) ? 29 : 28;
  return [4, 6, 9, 11].includes(month) ? 30 : 31;
}

/** Why `text` is not a date-time, or its kind and canonical form. */
export function readDateTime(text: string): { kind: TomlDateTimeKind; canonical: string } | string {
  const time = TIME.exec(text);
  if (time !== null) {
    const bad = checkTime(time[1], time[2], time[3]);
    if (bad !== null) return bad;
    return { kind: "local-time", canonical: text };
  }
  const m = DATE_TIME.exec(text);
  if (m === null) return "not a date or time";
  const [, y, mo, d, h, mi, s, frac, offset] = m;
  const year = Number(y), month = Number(mo), day = Number(d);
  if (month < 1 || month > 12) return `month ${mo} is out of range`;
  if (day < 1 || day > daysInMonth(year, month)) return `day ${d} is out of range for ${y}-${mo}`;
  const date = `${y}-${mo}-${d}`;
  if (h === undefined) return { kind: "local-date", canonical: date };
  const bad = checkTime(h, mi, s);
  if (bad !== null) return bad;
  const clock = `${h}:${mi}:${s}${frac ?? ""}`;
  if (offset === undefined) return { kind: "local-date-time", canonical: `${date}T${clock}` };
  if (offset !== "Z" && offset !== "z") {
    if (Number(offset.slice(1, 3)) > 23 || Number(offset.slice(4)) > 59) {
      return `offset ${offset} is out of range`;
    }
  }
  return {
    kind: "offset-date-time",
    canonical: `${date}T${clock}${offset === "z" ? "Z" : offset}`,
  };
}

function checkTime(h: string, mi: string, s: string): string | null {
  if (Number(h) > 23) return `hour ${h} is out of range`;
  if (Number(mi) > 59) return `minute ${mi} is out of range`;
  // RFC 3339 allows a leap second.
  if (Number(s) > 60) return `second ${s} is out of range`;
  return null;
}

/**
 * A TOML date-time, date or time, kept as written (with `T` between date
 * and time and an upper-case `Z`), so no precision or offset is lost.
 *
 * @example
 * ```ts
 * import { TomlDateTime } from "./toml_datetime.ts";
 * import assert from "node:assert/strict";
 *
 * const when = new TomlDateTime("1979-05-27 07:32:00-08:00");
 * assert.equal(when.kind, "offset-date-time");
 * assert.equal(when.toString(), "1979-05-27T07:32:00-08:00");
 * assert.equal(when.toDate().toISOString(), "1979-05-27T15:32:00.000Z");
 * assert.equal(new TomlDateTime("07:32:00.5").kind, "local-time");
 * ```
 */
export class TomlDateTime {
  /** Which of the four date-time types this is. */
  readonly kind: TomlDateTimeKind;
  readonly #text: string;

  /**
   * Reads `text` as TOML writes a date-time.
   * @throws {SyntaxError} when it is not one
   */
  constructor(text: string) {
    const read = readDateTime(text);
    if (typeof read === "string") {
      throw new SyntaxError(`Cannot read TOML date-time "${text}": ${read}`);
    }
    this.kind = read.kind;
    this.#text = read.canonical;
  }

  /** The RFC 3339 text: `1979-05-27T07:32:00Z`, `1979-05-27`, `07:32:00.999`. */
  toString(): string {
    return this.#text;
  }

  /** The same text as {@linkcode TomlDateTime.toString}. */
  toJSON(): string {
    return this.#text;
  }

  /**
   * The instant, to the millisecond (further digits are dropped).
   * @throws {TypeError} for a local date-time, date or time: it names no instant
   */
  toDate(): Date {
    if (this.kind !== "offset-date-time") {
      throw new TypeError(
        `Cannot convert TOML ${this.kind} "${this.#text}" to a Date: it has no offset`,
      );
    }
    const m = DATE_TIME.exec(this.#text)!;
    const [, y, mo, d, h, mi, s, frac, offset] = m;
    const ms = frac === undefined ? 0 : Number(frac.slice(1, 4).padEnd(3, "0"));
    const date = new Date(0);
    date.setUTCFullYear(Number(y), Number(mo) - 1, Number(d));
    date.setUTCHours(Number(h), Number(mi), Number(s), ms);
    if (offset !== "Z") {
      const sign = offset[0] === "-" ? -1 : 1;
      const minutes = Number(offset.slice(1, 3)) * 60 + Number(offset.slice(4));
      date.setTime(date.getTime() - sign * minutes * 60_000);
    }
    return date;
  }
}
