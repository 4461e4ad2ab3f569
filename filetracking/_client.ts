/**
 * {@linkcode FileTrackerClient}, which calls a `filetracking/1` server
 * (`tracker.ts`) over newline-delimited JSON-RPC 2.0, one call at a time.
 *
 * @module
 */

import { type Capability, parseHostPort } from "../capability.ts";
import { abortable } from "../_internal/async.ts";
import { closeQuietly } from "../_internal/io.ts";
import { JsonRpcCaller } from "../_internal/rpc.ts";
import { dialOwn } from "../_internal/peer_uid.ts";
import type { AdvanceResult, FileDiff, FileSnapshot, FlushResult, Method } from "./_core.ts";

const MIB = 1024 * 1024;
/** Replies carry up to 50 MiB of patches plus 15 MiB of base64 artifacts. */
const DEFAULT_MAX_REPLY = 256 * MIB;

/** Options for {@linkcode FileTrackerClient.connect}. */
export interface FileTrackerClientOptions {
  /** Aborts the connection attempt. */
  signal?: AbortSignal;
  /**
   * Largest reply accepted, in bytes; a longer one closes the connection.
   * @default 268435456 (256 MiB)
   */
  maxFrame?: number;
}

/** Options for one {@linkcode FileTrackerClient} call. */
export interface FileTrackerCallOptions {
  /** Aborts the call; the connection is closed, as a reply may be half read. */
  signal?: AbortSignal;
}

/**
 * A client for a `filetracking/1` server. Calls are sent one at a time on a
 * single connection; concurrent calls queue.
 *
 * @example Read what changed
 * ```ts
 * import { FileTrackerClient, startFileTracker } from "./tracker.ts";
 * import assert from "node:assert/strict";
 *
 * const root = await Deno.makeTempDir();
 * try {
 *   await using tracker = await startFileTracker(root);
 *   await using client = await FileTrackerClient.connect(tracker.url);
 *   const snapshot = await client.snapshot();
 *   assert.equal(snapshot.files_scanned, 0);
 * } finally {
 *   await Deno.remove(root, { recursive: true });
 * }
 * ```
 */
export class FileTrackerClient implements AsyncDisposable {
  readonly #caller: JsonRpcCaller;

  /** Use {@linkcode FileTrackerClient.connect}. */
  constructor(conn: Deno.TcpConn, maxFrame: number = DEFAULT_MAX_REPLY) {
    this.#caller = new JsonRpcCaller(conn, { maxFrameBytes: maxFrame, peer: "the file tracker" });
  }

  /**
   * Connects to a tracker.
   * @param url `tcp://host:port` or `host:port`
   * @param options cancellation and the reply size limit
   * @returns the connected client
   * @throws {TypeError} when the url is not a `tcp` url with a host and port
   */
  static async connect(
    url: string,
    options: FileTrackerClientOptions = {},
  ): Promise<FileTrackerClient> {
    const { hostname, port } = parseTrackerUrl(url);
    const { signal } = options;
    signal?.throwIfAborted();
    // Noted as this process's own: a forwarder of this process it reaches
    // knows its user without reading the kernel's socket tables.
    const connecting = dialOwn(port, () => Deno.connect({ hostname, port, transport: "tcp" }));
    let conn: Deno.TcpConn;
    try {
      conn = await abortable(connecting, signal);
    } catch (err) {
      // A connection that lands after the abort must not leak.
      connecting.then((c) => closeQuietly(c), () => {});
      throw err;
    }
    return new FileTrackerClient(conn, options.maxFrame ?? DEFAULT_MAX_REPLY);
  }

  /**
   * Connects to a `filetracking/1` capability's url (from
   * `HudClient.binding()`, the local forwarder's).
   * @param capability a `filetracking/1` binding
   * @param options cancellation and the reply size limit
   * @returns the connected client
   * @throws {TypeError} when the capability is not a file tracker or its url
   *   is not a `tcp` url with a host and port
   */
  static async fromBinding(
    capability: Capability,
    options: FileTrackerClientOptions = {},
  ): Promise<FileTrackerClient> {
    if (capability?.family !== "filetracking") {
      throw new TypeError(
        `Cannot open binding "${capability?.name}": expected a filetracking binding, got "${capability?.protocol}"`,
      );
    }
    return await FileTrackerClient.connect(capability.url, options);
  }

  /** Whether {@linkcode FileTrackerClient.close} was called or the connection broke. */
  get closed(): boolean {
    return this.#caller.closed;
  }

  /** Every tracked file now. */
  snapshot(options?: FileTrackerCallOptions): Promise<FileSnapshot> {
    return this.#call("snapshot", options);
  }

  /** Changes since this connection's last `diff`, `setup`, `advance` or `flush`. */
  diff(options?: FileTrackerCallOptions): Promise<FileDiff> {
    return this.#call("diff", options);
  }

  /** Changes since the tracker started (what the task's setup did); then re-baselines. */
  setup(options?: FileTrackerCallOptions): Promise<FileDiff> {
    return this.#call("setup", options);
  }

  /** Re-baselines without reporting changes. */
  advance(options?: FileTrackerCallOptions): Promise<AdvanceResult> {
    return this.#call("advance", options);
  }

  /** The final diff plus captured artifact files. */
  flush(options?: FileTrackerCallOptions): Promise<FlushResult> {
    return this.#call("flush", options);
  }

  /** Closes the connection. Idempotent; queued calls fail with `ConnectionClosedError`. */
  close(): void {
    this.#caller.close();
  }

  /** Closes the connection. */
  [Symbol.asyncDispose](): Promise<void> {
    this.close();
    return Promise.resolve();
  }

  async #call<T>(method: Method, options: FileTrackerCallOptions = {}): Promise<T> {
    return await this.#caller.call(method, {}, { signal: options.signal }) as T;
  }
}

function parseTrackerUrl(url: string): { hostname: string; port: number } {
  if (typeof url !== "string") {
    throw new TypeError("Cannot connect to file tracker: url must be a string");
  }
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(url)?.[1]?.toLowerCase();
  if (scheme !== undefined && scheme !== "tcp") {
    throw new TypeError(
      `Cannot connect to file tracker: unsupported scheme "${scheme}" in "${url}"`,
    );
  }
  const parsed = parseHostPort(scheme === undefined ? `tcp://${url}` : url);
  if (parsed === null || parsed.port === null) {
    throw new TypeError(`Cannot connect to file tracker: invalid url "${url}"`);
  }
  return { hostname: parsed.hostname, port: parsed.port };
}
