/**
 * What the Chrome DevTools Protocol carries, for the client (`client.ts`):
 * parameters, events and the client's error.
 *
 * @module
 */

/** JSON object as sent/received over CDP. */
export type CdpParams = Record<string, unknown>;

/** A protocol event as delivered to listeners. */
export interface CdpEvent {
  /** Event name, e.g. `Page.loadEventFired`. */
  readonly method: string;
  /** Event parameters (empty object if none were sent). */
  readonly params: CdpParams;
  /** Session the event belongs to; `undefined` for browser-level events. */
  readonly sessionId: string | undefined;
}

/** Listener for {@linkcode CdpClient.on}. */
export type CdpEventHandler = (params: CdpParams, event: CdpEvent) => void;

/** What produced a {@linkcode CdpError}. */
export type CdpErrorKind = "protocol" | "closed" | "exception";

/** Options for constructing a {@linkcode CdpError}. */
export interface CdpErrorOptions extends ErrorOptions {
  /** Origin of the error. */
  kind: CdpErrorKind;
  /** JSON-RPC error code (only for `kind: "protocol"`). */
  code?: number;
  /** Method whose call failed, if any. */
  method?: string;
  /** Extra `data` string from the protocol error. */
  data?: string;
  /** `Runtime.ExceptionDetails` (only for `kind: "exception"`). */
  exceptionDetails?: CdpParams;
}

/**
 * Error raised by the client.
 *
 * - `kind: "protocol"`: the browser answered with a JSON-RPC error (`code` is set).
 * - `kind: "closed"`: the connection closed before an answer arrived.
 * - `kind: "exception"`: evaluated JavaScript threw (`exceptionDetails` is set).
 */
export class CdpError extends Error {
  /** Origin of the error. */
  readonly kind: CdpErrorKind;
  /** JSON-RPC error code; `undefined` unless `kind` is `"protocol"`. */
  readonly code: number | undefined;
  /** Method whose call failed, if known. */
  readonly method: string | undefined;
  /** Extra protocol `data`, if any. */
  readonly data: string | undefined;
  /** `Runtime.ExceptionDetails` for `kind: "exception"`. */
  readonly exceptionDetails: CdpParams | undefined;

  /** Creates a new CdpError. */
  constructor(message: string, options: CdpErrorOptions) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "CdpError";
    this.kind = options.kind;
    this.code = options.code;
    this.method = options.method;
    this.data = options.data;
    this.exceptionDetails = options.exceptionDetails;
  }
}

/** Whether `value` is a JSON object (not null, not an array). */
export function isObject(value: unknown): value is CdpParams {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
