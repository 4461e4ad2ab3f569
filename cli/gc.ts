// `hud gc`: remove the containers that killed runs left behind.

import { removeStaleContainers } from "../engines/gc.ts";
import { EXIT_OK, type Io, parseCommand, PROGRAM, stringOption, UsageError } from "./_common.ts";

/** The help of `hud gc`. */
export const USAGE: string = `Usage: ${PROGRAM} gc [--older-than SECONDS] [--socket PATH]

Removes the containers ContainerRuntime started whose creating process is
gone, and with --older-than also those older than that, and prints their ids.

Options:
  --older-than SECONDS  also remove containers of live runs this old
  --socket PATH         the engine's socket
  -h, --help            show this help
`;

/** Runs `hud gc` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "gc",
    usage: USAGE,
    options: { "older-than": { type: "string" }, socket: { type: "string" } },
    positionals: { names: [], min: 0 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values } = parsed;
  const olderText = stringOption(values, "older-than");
  const olderThan = olderText === undefined ? undefined : Number(olderText);
  if (olderThan !== undefined && (!Number.isFinite(olderThan) || olderThan < 0)) {
    throw new UsageError(`--older-than must be a number of seconds, got "${olderText}"`);
  }
  const removed = await removeStaleContainers({
    socket: stringOption(values, "socket"),
    olderThan: olderThan === undefined ? undefined : olderThan * 1000,
  });
  for (const id of removed) io.out(`${id}\n`);
  io.err(`gc: removed ${removed.length} container${removed.length === 1 ? "" : "s"}\n`);
  return EXIT_OK;
}
