// The one accept loop for every listener the SDK opens (the control
// server, the SSH server, the file tracker, the client's forwarders).

import { delay } from "./async.ts";
import { isPeerGone } from "./io.ts";

/** Pause after a failed `accept()` (out of file descriptors...) before the next. */
const ACCEPT_BACKOFF_MS = 50;

/** Options for {@linkcode acceptLoop}. */
export interface AcceptLoopOptions {
  /**
   * Whether the owner is closing the listener: an error then ends the loop
   * without a report.
   */
  closing?: () => boolean;
  /**
   * Receives `accept()` failures other than the listener closing (running
   * out of file descriptors, say), and anything `handle` throws. The loop
   * pauses briefly after an `accept()` failure and goes on.
   */
  onError?: (error: unknown) => void;
  /**
   * Before each `accept()`: `null` to accept now, or a promise to wait for
   * first (asked again once it settles). A connection not accepted waits in
   * the kernel's queue and holds none of this process's descriptors, so an
   * owner near its descriptor limit pauses here rather than accepting to close.
   */
  room?: () => Promise<void> | null;
}

/**
 * Accepts connections until the listener is closed, handing each to
 * `handle` (which must not block: start the connection's task and return).
 * Resolves once the listener is closed; never rejects.
 */
export async function acceptLoop<C extends Deno.Conn>(
  listener: Deno.Listener<C>,
  handle: (conn: C) => void,
  options: AcceptLoopOptions = {},
): Promise<void> {
  const report = options.onError ?? (() => {});
  while (true) {
    for (let wait = options.room?.(); wait; wait = options.room?.()) await wait;
    let conn: C;
    try {
      conn = await listener.accept();
    } catch (err) {
      // A closed listener ends the loop; a connection that went away while
      // it waited to be accepted only ends itself.
      if (options.closing?.() || err instanceof Deno.errors.BadResource) return;
      if (isPeerGone(err)) continue;
      report(err);
      await delay(ACCEPT_BACKOFF_MS);
      continue;
    }
    try {
      handle(conn);
    } catch (err) {
      report(err);
    }
  }
}
