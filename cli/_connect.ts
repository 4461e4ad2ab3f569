// Reaching a served environment from `tasks`, `start` and `grade`: the --url
// and --ready-timeout flags, and a client that says why it could not connect.

import { connect, type HudClient } from "../client.ts";
import { NotReadyError } from "../errors.ts";
import { errorMessage } from "../_internal/util.ts";
import { parseControlUrl, redactUrl, SERVE_TOKEN_VAR } from "../_internal/auth.ts";
import { type Io, readTokenFile, stringOption, UsageError, type Values } from "./_common.ts";

/** The served environment `tasks`, `start` and `grade` reach unless told otherwise. */
export const DEFAULT_URL = "tcp://127.0.0.1:8765";
/** How long `tasks`, `start` and `grade` keep trying to reach a served environment. */
const CONNECT_TIMEOUT_S = 10;

/** Checks a --url value (tcp://host:port, with an optional token). */
function checkUrl(url: string): string {
  if (!/^(tcp:\/\/)?([^@/?#\s]*@)?(\[[^\]]+\]|[^:/?#\s@]+):\d+\/?$/.test(url.trim())) {
    throw new UsageError(`--url must be tcp://host:port, got "${redactUrl(url)}"`);
  }
  return url;
}

/** A served environment as a command reaches it: the url, and the token when one was given. */
export interface Target {
  /** The --url value, checked; it may hold a token. */
  url: string;
  /** The token from --token-file; else the url's, else `HUD_SERVE_TOKEN` (connect reads it). */
  token?: string;
  /** The --token-file path, for hints that repeat the command. */
  tokenFile?: string;
}

/**
 * The --url (checked, default {@linkcode DEFAULT_URL}) and --token-file of
 * `tasks`, `start` and `grade`. A token in --url is taken, with a warning:
 * every local user can read a command line (`/proc/PID/cmdline`).
 * @throws {UsageError} for a bad url, both a token in it and --token-file, or
 *   a token file {@linkcode readTokenFile} refuses
 */
export async function resolveTarget(values: Values, io: Io): Promise<Target> {
  const url = checkUrl(stringOption(values, "url") ?? DEFAULT_URL);
  const tokenFile = stringOption(values, "token-file");
  let inUrl: boolean;
  try {
    inUrl = parseControlUrl(url).token !== undefined;
  } catch (err) {
    throw new UsageError(`--url: ${errorMessage(err)}`);
  }
  if (tokenFile !== undefined) {
    if (inUrl) {
      throw new UsageError(
        `give the token in --url or --token-file, not both (--token-file keeps it off the command line)`,
      );
    }
    return { url, token: await readTokenFile(tokenFile), tokenFile };
  }
  if (inUrl) {
    io.err(
      `warning: the token in --url can be read by every local user (in this process's command line); set ${SERVE_TOKEN_VAR} or pass --token-file PATH (a file only you can read) instead\n`,
    );
  }
  return { url };
}

/** The --ready-timeout value in ms. */
export function readyTimeoutMs(values: Values): number {
  const text = stringOption(values, "ready-timeout");
  if (text === undefined) return CONNECT_TIMEOUT_S * 1000;
  if (!/^\d+(\.\d+)?$/.test(text) || !(Number(text) > 0)) {
    throw new UsageError(`--ready-timeout must be a positive number of seconds, got "${text}"`);
  }
  return Number(text) * 1000;
}

/** What {@linkcode connectTo} does beyond reaching the environment. */
export interface ConnectToOptions {
  /** Resume this session (the one `start` parked a task in). */
  sessionId?: string;
  /** Open the capabilities' forwarders (for `shell`, which uses one while this process runs). */
  forward?: boolean;
}

/**
 * Connects to a served environment for a command: no heartbeat, no
 * forwarders unless asked, and a "not ready" error that says why.
 */
export async function connectTo(
  target: Target,
  io: Io,
  values: Values,
  options: ConnectToOptions = {},
): Promise<HudClient> {
  const { sessionId, forward = false } = options;
  // Unless told to wait for an environment that is starting, one refused
  // connection says that nothing listens there.
  const waits = stringOption(values, "ready-timeout") !== undefined;
  try {
    return await connect(target.url, {
      token: target.token,
      readyTimeout: readyTimeoutMs(values),
      ...(waits ? {} : { refusedTimeout: 0 }),
      retryInterval: 200,
      heartbeatInterval: 0,
      // Forwarders die with this process: only a command that uses them here opens them.
      forward,
      signal: io.signal,
      sessionId,
    });
  } catch (err) {
    if (
      !waits && err instanceof NotReadyError && err.cause instanceof Deno.errors.ConnectionRefused
    ) {
      throw new NotReadyError(
        `Cannot connect to ${redactUrl(target.url)}: nothing listens there (connection refused); ` +
          `start the environment there first ("${io.program} serve FILE --port ${
            portOf(target.url)
          }"), ` +
          `or wait for one that is starting with --ready-timeout S`,
        { cause: err },
      );
    }
    // Say why it was not ready: refused, reset, closed before hello...
    if (err instanceof NotReadyError && err.cause !== undefined) {
      const cause = errorMessage(err.cause).replace(/ \(os error \d+\)$/, "");
      throw new NotReadyError(
        `${err.message}: ${cause.charAt(0).toLowerCase()}${
          cause.slice(1)
        } (wait longer with --ready-timeout S)`,
        { cause: err },
      );
    }
    throw err;
  }
}

/** The port of a checked --url. */
function portOf(url: string): number {
  return parseControlUrl(url).port;
}

/** The --token-file lines of a help text whose descriptions start at `column`. */
export function tokenFileHelp(column: number): string {
  const pad = " ".repeat(column);
  return `  --token-file PATH`.padEnd(column) +
    `read the token from this file (mode 0600; else\n${pad}${SERVE_TOKEN_VAR}; a token in --url warns)`;
}

/** The --ready-timeout lines of a help text whose descriptions start at `column`. */
export function readyTimeoutHelp(column: number): string {
  const pad = " ".repeat(column);
  return `  --ready-timeout S`.padEnd(column) +
    `seconds to keep trying to reach the\n${pad}environment (default: ${CONNECT_TIMEOUT_S})`;
}
