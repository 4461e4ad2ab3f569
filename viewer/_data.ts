// Reading results files for the viewer: one summary row per rollout for the
// table, the raw line for the rollout view, and tailing a file that a job is
// still writing.

import type { RunRecord } from "../eval/results.ts";
import { isRecord } from "../_internal/util.ts";

/** What the table shows of one rollout. */
export interface RowSummary {
  /** Index of the record in its file. */
  i: number;
  /** Task slug. */
  task: string;
  /** Template id. */
  id: string;
  /** Arguments, as compact JSON. */
  args: string;
  /** Group id. */
  group: string;
  /** Which repeat of the task. */
  repeat: number;
  /** The reward, or `null` when not graded. */
  reward: number | null;
  /** `completed`, `error` or `cancelled`. */
  status: string;
  /** The failed phase, if any. */
  phase: string | null;
  /** Wall time of the rollout in ms, when the trace has both ends. */
  duration: number | null;
  /** Start time in ms since the epoch, when known. */
  started: number | null;
  /** End time in ms since the epoch, when known. */
  ended: number | null;
  /** The first error's message, or "". */
  error: string;
}

function time(value: unknown): number | null {
  if (typeof value !== "string") return null;
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

/** The summary row of a record. */
export function summarize(record: RunRecord, i: number): RowSummary {
  // Records come from files: read them as untyped JSON, whatever RunRecord says.
  const raw = record as unknown as Record<string, unknown>;
  const trace: Record<string, unknown> = isRecord(raw.trace) ? raw.trace : {};
  const started = time(trace.started_at);
  const ended = time(trace.ended_at);
  const errors: unknown[] = Array.isArray(trace.errors) ? trace.errors : [];
  const first = errors.find(isRecord);
  const task = isRecord(record.task) ? record.task : { slug: "?", id: "?", args: {} };
  return {
    i,
    task: String(task.slug),
    id: String(task.id),
    args: JSON.stringify(task.args ?? {}),
    group: String(record.group_id ?? ""),
    repeat: typeof record.repeat === "number" ? record.repeat : 0,
    reward: typeof record.reward === "number" ? record.reward : null,
    status: String(record.status ?? "?"),
    phase: typeof record.failed_phase === "string" ? record.failed_phase : null,
    duration: started !== null && ended !== null ? ended - started : null,
    started,
    ended,
    error: first ? String(first.message ?? "") : "",
  };
}

/** The fields of {@linkcode RowSummary}, in the order {@linkcode packRow} writes them. */
export const ROW_FIELDS: readonly (keyof RowSummary)[] = [
  "i",
  "task",
  "id",
  "args",
  "group",
  "repeat",
  "reward",
  "status",
  "phase",
  "duration",
  "started",
  "ended",
  "error",
];

/** A summary as an array (a third smaller on the wire than an object). */
export function packRow(row: RowSummary): unknown[] {
  return ROW_FIELDS.map((k) => row[k]);
}

/** Parses one results line; `null` for a blank or unreadable one. */
export function parseRecord(line: string): RunRecord | null {
  if (line.trim() === "") return null;
  try {
    const value = JSON.parse(line);
    return isRecord(value) && isRecord(value.task) ? value as unknown as RunRecord : null;
  } catch {
    // A line cut short by a crash, or not a record.
    return null;
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
  readonly rows: RowSummary[] = [];
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
      this.rows.length = 0;
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
    for (const line of parts) {
      const record = parseRecord(line);
      if (record === null) continue;
      this.rows.push(summarize(record, this.lines.length));
      this.lines.push(line);
    }
  }
}

/** Reads a whole results file: its records, in order. */
export async function readResults(path: string): Promise<RunRecord[]> {
  const text = await Deno.readTextFile(path);
  const out: RunRecord[] = [];
  for (const line of text.split("\n")) {
    const record = parseRecord(line);
    if (record !== null) out.push(record);
  }
  return out;
}
