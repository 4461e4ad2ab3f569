// `hud view FILE...`: serve a local web page over results files.

import { startViewer } from "../viewer/mod.ts";
import { checkResultsFile } from "./_results_file.ts";
import {
  EXIT_OK,
  type Io,
  parseCommand,
  parsePort,
  PROGRAM,
  STOP_SIGNALS,
  stringOption,
} from "./_common.ts";

/** The help of `hud view`. */
export const USAGE: string = `Usage: ${PROGRAM} view FILE [FILE...] [--port PORT]

Serves a page over the results files (the JSONL that "eval --out" writes)
on 127.0.0.1 and prints its url, which carries the page's token. For each
job: what ran (agent or model and its settings, the environment), the
counts, mean reward, pass@k, subscores, tokens and cost, plots of rewards
and durations, a table per task, and a sortable, filterable table of
rollouts; for each rollout its grade, a timeline, the conversation or the
command's output, and the file diffs; with two files or more, a comparison
task by task. A resumed job's replaced attempts are history, never
counted. Rollouts appended to a file while the page is open appear as they
arrive. Serves until SIGINT or SIGTERM.

Options:
  --port PORT    port to listen on, 0 for any free port (default: 0)
  -h, --help     show this help
`;

/** Runs `hud view` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "view",
    usage: USAGE,
    options: { port: { type: "string" } },
    positionals: { names: ["FILE", ...Array(64).fill("FILE")], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const port = parsePort(stringOption(parsed.values, "port") ?? "0");
  for (const path of parsed.positionals) await checkResultsFile(path);
  const stopped = new AbortController();
  const signal = io.signal ? AbortSignal.any([io.signal, stopped.signal]) : stopped.signal;
  const onSignal = () => stopped.abort();
  for (const s of STOP_SIGNALS) Deno.addSignalListener(s, onSignal);
  try {
    const viewer = await startViewer(parsed.positionals, { port, signal });
    io.out(`Viewing ${parsed.positionals.length} results file(s) at ${viewer.url}\n`);
    await viewer.finished;
  } finally {
    for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, onSignal);
  }
  return EXIT_OK;
}
