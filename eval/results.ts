/**
 * Results files: JSONL, one {@linkcode RunRecord} per finished rollout,
 * only ever appended to and synced line by line, so that an interrupted
 * job resumes from what reached the disk.
 *
 * @module
 */

import type { TaskRow } from "../env.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import { openPrivate } from "../_internal/private_file.ts";
import { MAX_JSON_DEPTH, stringifyJson } from "../_internal/framing.ts";
import { redactDeep } from "../_internal/redact.ts";
import type { TraceJson, TraceStatus } from "./trace.ts";
import type { LegacyErrorClass, RolloutErrorClass } from "./failure.ts";
import type { AgentInfo } from "./agent.ts";

/** One finished rollout, as streamed to the results file. */
export interface RunRecord {
  /** The job it belongs to. */
  job_id: string;
  /** Repeats of one task share a group id. */
  group_id: string;
  /** The task row. */
  task: TaskRow;
  /** Which repeat of the task (0-based). */
  repeat: number;
  /** `completed`, `error` or `cancelled`. */
  status: Exclude<TraceStatus, "running">;
  /** The reward, or `null` when not graded. */
  reward: number | null;
  /** The phase that failed, if any. */
  failed_phase: string | null;
  /**
   * The failure's class (one of `FAILURE_CLASSES`, see
   * {@linkcode classifyError}): for a rollout not graded, of the failure
   * that ended it; for a graded one, of its first failure (the agent's
   * own); `null` for a rollout that did not fail, absent in older files.
   * Files from before the classes were renamed hold older names, which
   * `readErrorClass` reads as today's.
   */
  error_class?: RolloutErrorClass | LegacyErrorClass | null;
  /**
   * Which attempt at this (task, repeat) the record is, from 1: a retried
   * rollout has a record per attempt, and the latest counts. Absent in older files (1).
   */
  attempt?: number;
  /** The grade's flat subscores (`parent/child` for nested ones), when it had any. */
  subscores?: Record<string, number>;
  /** What ran, when the agent says ({@linkcode Agent.info}). */
  agent?: AgentInfo;
  /** The full trace; `{}` only for a slot a job never started. */
  trace: TraceJson | Record<string, never>;
}

/** The key of a rollout slot in a results file: task slug and repeat. */
export function recordKey(slug: string, repeat: number): string {
  return `${slug}#${repeat}`;
}

/** Whether `value` has the shape of a {@linkcode RunRecord}. */
export function isRunRecord(value: unknown): value is RunRecord {
  return isRecord(value) && isRecord(value.task) && typeof value.task.slug === "string" &&
    typeof value.repeat === "number" && (value.reward === null || typeof value.reward === "number");
}

/** Every record of a results file; other lines (cut short, foreign) are skipped. */
export async function readResults(
  path: string,
  mustExist = false,
): Promise<{ records: RunRecord[]; size: number; endsWithNewline: boolean }> {
  let bytes: Uint8Array;
  try {
    bytes = await Deno.readFile(path);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound && !mustExist) {
      return { records: [], size: 0, endsWithNewline: true };
    }
    throw err;
  }
  const records: RunRecord[] = [];
  for (const line of new TextDecoder().decode(bytes).split("\n")) {
    if (line.trim() === "") continue;
    try {
      const r = JSON.parse(line);
      if (isRunRecord(r)) records.push(r);
    } catch {
      // A line cut short by a crash: kept in the file, its rollout runs again.
    }
  }
  return {
    records,
    size: bytes.length,
    endsWithNewline: bytes.length === 0 || bytes[bytes.length - 1] === 0x0a,
  };
}

function dirname(path: string): string {
  const i = path.lastIndexOf("/");
  return i < 0 ? "." : i === 0 ? "/" : path.slice(0, i);
}

/**
 * Checks a results file before a job starts, as {@linkcode Taskset.run}
 * does with `out`: creates its directory, refuses an existing non-empty
 * file unless `resume` or `force` is set, and with `force` renames it
 * aside. Returns where the old file went, or `null`.
 * @throws {Error} naming the file and the two ways on, for a non-empty file
 */
export async function prepareResults(
  path: string,
  options: { resume?: boolean; force?: boolean } = {},
): Promise<string | null> {
  try {
    // Directories it makes are its owner's alone; existing ones keep their mode.
    await Deno.mkdir(dirname(path), { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new Error(
      `Cannot write results: cannot create directory "${dirname(path)}": ${errorMessage(err)}`,
      { cause: err },
    );
  }
  const info = await Deno.stat(path).catch((err) => {
    if (err instanceof Deno.errors.NotFound) return null;
    throw err;
  });
  if (info === null || info.size === 0 || options.resume) return null;
  if (!options.force) {
    throw new Error(
      `Cannot write results: "${path}" already holds results; resume it with --resume, or start over with --force (the old file is renamed aside)`,
    );
  }
  const aside = `${path}.${new Date().toISOString().replace(/[:.]/g, "-")}.bak`;
  await Deno.rename(path, aside);
  return aside;
}

/** A results file open for appending, with the records it already held. */
export interface ResultsFile {
  records: RunRecord[];
  /**
   * Appends a record, after writing the files its trace references
   * (screenshots) into {@linkcode resultsFilesDir}.
   */
  append(record: RunRecord, files?: ReadonlyMap<string, Uint8Array>): Promise<void>;
  close(): Promise<void>;
}

/**
 * Where a results file keeps the files its traces reference (`TraceFile`):
 * `<results>.files/`, beside it.
 */
export function resultsFilesDir(path: string): string {
  return `${path}.files`;
}

/** Writes `files` into `dir` (0700), each 0600; one already there (same name, same bytes) stays. */
async function writeFiles(dir: string, files: ReadonlyMap<string, Uint8Array>): Promise<void> {
  if (files.size === 0) return;
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  for (const [name, bytes] of files) {
    if (!/^[0-9a-f]{64}\.[a-z]+$/.test(name)) {
      throw new RangeError(`Cannot write trace file: invalid name "${name}"`);
    }
    const path = `${dir}/${name}`;
    if ((await Deno.stat(path).catch(() => null))?.size === bytes.length) continue;
    await Deno.writeFile(path, bytes, { mode: 0o600 });
  }
}

const encoder = new TextEncoder();
/** How deep a record is redacted: what the wire carries, and the levels above a trace's steps. */
const RECORD_DEPTH = MAX_JSON_DEPTH + 8;

/**
 * Opens a results file for appending, one synced line per record, in order.
 * With `resume`, `check` sees the records it holds before anything is
 * written; what it throws leaves the file as it was.
 */
export async function openResults(
  path: string,
  options: {
    resume: boolean;
    force: boolean;
    check?: (records: readonly RunRecord[]) => void;
  },
): Promise<ResultsFile> {
  await prepareResults(path, options);
  const { records, endsWithNewline } = options.resume
    ? await readResults(path)
    : { records: [], endsWithNewline: true };
  options.check?.(records);
  const file = await openPrivate(path);
  let writes: Promise<void> = Promise.resolve();
  const write = (bytes: Uint8Array) => {
    writes = writes.then(async () => {
      let off = 0;
      while (off < bytes.length) off += await file.write(bytes.subarray(off));
      // A SIGKILL or a power cut then loses at most the line being written.
      await file.syncData();
    });
    return writes;
  };
  // A line cut short by a crash stays; the next record starts on a line of its own.
  if (!endsWithNewline) await write(encoder.encode("\n"));
  let closed = false;
  return {
    records,
    // Integers the client read exactly (bigint) are written digit for digit.
    // The files first: a record never names a file that is not there. The
    // whole record is redacted (task arguments, agent info), its trace again
    // for values held since it was recorded.
    append: async (record, files) => {
      if (files !== undefined) await writeFiles(resultsFilesDir(path), files);
      await write(encoder.encode(stringifyJson(redactDeep(record, RECORD_DEPTH)) + "\n"));
    },
    async close() {
      if (closed) return;
      closed = true;
      await writes.catch(() => {});
      file.close();
    },
  };
}
