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
import { type SshBindingOptions, SshClient } from "./ssh/client.ts";
import { type CdpBindingOptions, CdpClient } from "./cdp/client.ts";
import { McpClient, type McpClientOptions } from "./mcp/client.ts";
import type { GradeFrame, PromptFrame, TaskEntry } from "./env.ts";
import { ConnectionClosedError, ErrorCode, HudProtocolError, NotReadyError } from "./errors.ts";
import { encodeFrame, LineReader, parseLine, replyResult } from "./_internal/framing.ts";
import { closeQuietly, isPeerGone, pump, writeAll } from "./_internal/io.ts";
import { abortable, Deadline, delay } from "./_internal/async.ts";
import { isRecord } from "./_internal/util.ts";
import { redactUrl, tokenFromEnv } from "./_internal/auth.ts";

/**
 * Where an environment is served: a `tcp://host:port` url, anything with a
 * `url` (a placement, a `Runtime`), or something to place first, released
 * again when the client closes: any runtime of `runtime/` or `engines/`
 * (`LocalRuntime`, `ContainerRuntime`...).
 *
 * The last member is the runtime contract (`RuntimeProvider` in
 * `runtime/placement.ts`) written out structurally, because the client is a
 * lower layer than the runtimes and imports none of them: `place()` gets
 * the connect signal and resolves to a disposable with a `url`.
 */
export type ConnectTarget =
  | string
  | { readonly url: string }
  | {
    place(options?: { signal?: AbortSignal }): Promise<{ readonly url: string } & AsyncDisposable>;
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
const TUNNEL_REPLY_MAX = 64 * 1024;

/** A control address, parsed. */
export interface ControlAddress {
  /** Host name or address (IPv6 without brackets). */
  hostname: string;
  /** Port. */
  port: number;
  /** The token from the url's password, percent-decoded, when there is one. */
  token?: string;
}

/**
 * Host, port and token of a control address: `tcp://host:port`,
 * `tcp://:TOKEN@host:port` or `host:port`. Messages never show the token.
 * @throws {TypeError} for another scheme, a missing port, or user info
 *   without a `:` before the token
 */
export function parseControlUrl(url: string): ControlAddress {
  if (typeof url !== "string") throw new TypeError("Cannot connect: url must be a string");
  const shown = redactUrl(url);
  const m =
    /^(?:([a-zA-Z][a-zA-Z0-9+.-]*):\/\/)?(?:([^@/?#]*)@)?(?:\[([^\]]+)\]|([^:/?#@]+)):(\d+)\/?$/
      .exec(url.trim());
  if (m && m[1] !== undefined && m[1].toLowerCase() !== "tcp") {
    throw new TypeError(
      `Cannot connect: unsupported scheme "${m[1]}" in "${shown}" (expected tcp://)`,
    );
  }
  if (!m) {
    const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(url)?.[1];
    if (scheme && scheme.toLowerCase() !== "tcp") {
      throw new TypeError(
        `Cannot connect: unsupported scheme "${scheme}" in "${shown}" (expected tcp://)`,
      );
    }
    throw new TypeError(`Cannot connect: invalid address "${shown}" (expected tcp://host:port)`);
  }
  const port = Number(m[5]);
  if (port < 1 || port > 65535) throw new RangeError(`Cannot connect: invalid port in "${shown}"`);
  const address: ControlAddress = { hostname: m[3] ?? m[4], port };
  if (m[2] !== undefined) {
    const colon = m[2].indexOf(":");
    if (colon < 0) {
      throw new TypeError(
        `Cannot connect: put the token after a colon in "${shown}" (tcp://:TOKEN@host:port)`,
      );
    }
    try {
      address.token = decodeURIComponent(m[2].slice(colon + 1));
    } catch {
      throw new TypeError(`Cannot connect: the token in "${shown}" is not valid percent-encoding`);
    }
  }
  return address;
}

function readManifest(result: unknown): Manifest {
  if (!isRecord(result) || typeof result.session_id !== "string" || !isRecord(result.env)) {
    throw new HudProtocolError(
      ErrorCode.INTERNAL_ERROR,
      "invalid hello reply: missing session_id or env",
    );
  }
  const bindings = Array.isArray(result.bindings) ? result.bindings : [];
  return {
    sessionId: result.session_id,
    env: { name: String(result.env.name), version: String(result.env.version) },
    bindings: bindings.map((b) => Capability.fromManifest(b)),
  };
}

/** A control connection plus its reader, before it becomes a client. */
interface Channel {
  conn: Deno.TcpConn;
  reader: LineReader;
}

/** Sends one request and reads its reply on a channel. */
async function roundTrip(
  channel: Channel,
  id: number,
  method: string,
  params: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  await writeAll(channel.conn, encodeFrame({ jsonrpc: "2.0", id, method, params }));
  const frame = await channel.reader.read();
  if (frame === null) {
    throw new ConnectionClosedError(`Connection closed before the reply to "${method}"`);
  }
  if (frame.kind === "oversized") {
    throw new HudProtocolError(
      ErrorCode.INTERNAL_ERROR,
      `reply of ${frame.size} bytes exceeds the frame limit`,
    );
  }
  let reply: unknown;
  try {
    reply = parseLine(frame.line);
  } catch (err) {
    throw new HudProtocolError(
      ErrorCode.PARSE_ERROR,
      `invalid reply to "${method}": ${(err as Error).message}`,
    );
  }
  return replyResult(reply, id, method);
}

/**
 * Connects to an environment, retrying until it answers `hello`: a refused
 * connection, or one closed before the reply, means "not ready yet"; an
 * error reply fails at once.
 *
 * @param target `tcp://host:port`, `host:port`, or a runtime with a `url`
 * @throws {NotReadyError} when the ready timeout passes
 * @throws {HudProtocolError} when the environment answers `hello` with an error
 * @throws {TypeError} for a malformed address
 */
export async function connect(
  target: ConnectTarget,
  options: ConnectOptions = {},
): Promise<HudClient> {
  if (typeof target === "object" && target !== null && !("url" in target) && "place" in target) {
    const placement = await target.place({ signal: options.signal });
    try {
      const client = await connect(placement, options);
      releaseOnClose(client, placement);
      return client;
    } catch (err) {
      await placement[Symbol.asyncDispose]();
      throw err;
    }
  }
  const given = typeof target === "string" ? target : (target as { url: string })?.url;
  const { token: urlToken, ...addr } = parseControlUrl(given);
  const url = redactUrl(given);
  const token = options.token ?? urlToken ?? tokenFromEnv();
  const readyTimeout = options.readyTimeout ?? 240_000;
  const interval = options.retryInterval ?? 500;
  using deadline = new Deadline(readyTimeout, options.signal, "connect");
  let lastError: unknown;
  let attempts = 0;
  while (true) {
    if (deadline.signal.aborted) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw new NotReadyError(
        `Cannot connect to ${url}: not ready after ${readyTimeout} ms (${attempts} attempts)`,
        { cause: lastError },
      );
    }
    attempts++;
    let conn: Deno.TcpConn | null = null;
    try {
      conn = await abortable(Deno.connect(addr), deadline.signal);
      const channel = {
        conn,
        reader: new LineReader(conn, options.maxFrameBytes ?? DEFAULT_MAX_FRAME),
      };
      const params: Record<string, unknown> = options.sessionId
        ? { session_id: options.sessionId }
        : {};
      if (token !== undefined) params.token = token;
      const c = conn;
      const result = await abortable(
        roundTrip(channel, 1, "hello", params),
        deadline.signal,
        () => closeQuietly(c),
      );
      const client = newClient(channel, url, token, readManifest(result), options);
      conn = null;
      await startForwarders(client);
      return client;
    } catch (err) {
      if (conn) closeQuietly(conn);
      if (err instanceof HudProtocolError) throw err;
      if (deadline.signal.aborted) continue;
      if (
        !(err instanceof Deno.errors.ConnectionRefused) && !isPeerGone(err) &&
        !(err instanceof ConnectionClosedError)
      ) {
        throw err;
      }
      lastError = err;
    }
    try {
      await delay(interval, deadline.signal);
    } catch {
      // The loop head reports the timeout or the abort.
    }
  }
}

/**
 * A loopback forwarder for one capability: each local connection becomes a
 * `tunnel.open` stream through the control port.
 */
class TcpForwarder {
  readonly capability: Capability;
  readonly #listener: Deno.TcpListener;
  readonly #control: { hostname: string; port: number };
  readonly #token: string | undefined;
  readonly #conns = new Set<Deno.Conn>();
  readonly #tasks = new Set<Promise<void>>();
  readonly #onError: (err: unknown) => void;
  readonly #loop: Promise<void>;
  #closed = false;

  constructor(
    capability: Capability,
    control: { hostname: string; port: number },
    token: string | undefined,
    onError: (err: unknown) => void,
  ) {
    this.capability = capability;
    this.#control = control;
    this.#token = token;
    this.#onError = onError;
    this.#listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    this.#loop = this.#accept();
  }

  get port(): number {
    return this.#listener.addr.port;
  }

  async #accept(): Promise<void> {
    while (true) {
      let local: Deno.Conn;
      try {
        local = await this.#listener.accept();
      } catch (err) {
        if (this.#closed || isPeerGone(err)) return;
        this.#onError(err);
        await delay(50);
        continue;
      }
      const task = this.#tunnel(local).catch((err) => {
        if (!isPeerGone(err)) this.#onError(err);
      }).finally(() => this.#tasks.delete(task));
      this.#tasks.add(task);
    }
  }

  async #tunnel(local: Deno.Conn): Promise<void> {
    this.#conns.add(local);
    let remote: Deno.TcpConn | null = null;
    try {
      remote = await Deno.connect(this.#control);
      this.#conns.add(remote);
      if (this.#closed) return;
      await writeAll(
        remote,
        encodeFrame({
          jsonrpc: "2.0",
          id: 1,
          method: "tunnel.open",
          params: this.#token === undefined
            ? { capability: this.capability.name }
            : { capability: this.capability.name, token: this.#token },
        }),
      );
      // Bytes the agent sends before the reply are forwarded at once.
      const up = pump(local, remote);
      const reader = new LineReader(remote, TUNNEL_REPLY_MAX);
      const frame = await reader.read();
      let ok = false;
      if (frame?.kind === "line") {
        try {
          const reply = parseLine(frame.line);
          ok = isRecord(reply) && isRecord(reply.result);
          if (!ok && isRecord(reply) && isRecord(reply.error)) {
            this.#onError(
              new HudProtocolError(
                Number(reply.error.code),
                `Cannot open tunnel to "${this.capability.name}": ${reply.error.message}`,
              ),
            );
          }
        } catch {
          ok = false;
        }
      }
      if (!ok) {
        closeQuietly(local);
        closeQuietly(remote);
        await up.catch(() => {});
        return;
      }
      const head = reader.takeBuffered();
      if (head.length > 0) await writeAll(local, head);
      await Promise.all([up, pump(remote, local)]);
    } finally {
      closeQuietly(local);
      this.#conns.delete(local);
      if (remote) {
        closeQuietly(remote);
        this.#conns.delete(remote);
      }
    }
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    closeQuietly(this.#listener);
    for (const c of this.#conns) closeQuietly(c);
    await this.#loop;
    await Promise.allSettled([...this.#tasks]);
  }
}

/** Rewrites `scheme://[user@]host:port/rest` to point at a local port. */
function localUrl(url: string, port: number): string {
  const m = /^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)?(?:([^@/?#]*)@)?([^/?#]*)(.*)$/s.exec(url)!;
  const scheme = m[1] ?? "tcp://";
  const user = m[2] !== undefined ? `${m[2]}@` : "";
  return `${scheme}${user}127.0.0.1:${port}${m[4]}`;
}

// Plumbing that connect() needs and HudClient's public API must not show;
// assigned in HudClient's static block, which can reach its #private members.
let newClient: (
  channel: Channel,
  url: string,
  token: string | undefined,
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
  readonly #channel: Channel;
  readonly #url: string;
  readonly #token: string | undefined;
  readonly #control: { hostname: string; port: number };
  readonly #options: ConnectOptions;
  readonly #forwarders = new Map<string, TcpForwarder>();
  #manifest: Manifest;
  #nextId = 2;
  #queue: Promise<unknown> = Promise.resolve();
  #failure: Error | null = null;
  #closed: Promise<void> | null = null;
  #heartbeat: ReturnType<typeof setTimeout> | undefined;
  #heartbeatStopped = false;
  #placement: AsyncDisposable | null = null;

  // TypeScript's `private` is the only way to keep a constructor out of the
  // public API (a #private name cannot apply to one); use connect().
  private constructor(
    channel: Channel,
    url: string,
    token: string | undefined,
    manifest: Manifest,
    options: ConnectOptions,
  ) {
    this.#channel = channel;
    this.#url = url;
    this.#token = token;
    this.#control = parseControlUrl(url);
    this.#manifest = manifest;
    this.#options = options;
    this.#scheduleHeartbeat();
  }

  static {
    newClient = (channel, url, token, manifest, options) =>
      new HudClient(channel, url, token, manifest, options);
    startForwarders = (client) => client.#startForwarders();
    releaseOnClose = (client, placement) => {
      client.#placement = placement;
    };
  }

  /** Opens one forwarder per binding. */
  async #startForwarders(): Promise<void> {
    if (this.#options.forward === false) return;
    try {
      for (const cap of this.#manifest.bindings) {
        this.#forwarders.set(
          cap.name,
          new TcpForwarder(cap, this.#control, this.#token, this.#options.onError ?? (() => {})),
        );
      }
    } catch (err) {
      await this.close();
      throw err;
    }
  }

  /**
   * The control address this client is connected to, `tcp://host:port`:
   * without the token, so that it is safe to show.
   */
  get url(): string {
    return this.#url;
  }

  /** Session id, environment name and version, and the published bindings. */
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
    return this.#closed !== null || this.#failure !== null;
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

  /**
   * A CDP client for the `cdp/1.3` binding: `open("cdp")` is
   * {@linkcode HudClient.openCdp}; see there.
   */
  open(ref: "cdp" | `cdp/${string}`, options?: CdpBindingOptions): Promise<CdpClient>;
  /**
   * An MCP client for the `mcp` binding (a tool server): `open("mcp")` is
   * {@linkcode HudClient.openMcp}; see there.
   */
  open(
    ref: "mcp" | `mcp/${string}`,
    options?: Omit<McpClientOptions, "authToken">,
  ): Promise<McpClient>;
  /**
   * An SSH client for an `ssh/2` binding, connected (lazily) through its
   * local forwarder, that checks the server's host key against the
   * binding's `host_pubkey` and logs in with its `client_key`. With `"cdp"`
   * or a `cdp/` protocol as the ref, a CDP client instead (see
   * {@linkcode HudClient.openCdp}).
   * @param ref a name, protocol or family, as for {@linkcode HudClient.binding}
   * @throws {RangeError} when the ref matches nothing or several bindings
   * @throws {TypeError} when the binding is not `ssh/2` or has no key to log in with
   */
  open(ref?: string, options?: SshBindingOptions): SshClient;
  open(
    ref = "shell",
    options: SshBindingOptions | CdpBindingOptions | Omit<McpClientOptions, "authToken"> = {},
  ): SshClient | Promise<CdpClient> | Promise<McpClient> {
    if (ref === "cdp" || ref.startsWith("cdp/")) {
      return this.openCdp(ref, options as CdpBindingOptions);
    }
    if (ref === "mcp" || ref.startsWith("mcp/")) {
      return this.openMcp(ref, options as Omit<McpClientOptions, "authToken">);
    }
    const capability = this.binding(ref);
    if (capability.family !== "ssh") {
      const hint = capability.family === "cdp"
        ? `; use openCdp("${capability.name}")`
        : capability.family === "mcp"
        ? `; use openMcp("${capability.name}")`
        : "";
      throw new TypeError(
        `Cannot open binding "${capability.name}": expected an ssh binding, got "${capability.protocol}"${hint}`,
      );
    }
    return SshClient.fromBinding(capability, options);
  }

  /**
   * A connected CDP client for a `cdp/1.3` binding (a browser), reached
   * through the binding's local forwarder: the WebSocket url's host and
   * port are the forwarder's. Close it before the client.
   * @param ref a name (`browser`), protocol or family, as for {@linkcode HudClient.binding}
   * @throws {RangeError} when the ref matches nothing or several bindings
   * @throws {TypeError} when the binding is not `cdp` or the browser cannot be reached
   */
  async openCdp(ref = "cdp", options: CdpBindingOptions = {}): Promise<CdpClient> {
    return await CdpClient.fromBinding(this.binding(ref), options);
  }

  /**
   * An initialized MCP client (streamable HTTP) for an `mcp` binding, reached
   * through the binding's local forwarder, with the binding's `auth_token`
   * if it has one. Close it before the client.
   * @param ref a name (`tools`), protocol or family, as for {@linkcode HudClient.binding}
   * @throws {RangeError} when the ref matches nothing or several bindings
   * @throws {TypeError} when the binding is not `mcp`
   * @throws {McpError} when the server cannot be initialized
   */
  async openMcp(
    ref = "mcp",
    options: Omit<McpClientOptions, "authToken"> = {},
  ): Promise<McpClient> {
    return await McpClient.fromBinding(this.binding(ref), options);
  }

  /**
   * Sends one request and returns its result. Calls queue behind each other.
   * @throws {HudProtocolError} for an error reply or a protocol violation
   * @throws {ConnectionClosedError} when the connection is closed or fails
   */
  call(
    method: string,
    params: Record<string, unknown> = {},
    options: CallOptions = {},
  ): Promise<Record<string, unknown>> {
    const run = async () => {
      if (this.#closed) {
        throw new ConnectionClosedError(`Cannot call "${method}": the client is closed`);
      }
      if (this.#failure) {
        throw new ConnectionClosedError(`Cannot call "${method}": the connection failed`, {
          cause: this.#failure,
        });
      }
      options.signal?.throwIfAborted();
      const id = this.#nextId++;
      try {
        return await abortable(
          roundTrip(this.#channel, id, method, params),
          options.signal,
          () => this.#fail(new ConnectionClosedError(`Call "${method}" was aborted`)),
        );
      } catch (err) {
        if (
          err instanceof HudProtocolError && err.code !== ErrorCode.INTERNAL_ERROR &&
          err.code !== ErrorCode.PARSE_ERROR
        ) {
          throw err;
        }
        if (options.signal?.aborted && err === options.signal.reason) throw err;
        // Transport failure or a broken stream: the connection is unusable.
        const failure = err instanceof Error ? err : new Error(String(err));
        this.#fail(failure);
        if (err instanceof HudProtocolError) throw err;
        if (this.#closed) {
          throw new ConnectionClosedError(`Call "${method}" interrupted: the client was closed`, {
            cause: err,
          });
        }
        throw new ConnectionClosedError(`Connection to ${this.#url} failed during "${method}"`, {
          cause: err,
        });
      }
    };
    const result = this.#queue.then(run, run);
    this.#queue = result.catch(() => {});
    return result;
  }

  #fail(err: Error): void {
    this.#failure ??= err;
    this.#stopHeartbeat();
    closeQuietly(this.#channel.conn);
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
    const timeout = this.#options.heartbeatTimeout ?? 5_000;
    const run = async () => {
      if (this.closed) return;
      const id = this.#nextId++;
      using deadline = new Deadline(timeout, undefined, "heartbeat");
      try {
        const result = await abortable(
          roundTrip(this.#channel, id, "hello", this.#helloParams(this.#manifest.sessionId)),
          deadline.signal,
        );
        this.#manifest = { ...readManifest(result), bindings: this.#manifest.bindings };
        this.#scheduleHeartbeat();
      } catch (err) {
        if (
          err instanceof HudProtocolError && err.code !== ErrorCode.INTERNAL_ERROR &&
          err.code !== ErrorCode.PARSE_ERROR
        ) {
          // An error reply only stops the heartbeat.
          this.#stopHeartbeat();
          return;
        }
        this.#fail(
          new ConnectionClosedError(`Heartbeat to ${this.#url} failed`, { cause: err }),
        );
      }
    };
    const result = this.#queue.then(run, run);
    this.#queue = result.catch(() => {});
    await this.#queue;
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
    if (this.#token !== undefined) params.token = this.#token;
    return params;
  }

  /** The environment's task templates, in registration order. */
  async listTasks(options?: CallOptions): Promise<TaskEntry[]> {
    const result = await this.call("tasks.list", {}, options);
    if (!Array.isArray(result.tasks)) {
      throw new HudProtocolError(
        ErrorCode.INTERNAL_ERROR,
        "invalid tasks.list reply: no tasks array",
      );
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
   * payload, whose `answer` the task receives.
   * @throws {HudProtocolError} `-32603` when the grade's score is not a number
   */
  async grade(payload: Record<string, unknown> = {}, options?: CallOptions): Promise<GradeFrame> {
    if (!isRecord(payload)) throw new TypeError("Cannot grade: payload must be an object");
    const result = await this.call("tasks.grade", payload, options);
    if (typeof result.score !== "number") {
      throw new HudProtocolError(
        ErrorCode.INTERNAL_ERROR,
        `invalid grade: score must be a number, got ${JSON.stringify(result.score)}`,
      );
    }
    return result as GradeFrame;
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
      closeQuietly(this.#channel.conn);
      await Promise.allSettled([...this.#forwarders.values()].map((f) => f.close()));
      await this.#queue;
      await this.#placement?.[Symbol.asyncDispose]();
    })();
    return this.#closed;
  }

  /** Same as {@linkcode HudClient.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
