// Error classes of the SSH modules, public through ssh.ts.

import type { ExitStatus } from "../_internal/exit.ts";

/**
 * An SSH connection failed: a protocol violation, a failed key exchange or
 * a disconnect. `reason` is the RFC 4253 disconnect reason code when there
 * is one (2 protocol error, 3 key exchange failed, 5 MAC error, 11 by
 * application, 14 no more auth methods...).
 */
export class SshError extends Error {
  /** The disconnect reason code, or 0 when none applies. */
  readonly reason: number;

  /**
   * Creates an SSH error.
   * @param message what went wrong
   * @param options `reason` (disconnect code) and `cause`
   */
  constructor(message: string, options?: ErrorOptions & { reason?: number }) {
    super(message, options);
    this.name = "SshError";
    this.reason = options?.reason ?? 0;
  }
}

/** The server's host key is not the expected one; never retried. */
export class SshHostKeyError extends SshError {
  /**
   * Creates a host key error.
   * @param message what did not match
   * @param options `cause`
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, { ...options, reason: 9 });
    this.name = "SshHostKeyError";
  }
}

/** The server refused our user name or key; never retried. */
export class SshAuthError extends SshError {
  /**
   * Creates an authentication error.
   * @param message why
   * @param options `cause`
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, { ...options, reason: 14 });
    this.name = "SshAuthError";
  }
}

/** A command run by a helper such as `readText()` ended unsuccessfully. */
export class SshCommandError extends SshError {
  /** The command's exit code, or `null` when a signal ended it. */
  readonly exitCode: ExitStatus["code"];
  /** The signal that ended it (`"SIGKILL"`), or `null`. */
  readonly signal: ExitStatus["signal"];
  /** What the command wrote to stderr. */
  readonly stderr: string;

  /**
   * Creates a command error.
   * @param message what failed
   * @param status how the command ended
   * @param stderr the command's stderr text
   */
  constructor(message: string, status: ExitStatus, stderr: string) {
    super(message);
    this.name = "SshCommandError";
    this.exitCode = status.code;
    this.signal = status.signal;
    this.stderr = stderr;
  }
}

/**
 * An SFTP request failed: `code` is the SFTP status (2 no such file,
 * 3 permission denied, 4 failure, 8 unsupported...).
 */
export class SshFileError extends SshError {
  /** The SFTP status code. */
  readonly code: number;
  /** The remote path concerned. */
  readonly path: string;

  /**
   * Creates a file error.
   * @param message what failed
   * @param code the SFTP status code
   * @param path the remote path
   */
  constructor(message: string, code: number, path: string) {
    super(message);
    this.name = "SshFileError";
    this.code = code;
    this.path = path;
  }
}

/** Disconnect reason codes (RFC 4253 section 11.1). */
export const DISCONNECT = {
  PROTOCOL_ERROR: 2,
  KEY_EXCHANGE_FAILED: 3,
  MAC_ERROR: 5,
  SERVICE_NOT_AVAILABLE: 7,
  HOST_KEY_NOT_VERIFIABLE: 9,
  CONNECTION_LOST: 10,
  BY_APPLICATION: 11,
  TOO_MANY_CONNECTIONS: 12,
  AUTH_CANCELLED_BY_USER: 13,
  NO_MORE_AUTH_METHODS_AVAILABLE: 14,
} as const;
