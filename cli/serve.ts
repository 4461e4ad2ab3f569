// `hud serve FILE`: load an environment module and serve it on a control port
// until a signal (or the end of standard input) stops it.

import type { Environment } from "../env.ts";
import { loadEnvironment } from "../loader.ts";
import { servingOf } from "../_internal/serving.ts";
import { type HudServer, serve } from "../server.ts";
import { isLoopback } from "../_internal/net.ts";
import {
  SERVE_PORT_VAR,
  SERVE_TOKEN_VAR,
  shownControlUrl,
  takeTokenFromEnv,
} from "../_internal/auth.ts";
import { errorMessage } from "../_internal/util.ts";
import { codeStack } from "../_internal/stack.ts";
import { redactSecrets } from "../_internal/redact.ts";
import type { TaskError } from "../errors.ts";
import {
  type CommandSpec,
  DEFAULT_PORT,
  EXIT_INTERRUPTED,
  EXIT_OK,
  type Io,
  parseCommand,
  parsePort,
  PROGRAM,
  readTokenFile,
  STOP_SIGNALS,
  stringOption,
  UsageError,
  type Values,
} from "./_common.ts";

/** A positive number option (`scale` converts seconds to ms), or undefined. */
function positiveOption(values: Values, name: string, scale: number): number | undefined {
  const text = stringOption(values, name);
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!/^\d+(\.\d+)?$/.test(text) || !(n > 0)) {
    throw new UsageError(`--${name} must be a positive number, got "${text}"`);
  }
  return scale === 1 ? Math.floor(n) : n * scale;
}

/**
 * `serve`'s auth options from its flags: the token from --token-file, else
 * HUD_SERVE_TOKEN (taken out of this process's environment, so that what
 * the environment's hooks start does not inherit it), else generated.
 */
async function serveAuth(
  values: Values,
  hostname: string,
): Promise<{ auth: boolean; token?: string; insecureListen?: boolean }> {
  const tokenFile = stringOption(values, "token-file");
  const fromEnv = takeTokenFromEnv();
  if (values["no-auth-without-token"]) {
    if (values["no-auth"]) {
      throw new UsageError("give --no-auth or --no-auth-without-token, not both");
    }
    // An image that HUD's runtimes start: they pass no token, and reach the
    // port the engine publishes, so the server listens on every interface.
    if (tokenFile === undefined && fromEnv === undefined) {
      return { auth: false, insecureListen: true };
    }
  }
  if (values["no-auth"]) {
    if (tokenFile !== undefined) throw new UsageError("give --token-file or --no-auth, not both");
    // The name as given; bind() checks the address it resolves to as well.
    if (!isLoopback(hostname) && !values["insecure-listen"]) {
      throw new UsageError(
        `--no-auth on "${hostname}" lets anyone who can reach it in; add --insecure-listen to mean it, or listen on 127.0.0.1`,
      );
    }
    return { auth: false, insecureListen: Boolean(values["insecure-listen"]) };
  }
  if (values["insecure-listen"] && !values["no-auth-without-token"]) {
    throw new UsageError("--insecure-listen needs --no-auth");
  }
  if (tokenFile === undefined) return { auth: true, token: fromEnv };
  return { auth: true, token: await readTokenFile(tokenFile) };
}

/** The help of `hud serve`. */
export const USAGE: string =
  `Usage: ${PROGRAM} serve FILE [--env NAME] [--host HOST] [--port PORT] [--stop-on-eof]
                 [--token-file PATH | --no-auth [--insecure-listen] | --no-auth-without-token]

Loads the environment from FILE (a TypeScript module), runs its initialize
hooks, binds the control port and prints ${SERVE_PORT_VAR}=<port> on standard
output. Serves until SIGINT, SIGTERM or SIGHUP, then closes every
connection, cancels held tasks and runs the shutdown hooks (a second signal
skips waiting for connections, but the shutdown hooks still run).

Clients must present a token: the one in --token-file, else the one in
${SERVE_TOKEN_VAR}, else a fresh random one, printed as ${SERVE_TOKEN_VAR}=<token>
on standard output before the port line (and nowhere else). The clients
(tasks, start, grade) take it from ${SERVE_TOKEN_VAR} or --token-file PATH:
a token on a command line can be read by every local user.

Options:
  --env NAME            the environment to serve, by export or environment
                        name (default: the module's only environment)
  --host HOST           interface to listen on (default: 127.0.0.1; use
                        0.0.0.0 in a container)
  --port PORT           port to listen on, 0 for any free port (default: ${DEFAULT_PORT})
  --stop-on-eof         also stop when standard input closes, so that a
                        server started by another program ends when that
                        program does
  --token-file PATH     read the token from this file (one line)
  --no-auth             accept clients without a token, as HUD's Python
                        SDK does: anyone who can reach the port can use the
                        environment; loopback hosts only, unless also given
  --insecure-listen     allow --no-auth on a non-loopback host
  --no-auth-without-token
                        require the token only when one is given
                        (--token-file or ${SERVE_TOKEN_VAR}); else serve
                        without authentication, on any host, as HUD's
                        images do (what images of "image" run, so that
                        HUD's runtimes, which send no token, can use them)
  --parked-ttl SECONDS  how long a parked task waits for its grader
                        (default: 3600)
  --max-parked N        most tasks parked at once (default: 10000)
  --max-connections N   most connections at once (default: the open-files
                        limit less a reserve)
  -h, --help            show this help
`;

/** The options and operand of `hud serve`. */
const SPEC: CommandSpec = {
  name: "serve",
  usage: USAGE,
  options: {
    env: { type: "string" },
    host: { type: "string" },
    port: { type: "string" },
    "stop-on-eof": { type: "boolean" },
    "token-file": { type: "string" },
    "no-auth": { type: "boolean" },
    "no-auth-without-token": { type: "boolean" },
    "insecure-listen": { type: "boolean" },
    "parked-ttl": { type: "string" },
    "max-parked": { type: "string" },
    "max-connections": { type: "string" },
  },
  positionals: { names: ["FILE"], min: 1 },
};

/** Runs `hud serve` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, SPEC, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [file] } = parsed;
  const hostname = stringOption(values, "host") ?? "127.0.0.1";
  const port = parsePort(stringOption(values, "port"));
  const limits = {
    parkedTtl: positiveOption(values, "parked-ttl", 1000),
    maxParked: positiveOption(values, "max-parked", 1),
    maxConnections: positiveOption(values, "max-connections", 1),
  };
  const auth = await serveAuth(values, hostname);
  using stopper = new Stopper(io.signal);
  // The parent holds our stdin open; end of file means it is gone.
  const lifeline = values["stop-on-eof"] ? watchStdin(io, stopper) : null;
  try {
    const env = await loadServable(file, stringOption(values, "env"));
    stopper.loaded(env);
    const server = await serve(env, {
      hostname,
      port,
      ...auth,
      ...limits,
      signal: stopper.signal,
      handleSignals: false,
      announce: (line) => io.out(line + "\n"),
      onError: (err) => io.err(`warning: ${errorMessage(err)}\n`),
      onTaskError: (err) => io.err(taskErrorLog(err)),
    }).catch((err) => {
      throw err instanceof Deno.errors.AddrInUse
        ? new Error(
          `Cannot serve: address ${hostname}:${port} is already in use; pick another with --port`,
          { cause: err },
        )
        : err;
    });
    if (!stopper.signal.aborted) serving(io, env, hostname, server);
    await server.finished;
  } finally {
    await lifeline?.stop();
  }
  return EXIT_OK;
}

/**
 * The serve log's lines for task code that threw: which task, the message,
 * and the environment's own frames (file and line), secrets redacted.
 */
export function taskErrorLog(err: TaskError): string {
  const where = codeStack(err.cause);
  const head = `task error: "${err.taskId}": ${redactSecrets(err.message)}${
    where === null ? "" : ` (at ${where.at})`
  }\n`;
  if (where === null) return head;
  return head + where.stack.split("\n").map((l) => `  ${l.trim()}\n`).join("");
}

/** Says on standard error where the environment is served (never with the token). */
function serving(io: Io, env: Environment, hostname: string, server: HudServer): void {
  const where = shownControlUrl({ hostname, port: server.addr.port });
  io.err(`Serving "${env.name}" ${env.version} on ${where} (stop with Ctrl-C)\n`);
}

/**
 * The environment of a module, refused when the module serves it itself on
 * import (serving it again would print a second port line for it).
 */
async function loadServable(file: string, name: string | undefined): Promise<Environment> {
  const env = await loadEnvironment(file, { name });
  const itself = servingOf(env);
  if (itself !== undefined) {
    await itself.shutdown();
    throw new Error(
      `Cannot serve "${file}": the module serves its environment itself when imported; ` +
        `guard its serve() call with "if (import.meta.main)"`,
    );
  }
  return env;
}

/**
 * Stops `serve` on SIGINT, SIGTERM or SIGHUP, handled from the start, not
 * from when serve() announces the port: a signal that arrives while the
 * module loads or the initialize hooks run then still ends in the shutdown
 * hooks, and one sent right after the announcement cannot kill the process
 * before its handler is in place. A second signal exits sooner, once the
 * shutdown hooks have removed what must not stay on disk (key files).
 */
class Stopper implements Disposable {
  readonly #stopped = new AbortController();
  readonly signal: AbortSignal;
  #env: Environment | null = null;
  #received = 0;

  constructor(outer: AbortSignal | undefined) {
    this.signal = outer ? AbortSignal.any([outer, this.#stopped.signal]) : this.#stopped.signal;
    for (const s of STOP_SIGNALS) Deno.addSignalListener(s, this.#onSignal);
  }

  /** The environment, once loaded: a second signal runs its shutdown hooks before exiting. */
  loaded(env: Environment): void {
    this.#env = env;
  }

  /** Stops serving (before it starts: never serves). */
  stop(reason: string): void {
    this.#stopped.abort(new Error(reason));
  }

  #onSignal = (): void => {
    if (++this.#received > 1) {
      const stopping = this.#env ? this.#env.stop().catch(() => {}) : Promise.resolve();
      void stopping.then(() => Deno.exit(EXIT_INTERRUPTED));
      return;
    }
    this.stop("Stopped by a signal before serving");
  };

  [Symbol.dispose](): void {
    for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, this.#onSignal);
  }
}

/** Stops serving when standard input ends (the parent that holds it open is gone). */
function watchStdin(io: Io, stopper: Stopper): { stop(): Promise<void> } {
  const reader = io.stdin().getReader();
  const watching = (async () => {
    try {
      while (!(await reader.read()).done) { /* discard */ }
    } catch {
      // A broken pipe means the same as end of file.
    }
    stopper.stop("Standard input closed before serving");
  })();
  return {
    async stop() {
      await reader.cancel().catch(() => {});
      await watching;
    },
  };
}
