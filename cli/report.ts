// `hud report FILE...`: a table per task of results files, one HTML page,
// or the rollouts as Harbor trajectories (ATIF).

import meta from "../deno.json" with { type: "json" };
import { renderReport } from "../viewer/mod.ts";
import { Job } from "../eval/job.ts";
import { formatJobTable } from "../eval/report.ts";
import { writePrivateText } from "../_internal/private_file.ts";
import { writeTrajectories } from "../eval/atif.ts";
import { EXIT_OK, type Io, parseCommand, PROGRAM, stringOption, UsageError } from "./_common.ts";
import { checkResultsFile } from "./_results_file.ts";

/** The help of `hud report`. */
export const USAGE: string = `Usage: ${PROGRAM} report FILE [FILE...] [--html OUT]
       ${PROGRAM} report FILE --atif DIR

Prints a table per task of the results file (the JSONL that "eval --out"
writes), as "eval" closes a run: the latest attempt of each task and repeat
counts, the attempts it replaced (a resumed job's cancelled ones) are named,
never counted. With --html, writes instead one self-contained HTML page
(inline CSS and script, no network) that shows what "view" shows, to attach
to a review or open from disk. With --atif, writes each counted rollout as a
trajectory in Harbor's format (ATIF v1.4), DIR/<task slug>.<repeat>.json,
readable by the user only.

Options:
  --html OUT     write the page to OUT (created 0600: it holds the traces)
  --atif DIR     write ATIF v1.4 trajectories into DIR (made if missing)
  -h, --help     show this help
`;

/** Runs `hud report` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "report",
    usage: USAGE,
    options: { html: { type: "string" }, atif: { type: "string" } },
    positionals: { names: ["FILE", ...Array(64).fill("FILE")], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const html = stringOption(parsed.values, "html");
  const atif = stringOption(parsed.values, "atif");
  if (html !== undefined && atif !== undefined) {
    throw new UsageError("give --html or --atif, not both");
  }
  for (const path of parsed.positionals) await checkResultsFile(path);
  if (html !== undefined) {
    // The page holds the traces of the results files, which are their owner's alone.
    await writePrivateText(html, await renderReport(parsed.positionals));
    io.err(`Wrote ${html}\n`);
    return EXIT_OK;
  }
  if (atif !== undefined) {
    if (parsed.positionals.length > 1) {
      throw new UsageError("--atif takes one results file; run it once per file");
    }
    const written = await writeTrajectories(parsed.positionals[0], atif, {
      sdkVersion: meta.version,
    });
    io.err(`Wrote ${written.length} trajectories (ATIF v1.4) into ${atif}\n`);
    return EXIT_OK;
  }
  for (const path of parsed.positionals) {
    if (parsed.positionals.length > 1) io.out(`${path}\n`);
    io.out(formatJobTable(await Job.load(path)));
  }
  return EXIT_OK;
}
