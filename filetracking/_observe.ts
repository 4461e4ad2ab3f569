/**
 * {@linkcode observeFiles}: the `filetracking/1` calls a rollout makes
 * around an agent run, through {@linkcode FileTrackerClient}, reporting each
 * non-empty result and riding out the tracker's failures.
 *
 * @module
 */

import type { Capability } from "../capability.ts";
import { HudProtocolError } from "../errors.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { isRecord } from "../_internal/util.ts";
import type { FileDiff, FileSnapshot, FlushResult } from "./_core.ts";
import { FileTrackerClient } from "./_client.ts";

/** One result an observer reports, tagged with the call that produced it. */
export type FileTrackingEvent =
  | { kind: "setup"; result: FileDiff }
  | { kind: "snapshot"; result: FileSnapshot }
  | { kind: "diff"; result: FileDiff }
  | { kind: "flush"; result: FlushResult };

/** Options for {@linkcode observeFiles}. */
export interface ObserveFilesOptions {
  /**
   * Milliseconds between `diff` calls while the run goes on.
   * @default 2000
   */
  pollInterval?: number;
  /**
   * Milliseconds each tracker call (and the connection) may take.
   * @default 60000
   */
  callTimeout?: number;
  /**
   * Receives each non-empty result: a `setup` or `diff` with changes, a
   * `snapshot` with files, a `flush` with changes or eligible artifacts.
   */
  onResult?: (event: FileTrackingEvent) => void;
  /**
   * Receives tracker failures (connection refused, error replies, timeouts).
   * Tracking goes on: after an error reply on the same connection, after a
   * lost connection on a new one (changes made while it was down may be
   * missing from the trace); the run goes on in any case.
   */
  onError?: (error: unknown) => void;
  /**
   * Consecutive failed reconnections after which tracking stops.
   * @default 3
   */
  maxReconnects?: number;
  /** Stops tracking (not the run) when aborted. */
  signal?: AbortSignal;
}

/**
 * Runs `run` while observing a `filetracking/1` capability: before it,
 * `setup` (or `advance` when the capability's `setup_diff` is not `true`) and
 * `snapshot`; while it runs, `diff` every `pollInterval`; after it (even when
 * it throws), `flush`. Tracker failures never fail the run: they go to
 * `onError`, and tracking goes on (see {@linkcode ObserveFilesOptions.onError}).
 *
 * @example Observe a run
 * ```ts
 * import { type FileTrackingEvent, observeFiles, startFileTracker } from "./tracker.ts";
 * import assert from "node:assert/strict";
 *
 * const root = await Deno.makeTempDir();
 * try {
 *   await using tracker = await startFileTracker(root);
 *   const events: FileTrackingEvent[] = [];
 *   const answer = await observeFiles(tracker.capability(), async () => {
 *     await Deno.writeTextFile(`${root}/fix.py`, "print('fixed')\n");
 *     return 42;
 *   }, { onResult: (e) => events.push(e) });
 *   assert.equal(answer, 42);
 *   assert.deepEqual(events.map((e) => e.kind), ["flush"]);
 * } finally {
 *   await Deno.remove(root, { recursive: true });
 * }
 * ```
 *
 * @param capability the `filetracking/1` binding (its url must be reachable)
 * @param run the agent run
 * @param options polling, callbacks and cancellation
 * @returns what `run` returns
 * @throws whatever `run` throws, and nothing else
 */
export async function observeFiles<T>(
  capability: Capability,
  run: () => Promise<T>,
  options: ObserveFilesOptions = {},
): Promise<T> {
  const pollInterval = options.pollInterval ?? 2000;
  const callTimeout = options.callTimeout ?? 60_000;
  const { signal } = options;
  const report = (err: unknown) => {
    try {
      options.onError?.(err);
    } catch {
      // A failing reporter must not fail the run either.
    }
  };
  const emit = (event: FileTrackingEvent) => {
    try {
      options.onResult?.(event);
    } catch (err) {
      report(err);
    }
  };
  let client: FileTrackerClient | null = null;
  const call = async <R>(
    what: string,
    fn: (c: FileTrackerClient, s: AbortSignal) => Promise<R>,
  ) => {
    using deadline = new Deadline(callTimeout, signal, `filetracking ${what}`);
    return await fn(client!, deadline.signal);
  };
  // An error reply leaves the connection usable: the next poll tries again.
  // Anything else (a timeout, a lost connection) drops it for a new one.
  const fail = (err: unknown) => {
    report(err);
    if (err instanceof HudProtocolError) return;
    client?.close();
    client = null;
  };
  const open = async () => {
    using deadline = new Deadline(callTimeout, signal, "filetracking connect");
    client = await FileTrackerClient.connect(capability.url, { signal: deadline.signal });
  };

  try {
    await open();
  } catch (err) {
    fail(err);
  }
  if (client) {
    try {
      if (capability.params.setup_diff === true) {
        const result = await call("setup", (c, s) => c.setup({ signal: s }));
        if (patchCount(result) > 0) emit({ kind: "setup", result });
      } else {
        await call("advance", (c, s) => c.advance({ signal: s }));
      }
      const snapshot = await call("snapshot", (c, s) => c.snapshot({ signal: s }));
      if (Array.isArray(snapshot.files) && snapshot.files.length > 0) {
        emit({ kind: "snapshot", result: snapshot });
      }
    } catch (err) {
      fail(err);
    }
  }

  const maxReconnects = options.maxReconnects ?? 3;
  let reconnectFailures = client ? 0 : maxReconnects; // never connected: do not retry
  const stop = new AbortController();
  const pollSignal = signal ? AbortSignal.any([stop.signal, signal]) : stop.signal;
  const poll = async () => {
    while (client || reconnectFailures < maxReconnects) {
      try {
        await delay(pollInterval, pollSignal);
      } catch {
        return; // the run ended or tracking was cancelled
      }
      if (!client) {
        try {
          await open();
          // A new connection starts at the tracker's baseline: move it to now.
          await call("advance", (c, s) => c.advance({ signal: s }));
          reconnectFailures = 0;
        } catch (err) {
          reconnectFailures++;
          fail(err);
          continue;
        }
      }
      try {
        // Not tied to `stop`: a diff in flight when the run ends completes.
        const result = await call("diff", (c, s) => c.diff({ signal: s }));
        if (patchCount(result) > 0) emit({ kind: "diff", result });
      } catch (err) {
        fail(err);
      }
    }
  };
  const polling = poll();
  try {
    return await run();
  } finally {
    stop.abort();
    await polling;
    if (client) {
      try {
        const result = await call("flush", (c, s) => c.flush({ signal: s }));
        if (flushHasContent(result)) emit({ kind: "flush", result });
      } catch (err) {
        report(err);
        // A tracker without flush (an older HUD one) still has the last
        // changes: take them as a diff rather than lose them.
        if (err instanceof HudProtocolError && client) {
          try {
            const result = await call("diff", (c, s) => c.diff({ signal: s }));
            if (patchCount(result) > 0) emit({ kind: "diff", result });
          } catch (again) {
            report(again);
          }
        }
      }
      (client as FileTrackerClient | null)?.close();
    }
  }
}

/** Patches in a `diff`/`setup` result, whatever else it holds (0 for none). */
function patchCount(result: unknown): number {
  return isRecord(result) && Array.isArray(result.patches) ? result.patches.length : 0;
}

/**
 * Whether a `flush` result reports anything: changes or artifacts. It reads
 * HUD's shape (`{"diff": {...}, "capture": {"files_eligible", ...}}`, which
 * this project's tracker sends too) and the flat one of earlier versions
 * (the diff's members beside `capture: {"eligible", ...}`).
 */
function flushHasContent(result: unknown): boolean {
  if (!isRecord(result)) return false;
  if (patchCount(isRecord(result.diff) ? result.diff : result) > 0) return true;
  const capture = isRecord(result.capture) ? result.capture : {};
  const counts = [capture.files_eligible, capture.files_captured, capture.eligible];
  return counts.some((n) => typeof n === "number" && n > 0) ||
    (Array.isArray(capture.files) && capture.files.length > 0);
}
