/**
 * File tracking: what an agent changed in a workspace.
 *
 * {@linkcode startFileTracker} serves the `filetracking/1` capability over
 * newline-delimited JSON-RPC 2.0: `snapshot`, `diff`, `setup`, `advance` and
 * `flush`. {@linkcode FileTrackerClient} calls it, and
 * {@linkcode observeFiles} wraps an agent run with the calls a rollout makes
 * and reports each non-empty result.
 *
 * `diff`, `flush`, `setup` and `advance` report and move the position of the
 * connection that calls them: observers on separate connections (rollouts
 * running side by side on one workspace) each get every change, and none
 * consumes another's. `setup` reports against the baseline taken when the
 * tracker started; a new connection starts at that baseline too.
 *
 * @module
 */

import { Capability, parseHostPort } from "../capability.ts";
import { ErrorCode, HudProtocolError } from "../errors.ts";
import { encodeFrame, LineReader, parseLine } from "../_internal/framing.ts";
import { closeQuietly, isPeerGone, prefixed, writeAll } from "../_internal/io.ts";
import { abortable, Deadline, delay } from "../_internal/async.ts";
import { acceptLoop } from "../_internal/accept.ts";
import { formatHost } from "../_internal/net.ts";
import { type PeerUsers, peerUsers, refusePeer } from "../_internal/peer_uid.ts";
import { JsonRpcCaller } from "../_internal/rpc.ts";
import {
  type AdvanceResult,
  type FileDiff,
  type FileSnapshot,
  type FlushResult,
  Tracker,
} from "./_core.ts";
import { isRecord } from "../_internal/util.ts";

export type {
  AdvanceResult,
  ArtifactCapture,
  CapturedFile,
  FileDiff,
  FilePatch,
  FileSnapshot,
  FlushResult,
  PatchStatus,
  ScanIssue,
  SkippedArtifact,
  SnapshotFile,
} from "./_core.ts";

const MIB = 1024 * 1024;
/** Requests are small: a method name and empty params. */
const MAX_REQUEST = MIB;
/** Replies carry up to 50 MiB of patches plus 15 MiB of base64 artifacts. */
const DEFAULT_MAX_REPLY = 256 * MIB;

/** Options for {@linkcode startFileTracker}. */
export interface FileTrackerOptions {
  /**
   * Interface to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Port to listen on; 0 picks a free one.
   * @default 0
   */
  port?: number;
  /**
   * Listen on a TCP port. `false` serves only the connections handed to
   * {@linkcode FileTracker.attach} (as the control server's tunnel
   * does), so that the tracker has no port of its own; its `url` is then
   * the placeholder `tcp://127.0.0.1:0`.
   * @default true
   */
  listen?: boolean;
  /**
   * The local users (uids) whose connections the tracker's port serves; a
   * connection from anyone else is closed before it is read (and reported
   * to `onError`), since the tracker reads the tree as this process's user.
   * On Linux the owner of each accepted loopback connection is read from
   * `/proc/net/tcp` and `/proc/net/tcp6`; where it cannot be told (not
   * Linux), listening needs `"any"`, which serves every local user, or
   * `listen: false`. Connections handed to
   * {@linkcode FileTracker.attach} (the authenticated tunnel's) are
   * not checked.
   * @default [this process's uid]
   */
  allowUsers?: readonly number[] | "any";
  /** Shuts the tracker down when aborted. */
  signal?: AbortSignal;
  /** Called once listening, with the bound address. */
  onListen?: (addr: Deno.NetAddr) => void;
  /** Called with errors that are not a peer going away; the tracker keeps serving. */
  onError?: (error: unknown) => void;
  /**
   * Published as `setup_diff`: whether observers call `setup` (report what the
   * task's setup changed) rather than `advance`.
   * @default true
   */
  setupDiff?: boolean;
  /**
   * Files over this size get a placeholder instead of a diff.
   * @default 1048576 (1 MiB)
   */
  maxFileSize?: number;
  /**
   * Bytes of file content read per scan; files past it are tracked by
   * metadata and the result is marked `truncated`.
   * @default 52428800 (50 MiB)
   */
  scanBudget?: number;
  /**
   * Characters of patch text (or snapshot listing) per result; patches past
   * it become placeholders and the result is marked `truncated`.
   * @default 52428800 (50 MiB)
   */
  maxPayload?: number;
  /**
   * Artifact files `flush` captures.
   * @default 20
   */
  maxCaptureFiles?: number;
  /**
   * Largest artifact file `flush` captures, in bytes.
   * @default 5242880 (5 MiB)
   */
  maxCaptureFileSize?: number;
  /**
   * Bytes of artifacts `flush` captures in total.
   * @default 15728640 (15 MiB)
   */
  maxCaptureTotal?: number;
}

/** A running file tracker; shaped like the handle `Deno.serve` returns. */
export interface FileTracker extends AsyncDisposable {
  /** The bound address (port 0 when not listening). */
  readonly addr: Deno.NetAddr;
  /** `tcp://host:port` of the bound address. */
  readonly url: string;
  /**
   * Serves one already-open connection until it ends; `head` holds bytes
   * already read from it. The connection is closed afterwards.
   */
  attach(conn: Deno.Conn, head?: Uint8Array): Promise<void>;
  /** The tracked directory, resolved. */
  readonly root: string;
  /** Resolves once the tracker has shut down. */
  readonly finished: Promise<void>;
  /**
   * The `filetracking/1` capability to publish for this tracker.
   * @param name capability name; defaults to `filetracking`
   */
  capability(name?: string): Capability;
  /** Stops listening, closes every connection and waits for them. Idempotent. */
  shutdown(): Promise<void>;
}

function positive(name: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || Number.isNaN(value)) {
    throw new TypeError(`Cannot start file tracker: "${name}" must be a number`);
  }
  if (value < 0) throw new RangeError(`Cannot start file tracker: "${name}" must not be negative`);
  return value;
}

/**
 * Takes a baseline of `root`, then serves `filetracking/1` on it.
 *
 * The tracker walks the tree honouring `.gitignore` files, skips noise
 * directories (`.git`, `node_modules`, `__pycache__`, `dist`...), tracks
 * credential-shaped files (`.env*`, keys, `.ssh/`, `.aws/`...) by size and
 * time only, binary files by hash only, and re-reads a file only when its
 * size, times or inode changed.
 *
 * @example Track a directory
 * ```ts
 * import { FileTrackerClient, startFileTracker } from "./tracker.ts";
 * import assert from "node:assert/strict";
 *
 * const root = await Deno.makeTempDir();
 * try {
 *   await using tracker = await startFileTracker(root);
 *   await using client = await FileTrackerClient.connect(tracker.url);
 *   await Deno.writeTextFile(`${root}/hello.txt`, "hi\n");
 *   const diff = await client.diff();
 *   assert.equal(diff.patches[0].status, "added");
 *   assert.equal(tracker.capability().params.setup_diff, true);
 * } finally {
 *   await Deno.remove(root, { recursive: true });
 * }
 * ```
 *
 * @param root the directory to track
 * @param options where to listen, callbacks and limits
 * @returns the running tracker
 * @throws {TypeError} when `root` is not a directory or an option has the wrong type
 * @throws {RangeError} when a limit is negative
 * @throws {Deno.errors.NotFound} when `root` does not exist
 * @throws {Deno.errors.NotSupported} when listening where a connection's
 *   user cannot be told, unless `allowUsers` is `"any"`
 */
export async function startFileTracker(
  root: string,
  options: FileTrackerOptions = {},
): Promise<FileTracker> {
  if (typeof root !== "string" || root === "") {
    throw new TypeError("Cannot start file tracker: root must be a non-empty string");
  }
  options.signal?.throwIfAborted();
  const tracker = await Tracker.create(root, {
    maxFileSize: positive("maxFileSize", options.maxFileSize, MIB),
    scanBudget: positive("scanBudget", options.scanBudget, 50 * MIB),
    maxPayload: positive("maxPayload", options.maxPayload, 50 * MIB),
    maxCaptureFiles: positive("maxCaptureFiles", options.maxCaptureFiles, 20),
    maxCaptureFileSize: positive("maxCaptureFileSize", options.maxCaptureFileSize, 5 * MIB),
    maxCaptureTotal: positive("maxCaptureTotal", options.maxCaptureTotal, 15 * MIB),
  });
  options.signal?.throwIfAborted();
  // Who may use the port, settled before it opens.
  const users = options.listen === false ? "any" : peerUsers(options.allowUsers, {
    what: "Cannot start file tracker",
    listener: "the file tracker",
    option: "allowUsers",
    orElse: "listen: false (and attach it to the environment)",
  });
  const listener = options.listen === false ? null : Deno.listen({
    hostname: options.hostname ?? "127.0.0.1",
    port: options.port ?? 0,
    transport: "tcp",
  });
  const server = new FileTrackerServer(
    listener,
    users,
    tracker,
    await Deno.realPath(root),
    options,
  );
  options.onListen?.(server.addr);
  return server;
}

const METHODS = ["snapshot", "diff", "setup", "advance", "flush"] as const;
type Method = typeof METHODS[number];

class FileTrackerServer implements FileTracker {
  readonly #listener: Deno.Listener<Deno.TcpConn, Deno.NetAddr> | null;
  readonly #users: PeerUsers;
  readonly #tracker: Tracker;
  readonly #root: string;
  readonly #setupDiff: boolean;
  readonly #onError: (error: unknown) => void;
  readonly #signal: AbortSignal | undefined;
  readonly #conns = new Set<Deno.Conn>();
  readonly #tasks = new Set<Promise<void>>();
  readonly #accepting: Promise<void>;
  readonly #finished: Promise<void>;
  #resolveFinished!: () => void;
  #shutdown: Promise<void> | null = null;
  readonly #onAbort = () => void this.shutdown();

  constructor(
    listener: Deno.Listener<Deno.TcpConn, Deno.NetAddr> | null,
    users: PeerUsers,
    tracker: Tracker,
    root: string,
    options: FileTrackerOptions,
  ) {
    this.#listener = listener;
    this.#users = users;
    this.#tracker = tracker;
    this.#root = root;
    this.#setupDiff = options.setupDiff ?? true;
    this.#onError = options.onError ?? (() => {});
    this.#signal = options.signal;
    this.#finished = new Promise((resolve) => this.#resolveFinished = resolve);
    this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
    this.#accepting = this.#accept();
  }

  get addr(): Deno.NetAddr {
    return this.#listener?.addr ?? { transport: "tcp", hostname: "127.0.0.1", port: 0 };
  }

  get url(): string {
    return `tcp://${formatHost(this.addr.hostname)}:${this.addr.port}`;
  }

  get root(): string {
    return this.#root;
  }

  get finished(): Promise<void> {
    return this.#finished;
  }

  capability(name?: string): Capability {
    return Capability.filetracking({
      name,
      url: this.url,
      root: this.#root,
      setupDiff: this.#setupDiff,
    });
  }

  shutdown(): Promise<void> {
    this.#shutdown ??= this.#close();
    return this.#shutdown;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.shutdown();
  }

  async #close(): Promise<void> {
    this.#signal?.removeEventListener("abort", this.#onAbort);
    if (this.#listener) closeQuietly(this.#listener);
    await this.#accepting;
    for (const conn of this.#conns) closeQuietly(conn);
    await Promise.allSettled(this.#tasks);
    this.#resolveFinished();
  }

  async #accept(): Promise<void> {
    if (this.#listener === null) return;
    await acceptLoop(this.#listener, (conn) => {
      const task: Promise<void> = this.#admit(conn).catch((err) => this.#onError(err))
        .finally(() => this.#tasks.delete(task));
      this.#tasks.add(task);
    }, {
      closing: () => this.#shutdown !== null,
      onError: this.#onError,
    });
  }

  /** Serves a connection to the port if its user is allowed; closes it unread if not. */
  async #admit(conn: Deno.Conn): Promise<void> {
    if (this.#users !== "any") {
      this.#conns.add(conn);
      let refused: Error | null;
      try {
        refused = await refusePeer(conn, this.#users, "File tracker", "allowUsers");
      } catch (err) {
        closeQuietly(conn);
        throw err;
      } finally {
        this.#conns.delete(conn);
      }
      if (refused !== null) {
        closeQuietly(conn);
        this.#onError(refused);
        return;
      }
    }
    await this.attach(conn);
  }

  attach(conn: Deno.Conn, head: Uint8Array = new Uint8Array()): Promise<void> {
    if (this.#shutdown) {
      closeQuietly(conn);
      return Promise.resolve();
    }
    this.#conns.add(conn);
    const task = this.#serve(conn, head).catch((err) => this.#onError(err)).finally(() => {
      this.#conns.delete(conn);
      closeQuietly(conn);
      this.#tasks.delete(task);
    });
    this.#tasks.add(task);
    return task;
  }

  async #serve(conn: Deno.Conn, head: Uint8Array): Promise<void> {
    const reader = new LineReader(prefixed(conn, head), MAX_REQUEST);
    // Each connection observes from its own position (see TrackerCursor).
    const cursor = this.#tracker.cursor();
    const send = (frame: unknown) => writeAll(conn, encodeFrame(frame));
    const fail = (id: unknown, code: number, message: string) =>
      send({ jsonrpc: "2.0", id, error: { code, message } });
    try {
      while (true) {
        const read = await reader.read();
        if (read === null) return;
        if (read.kind === "oversized") {
          await fail(null, ErrorCode.INVALID_REQUEST, `Frame too large: over ${MAX_REQUEST} bytes`);
          return;
        }
        let request: unknown;
        try {
          request = parseLine(read.line);
        } catch (err) {
          await fail(null, ErrorCode.PARSE_ERROR, `Parse error: ${(err as Error).message}`);
          continue;
        }
        if (!isRecord(request)) {
          await fail(null, ErrorCode.INVALID_REQUEST, "Invalid request: expected a JSON object");
          continue;
        }
        const hasId = request.id !== undefined;
        const id = request.id ?? null;
        const method = typeof request.method === "string" ? request.method : "";
        if (!(METHODS as readonly string[]).includes(method)) {
          if (hasId) await fail(id, ErrorCode.METHOD_NOT_FOUND, `method not found: ${method}`);
          continue;
        }
        let result: unknown;
        try {
          result = method === "snapshot"
            ? await this.#tracker.snapshot()
            : await this.#tracker[method as Exclude<Method, "snapshot">](cursor);
        } catch (err) {
          if (hasId) {
            const message = err instanceof Error ? err.message : String(err);
            await fail(id, ErrorCode.SERVER_ERROR, message);
          }
          continue;
        }
        if (hasId) await send({ jsonrpc: "2.0", id, result });
      }
    } catch (err) {
      if (!isPeerGone(err)) throw err;
    }
  }
}

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
    const connecting = Deno.connect({ hostname, port, transport: "tcp" });
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
