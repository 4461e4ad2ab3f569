// `hud report FILE...`: a table per task of results files, or one HTML page.

import { renderReport } from "../viewer/mod.ts";
import { Job } from "../eval/job.ts";
import type { RunRecord } from "../eval/results.ts";
import { formatJobTable } from "../eval/report.ts";
import { EXIT_OK, type Io, parseCommand, PROGRAM, stringOption } from "./_common.ts";

/** The help of `hud report`. */
export const USAGE: string = `Usage: ${PROGRAM} report FILE [FILE...] [--html OUT]

Prints a table per task of the results file (the JSONL that "eval --out"
writes). With --html, writes instead one self-contained HTML page (inline
CSS and script, no network) that shows what "view" shows, to attach to a
review or open from disk.

Options:
  --html OUT     write the page to OUT
  -h, --help     show this help
`;

/** Runs `hud report` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "report",
    usage: USAGE,
    options: { html: { type: "string" } },
    positionals: { names: ["FILE", ...Array(64).fill("FILE")], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const html = stringOption(parsed.values, "html");
  if (html !== undefined) {
    await Deno.writeTextFile(html, await renderReport(parsed.positionals));
    io.err(`Wrote ${html}\n`);
    return EXIT_OK;
  }
  for (const path of parsed.positionals) {
    const records: RunRecord[] = [];
    for (const line of (await Deno.readTextFile(path)).split("\n")) {
      if (line.trim() === "") continue;
      try {
        records.push(JSON.parse(line));
      } catch {
        // A line cut short by a crash.
      }
    }
    if (parsed.positionals.length > 1) io.out(`${path}\n`);
    io.out(formatJobTable(new Job(records[0]?.job_id ?? "-", records, records.map(() => null))));
  }
  return EXIT_OK;
}
