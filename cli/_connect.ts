// Reaching a served environment from `tasks`, `start` and `grade`: the --url
// and --ready-timeout flags, and a client that says why it could not connect.

import { connect, type HudClient } from "../client.ts";
import { NotReadyError } from "../errors.ts";
import { errorMessage } from "../_internal/util.ts";
import { redactUrl } from "../_internal/auth.ts";
import { type Io, stringOption, UsageError, type Values } from "./_common.ts";

/** The served environment `tasks`, `start` and `grade` reach unless told otherwise. */
export const DEFAULT_URL = "tcp://127.0.0.1:8765";
/** How long `tasks`, `start` and `grade` keep trying to reach a served environment. */
const CONNECT_TIMEOUT_S = 10;

/** Checks a --url value (tcp://host:port, with an optional token). */
export function checkUrl(url: string): string {
  if (!/^(tcp:\/\/)?([^@/?#\s]*@)?(\[[^\]]+\]|[^:/?#\s@]+):\d+\/?$/.test(url.trim())) {
    throw new UsageError(`--url must be tcp://host:port, got "${redactUrl(url)}"`);
  }
  return url;
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

/**
 * Connects to a served environment for a command: no heartbeat, no
 * forwarders, and a "not ready" error that says why.
 */
export async function connectTo(
  url: string,
  io: Io,
  values: Values,
  sessionId?: string,
): Promise<HudClient> {
  try {
    return await connect(url, {
      readyTimeout: readyTimeoutMs(values),
      retryInterval: 200,
      heartbeatInterval: 0,
      // Forwarders would die with this process; nobody could use them.
      forward: false,
      signal: io.signal,
      sessionId,
    });
  } catch (err) {
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

/** The --ready-timeout lines of a help text whose descriptions start at `column`. */
export function readyTimeoutHelp(column: number): string {
  const pad = " ".repeat(column);
  return `  --ready-timeout S`.padEnd(column) +
    `seconds to keep trying to reach the\n${pad}environment (default: ${CONNECT_TIMEOUT_S})`;
}
