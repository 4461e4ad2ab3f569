/**
 * The control client: connects to an environment served over the HUD
 * control protocol, waits until it is ready, and opens one local TCP
 * forwarder per published capability, so that an agent reaches every
 * capability through the single control port.
 *
 * @example Connect, start a task, grade it
 * ```ts
 * import { bind, connect, Environment } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo");
 * env.template({ id: "echo" }, async function* () {
 *   const answer = yield "Say anything";
 *   yield { score: 1, content: answer };
 * });
 * await using server = bind(env);
 * await using client = await connect(server);
 * assert.equal(client.manifest.env.name, "demo");
 * await client.startTask("echo");
 * assert.deepEqual(await client.grade({ answer: "hi" }), { score: 1, content: "hi" });
 * ```
 *
 * @module
 */

import { Capability } from "./capability.ts";
import type { SshBindingOptions, SshClient } from "./ssh/client.ts";
import type { CdpBindingOptions, CdpClient } from "./cdp/client.ts";
import type { McpBindingOptions, McpClient } from "./mcp/client.ts";
import type { RfbBindingOptions, RfbClient } from "./rfb/client.ts";
import type { FileTrackerClient, FileTrackerClientOptions } from "./filetracking/tracker.ts";
import type { GradeFrame, PromptFrame, TaskEntry } from "./env.ts";
import { ConnectionClosedError, HudProtocolError, ProtocolViolationError } from "./errors.ts";
import type { JsonRpcCaller } from "./_internal/rpc.ts";
import { helloUntilReady } from "./_internal/ready.ts";
import { isRecord } from "./_internal/util.ts";
import { forwardUsers, isPlaceholderUrl, localUrl, TcpForwarder } from "./_client/forwarder.ts";
import {
  type ControlAddress,
  controlAddress,
  formatControlUrl,
  parseControlUrl,
  shownControlUrl,
  tokenFromEnv,
} from "./_internal/auth.ts";

/**
 * Where an environment is served: an address (a {@linkcode ControlAddress}
 * record, or its url form `tcp://host:port`), anything that has one (a
 * placement, a server handle, a `Runtime`; or, from code written before
 * addresses were records, anything with a `url`), or something to place
 * first, released again when the client closes: any runtime of `runtime/`
 * or `engines/` (`LocalRuntime`, `ContainerRuntime`...).
 *
 * The last member is the runtime contract (`RuntimeProvider` in
 * `runtime/placement.ts`) written out structurally, because the client is a
 * lower layer than the runtimes and imports none of them: `place()` gets
 * the connect signal and resolves to a disposable with an `address`.
 */
export type ConnectTarget =
  | string
  | ControlAddress
  | { readonly address: ControlAddress }
  | { readonly url: string }
  | {
    place(
      options?: { signal?: AbortSignal },
    ): Promise<({ readonly address: ControlAddress } | { readonly url: string }) & AsyncDisposable>;
  };

/** Options for {@linkcode connect}. */
export interface ConnectOptions {
  /**
   * The server's token, sent in `params.token` of every `hello` and
   * `tunnel.open`.
   * @default the url's password (`tcp://:TOKEN@host:port`), else
   *   `HUD_SERVE_TOKEN` from the environment, else none
   */
  token?: string;
  /**
   * How long to keep retrying until the environment answers `hello`, in ms.
   * @default 240_000
   */
  readyTimeout?: number;
  /**
   * How long connections may be refused (nothing listens) before connecting
   * fails with a `NotReadyError` that says so, in ms. Once a connection was
   * accepted, only `readyTimeout` counts: something is there, starting.
   * @default 10_000 for an address (a url, or a `Runtime`, which is one);
   *   `readyTimeout` when it is given, and for a placement or a runtime to
   *   place (which may still be starting)
   */
  refusedTimeout?: number;
  /**
   * Pause between attempts, in ms.
   * @default 500
   */
  retryInterval?: number;
  /** Aborts connecting; once connected, it has no effect (close the client). */
  signal?: AbortSignal;
  /** Resume this session instead of starting a new one. */
  sessionId?: string;
  /**
   * Interval of the `hello` heartbeat, in ms; 0 turns it off.
   * @default 120_000
   */
  heartbeatInterval?: number;
  /**
   * How long a heartbeat reply may take, in ms, counted from when it is sent.
   * @default 5_000
   */
  heartbeatTimeout?: number;
  /**
   * Open one local forwarder per capability.
   * @default true
   */
  forward?: boolean;
  /**
   * The local users (uids) whose connections the forwarders serve; a
   * connection from anyone else is closed (and reported to `onError`). On
   * Linux the owner of each accepted loopback connection is read from
   * `/proc/net/tcp` and `/proc/net/tcp6` (so it needs read access there).
   * Where it cannot be told (not Linux), forwarding needs `"any"`, which
   * serves every local user: connecting fails otherwise.
   * @default [this process's uid]
   */
  forwardUsers?: readonly number[] | "any";
  /**
   * Largest accepted reply frame, in bytes.
   * @default 16 MiB
   */
  maxFrameBytes?: number;
  /** Called with errors nobody awaits (a forwarder's tunnel failing). */
  onError?: (error: unknown) => void;
}

/** The manifest from `hello`. */
export interface Manifest {
  /** This connection's session id. */
  sessionId: string;
  /** The environment's name and version. */
  env: { name: string; version: string };
  /** Published capabilities, with the urls the environment gave. */
  bindings: Capability[];
  /** The template of the task this session holds (a resumed session), if the server says. */
  taskId?: string;
}

/** Options for a single call. */
export interface CallOptions {
  /**
   * Aborts the call. The reply can no longer be matched, so the connection
   * is closed too.
   */
  signal?: AbortSignal;
}

const DEFAULT_MAX_FRAME = 16 * 1024 * 1024;
/** How long an address may refuse connections before connect() gives up. */
const DEFAULT_REFUSED_TIMEOUT = 10_000;

export type { ControlAddress };
export { formatControlUrl, parseControlUrl };

function readManifest(result: unknown): Manifest {
  if (!isRecord(result) || typeof result.session_id !== "string" || !isRecord(result.env)) {
    throw new ProtocolViolationError("Invalid hello reply: missing session_id or env");
  }
  const bindings = Array.isArray(result.bindings) ? result.bindings : [];
  return {
    sessionId: result.session_id,
    env: { name: String(result.env.name), version: String(result.env.version) },
    bindings: bindings.map((b) => Capability.fromManifest(b)),
    ...(isRecord(result.task) && typeof result.task.id === "string"
      ? { taskId: result.task.id }
      : {}),
  };
}

/**
 * Connects to an environment, retrying until it answers `hello`: a refused
 * connection, or one closed before the reply, means "not ready yet"; an
 * error reply fails at once. An address that refuses every connection for
 * `refusedTimeout` (10 s by default) fails sooner than the ready timeout,
 * with a message saying that nothing listens there.
 *
 * @param target an address (`tcp://host:port`, `host:port`, or a
 *   {@linkcode ControlAddress}), a placement, or a runtime to place
 * @throws {NotReadyError} when the ready timeout passes
 * @throws {HudProtocolError} when the environment answers `hello` with an error
 * @throws {ProtocolViolationError} when its reply to `hello` breaks the protocol
 * @throws {TypeError} for a malformed address
 */
export async function connect(
  target: ConnectTarget,
  options: ConnectOptions = {},
): Promise<HudClient> {
  if (isRecord(target) && !("url" in target || "address" in target) && "place" in target) {
    const placement = await (target as { place: PlaceTarget }).place({ signal: options.signal });
    try {
      const client = await connect(placement, options);
      releaseOnClose(client, placement);
      return client;
    } catch (err) {
      await placement[Symbol.asyncDispose]();
      throw err;
    }
  }
  const { address, settled } = targetAddress(target);
  const token = options.token ?? address.token ?? tokenFromEnv();
  const readyTimeout = options.readyTimeout ?? 240_000;
  // An address that refuses has nothing behind it: say so soon. A
  // placement may still be starting.
  const refusedTimeout = options.refusedTimeout ??
    (options.readyTimeout === undefined && settled ? DEFAULT_REFUSED_TIMEOUT : readyTimeout);
  const params: Record<string, unknown> = options.sessionId
    ? { session_id: options.sessionId }
    : {};
  if (token !== undefined) params.token = token;
  const shown = shownControlUrl(address);
  const { caller, result } = await helloUntilReady(address, params, {
    url: shown,
    readyTimeout,
    refusedTimeout,
    retryInterval: options.retryInterval ?? 500,
    maxFrameBytes: options.maxFrameBytes ?? DEFAULT_MAX_FRAME,
    signal: options.signal,
  });
  let manifest: Manifest;
  try {
    manifest = readManifest(result);
  } catch (err) {
    caller.close();
    throw err;
  }
  const control = controlAddress(address.hostname, address.port, token);
  const client = newClient(caller, control, manifest, options);
  await startForwarders(client);
  return client;
}

type PlaceTarget = Extract<ConnectTarget, { place: unknown }>["place"];

/**
 * The address a target names, and whether it is settled: an address given
 * as such (a url, a record, a `Runtime`) is served already, so refusals
 * mean nothing is there; a placement may still be starting.
 * @throws {TypeError} for a malformed url or record
 */
function targetAddress(target: ConnectTarget): { address: ControlAddress; settled: boolean } {
  if (typeof target === "string") return { address: parseControlUrl(target), settled: true };
  if (!isRecord(target)) {
    throw new TypeError("Cannot connect: expected an address, a placement or a runtime");
  }
  const runtime = "place" in target;
  if ("address" in target && isRecord(target.address)) {
    return { address: checkedAddress(target.address), settled: runtime };
  }
  if ("hostname" in target) return { address: checkedAddress(target), settled: true };
  if ("url" in target) return { address: parseControlUrl(target.url as string), settled: runtime };
  throw new TypeError("Cannot connect: expected an address, a placement or a runtime");
}

/** A {@linkcode ControlAddress} given as a record, checked. */
function checkedAddress(address: Record<string, unknown>): ControlAddress {
  const { hostname, port, token } = address;
  if (typeof hostname !== "string" || hostname === "") {
    throw new TypeError("Cannot connect: the address's hostname must be a non-empty string");
  }
  if (!Number.isInteger(port) || (port as number) < 1 || (port as number) > 65535) {
    throw new RangeError(`Cannot connect: invalid port ${String(port)} for "${hostname}"`);
  }
  if (token !== undefined && typeof token !== "string") {
    throw new TypeError("Cannot connect: the address's token must be a string");
  }
  return controlAddress(hostname, port as number, token);
}

/** The client {@linkcode HudClient.open} returns for a binding's protocol family. */
export type ProtocolClient = SshClient | CdpClient | McpClient | FileTrackerClient | RfbClient;

/** Options for {@linkcode HudClient.open}: those of the family's `fromBinding`. */
export type OpenOptions =
  | SshBindingOptions
  | CdpBindingOptions
  | McpBindingOptions
  | FileTrackerClientOptions
  | RfbBindingOptions;

type Opener = (capability: Capability, options: OpenOptions) => Promise<ProtocolClient>;

// One entry per protocol family. Each loads its subsystem on first use, so
// that the control client itself loads no SSH, CDP or MCP code.
const OPENERS: Readonly<Record<string, Opener>> = {
  ssh: async (capability, options) => {
    const { SshClient } = await import("./ssh/client.ts");
    return SshClient.fromBinding(capability, options as SshBindingOptions);
  },
  cdp: async (capability, options) => {
    const { CdpClient } = await import("./cdp/client.ts");
    return await CdpClient.fromBinding(capability, options as CdpBindingOptions);
  },
  mcp: async (capability, options) => {
    const { McpClient } = await import("./mcp/client.ts");
    return await McpClient.fromBinding(capability, options as McpBindingOptions);
  },
  filetracking: async (capability, options) => {
    const { FileTrackerClient } = await import("./filetracking/tracker.ts");
    return await FileTrackerClient.fromBinding(capability, options as FileTrackerClientOptions);
  },
  rfb: async (capability, options) => {
    const { RfbClient } = await import("./rfb/client.ts");
    return await RfbClient.fromBinding(capability, options as RfbBindingOptions);
  },
};

// Plumbing that connect() needs and HudClient's public API must not show;
// assigned in HudClient's static block, which can reach its #private members.
let newClient: (
  caller: JsonRpcCaller,
  control: ControlAddress,
  manifest: Manifest,
  options: ConnectOptions,
) => HudClient;
let startForwarders: (client: HudClient) => Promise<void>;
let releaseOnClose: (client: HudClient, placement: AsyncDisposable) => void;

/**
 * A connection to an environment's control port. Calls are serialised on
 * the connection; each reply's id is checked. Dispose it (or `close()`) to
 * close the connection, the forwarders and their tunnels; closing sends no
 * `bye`, so an ungraded task stays parked for a later grader.
 */
export class HudClient implements AsyncDisposable {
  readonly #caller: JsonRpcCaller;
  /** Where the server is, with the token this client presents (never shown). */
  readonly #control: ControlAddress;
  readonly #options: ConnectOptions;
  readonly #forwarders = new Map<string, TcpForwarder>();
  #manifest: Manifest;
  #closed: Promise<void> | null = null;
  /** Aborts when this client closes: what open() made stops connecting. */
  readonly #closing = new AbortController();
  #heartbeat: ReturnType<typeof setTimeout> | undefined;
  #heartbeatStopped = false;
  #placement: AsyncDisposable | null = null;

  // TypeScript's `private` is the only way to keep a constructor out of the
  // public API (a #private name cannot apply to one); use connect().
  private constructor(
    caller: JsonRpcCaller,
    control: ControlAddress,
    manifest: Manifest,
    options: ConnectOptions,
  ) {
    this.#caller = caller;
    this.#control = control;
    this.#manifest = manifest;
    this.#options = options;
    this.#scheduleHeartbeat();
  }

  static {
    newClient = (caller, control, manifest, options) =>
      new HudClient(caller, control, manifest, options);
    startForwarders = (client) => client.#startForwarders();
    releaseOnClose = (client, placement) => {
      client.#placement = placement;
    };
  }

  /**
   * Opens one forwarder per binding. A binding published with a placeholder
   * url (port 0: served through the control port only) gets its
   * forwarder's url in the manifest too, so that whoever reads the raw
   * bindings can dial it.
   */
  async #startForwarders(): Promise<void> {
    if (this.#options.forward === false) return;
    try {
      const users = forwardUsers(this.#options.forwardUsers);
      for (const cap of this.#manifest.bindings) {
        this.#forwarders.set(
          cap.name,
          new TcpForwarder(cap, this.#control, users, this.#options.onError ?? (() => {})),
        );
      }
    } catch (err) {
      await this.close();
      throw err;
    }
    this.#manifest = { ...this.#manifest, bindings: this.#dialable(this.#manifest.bindings) };
  }

  /** `bindings` with each placeholder url replaced by its forwarder's. */
  #dialable(bindings: Capability[]): Capability[] {
    return bindings.map((cap) => isPlaceholderUrl(cap.url) ? this.#local(cap) : cap);
  }

  /**
   * The control address this client is connected to, `tcp://host:port`:
   * without the token, so that it is safe to show.
   */
  get url(): string {
    return shownControlUrl(this.#control);
  }

  /**
   * Session id, environment name and version, and the published bindings
   * with the urls the environment gave (but a placeholder's, port 0, which
   * is its forwarder's).
   */
  get manifest(): Manifest {
    return this.#manifest;
  }

  /** This connection's session id. */
  get sessionId(): string {
    return this.#manifest.sessionId;
  }

  /** Every binding, with urls rewritten to the local forwarders. */
  get bindings(): Capability[] {
    return this.#manifest.bindings.map((cap) => this.#local(cap));
  }

  /** Whether the connection is closed or failed. */
  get closed(): boolean {
    return this.#closed !== null || this.#caller.closed;
  }

  #local(cap: Capability): Capability {
    const fwd = this.#forwarders.get(cap.name);
    return fwd ? cap.withUrl(localUrl(cap.url, fwd.port)) : cap;
  }

  /**
   * The capability a ref names: a name (`shell`), a full protocol (`ssh/2`)
   * or a protocol family (`ssh`); its url points at the local forwarder.
   * @throws {RangeError} when the ref matches nothing or several bindings
   */
  binding(ref: string): Capability {
    const all = this.#manifest.bindings;
    const byName = all.filter((c) => c.name === ref);
    const matches = byName.length > 0
      ? byName
      : all.filter((c) => c.protocol === ref).length > 0
      ? all.filter((c) => c.protocol === ref)
      : all.filter((c) => c.family === ref);
    const listed = all.map((c) => `"${c.name}" (${c.protocol})`).join(", ") || "none";
    if (matches.length === 0) {
      throw new RangeError(`Cannot find binding "${ref}": available are ${listed}`);
    }
    if (matches.length > 1) {
      throw new RangeError(
        `Cannot pick binding "${ref}": it matches ${
          matches.map((c) => `"${c.name}"`).join(", ")
        }; use a name`,
      );
    }
    return this.#local(matches[0]);
  }

  /** An SSH client for the `ssh/2` binding; see {@linkcode HudClient.open}. */
  open(ref?: "shell" | "ssh" | `ssh/${string}`, options?: SshBindingOptions): Promise<SshClient>;
  /** A connected CDP client for the `cdp/1.3` binding (a browser). */
  open(ref: "browser" | "cdp" | `cdp/${string}`, options?: CdpBindingOptions): Promise<CdpClient>;
  /** An initialized MCP client for the `mcp` binding (a tool server). */
  open(ref: "tools" | "mcp" | `mcp/${string}`, options?: McpBindingOptions): Promise<McpClient>;
  /** A connected file tracker client for the `filetracking/1` binding. */
  open(
    ref: "filetracking" | `filetracking/${string}`,
    options?: FileTrackerClientOptions,
  ): Promise<FileTrackerClient>;
  /** A connected VNC client for the `rfb/3.8` binding (a desktop). */
  open(ref: "screen" | "rfb" | `rfb/${string}`, options?: RfbBindingOptions): Promise<RfbClient>;
  /**
   * The protocol client for a binding, reached through its local
   * forwarder, by the binding's protocol family: an `SshClient` for `ssh`
   * (connected on first use; it checks the host key against `host_pubkey`
   * and logs in with `client_key`), a connected `CdpClient` for `cdp`, an
   * initialized `McpClient` for `mcp` (with the binding's `auth_token`), a
   * connected `FileTrackerClient` for `filetracking`, a connected
   * `RfbClient` for `rfb` (with the binding's `password`). Each family's code is
   * loaded on the first `open` that needs it. The caller owns the client:
   * close it before this one. Closing this one aborts the client's signal
   * (its connecting and retries; an MCP client's requests), so that a
   * client left behind, as by an agent a rollout stopped waiting for, does
   * not go on trying forwarders that are gone.
   *
   * The ref is resolved as by {@linkcode HudClient.binding}. With a family
   * or protocol as the ref, or a factory's default name (`shell`,
   * `browser`, `tools`, `filetracking`, `screen`), the result has that family's type;
   * with another name it is a {@linkcode ProtocolClient} to narrow.
   * @param ref a name, protocol or family
   * @param options the family's `fromBinding` options (a signal, keys...)
   * @throws {RangeError} when the ref matches nothing or several bindings
   * @throws {TypeError} when no client speaks the binding's protocol, or the
   *   binding lacks what its client needs (such as a key to log in with)
   */
  open(ref?: string, options?: OpenOptions): Promise<ProtocolClient>;
  async open(ref = "shell", options: OpenOptions = {}): Promise<ProtocolClient> {
    const capability = this.binding(ref);
    const opener = Object.hasOwn(OPENERS, capability.family)
      ? OPENERS[capability.family]
      : undefined;
    if (opener === undefined) {
      throw new TypeError(
        `Cannot open binding "${capability.name}": no client speaks "${capability.protocol}" (clients: ${
          Object.keys(OPENERS).join(", ")
        }); use binding("${capability.name}") for its url`,
      );
    }
    const signal = options.signal === undefined
      ? this.#closing.signal
      : AbortSignal.any([options.signal, this.#closing.signal]);
    return await opener(capability, { ...options, signal });
  }

  /**
   * Sends one request and returns its result. Calls queue behind each other.
   * Integers beyond ±(2^53−1) are exact both ways: a `bigint` in `params`
   * goes out as its digits, and such an integer in a reply arrives as a
   * `bigint`.
   * @throws {HudProtocolError} for an error reply
   * @throws {ProtocolViolationError} for a reply that breaks the protocol
   *   (the connection is closed)
   * @throws {ConnectionClosedError} when the connection is closed or fails
   */
  async call(
    method: string,
    params: Record<string, unknown> = {},
    options: CallOptions = {},
  ): Promise<Record<string, unknown>> {
    if (this.#closed) {
      throw new ConnectionClosedError(`Cannot call "${method}": the client is closed`);
    }
    try {
      return await this.#caller.call(method, params, options);
    } finally {
      if (this.#caller.closed) this.#stopHeartbeat();
    }
  }

  #scheduleHeartbeat(): void {
    const every = this.#options.heartbeatInterval ?? 120_000;
    if (every <= 0 || this.#heartbeatStopped) return;
    this.#heartbeat = setTimeout(() => void this.#beat(), every);
    Deno.unrefTimer(this.#heartbeat);
  }

  #stopHeartbeat(): void {
    this.#heartbeatStopped = true;
    clearTimeout(this.#heartbeat);
  }

  async #beat(): Promise<void> {
    if (this.closed) return;
    try {
      const result = await this.#caller.call(
        "hello",
        this.#helloParams(this.#manifest.sessionId),
        { timeout: this.#options.heartbeatTimeout ?? 5_000 },
      );
      this.#manifest = { ...readManifest(result), bindings: this.#manifest.bindings };
      this.#scheduleHeartbeat();
    } catch (err) {
      // An error reply only stops the heartbeat; anything else has ended
      // the connection, and the next call says so.
      this.#stopHeartbeat();
      if (!(err instanceof HudProtocolError)) {
        this.#caller.fail(
          new ConnectionClosedError(`Heartbeat to ${this.url} failed`, { cause: err }),
        );
      }
    }
  }

  /**
   * Says `hello` again: with another session's id, this connection resumes
   * that (parked) session and its task.
   */
  async hello(sessionId?: string, options?: CallOptions): Promise<Manifest> {
    const result = await this.call("hello", this.#helloParams(sessionId), options);
    this.#manifest = { ...readManifest(result), bindings: this.#manifest.bindings };
    return this.#manifest;
  }

  /** `hello`'s params: the session to resume, and the token. */
  #helloParams(sessionId: string | undefined): Record<string, unknown> {
    const params: Record<string, unknown> = sessionId === undefined
      ? {}
      : { session_id: sessionId };
    if (this.#control.token !== undefined) params.token = this.#control.token;
    return params;
  }

  /** The environment's task templates, in registration order. */
  async listTasks(options?: CallOptions): Promise<TaskEntry[]> {
    const result = await this.call("tasks.list", {}, options);
    if (!Array.isArray(result.tasks)) {
      throw this.#violation("Invalid tasks.list reply: no tasks array");
    }
    return result.tasks as TaskEntry[];
  }

  /**
   * Starts a task; any task this session held is cancelled first.
   * @returns the prompt frame
   */
  async startTask(
    id: string,
    args: Record<string, unknown> = {},
    options?: CallOptions,
  ): Promise<PromptFrame> {
    if (typeof id !== "string") throw new TypeError("Cannot start task: id must be a string");
    const result = await this.call("tasks.start", { id, args }, options);
    return result as PromptFrame;
  }

  /**
   * Grades this session's task (or adopts the lone parked one) with the
   * payload, whose `answer` the task receives. A boolean score (which HUD's
   * server sends for `{"score": True}`, a bool being an int in Python) is
   * read as 1 or 0.
   * @throws {ProtocolViolationError} when the grade's score is not a finite
   *   number or a boolean
   */
  async grade(payload: Record<string, unknown> = {}, options?: CallOptions): Promise<GradeFrame> {
    if (!isRecord(payload)) throw new TypeError("Cannot grade: payload must be an object");
    const result = await this.call("tasks.grade", payload, options);
    if (typeof result.score === "boolean" || typeof result.score === "bigint") {
      return { ...result, score: Number(result.score) };
    }
    if (typeof result.score !== "number") {
      throw this.#violation(
        `Invalid grade: score must be a number, got ${JSON.stringify(result.score)}`,
      );
    }
    // HUD's server writes a NaN score as Python's token, which is read.
    if (!Number.isFinite(result.score)) {
      throw this.#violation(`Invalid grade: score must be a finite number, got ${result.score}`);
    }
    return result as GradeFrame;
  }

  /**
   * A reply in step with its request whose content the protocol does not
   * allow: the connection stays usable.
   */
  #violation(message: string): ProtocolViolationError {
    return new ProtocolViolationError(message);
  }

  /** Cancels this session's task, if any. */
  async cancel(options?: CallOptions): Promise<void> {
    await this.call("tasks.cancel", {}, options);
  }

  /** Cancels the task and ends the session; the server closes the connection. */
  async bye(options?: CallOptions): Promise<void> {
    await this.call("bye", {}, options);
    await this.close();
  }

  /** Closes forwarders, tunnels and the connection. Sends no `bye`. Idempotent. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#stopHeartbeat();
      this.#closing.abort(new ConnectionClosedError("Cannot connect: the HUD client is closed"));
      this.#caller.close();
      await Promise.allSettled([...this.#forwarders.values()].map((f) => f.close()));
      await this.#caller.idle;
      await this.#placement?.[Symbol.asyncDispose]();
    })();
    return this.#closed;
  }

  /** Same as {@linkcode HudClient.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
