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
  const observer = new FileObserver(capability, options);
  await observer.begin();
  const stop = new AbortController();
  const polling = observer.poll(stop.signal);
  try {
    return await run();
  } finally {
    stop.abort();
    await polling;
    await observer.finish();
  }
}

/**
 * The tracker calls of one observed run, over one connection at a time:
 * each failure is reported, and a lost connection is dropped for a new one
 * at the next poll (up to `maxReconnects` failures in a row).
 */
class FileObserver {
  readonly #capability: Capability;
  readonly #options: ObserveFilesOptions;
  readonly #pollInterval: number;
  readonly #callTimeout: number;
  readonly #maxReconnects: number;
  #client: FileTrackerClient | null = null;
  #reconnectFailures = 0;

  constructor(capability: Capability, options: ObserveFilesOptions) {
    this.#capability = capability;
    this.#options = options;
    this.#pollInterval = options.pollInterval ?? 2000;
    this.#callTimeout = options.callTimeout ?? 60_000;
    this.#maxReconnects = options.maxReconnects ?? 3;
  }

  /** Before the run: connect, then `setup` (or `advance`) and `snapshot`. */
  async begin(): Promise<void> {
    try {
      await this.#open();
    } catch (err) {
      this.#fail(err);
    }
    if (this.#client) await this.#prime();
    // Never connected (or dropped at once): do not retry.
    if (!this.#client) this.#reconnectFailures = this.#maxReconnects;
  }

  async #prime(): Promise<void> {
    try {
      if (this.#capability.params.setup_diff === true) {
        const result = await this.#call("setup", (c, s) => c.setup({ signal: s }));
        if (patchCount(result) > 0) this.#emit({ kind: "setup", result });
      } else {
        await this.#call("advance", (c, s) => c.advance({ signal: s }));
      }
      const snapshot = await this.#call("snapshot", (c, s) => c.snapshot({ signal: s }));
      if (Array.isArray(snapshot.files) && snapshot.files.length > 0) {
        this.#emit({ kind: "snapshot", result: snapshot });
      }
    } catch (err) {
      this.#fail(err);
    }
  }

  /** While the run goes on (until `stop` aborts): `diff` every `pollInterval`. */
  async poll(stop: AbortSignal): Promise<void> {
    const signal = this.#options.signal;
    const pollSignal = signal ? AbortSignal.any([stop, signal]) : stop;
    while (this.#client || this.#reconnectFailures < this.#maxReconnects) {
      try {
        await delay(this.#pollInterval, pollSignal);
      } catch {
        return; // the run ended or tracking was cancelled
      }
      if (!this.#client && !await this.#reconnect()) continue;
      try {
        // Not tied to `stop`: a diff in flight when the run ends completes.
        await this.#diff();
      } catch (err) {
        this.#fail(err);
      }
    }
  }

  /** A new connection, moved to now; whether it worked. */
  async #reconnect(): Promise<boolean> {
    try {
      await this.#open();
      // A new connection starts at the tracker's baseline: move it to now.
      await this.#call("advance", (c, s) => c.advance({ signal: s }));
      this.#reconnectFailures = 0;
      return true;
    } catch (err) {
      this.#reconnectFailures++;
      this.#fail(err);
      return false;
    }
  }

  /** After the run (even one that threw): `flush`, then close. */
  async finish(): Promise<void> {
    if (!this.#client) return;
    try {
      const result = await this.#call("flush", (c, s) => c.flush({ signal: s }));
      if (flushHasContent(result)) this.#emit({ kind: "flush", result });
    } catch (err) {
      this.#report(err);
      // A tracker without flush (an older HUD one) still has the last
      // changes: take them as a diff rather than lose them.
      if (err instanceof HudProtocolError && this.#client) {
        try {
          await this.#diff();
        } catch (again) {
          this.#report(again);
        }
      }
    }
    this.#client?.close();
  }

  async #diff(): Promise<void> {
    const result = await this.#call("diff", (c, s) => c.diff({ signal: s }));
    if (patchCount(result) > 0) this.#emit({ kind: "diff", result });
  }

  async #open(): Promise<void> {
    using deadline = new Deadline(this.#callTimeout, this.#options.signal, "filetracking connect");
    this.#client = await FileTrackerClient.connect(this.#capability.url, {
      signal: deadline.signal,
    });
  }

  async #call<R>(
    what: string,
    fn: (c: FileTrackerClient, s: AbortSignal) => Promise<R>,
  ): Promise<R> {
    const signal = this.#options.signal;
    using deadline = new Deadline(this.#callTimeout, signal, `filetracking ${what}`);
    return await fn(this.#client!, deadline.signal);
  }

  // An error reply leaves the connection usable: the next poll tries again.
  // Anything else (a timeout, a lost connection) drops it for a new one.
  #fail(err: unknown): void {
    this.#report(err);
    if (err instanceof HudProtocolError) return;
    this.#client?.close();
    this.#client = null;
  }

  #report(err: unknown): void {
    try {
      this.#options.onError?.(err);
    } catch {
      // A failing reporter must not fail the run either.
    }
  }

  #emit(event: FileTrackingEvent): void {
    try {
      this.#options.onResult?.(event);
    } catch (err) {
      this.#report(err);
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
