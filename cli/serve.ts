// `hud serve FILE`: load an environment module and serve it on a control port
// until a signal (or the end of standard input) stops it.

import type { Environment } from "../env.ts";
import { loadEnvironment } from "../loader.ts";
import { servingOf } from "../_internal/serving.ts";
import { serve } from "../server.ts";
import { isLoopback } from "../_internal/net.ts";
import { errorMessage } from "../_internal/util.ts";
import {
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
  let fromEnv: string | undefined;
  try {
    fromEnv = Deno.env.get("HUD_SERVE_TOKEN") || undefined;
    Deno.env.delete("HUD_SERVE_TOKEN");
  } catch {
    // No --allow-env: nothing to take.
  }
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
hooks, binds the control port and prints HUD_SERVE_PORT=<port> on standard
output. Serves until SIGINT, SIGTERM or SIGHUP, then closes every
connection, cancels held tasks and runs the shutdown hooks (a second signal
skips waiting for connections, but the shutdown hooks still run).

Clients must present a token: the one in --token-file, else the one in
HUD_SERVE_TOKEN, else a fresh random one, printed as HUD_SERVE_TOKEN=<token>
on standard output before the port line (and nowhere else). Clients take it
from HUD_SERVE_TOKEN or the url (tcp://:TOKEN@host:port).

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
                        (--token-file or HUD_SERVE_TOKEN); else serve
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

/** Runs `hud serve` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
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
  }, io);
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
  // Signals are handled from the start, not from when serve() announces the
  // port: a SIGTERM that arrives while the module loads or the initialize
  // hooks run then still ends in the shutdown hooks, and one sent right
  // after the announcement cannot kill the process before its handler is
  // in place. A second signal exits sooner, once the shutdown hooks have
  // removed what must not stay on disk (key files).
  const stopped = new AbortController();
  const signal = io.signal ? AbortSignal.any([io.signal, stopped.signal]) : stopped.signal;
  let received = 0;
  let loaded: Environment | null = null;
  const onSignal = () => {
    if (++received > 1) {
      const stopping = loaded ? loaded.stop().catch(() => {}) : Promise.resolve();
      void stopping.then(() => Deno.exit(EXIT_INTERRUPTED));
      return;
    }
    stopped.abort(new Error("Stopped by a signal before serving"));
  };
  for (const s of STOP_SIGNALS) Deno.addSignalListener(s, onSignal);
  // The parent holds our stdin open; end of file means it is gone.
  const lifeline = values["stop-on-eof"] ? io.stdin().getReader() : null;
  const watching = lifeline && (async () => {
    try {
      while (!(await lifeline.read()).done) { /* discard */ }
    } catch {
      // A broken pipe means the same as end of file.
    }
    stopped.abort(new Error("Standard input closed before serving"));
  })();
  try {
    const env = await loadEnvironment(file, { name: stringOption(values, "env") });
    const itself = servingOf(env);
    if (itself !== undefined) {
      // Serving it again would print a second port line for the same environment.
      await itself.shutdown();
      throw new Error(
        `Cannot serve "${file}": the module serves its environment itself when imported; ` +
          `guard its serve() call with "if (import.meta.main)"`,
      );
    }
    loaded = env;
    const server = await serve(env, {
      hostname,
      port,
      ...auth,
      ...limits,
      signal,
      handleSignals: false,
      announce: (line) => io.out(line + "\n"),
      onError: (err) => io.err(`warning: ${errorMessage(err)}\n`),
    }).catch((err) => {
      if (err instanceof Deno.errors.AddrInUse) {
        throw new Error(
          `Cannot serve: address ${hostname}:${port} is already in use; pick another with --port`,
          { cause: err },
        );
      }
      throw err;
    });
    if (!signal.aborted) {
      io.err(
        `Serving "${env.name}" ${env.version} on tcp://${hostname}:${server.addr.port} (stop with Ctrl-C)\n`,
      );
    }
    await server.finished;
  } finally {
    for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, onSignal);
    if (lifeline) {
      await lifeline.cancel().catch(() => {});
      await watching;
    }
  }
  return EXIT_OK;
}
