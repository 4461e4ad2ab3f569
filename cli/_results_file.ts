// Whether a file `report` and `view` are given is a results file: one whose
// lines are rollout records (the JSONL "eval --out" writes), or which has
// none yet. A module or any other text is refused in one line, rather than
// shown as an empty job.

import { isRunRecord } from "../eval/results.ts";
import { errorMessage } from "../_internal/util.ts";

/**
 * Refuses a path that is not a file, or a file with text in it of which no
 * line is a rollout record. Reads up to the first record (a results file's
 * first line), so a large file is not read twice.
 * @throws {Error} one line naming the path and the way out
 */
export async function checkResultsFile(path: string): Promise<void> {
  const info = await Deno.stat(path).catch(() => null);
  if (info === null || !info.isFile) {
    throw new Error(`Cannot read results: "${path}" is not a file (run a job with --out first)`);
  }
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path);
  } catch (err) {
    throw new Error(`Cannot read results: "${path}": ${errorMessage(err)}`);
  }
  const decoder = new TextDecoder();
  let pending = "";
  let lines = 0;
  /** Whether `line` is a record; counts the lines with text. */
  const record = (line: string) => {
    if (line.trim() === "") return false;
    lines++;
    try {
      return isRunRecord(JSON.parse(line));
    } catch {
      return false;
    }
  };
  for await (const chunk of file.readable) {
    const parts = (pending + decoder.decode(chunk, { stream: true })).split("\n");
    pending = parts.pop()!;
    // The readable closes the file when the loop stops early.
    if (parts.some(record)) return;
  }
  if (record(pending + decoder.decode())) return;
  if (lines > 0) {
    throw new Error(
      `Cannot read results: "${path}" is not a results file (none of its ${lines} lines is a rollout record); give the JSONL that "eval --out" writes`,
    );
  }
}
