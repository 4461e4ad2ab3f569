/**
 * Errors callers catch, and the JSON-RPC error codes of the protocol.
 *
 * Wire errors apart from local ones: a {@linkcode HudProtocolError} is an
 * error reply (with its code), made where a reply is written or read. What
 * goes wrong in this process has its own class: {@linkcode TaskError} for
 * task code, {@linkcode ProtocolViolationError} for a peer that broke the
 * protocol, `TypeError`/`RangeError` for bad arguments. The server maps
 * local errors to codes in one place (`-32000` for all of these).
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

/** An error reply on the wire, with its JSON-RPC code. */
export class HudProtocolError extends Error {
  /** The JSON-RPC error code. */
  readonly code: number;
  /**
   * The error's `data` member, when the peer sent one: for task code that
   * threw, where in the environment's code (`at`, `stack`) and the failure
   * class it named (`class`).
   */
  readonly data: unknown;

  /**
   * Creates an error with a JSON-RPC code.
   * @param code the JSON-RPC error code
   * @param message what went wrong
   */
  constructor(code: number, message: string, options?: ErrorOptions & { data?: unknown }) {
    super(message, options);
    this.name = "HudProtocolError";
    this.code = code;
    this.data = options?.data;
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
 * Task code failed: a template's body threw, or broke the template contract
 * (returned before yielding a prompt, ended without yielding an evaluation,
 * yielded something that is not a grade). The server answers `-32000` with
 * the message.
 */
export class TaskError extends Error {
  /** The template id. */
  readonly taskId: string;

  /**
   * Creates the error.
   * @param taskId the template id
   * @param message what went wrong (for a body that threw: its message)
   */
  constructor(taskId: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "TaskError";
    this.taskId = taskId;
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
