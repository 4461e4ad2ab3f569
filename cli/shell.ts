// `hud shell [COMMAND...]`: the shell capability of a served environment
// (the workspace an agent gets), from the command line: where a task that
// `start` parked has its files. Through the control port's forwarder, with
// the SDK's SSH client, as an agent reaches it.

import type { SshClient, SshProcess } from "../ssh/mod.ts";
import { shellQuote } from "../_internal/shell.ts";
import { EXIT_FAILURE, EXIT_OK, type Io, parseCommand, PROGRAM, stringOption } from "./_common.ts";
import {
  connectTo,
  DEFAULT_URL,
  readyTimeoutHelp,
  resolveTarget,
  tokenFileHelp,
} from "./_connect.ts";

/** The help of `hud shell`. */
export const USAGE: string =
  `Usage: ${PROGRAM} shell [--url URL] [--token-file PATH] [--cwd DIR] [--capability NAME] [-- COMMAND...]

Opens the shell of a served environment: its workspace, as an agent reaches
it (the same sandbox and user), where a task that "${PROGRAM} start --url"
parked has its files. With COMMAND, runs it there (its words joined with
spaces, as ssh does) and exits with its exit code; without, a shell, on a
terminal when standard input is one ("exit" or Ctrl-D ends it), else
reading its commands from standard input.

Options:
  --url URL           a served environment (default: ${DEFAULT_URL})
${tokenFileHelp(22)}
  --cwd DIR           the directory to start in (the task's: "${PROGRAM} start"
                      prints it; default: the workspace's root)
  --capability NAME   the shell binding to open (default: "shell")
${readyTimeoutHelp(22)}
  -h, --help          show this help
`;

/** The command line run on the other side: COMMAND, or a shell, in `cwd` when given. */
function remoteCommand(words: string[], cwd: string | undefined, terminal: boolean): string {
  const command = words.length > 0 ? words.join(" ") : terminal ? "exec bash -i" : "exec bash";
  return cwd === undefined ? command : `cd ${shellQuote(cwd)} && ${command}`;
}

/** This terminal's columns and rows; 80x24 where it says none (a fresh pty says 0x0). */
function terminalSize(): [number, number] {
  const { columns, rows } = Deno.consoleSize();
  return columns > 0 && rows > 0 ? [columns, rows] : [80, 24];
}

/** Writes a stream to `write` as text, as it comes. */
async function drain(stream: ReadableStream<Uint8Array>, write: (text: string) => void) {
  const decoder = new TextDecoder();
  for await (const chunk of stream) write(decoder.decode(chunk, { stream: true }));
  const rest = decoder.decode();
  if (rest !== "") write(rest);
}

/**
 * Runs `proc` to its end with this terminal or these streams: standard
 * input in (raw on a terminal, with its size followed), output out.
 */
async function attach(proc: SshProcess, io: Io, terminal: boolean): Promise<void> {
  const input = new AbortController();
  const onResize = () => proc.resize(...terminalSize());
  if (terminal) {
    Deno.stdin.setRaw(true);
    Deno.addSignalListener("SIGWINCH", onResize);
  }
  try {
    const feeding = io.stdin().pipeTo(proc.stdin, { signal: input.signal }).catch(() => {});
    await Promise.all([drain(proc.stdout, io.out), drain(proc.stderr, io.err), proc.status]);
    input.abort();
    await feeding;
  } finally {
    if (terminal) {
      Deno.removeSignalListener("SIGWINCH", onResize);
      Deno.stdin.setRaw(false);
    }
  }
}

/** Runs `hud shell` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "shell",
    usage: USAGE,
    options: {
      url: { type: "string" },
      "token-file": { type: "string" },
      cwd: { type: "string" },
      capability: { type: "string" },
      "ready-timeout": { type: "string" },
    },
    positionals: { names: ["COMMAND"], min: 0, rest: true },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals } = parsed;
  const target = await resolveTarget(values, io);
  await using client = await connectTo(target, io, values, { forward: true });
  const name = stringOption(values, "capability") ?? "shell";
  const binding = client.binding(name);
  if (binding.family !== "ssh") {
    throw new Error(
      `Cannot open a shell: binding "${binding.name}" speaks "${binding.protocol}", not ssh; name a shell with --capability`,
    );
  }
  await using shell = await client.open(binding.name, { signal: io.signal }) as SshClient;
  const terminal = positionals.length === 0 && io.stdin() === Deno.stdin.readable &&
    Deno.stdin.isTerminal();
  const [cols, rows] = terminal ? terminalSize() : [0, 0];
  await using proc = await shell.spawn(
    remoteCommand(positionals, stringOption(values, "cwd"), terminal),
    { signal: io.signal, ...(terminal ? { pty: { cols, rows } } : {}) },
  );
  await attach(proc, io, terminal);
  const status = await proc.status;
  if (status.code !== null) return status.code;
  io.err(`The command was killed by ${status.signal}\n`);
  return EXIT_FAILURE;
}
