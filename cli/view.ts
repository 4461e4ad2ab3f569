// `hud view FILE...`: serve a local web page over results files.

import { serveViewer } from "../viewer/mod.ts";
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
on 127.0.0.1 and prints its url. The page shows each job's summary, a
sortable, filterable table of rollouts, each rollout's steps with the
file diffs and the grade, and, with two files or more, a comparison of
rewards task by task. Rollouts appended to a file while the page is open
appear as they arrive. Serves until SIGINT or SIGTERM.

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
  const stopped = new AbortController();
  const signal = io.signal ? AbortSignal.any([io.signal, stopped.signal]) : stopped.signal;
  const onSignal = () => stopped.abort();
  for (const s of STOP_SIGNALS) Deno.addSignalListener(s, onSignal);
  try {
    const viewer = await serveViewer(parsed.positionals, { port, signal });
    io.out(`Viewing ${parsed.positionals.length} results file(s) at ${viewer.url}\n`);
    await viewer.finished;
  } finally {
    for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, onSignal);
  }
  return EXIT_OK;
}
