/**
 * Errors callers catch, and the JSON-RPC error codes of the protocol.
 *
 * @module
 */

/** JSON-RPC error codes used by the control protocol. */
export const ErrorCode = {
  /** The line is not valid JSON. */
  PARSE_ERROR: -32700,
  /** The frame is not a request object, or the request is not valid now. */
  INVALID_REQUEST: -32600,
  /** No such method. */
  METHOD_NOT_FOUND: -32601,
  /** A parameter has the wrong type, or names no known task. */
  INVALID_PARAMS: -32602,
  /** The peer sent something the protocol does not allow. */
  INTERNAL_ERROR: -32603,
  /** Task code failed, or arguments were refused. */
  SERVER_ERROR: -32000,
  /**
   * The connection did not authenticate: its first frame was not a `hello`
   * or `tunnel.open` carrying the server's token. The server closes the
   * connection after this error.
   */
  UNAUTHORIZED: -32001,
  /** A server limit was reached (connections, buffered bytes, parked tasks). */
  LIMIT_EXCEEDED: -32002,
} as const;

/** An error frame from the peer, or a protocol violation, with its JSON-RPC code. */
export class HudProtocolError extends Error {
  /** The JSON-RPC error code. */
  readonly code: number;

  /**
   * Creates an error with a JSON-RPC code.
   * @param code the JSON-RPC error code
   * @param message what went wrong
   */
  constructor(code: number, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "HudProtocolError";
    this.code = code;
  }
}

/** The connection ended before the call completed. */
export class ConnectionClosedError extends Error {
  /**
   * Creates the error.
   * @param message what was interrupted
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ConnectionClosedError";
  }
}

/** The environment did not become ready in time. */
export class NotReadyError extends Error {
  /**
   * Creates the error.
   * @param message what was waited for
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "NotReadyError";
  }
}

/**
 * The peer broke the protocol: a reply that does not answer the request
 * (its id differs), that has no result object, that cannot be parsed, or
 * that exceeds the frame limit. Found locally, never sent or received as a
 * JSON-RPC error (those are {@linkcode HudProtocolError}). A reply out of
 * step with its request, or one that cannot be read, ends the connection.
 */
export class ProtocolViolationError extends Error {
  /**
   * Creates the error.
   * @param message what the peer sent that the protocol does not allow
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ProtocolViolationError";
  }
}
