// Reading results files for the viewer: one row per attempt for the table
// (packed as arrays), the raw line for the rollout page, the job's summary
// from the one summarizer, and tailing a file that a job is still writing.

import type { RunRecord } from "../eval/results.ts";
import { recordKey } from "../eval/results.ts";
import {
  digestRecord,
  type JobSummary,
  type RolloutDigest,
  summarizeDigests,
} from "../eval/_summary.ts";
import { isRecord } from "../_internal/util.ts";
import { redactDeep } from "../_internal/redact.ts";

/** One attempt: its digest, its place in the file, and the attempt it replaced. */
export interface Row extends RolloutDigest {
  /** Index of the record in its file. */
  i: number;
  /** Index of the earlier attempt of the same task and repeat that this one replaced, or `null`. */
  prev: number | null;
  /** Which attempt of its task and repeat this is, from 1. */
  attempt: number;
}

/**
 * The fields of a packed row, in order. The row's index is its place;
 * `group` is `null` when it is the job's usual `<job id>:<slug>`.
 */
export const ROW_FIELDS: readonly string[] = [
  "task",
  "args",
  "group",
  "repeat",
  "reward",
  "status",
  "phase",
  "duration",
  "error",
  "prev",
  "attempt",
  "sub",
  "calls",
  "tools",
  "tokens",
  "class",
  "graded",
  "snap",
];

/**
 * A row as an array (a third smaller on the wire than an object);
 * subscores as values in the order of `names`.
 */
function packRow(row: Row, names: readonly string[]): unknown[] {
  const sub = row.subscores === null
    ? null
    : names.map((n) => Object.hasOwn(row.subscores!, n) ? row.subscores![n] : null);
  const tokens = row.inputTokens === null && row.outputTokens === null
    ? null
    : (row.inputTokens ?? 0) + (row.outputTokens ?? 0);
  return [
    row.slug,
    JSON.stringify(row.args),
    row.group === `${row.job}:${row.slug}` ? null : row.group,
    row.repeat,
    row.reward,
    row.status,
    row.phase,
    row.duration,
    row.errorMessage || row.error,
    row.prev,
    row.attempt,
    sub,
    row.modelCalls,
    row.toolCalls,
    tokens,
    row.errorClass,
    row.graded,
    row.fromSnapshot?.id ?? null,
  ];
}

/** Parses one results line, redacted; `null` for a blank or unreadable one. */
export function parseRecord(line: string): RunRecord | null {
  return readLine(line)?.record ?? null;
}

/**
 * One results line parsed and redacted (a page holds what the file holds,
 * redacted again: a file written before traces were, or secrets this
 * process holds that the writer did not), and the line to serve: the
 * file's own, integers exact, when nothing was redacted.
 */
function readLine(line: string): { record: RunRecord; line: string } | null {
  if (line.trim() === "") return null;
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    // A line cut short by a crash, or not a record.
    return null;
  }
  if (!isRecord(value) || !isRecord(value.task)) return null;
  const redacted = redactDeep(value, 80);
  const record = redacted as RunRecord;
  return { record, line: redacted === value ? line : JSON.stringify(redacted) };
}

/** The summary's head: everything but the per-task lines, which can be many. */
export type SummaryHead = Omit<JobSummary, "tasks">;

/**
 * The rows of a file's records, in order: which attempt each is and
 * which one it replaced, from the same key the summarizer counts by.
 */
export class Rows {
  readonly rows: Row[] = [];
  readonly #packed: unknown[][] = [];
  readonly #latest = new Map<string, number>();
  readonly #names: string[] = [];
  readonly #known = new Set<string>();
  #summary: JobSummary | null = null;
  #head: SummaryHead | null = null;

  /** Adds the record on line `i` (its index among the records). */
  add(record: RunRecord): Row {
    const digest = digestRecord(record);
    const key = recordKey(digest.slug, digest.repeat);
    const prev = this.#latest.get(key) ?? null;
    const row: Row = {
      ...digest,
      i: this.rows.length,
      prev,
      attempt: prev === null ? 1 : this.rows[prev].attempt + 1,
    };
    this.#latest.set(key, row.i);
    this.rows.push(row);
    for (const name of Object.keys(digest.subscores ?? {})) {
      if (!this.#known.has(name)) {
        this.#known.add(name);
        this.#names.push(name);
      }
    }
    // Packed once: names only grow, so a row packed earlier stays right
    // (the page reads a missing subscore as none).
    this.#packed.push(packRow(row, this.#names));
    this.#summary = null;
    this.#head = null;
    return row;
  }

  /** Subscore names in the order first met: the columns of packed rows. */
  get subscoreNames(): readonly string[] {
    return this.#names;
  }

  /** The job's summary over these attempts (cached until the next add). */
  get summary(): JobSummary {
    this.#summary ??= summarizeDigests(this.rows);
    return this.#summary;
  }

  /** The summary without its per-task lines, which can be many (cached too). */
  get head(): SummaryHead {
    if (this.#head === null) {
      const { tasks: _, ...head } = this.summary;
      this.#head = head;
    }
    return this.#head;
  }

  /** Forgets every row. */
  clear(): void {
    this.rows.length = 0;
    this.#latest.clear();
    this.#names.length = 0;
    this.#known.clear();
    this.#packed.length = 0;
    this.#summary = null;
    this.#head = null;
  }

  /** Rows from `from` on, packed. */
  packed(from = 0): unknown[][] {
    return from === 0 ? this.#packed : this.#packed.slice(from);
  }
}

/**
 * A results file read incrementally: each {@linkcode ResultsFile.refresh}
 * reads what was appended since the last one, keeping a partial last line
 * for the next. A file that shrank (a resumed job rewrote it) is read again
 * from the start, and `generation` counts those restarts.
 */
export class ResultsFile {
  readonly path: string;
  readonly lines: string[] = [];
  readonly table: Rows = new Rows();
  #generation = 0;
  #offset = 0;
  #rest = "";
  #decoder = new TextDecoder();
  #refreshing: Promise<void> | null = null;

  constructor(path: string) {
    this.path = path;
  }

  get generation(): number {
    return this.#generation;
  }

  /** Reads what was appended; concurrent calls share one read. */
  refresh(): Promise<void> {
    this.#refreshing ??= this.#read().finally(() => this.#refreshing = null);
    return this.#refreshing;
  }

  async #read(): Promise<void> {
    using file = await Deno.open(this.path, { read: true });
    const size = (await file.stat()).size;
    if (size < this.#offset) {
      this.#generation++;
      this.#offset = 0;
      this.#rest = "";
      this.#decoder = new TextDecoder();
      this.lines.length = 0;
      this.table.clear();
    }
    if (size === this.#offset) return;
    await file.seek(this.#offset, Deno.SeekMode.Start);
    const buffer = new Uint8Array(size - this.#offset);
    let got = 0;
    while (got < buffer.length) {
      const n = await file.read(buffer.subarray(got));
      if (n === null) break;
      got += n;
    }
    this.#offset += got;
    const text = this.#rest + this.#decoder.decode(buffer.subarray(0, got), { stream: true });
    const parts = text.split("\n");
    this.#rest = parts.pop() ?? "";
    let added = false;
    for (const part of parts) {
      const read = readLine(part);
      if (read === null) continue;
      this.table.add(read.record);
      this.lines.push(read.line);
      added = true;
    }
    // Summarized as it is read, as the rows are: the page, every poll and
    // the page's next request need it, so that none of them waits for it.
    if (added) void this.table.head;
  }
}
