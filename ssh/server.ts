/**
 * An SSH-2 server on Deno's WebCrypto, interoperable with OpenSSH: public-key
 * (`ssh-ed25519`) logins against a fixed set of authorised keys, and session
 * channels that run `bash -lc <command>` (or `bash -l`) in a working
 * directory with a clean environment, each in its own process group, killed
 * when its channel or connection goes. A `pty-req` is served through
 * util-linux `script` where it is installed, and refused otherwise;
 * `window-change` resizes that terminal (coreutils `stty -F` on it, which
 * also signals SIGWINCH). The `sftp` subsystem (SFTP version 3, see
 * `_sftp.ts`) serves files under the working directory, in this process,
 * refusing paths whose real location leaves it, or runs a program that
 * speaks SFTP on stdio (`sftpCommand`, as OpenSSH's `Subsystem sftp`)
 * through the `spawn` hook; OpenSSH's `scp` uses it.
 *
 * @module
 */

import { closeQuietly, prefixed } from "../_internal/io.ts";
import { acceptLoop } from "../_internal/accept.ts";
import { DISCONNECT } from "./_errors.ts";
import {
  Ed25519Signer,
  type Ed25519Signer as Signer,
  formatPublicKey,
  parsePrivateKey,
  parsePublicKey,
} from "./_keys.ts";
import { CIPHERS } from "./_cipher.ts";
import type { ServerConfig, SshSpawner, SshSpawnOptions } from "./_session.ts";
import { ServerConnection } from "./_server_connection.ts";

export type { SshSpawner, SshSpawnOptions } from "./_session.ts";

/** Limits on connections that have not logged in yet, as OpenSSH's `MaxStartups`. */
export interface SshStartupLimits {
  /** Unauthenticated connections accepted before random early drop begins. */
  start: number;
  /** Percent chance of dropping a new connection when `start` are pending. */
  rate: number;
  /** Unauthenticated connections at which every new one is dropped. */
  full: number;
}

/** Options for {@linkcode startSshServer}. */
export interface SshServerOptions {
  /**
   * Address to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Port to listen on; 0 picks a free one.
   * @default 0
   */
  port?: number;
  /** Shuts the server down when aborted. */
  signal?: AbortSignal;
  /** Called once listening. */
  onListen?: (addr: Deno.NetAddr) => void;
  /**
   * Called with unexpected errors (not with a peer's misbehaviour, which
   * only ends that peer's connection).
   * @default ignores them
   */
  onError?: (error: unknown) => void;
  /** The host key: an unencrypted OpenSSH Ed25519 private key. */
  hostKey: string;
  /** Public keys (`ssh-ed25519 AAAA...`) allowed to log in. */
  authorizedKeys: readonly string[];
  /**
   * The only user name accepted; any name when unset.
   * @default undefined
   */
  user?: string;
  /**
   * Working directory of commands.
   * @default Deno.cwd()
   */
  cwd?: string;
  /**
   * Variables set for commands, on top of PATH, HOME, USER and LANG taken
   * from this process. Nothing else of this process's environment leaks in.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * Failed authentication attempts allowed per connection.
   * @default 6
   */
  maxAuthTries?: number;
  /**
   * Milliseconds a connection may take to log in.
   * @default 30000
   */
  loginGraceTime?: number;
  /**
   * Connections from the listener served at once; more are refused (those
   * handed over through `attach` are not counted).
   * @default 256
   */
  maxConnections?: number;
  /**
   * Cap on connections from the listener that have not logged in: from
   * `start` pending, a new one is dropped with a chance growing from `rate`
   * percent to 100 at `full` (OpenSSH's `MaxStartups 10:30:100`).
   * @default { start: 10, rate: 30, full: 100 }
   */
  maxStartups?: SshStartupLimits;
  /**
   * Milliseconds a connection may take to send its version line.
   * @default 10000
   */
  versionTimeout?: number;
  /**
   * Starts each session's command.
   * @default runs `argv` directly with `clearEnv` in a new session
   */
  spawn?: SshSpawner;
  /**
   * Bytes sent plus received after which a connection renews its keys.
   * @default 1073741824 (1 GiB)
   */
  rekeyLimit?: number;
  /**
   * Ciphers offered, from `chacha20-poly1305@openssh.com`,
   * `aes128-gcm@openssh.com`, `aes256-gcm@openssh.com`, `aes128-ctr` and
   * `aes256-ctr`. The client's order decides among them; OpenSSH's `ssh`
   * and Dropbear's pick chacha20-poly1305 (WebAssembly here, the cheapest
   * per packet), PuTTY aes256-ctr.
   * @default ["chacha20-poly1305@openssh.com", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr"]
   */
  ciphers?: readonly string[];
  /**
   * Whether to serve the `sftp` subsystem (also what `scp` uses), confined
   * to `cwd`: paths whose real location leaves it are refused.
   * @default true
   */
  sftp?: boolean;
  /**
   * A program speaking SFTP on stdin and stdout (OpenSSH's `sftp-server`,
   * or the SDK's own in a workspace sandbox) to start through `spawn` for
   * each `sftp` subsystem request, in `cwd` with the commands'
   * environment, instead of serving SFTP in this process.
   * @default undefined: SFTP in this process (when `sftp` is on)
   */
  sftpCommand?: readonly string[];
  /**
   * Whether closing a session's channel kills its command's process group
   * (what a command left in the background dies with its session). False
   * leaves them running, as `docker exec` leaves what a command started
   * running in its container; they are the `spawn` hook's to end.
   * @default true
   */
  killOnClose?: boolean;
}

/** A running SSH server, as returned by {@linkcode startSshServer}. */
export interface SshServer {
  /** The address it listens on. */
  readonly addr: Deno.NetAddr;
  /** The host public key, `ssh-ed25519 AAAA...`. */
  readonly hostPublicKey: string;
  /** Resolves once the server has shut down. */
  readonly finished: Promise<void>;
  /**
   * Serves one connection accepted elsewhere (a control server's
   * `tunnel.open`) as if it had come to the listener; `head` holds bytes
   * already read from it. Resolves when it ends. Such connections were
   * authenticated by whoever hands them over, and are bounded there: they
   * neither count towards nor wait for `maxConnections` and `maxStartups`,
   * so anonymous TCP connections cannot crowd them out.
   */
  attach(conn: Deno.Conn, head?: Uint8Array): Promise<void>;
  /** Stops listening, ends every connection (killing its commands) and waits. */
  shutdown(): Promise<void>;
  /** Same as `shutdown()`. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** The default {@linkcode SshSpawner}: `argv` as is, in its own session. */
function spawnDirect(argv: readonly string[], options: SshSpawnOptions): Deno.ChildProcess {
  return new Deno.Command(argv[0], {
    args: argv.slice(1),
    cwd: options.cwd,
    env: options.env,
    clearEnv: true,
    // setsid(): the command leads its own process group, which we kill.
    detached: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

function checkCiphers(ciphers: readonly string[] | undefined): readonly string[] | undefined {
  if (ciphers === undefined) return undefined;
  if (!Array.isArray(ciphers) || ciphers.length === 0) {
    throw new TypeError("Cannot start SSH server: ciphers must be a non-empty array of names");
  }
  for (const c of ciphers) {
    if (!Object.hasOwn(CIPHERS, c)) {
      throw new RangeError(
        `Cannot start SSH server: unknown cipher "${c}" (known: ${
          Object.keys(CIPHERS).join(", ")
        })`,
      );
    }
  }
  return [...ciphers];
}

function checkStartups(limits: SshStartupLimits): SshStartupLimits {
  const { start, rate, full } = limits ?? {};
  const ok = Number.isInteger(start) && Number.isInteger(rate) && Number.isInteger(full) &&
    start >= 1 && start <= full && rate >= 0 && rate <= 100;
  if (!ok) {
    throw new RangeError(
      `Cannot start SSH server: invalid maxStartups "${start}:${rate}:${full}" (want start:rate:full with 1 <= start <= full, 0 <= rate <= 100)`,
    );
  }
  return { start, rate, full };
}

/** {@linkcode SshServerOptions} checked, with every default applied. */
interface ServerSettings {
  /** What each connection and session is handed. */
  config: ServerConfig;
  hostKey: ReturnType<typeof parsePrivateKey>;
  hostname: string;
  port: number;
  loginGraceTime: number;
  versionTimeout: number;
  maxConnections: number;
  startups: SshStartupLimits;
}

/**
 * Checks `options` and applies the defaults, once.
 * @throws {TypeError} when a key does not parse or an option has the wrong type
 * @throws {RangeError} when a limit is out of range
 */
function serverSettings(options: SshServerOptions): ServerSettings {
  if (typeof options !== "object" || options === null) {
    throw new TypeError("Cannot start SSH server: expected an options object");
  }
  const hostKey = parsePrivateKey(options.hostKey);
  const authorized = authorizedBlobs(options.authorizedKeys);
  const maxAuthTries = options.maxAuthTries ?? 6;
  if (!Number.isInteger(maxAuthTries) || maxAuthTries < 1) {
    throw new RangeError(`Cannot start SSH server: invalid maxAuthTries "${maxAuthTries}"`);
  }
  const loginGraceTime = options.loginGraceTime ?? 30_000;
  const versionTimeout = options.versionTimeout ?? 10_000;
  if (!(versionTimeout > 0)) {
    throw new RangeError(`Cannot start SSH server: invalid versionTimeout "${versionTimeout}"`);
  }
  const maxConnections = options.maxConnections ?? 256;
  const startups = checkStartups(options.maxStartups ?? { start: 10, rate: 30, full: 100 });
  if (options.spawn !== undefined && typeof options.spawn !== "function") {
    throw new TypeError("Cannot start SSH server: spawn must be a function");
  }
  const cwd = options.cwd ?? Deno.cwd();
  const config: ServerConfig = {
    spawn: options.spawn ?? spawnDirect,
    cwd,
    env: { ...(options.env ?? {}) },
    user: options.user,
    authorized,
    maxAuthTries,
    rekeyLimit: options.rekeyLimit,
    ciphers: checkCiphers(options.ciphers),
    onError: options.onError ?? (() => {}),
    sftpRoot: null,
    sftpCommand: checkSftpCommand(options.sftpCommand),
    killOnClose: options.killOnClose ?? true,
  };
  if (options.sftp ?? true) {
    config.sftpRoot = Deno.realPath(cwd);
    config.sftpRoot.catch(() => {});
  }
  return {
    config,
    hostKey,
    hostname: options.hostname ?? "127.0.0.1",
    port: options.port ?? 0,
    loginGraceTime,
    versionTimeout,
    maxConnections,
    startups,
  };
}

/** The keys that may log in, as the blobs a login presents. */
function authorizedBlobs(keys: readonly string[]): Uint8Array[] {
  if (!Array.isArray(keys)) {
    throw new TypeError("Cannot start SSH server: authorizedKeys must be an array");
  }
  return keys.map((k) => parsePublicKey(k).blob);
}

function checkSftpCommand(command: readonly string[] | undefined): readonly string[] | null {
  if (command === undefined) return null;
  if (
    !Array.isArray(command) || command.length === 0 || !command.every((a) => typeof a === "string")
  ) {
    throw new TypeError("Cannot start SSH server: sftpCommand must be a non-empty string array");
  }
  return [...command];
}

class Server implements SshServer {
  readonly #listener: Deno.TcpListener;
  readonly #hostKey: Promise<Signer>;
  readonly #config: ServerConfig;
  readonly #grace: number;
  readonly #versionTimeout: number;
  readonly #maxConnections: number;
  readonly #startups: SshStartupLimits;
  readonly #conns = new Map<ServerConnection, Promise<void>>();
  /** Connections from our listener that have not logged in yet. */
  readonly #unauthed = new Set<ServerConnection>();
  /** Connections from our listener being served. */
  #listened = 0;
  readonly #hostPublicKey: string;
  readonly #finished: Promise<void>;
  #finishedResolve!: () => void;
  #accepting: Promise<void>;
  #shuttingDown: Promise<void> | null = null;

  constructor(options: SshServerOptions) {
    const settings = serverSettings(options);
    this.#config = settings.config;
    this.#grace = settings.loginGraceTime;
    this.#versionTimeout = settings.versionTimeout;
    this.#maxConnections = settings.maxConnections;
    this.#startups = settings.startups;
    this.#hostKey = Ed25519Signer.fromParsed(settings.hostKey);
    this.#hostKey.catch(() => {});
    this.#hostPublicKey = formatPublicKey(settings.hostKey.publicKey);
    this.#finished = new Promise((resolve) => this.#finishedResolve = resolve);
    this.#listener = Deno.listen({
      hostname: settings.hostname,
      port: settings.port,
      transport: "tcp",
    });
    const signal = options.signal;
    if (signal?.aborted) {
      this.#accepting = Promise.resolve();
      this.shutdown();
      return;
    }
    signal?.addEventListener("abort", () => this.shutdown(), { once: true });
    options.onListen?.(this.addr);
    this.#accepting = this.#accept();
  }

  get addr(): Deno.NetAddr {
    return this.#listener.addr;
  }

  get hostPublicKey(): string {
    return this.#hostPublicKey;
  }

  get finished(): Promise<void> {
    return this.#finished;
  }

  async #accept(): Promise<void> {
    await acceptLoop(this.#listener, (conn) => void this.#serve(conn), {
      closing: () => this.#shuttingDown !== null,
      onError: this.#config.onError,
    });
  }

  attach(conn: Deno.Conn, head?: Uint8Array): Promise<void> {
    if (this.#shuttingDown !== null) {
      closeQuietly(conn);
      return Promise.resolve();
    }
    if (head === undefined || head.length === 0) return this.#serve(conn, true);
    if ("setNoDelay" in conn) (conn as Deno.TcpConn).setNoDelay(true);
    const from = prefixed(conn, head);
    // The transport reads, writes and closes; nothing else of a Conn.
    const joined = {
      read: (p: Uint8Array) => from.read(p),
      write: (p: Uint8Array) => conn.write(p),
      closeWrite: () => conn.closeWrite(),
      close: () => conn.close(),
    } as unknown as Deno.Conn;
    return this.#serve(joined, true);
  }

  /**
   * Serves a connection. Only those from our listener count towards the
   * connection cap and the unauthenticated slots: handed-over ones were
   * authenticated (the control token) and are capped by whoever handed
   * them over.
   */
  #serve(conn: Deno.Conn, attached = false): Promise<void> {
    if (!attached && (this.#listened >= this.#maxConnections || this.#dropStartup())) {
      closeQuietly(conn);
      return Promise.resolve();
    }
    if ("setNoDelay" in conn) (conn as Deno.TcpConn).setNoDelay(true);
    const c = new ServerConnection(conn, this.#hostKey, this.#config);
    if (!attached) {
      this.#listened++;
      this.#unauthed.add(c);
      c.authed.then(() => this.#unauthed.delete(c));
    }
    const task = c.run(this.#grace, this.#versionTimeout).catch((err) => this.#config.onError(err))
      .finally(() => {
        if (!attached) {
          this.#listened--;
          this.#unauthed.delete(c);
        }
        this.#conns.delete(c);
      });
    this.#conns.set(c, task);
    return task;
  }

  /** OpenSSH's random early drop: whether to refuse a new connection. */
  #dropStartup(): boolean {
    const { start, rate, full } = this.#startups;
    const n = this.#unauthed.size;
    if (n >= full) return true;
    if (n < start) return false;
    const p = rate + ((100 - rate) * (n - start)) / (full - start);
    return Math.random() * 100 < p;
  }

  shutdown(): Promise<void> {
    this.#shuttingDown ??= (async () => {
      closeQuietly(this.#listener);
      await this.#accepting;
      for (const c of this.#conns.keys()) {
        c.transport.disconnect(DISCONNECT.BY_APPLICATION, "server shutting down").catch(() => {});
      }
      await Promise.allSettled([...this.#conns.values()]);
      // Operations the constructor started end before the server is done.
      await this.#hostKey.catch(() => {});
      await this.#config.sftpRoot?.catch(() => {});
      this.#finishedResolve();
    })();
    return this.#shuttingDown;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.shutdown();
  }
}

/**
 * Starts an SSH server. Commands run as this process's user (or however the
 * `spawn` hook starts them); only the keys in `authorizedKeys` may log in.
 *
 * @example Serve a directory over SSH
 * ```ts
 * import { generateSshKeyPair } from "./keys.ts";
 * import { startSshServer } from "./server.ts";
 * import assert from "node:assert/strict";
 *
 * const host = await generateSshKeyPair();
 * const client = await generateSshKeyPair();
 * await using server = startSshServer({
 *   hostKey: host.privateKey,
 *   authorizedKeys: [client.publicKey],
 *   cwd: Deno.cwd(),
 * });
 * // Log in with: ssh -i <client key> -p <port> agent@127.0.0.1
 * assert.ok(server.addr.port > 0);
 * assert.equal(server.hostPublicKey, host.publicKey);
 * ```
 *
 * @param options keys, address, working directory, environment
 * @returns the running server
 * @throws {TypeError} when a key does not parse
 * @throws {RangeError} when a limit is out of range
 */
export function startSshServer(options: SshServerOptions): SshServer {
  return new Server(options);
}
