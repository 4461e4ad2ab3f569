// The runtimes' readiness probe: a `hello` round trip with the token, as
// connect() does it, without the client (no forwarders, no heartbeat, no
// protocol clients): a runtime waits for its environment with this.

import { parseControlUrl } from "../_internal/control_url.ts";
import { helloUntilReady } from "../_internal/ready.ts";
import { redactUrl, tokenFromEnv } from "../_internal/auth.ts";

/** Options for {@linkcode probeReady}. */
export interface ProbeOptions {
  /**
   * How long to keep trying, in ms.
   * @default 60_000
   */
  readyTimeout?: number;
  /**
   * How long connections may be refused before giving up.
   * @default the ready timeout (a placement that is starting refuses at first)
   */
  refusedTimeout?: number;
  /**
   * Pause between attempts, in ms.
   * @default 200
   */
  retryInterval?: number;
  /** Aborts the probe. */
  signal?: AbortSignal;
}

/** Replies to `hello` are a manifest: small. */
const PROBE_MAX_FRAME = 16 * 1024 * 1024;

/**
 * Resolves once the environment at `url` answers `hello` (with the url's
 * token, else `HUD_SERVE_TOKEN`), then closes the connection. Refusals and
 * connections closed before the reply are retried; an error reply (a wrong
 * token, say) fails at once.
 * @throws {NotReadyError} when it did not answer in time
 * @throws {HudProtocolError} for an error reply
 */
export async function probeReady(url: string, options: ProbeOptions = {}): Promise<void> {
  const { token, ...addr } = parseControlUrl(url);
  const readyTimeout = options.readyTimeout ?? 60_000;
  const secret = token ?? tokenFromEnv();
  const { caller } = await helloUntilReady(addr, secret === undefined ? {} : { token: secret }, {
    url: redactUrl(url),
    readyTimeout,
    refusedTimeout: options.refusedTimeout ?? readyTimeout,
    retryInterval: options.retryInterval ?? 200,
    maxFrameBytes: PROBE_MAX_FRAME,
    signal: options.signal,
  });
  caller.close();
}
