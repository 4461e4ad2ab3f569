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

import { Capability } from "../capability.ts";
import { ErrorCode } from "../errors.ts";
import { encodeFrame, LineReader, parseLine } from "../_internal/framing.ts";
import { closeQuietly, isPeerGone, prefixed, writeAll } from "../_internal/io.ts";
import { acceptLoop } from "../_internal/accept.ts";
import { formatHost } from "../_internal/net.ts";
import { type PeerUsers, peerUsers, refusePeer } from "../_internal/peer_uid.ts";
import { type Method, METHODS, Tracker, type TrackerCursor } from "./_core.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";

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
export {
  type FileTrackerCallOptions,
  FileTrackerClient,
  type FileTrackerClientOptions,
} from "./_client.ts";
export { type FileTrackingEvent, observeFiles, type ObserveFilesOptions } from "./_observe.ts";

const MIB = 1024 * 1024;
/** Requests are small: a method name and empty params. */
const MAX_REQUEST = MIB;

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
    try {
      while (true) {
        const read = await reader.read();
        if (read === null) return;
        if (read.kind === "oversized") {
          const message = `Frame too large: over ${MAX_REQUEST} bytes`;
          await writeAll(conn, encodeFrame(rpcFailure(null, ErrorCode.INVALID_REQUEST, message)));
          return;
        }
        const reply = await this.#answer(read.line, cursor);
        if (reply !== null) await writeAll(conn, encodeFrame(reply));
      }
    } catch (err) {
      if (!isPeerGone(err)) throw err;
    }
  }

  /** The reply to one request line, or `null` for a notification. */
  async #answer(line: Uint8Array, cursor: TrackerCursor): Promise<Record<string, unknown> | null> {
    let request: unknown;
    try {
      request = parseLine(line);
    } catch (err) {
      return rpcFailure(null, ErrorCode.PARSE_ERROR, `Parse error: ${errorMessage(err)}`);
    }
    if (!isRecord(request)) {
      return rpcFailure(null, ErrorCode.INVALID_REQUEST, "Invalid request: expected a JSON object");
    }
    const hasId = request.id !== undefined;
    const id = request.id ?? null;
    const method = typeof request.method === "string" ? request.method : "";
    if (!(METHODS as readonly string[]).includes(method)) {
      return hasId
        ? rpcFailure(id, ErrorCode.METHOD_NOT_FOUND, `method not found: ${method}`)
        : null;
    }
    try {
      const result = method === "snapshot"
        ? await this.#tracker.snapshot()
        : await this.#tracker[method as Exclude<Method, "snapshot">](cursor);
      return hasId ? { jsonrpc: "2.0", id, result } : null;
    } catch (err) {
      return hasId ? rpcFailure(id, ErrorCode.SERVER_ERROR, errorMessage(err)) : null;
    }
  }
}

function rpcFailure(id: unknown, code: number, message: string): Record<string, unknown> {
  return { jsonrpc: "2.0", id, error: { code, message } };
}
