/**
 * {@linkcode SshClient}, an SSH client on Deno's WebCrypto with no
 * dependencies: it verifies the server's host key, runs commands (with a
 * terminal when asked) and moves files over SFTP (falling back to commands
 * where a server has no SFTP). Keys are in `keys.ts`, the server in
 * `server.ts`.
 *
 * Both ends speak what OpenSSH 9 speaks, checked against its `ssh` and
 * `sshd`: key exchange `curve25519-sha256` (and `@libssh.org`) with strict
 * key exchange (`kex-strict-*-v00@openssh.com`), host keys and user keys
 * `ssh-ed25519`, ciphers `chacha20-poly1305@openssh.com`, `aes128-gcm@openssh.com`,
 * `aes256-gcm@openssh.com`, `aes128-ctr` and `aes256-ctr`, MACs `hmac-sha2-256-etm@openssh.com` and
 * `hmac-sha2-256`, `ext-info` with `server-sig-algs`, rekeying either way.
 *
 * @module
 */

import type { Capability } from "../capability.ts";
import { parseHostPort } from "../capability.ts";
import { ClientConnection } from "./_connection.ts";
import {
  DISCONNECT,
  SshAuthError,
  SshCommandError,
  SshError,
  SshFileError,
  SshHostKeyError,
} from "./_errors.ts";
import { S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, SftpClient } from "./_sftp_client.ts";
import type { SftpAttrs } from "./_sftp_wire.ts";
import { Ed25519Signer, parsePrivateKey, parsePublicKey } from "./_keys.ts";
import { fromUtf8, utf8 } from "./_wire.ts";
import { dialOwn } from "../_internal/peer_uid.ts";
import {
  abortReason,
  checkExecOptions,
  collectStream,
  runToEnd,
  type SshExecOptions,
  type SshExecResult,
  type SshProcess,
  startCommand,
} from "./_exec.ts";
import { describeExit } from "../_internal/exit.ts";
import { delay } from "../_internal/async.ts";
import { shellQuote } from "../_internal/shell.ts";

export { SshAuthError, SshCommandError, SshError, SshFileError, SshHostKeyError };
export type {
  SshExecOptions,
  SshExecResult,
  SshExitStatus,
  SshProcess,
  SshPtyOptions,
} from "./_exec.ts";

/** Options for {@linkcode SshClient}. */
export interface SshClientOptions {
  /**
   * Server host name or address.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Server port.
   * @default 22
   */
  port?: number;
  /**
   * User name to log in as.
   * @default "agent"
   */
  user?: string;
  /** The server's host key, `ssh-ed25519 AAAA...`; any other key is refused. */
  hostPublicKey: string;
  /**
   * Our key: an unencrypted OpenSSH Ed25519 private key. Either this or
   * `privateKeyPath` is required.
   */
  privateKey?: string;
  /** A file holding `privateKey`, read when connecting. */
  privateKeyPath?: string;
  /** Aborts connecting (and later reconnecting). */
  signal?: AbortSignal;
  /**
   * Milliseconds one connection attempt may take.
   * @default 15000
   */
  connectTimeout?: number;
  /**
   * Ciphers we offer, in order of preference: `chacha20-poly1305@openssh.com`
   * (WebAssembly, the cheapest per packet here), `aes128-gcm@openssh.com`,
   * `aes256-gcm@openssh.com`, `aes128-ctr`, `aes256-ctr`.
   * @default all five, in that order
   */
  ciphers?: readonly string[];
  /**
   * MACs we offer (used with the CTR ciphers): `hmac-sha2-256-etm@openssh.com`,
   * `hmac-sha2-256`.
   * @default both, in that order
   */
  macs?: readonly string[];
  /**
   * Bytes sent plus received after which the connection renews its keys.
   * @default 1073741824 (1 GiB)
   */
  rekeyLimit?: number;
}

/** Options for {@linkcode SshClient.fromBinding}. */
export interface SshBindingOptions {
  /**
   * Our private key; defaults to the binding's `client_key` (and, with
   * `allowKeyPath`, else the file at its `client_key_path`).
   */
  privateKey?: string;
  /**
   * Read the key from the binding's `client_key_path` when it has no inline
   * `client_key`. Off by default: an environment must not make us read a
   * file of its choosing (such as our own `~/.ssh/id_ed25519`) and log in
   * with it.
   * @default false
   */
  allowKeyPath?: boolean;
  /** Aborts connecting. */
  signal?: AbortSignal;
  /**
   * Milliseconds one connection attempt may take.
   * @default 15000
   */
  connectTimeout?: number;
}

/** Options for the file methods of {@linkcode SshClient}. */
export interface SshFileOptions {
  /** Abandons the call when aborted. */
  signal?: AbortSignal;
  /** Milliseconds after which the call rejects. */
  timeout?: number;
}

/** What {@linkcode SshClient.stat} returns. */
export interface SshFileInfo {
  /** Size in bytes. */
  readonly size: number;
  /** Permission bits (`0o644`...). */
  readonly mode: number;
  /** Whether it is a regular file. */
  readonly isFile: boolean;
  /** Whether it is a directory. */
  readonly isDirectory: boolean;
  /** Whether it is a symbolic link (only when not followed). */
  readonly isSymlink: boolean;
  /** Last modification, or null when the server did not say. */
  readonly mtime: Date | null;
}

/** An entry of {@linkcode SshClient.listDir}. */
export interface SshDirEntry {
  /** The entry's name (not a path). */
  readonly name: string;
  /** Whether it is a regular file. */
  readonly isFile: boolean;
  /** Whether it is a directory. */
  readonly isDirectory: boolean;
  /** Whether it is a symbolic link. */
  readonly isSymlink: boolean;
}

/** {@linkcode SshClientOptions} with every default applied. */
interface ClientSettings extends SshClientOptions {
  hostname: string;
  port: number;
  user: string;
  connectTimeout: number;
}

const RETRY_DELAYS = [100, 400];

/**
 * Whether another connection attempt might succeed: not after a failed
 * negotiation or login (ours or reported by the peer), which would only
 * fail the same way again.
 */
function isTransient(err: unknown): boolean {
  if (!(err instanceof SshError)) return true;
  return err.reason !== DISCONNECT.KEY_EXCHANGE_FAILED &&
    err.reason !== DISCONNECT.NO_MORE_AUTH_METHODS_AVAILABLE &&
    err.reason !== DISCONNECT.HOST_KEY_NOT_VERIFIABLE;
}

/**
 * An SSH client that logs in with an Ed25519 key, refuses any host key but
 * the expected one, and runs commands. It connects on first use and
 * reconnects (three tries, with backoff) when the connection was lost.
 *
 * @example Run a command on an SSH server
 * ```ts
 * import { generateSshKeyPair, SshClient } from "./mod.ts";
 * import { startSshServer } from "./server.ts";
 * import assert from "node:assert/strict";
 *
 * const host = await generateSshKeyPair();
 * const key = await generateSshKeyPair();
 * await using server = startSshServer({
 *   hostKey: host.privateKey,
 *   authorizedKeys: [key.publicKey],
 * });
 * await using client = await SshClient.connect({
 *   port: server.addr.port,
 *   hostPublicKey: server.hostPublicKey,
 *   privateKey: key.privateKey,
 * });
 * const result = await client.exec("echo hello");
 * assert.equal(result.stdoutText, "hello\n");
 * assert.equal(result.code, 0);
 * ```
 */
export class SshClient {
  readonly #options: ClientSettings;
  readonly #keyText: () => Promise<string>;
  #conn: ClientConnection | null = null;
  #connecting: Promise<ClientConnection> | null = null;
  #closed = false;
  readonly #processes = new Set<Promise<unknown>>();
  #sftp: { conn: ClientConnection; session: Promise<SftpClient | null> } | null = null;

  /**
   * Creates a client; it connects on first use. Use
   * {@linkcode SshClient.connect} to connect at once.
   * @param options where to connect and with which keys
   * @throws {TypeError} when a key does not parse
   */
  constructor(options: SshClientOptions) {
    if (typeof options !== "object" || options === null) {
      throw new TypeError("Cannot create SSH client: expected an options object");
    }
    parsePublicKey(options.hostPublicKey);
    const { privateKey, privateKeyPath } = options;
    if (typeof privateKey === "string") {
      parsePrivateKey(privateKey);
      this.#keyText = () => Promise.resolve(privateKey);
    } else if (typeof privateKeyPath === "string" && privateKeyPath !== "") {
      this.#keyText = () => Deno.readTextFile(privateKeyPath);
    } else {
      throw new TypeError("Cannot create SSH client: privateKey or privateKeyPath is required");
    }
    this.#options = {
      ...options,
      hostname: options.hostname ?? "127.0.0.1",
      port: options.port ?? 22,
      user: options.user ?? "agent",
      connectTimeout: options.connectTimeout ?? 15_000,
    };
  }

  /**
   * Connects and logs in.
   * @param options where to connect and with which keys
   * @returns a connected client
   * @throws {SshHostKeyError} when the server's host key is not `hostPublicKey`
   * @throws {SshAuthError} when the server refuses the key
   * @throws {SshError} when the connection fails three times
   */
  static async connect(options: SshClientOptions): Promise<SshClient> {
    const client = new SshClient(options);
    await client.#ensure(options.signal);
    return client;
  }

  /**
   * A client for an `ssh/2` capability: host and port from its url, user,
   * host key and client key from its params. Connects on first use.
   * @param capability an `ssh/2` binding
   * @param options key override, signal
   * @returns the client
   * @throws {TypeError} when the capability is not an SSH binding
   */
  static fromBinding(capability: Capability, options: SshBindingOptions = {}): SshClient {
    if (capability?.family !== "ssh") {
      throw new TypeError(
        `Cannot create SSH client: capability "${capability?.name}" is not an ssh binding`,
      );
    }
    const hp = parseHostPort(capability.url);
    if (hp === null) {
      throw new TypeError(`Cannot create SSH client: invalid url "${capability.url}"`);
    }
    const p = capability.params;
    const hostPublicKey = p.host_pubkey;
    if (typeof hostPublicKey !== "string") {
      throw new TypeError(
        `Cannot create SSH client: binding "${capability.name}" has no host_pubkey`,
      );
    }
    const privateKey = options.privateKey ??
      (typeof p.client_key === "string" ? p.client_key : undefined);
    const privateKeyPath = options.allowKeyPath === true && typeof p.client_key_path === "string"
      ? p.client_key_path
      : undefined;
    if (privateKey === undefined && privateKeyPath === undefined) {
      throw new TypeError(
        `Cannot create SSH client: binding "${capability.name}" has no client_key${
          typeof p.client_key_path === "string"
            ? " (pass allowKeyPath: true to read its client_key_path)"
            : ""
        }`,
      );
    }
    return new SshClient({
      hostname: hp.hostname,
      port: hp.port ?? 22,
      user: typeof p.user === "string" ? p.user : "agent",
      hostPublicKey,
      privateKey,
      privateKeyPath,
      signal: options.signal,
      connectTimeout: options.connectTimeout,
    });
  }

  /** Whether a connection is up right now. */
  get connected(): boolean {
    return this.#conn !== null && !this.#conn.transport.isClosed;
  }

  async #ensure(signal?: AbortSignal): Promise<ClientConnection> {
    if (this.#closed) throw new SshError("Cannot use SSH client: closed");
    if (this.#conn !== null && !this.#conn.transport.isClosed) return this.#conn;
    this.#connecting ??= this.#connectWithRetry(signal).finally(() => this.#connecting = null);
    const conn = await this.#connecting;
    if (this.#closed) {
      await conn.transport.disconnect(11, "closed by client");
      throw new SshError("Cannot use SSH client: closed");
    }
    this.#conn = conn;
    return conn;
  }

  async #connectWithRetry(signal?: AbortSignal): Promise<ClientConnection> {
    const signals = [signal, this.#options.signal].filter((s): s is AbortSignal => !!s);
    const sig = signals.length === 0 ? undefined : AbortSignal.any(signals);
    let last: unknown;
    for (let attempt = 0; attempt <= RETRY_DELAYS.length; attempt++) {
      if (sig?.aborted) throw abortReason(sig);
      try {
        return await this.#connectOnce(sig);
      } catch (err) {
        if (err instanceof SshHostKeyError || err instanceof SshAuthError || sig?.aborted) {
          throw err;
        }
        if (err instanceof TypeError || !isTransient(err)) throw err;
        last = err;
      }
      if (attempt < RETRY_DELAYS.length) await delay(RETRY_DELAYS[attempt], sig);
    }
    throw new SshError(
      `Cannot connect: ${this.#options.hostname}:${this.#options.port} failed three times`,
      { cause: last },
    );
  }

  async #connectOnce(signal?: AbortSignal): Promise<ClientConnection> {
    const opts = this.#options;
    const keyText = await this.#keyText();
    const signer = await Ed25519Signer.fromParsed(parsePrivateKey(keyText));
    const hostBlob = parsePublicKey(opts.hostPublicKey).blob;
    // Noted as this process's own: a forwarder of this process it reaches
    // knows its user without reading the kernel's socket tables.
    const tcp = await dialOwn(
      opts.port,
      () => Deno.connect({ hostname: opts.hostname, port: opts.port, transport: "tcp" }),
    );
    tcp.setNoDelay(true);
    const conn = new ClientConnection(tcp, opts, hostBlob);
    const onAbort = () => conn.transport.close();
    signal?.addEventListener("abort", onAbort, { once: true });
    const timer = setTimeout(() => conn.transport.close(), opts.connectTimeout);
    try {
      await conn.login(opts.user, signer);
      return conn;
    } catch (err) {
      conn.transport.close();
      await conn.transport.wait();
      if (signal?.aborted) throw abortReason(signal);
      throw err;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * Starts `command` and returns its streams. Read stdout and stderr (or
   * cancel them), else the command stalls once the window fills.
   * @param command a shell command line
   * @param options signal, timeout, env (`stdin` is ignored: write to `stdin`)
   * @returns the running process
   * @throws {SshError} when the server refuses to run the command
   */
  async spawn(command: string, options: SshExecOptions = {}): Promise<SshProcess> {
    if (typeof command !== "string") throw new TypeError("Cannot run command: expected a string");
    checkExecOptions(options);
    const conn = await this.#ensure(options.signal);
    const proc = await startCommand(conn, command, options);
    const tracked = proc.status.then(() => {}, () => {});
    this.#processes.add(tracked);
    tracked.finally(() => this.#processes.delete(tracked));
    return proc;
  }

  /**
   * Runs `command` to completion and collects its output.
   *
   * @param command a shell command line (run by the server's shell)
   * @param options stdin, signal, timeout, env
   * @returns exit code or signal, stdout and stderr
   * @throws {SshError} when the connection fails or the server refuses
   * @throws {DOMException} `AbortError`/`TimeoutError` when cancelled (the command is killed)
   */
  async exec(command: string, options: SshExecOptions = {}): Promise<SshExecResult> {
    return await runToEnd(await this.spawn(command, options), options.stdin);
  }

  async #checked(command: string, what: string, options: SshExecOptions): Promise<SshExecResult> {
    const r = await this.exec(command, options);
    if (r.code !== 0) {
      const detail = r.stderrText.trim().split("\n").pop() ?? "";
      throw new SshCommandError(`Cannot ${what}: ${detail || describeExit(r)}`, r, r.stderrText);
    }
    return r;
  }

  /**
   * The connection's SFTP session, opened on first use; null when the
   * server refuses the subsystem (then the file methods run commands).
   */
  async #sftpSession(signal?: AbortSignal): Promise<SftpClient | null> {
    const conn = await this.#ensure(signal);
    const cached = this.#sftp;
    if (cached !== null && cached.conn === conn) {
      const s = await cached.session;
      if (s === null || s.usable) return s;
    }
    const session = SftpClient.open(conn.mux);
    this.#sftp = { conn, session };
    session.catch(() => {
      if (this.#sftp?.session === session) this.#sftp = null;
    });
    return await session;
  }

  /** Runs `work` under the options' signal and timeout. */
  async #file<T>(
    what: string,
    options: SshFileOptions,
    work: (sftp: SftpClient | null) => Promise<T>,
  ): Promise<T> {
    const { signal, timeout } = options;
    if (signal?.aborted) throw abortReason(signal);
    if (timeout !== undefined && !(timeout >= 0)) {
      throw new RangeError(`Cannot ${what}: invalid timeout "${timeout}"`);
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort: (() => void) | undefined;
    const stop = new Promise<never>((_, reject) => {
      if (timeout !== undefined) {
        timer = setTimeout(
          () => reject(new DOMException(`Timed out after ${timeout} ms: ${what}`, "TimeoutError")),
          timeout,
        );
      }
      if (signal !== undefined) {
        onAbort = () => reject(abortReason(signal));
        signal.addEventListener("abort", onAbort, { once: true });
      }
    });
    stop.catch(() => {});
    const task = (async () => work(await this.#sftpSession(signal)))();
    task.catch(() => {});
    this.#processes.add(task);
    task.finally(() => this.#processes.delete(task)).catch(() => {});
    try {
      return await Promise.race([task, stop]);
    } finally {
      clearTimeout(timer);
      if (onAbort !== undefined) signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * Reads a remote file, binary-safe, over SFTP (relative paths start in the
   * server's working directory, or the login directory of an OpenSSH server).
   * @param path the file
   * @param options signal, timeout
   * @returns its bytes
   * @throws {SshFileError} when it cannot be read (`code` 2: no such file)
   */
  readFile(path: string, options: SshFileOptions = {}): Promise<Uint8Array> {
    return this.#file(`read "${path}"`, options, async (sftp) => {
      if (sftp !== null) return await sftp.readFile(path);
      const r = await this.#checked(`cat -- ${shellQuote(path)}`, `read "${path}"`, {});
      return r.stdout;
    });
  }

  /**
   * Writes a remote file, creating or replacing it, streaming over SFTP.
   * @param path the file
   * @param data its content: bytes, text, or a stream of bytes
   * @param options signal, timeout
   * @throws {SshFileError} when it cannot be written
   */
  writeFile(
    path: string,
    data: Uint8Array | string | ReadableStream<Uint8Array>,
    options: SshFileOptions = {},
  ): Promise<void> {
    const bytes = typeof data === "string" ? utf8(data) : data;
    return this.#file(`write "${path}"`, options, async (sftp) => {
      if (sftp !== null) return await sftp.writeFile(path, bytes);
      const input = bytes instanceof Uint8Array ? bytes : await collectStream(bytes);
      await this.#checked(`cat > ${shellQuote(path)}`, `write "${path}"`, { stdin: input });
    });
  }

  /**
   * Reads a remote text file (UTF-8).
   * @param path the file
   * @param options signal, timeout
   * @returns its text
   * @throws {SshFileError} when it cannot be read
   */
  async readText(path: string, options: SshFileOptions = {}): Promise<string> {
    return fromUtf8(await this.readFile(path, options));
  }

  /**
   * Writes a remote text file (UTF-8), replacing it.
   * @param path the file
   * @param text its new content
   * @param options signal, timeout
   * @throws {SshFileError} when it cannot be written
   */
  writeText(path: string, text: string, options: SshFileOptions = {}): Promise<void> {
    return this.writeFile(path, text, options);
  }

  /**
   * Lists a remote directory, sorted by name, without `.` and `..`.
   * @param path the directory
   * @param options signal, timeout
   * @returns its entries
   * @throws {SshFileError} when it cannot be listed
   */
  listDir(path: string, options: SshFileOptions = {}): Promise<SshDirEntry[]> {
    return this.#file(`list "${path}"`, options, async (sftp) => {
      let entries: SshDirEntry[];
      if (sftp !== null) {
        entries = (await sftp.listDir(path)).map(({ name, attrs }) => {
          const type = (attrs.permissions ?? 0) & S_IFMT;
          return {
            name,
            isFile: type === S_IFREG,
            isDirectory: type === S_IFDIR,
            isSymlink: type === S_IFLNK,
          };
        });
      } else {
        entries = await this.#listByCommand(path);
      }
      return entries.sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    });
  }

  async #listByCommand(path: string): Promise<SshDirEntry[]> {
    const r = await this.#checked(
      `cd -- ${shellQuote(path)} && find . -mindepth 1 -maxdepth 1 -printf '%y\\t%f\\0'`,
      `list "${path}"`,
      {},
    );
    const entries: SshDirEntry[] = [];
    for (const item of r.stdoutText.split("\0")) {
      if (item === "") continue;
      const type = item[0];
      entries.push({
        name: item.slice(2),
        isFile: type === "f",
        isDirectory: type === "d",
        isSymlink: type === "l",
      });
    }
    return entries;
  }

  /**
   * Describes a remote file.
   * @param path the file
   * @param options signal, timeout; `followSymlinks` false describes a link itself
   * @returns size, mode, type and modification time
   * @throws {SshFileError} when it does not exist or cannot be reached
   */
  stat(
    path: string,
    options: SshFileOptions & { followSymlinks?: boolean } = {},
  ): Promise<SshFileInfo> {
    const follow = options.followSymlinks ?? true;
    return this.#file(`stat "${path}"`, options, async (sftp) => {
      let attrs: SftpAttrs;
      if (sftp !== null) {
        attrs = await sftp.stat(path, follow);
      } else {
        const r = await this.#checked(
          `stat ${follow ? "-L " : ""}-c '%s %f %Y' -- ${shellQuote(path)}`,
          `stat "${path}"`,
          {},
        );
        const [size, mode, mtime] = r.stdoutText.trim().split(" ");
        attrs = { size: Number(size), permissions: parseInt(mode, 16), mtime: Number(mtime) };
      }
      const type = (attrs.permissions ?? 0) & S_IFMT;
      return {
        size: attrs.size ?? 0,
        mode: (attrs.permissions ?? 0) & 0o7777,
        isFile: type === S_IFREG,
        isDirectory: type === S_IFDIR,
        isSymlink: type === S_IFLNK,
        mtime: attrs.mtime === undefined ? null : new Date(attrs.mtime * 1000),
      };
    });
  }

  /**
   * Removes a remote file (or, with `recursive`, a directory and what it holds
   * when SFTP is not available; over SFTP, an empty directory).
   * @param path the file or empty directory
   * @param options signal, timeout
   * @throws {SshFileError} when it cannot be removed
   */
  remove(path: string, options: SshFileOptions = {}): Promise<void> {
    return this.#file(`remove "${path}"`, options, async (sftp) => {
      if (sftp === null) {
        await this.#checked(
          `if [ -d ${shellQuote(path)} ] && [ ! -L ${shellQuote(path)} ]; then rmdir -- ${
            shellQuote(path)
          }; else rm -- ${shellQuote(path)}; fi`,
          `remove "${path}"`,
          {},
        );
        return;
      }
      const info = await sftp.stat(path, false);
      if (((info.permissions ?? 0) & S_IFMT) === S_IFDIR) await sftp.rmdir(path);
      else await sftp.remove(path);
    });
  }

  /**
   * Renames a remote file, replacing `to` where the server allows it
   * (OpenSSH's and ours do).
   * @param from the current path
   * @param to the new path
   * @param options signal, timeout
   * @throws {SshFileError} when it cannot be renamed
   */
  rename(from: string, to: string, options: SshFileOptions = {}): Promise<void> {
    return this.#file(`rename "${from}"`, options, async (sftp) => {
      if (sftp !== null) return await sftp.rename(from, to);
      await this.#checked(
        `mv -f -- ${shellQuote(from)} ${shellQuote(to)}`,
        `rename "${from}"`,
        {},
      );
    });
  }

  /** Closes the connection (killing running commands); idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    const connecting = this.#connecting;
    if (connecting !== null) await connecting.catch(() => {});
    const conn = this.#conn;
    this.#conn = null;
    this.#sftp = null;
    if (conn !== null) {
      await conn.transport.disconnect(11, "closed by client");
      await conn.transport.wait();
    }
    await Promise.allSettled([...this.#processes]);
  }

  /** Same as `close()`. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
