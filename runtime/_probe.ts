// The runtimes' readiness probe: a `hello` round trip with the token, as
// connect() does it (the same helloUntilReady), without the client (no
// forwarders, no heartbeat, no protocol clients). A runtime waits for its
// environment with probeReady; a pool that watches a member's server holds
// the probe's connection open with holdReady.

import { type ControlAddress, shownControlUrl, tokenFromEnv } from "../_internal/auth.ts";
import { type HelloReply, helloUntilReady } from "../_internal/ready.ts";

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
 * A session held open after its `hello`: `ended` resolves when the server
 * closes the connection or it breaks (the server died, or its host), or
 * when it is closed here.
 */
export interface HeldSession {
  /** Resolves once the connection has ended, whoever ended it. */
  readonly ended: Promise<void>;
  /** Closes the connection. Idempotent. */
  close(): void;
}

/**
 * Resolves once the environment at `address` answers `hello` (with the
 * address's token, else `HUD_SERVE_TOKEN`), then closes the connection.
 * Refusals and connections closed before the reply are retried; an error
 * reply (a wrong token, say) fails at once.
 * @throws {NotReadyError} when it did not answer in time
 * @throws {HudProtocolError} for an error reply
 */
export async function probeReady(
  address: ControlAddress,
  options: ProbeOptions = {},
): Promise<void> {
  (await hello(address, options)).caller.close();
}

/**
 * {@linkcode probeReady}, keeping the connection: its end says that the
 * server went away, sooner than anything that polls. Nothing more is sent
 * on it.
 */
export async function holdReady(
  address: ControlAddress,
  options: ProbeOptions = {},
): Promise<HeldSession> {
  const { caller, conn } = await hello(address, options);
  const ended = (async () => {
    const buf = new Uint8Array(4096);
    try {
      while ((await conn.read(buf)) !== null) { /* nothing else comes */ }
    } catch {
      // reset, or closed here: the same
    }
  })();
  return { ended, close: () => caller.close() };
}

function hello(address: ControlAddress, options: ProbeOptions): Promise<HelloReply> {
  const readyTimeout = options.readyTimeout ?? 60_000;
  const token = address.token ?? tokenFromEnv();
  return helloUntilReady(address, token === undefined ? {} : { token }, {
    url: shownControlUrl(address),
    readyTimeout,
    refusedTimeout: options.refusedTimeout ?? readyTimeout,
    retryInterval: options.retryInterval ?? 200,
    maxFrameBytes: PROBE_MAX_FRAME,
    signal: options.signal,
  });
}
