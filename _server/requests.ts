// From a frame to a request object, or to the error reply a bad frame gets.

import { ErrorCode } from "../errors.ts";
import { type LineResult, parseLine, peekId } from "../_internal/framing.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import { errorReply, type Reply } from "./dispatcher.ts";

/** Limits a frame is read under. */
export interface FrameLimits {
  /** The largest frame this connection may send now, in bytes. */
  maxFrameBytes: number;
  /** The shared budget of unfinished frames, in bytes (named in its refusal). */
  maxBufferedBytes: number;
  /** The deepest nesting of arrays and objects. */
  maxJsonDepth: number;
}

/**
 * A request, or the reply to a frame that is none; `fatal` when the stream
 * cannot go on (an oversized frame leaves it mid-line).
 */
export type ParsedFrame =
  | { request: Record<string, unknown> }
  | { error: Reply; fatal: boolean };

/** How the server reads a request: as HUD's server (Python's `json`) does. */
const PARSE = { exactIntegers: true, nonFinite: true } as const;

/**
 * Parses one frame from the line reader. Integers beyond ±(2^53−1) stay
 * exact (`bigint`), Python's `NaN`/`Infinity` tokens are read, and an
 * error reply carries the request's id whenever it can be read from the
 * frame (`null` otherwise).
 */
export function parseRequest(frame: LineResult, limits: FrameLimits): ParsedFrame {
  if (frame.kind === "oversized") {
    const id = peekId(frame.head) ?? null;
    const error = frame.overBudget
      ? errorReply(
        id,
        ErrorCode.LIMIT_EXCEEDED,
        `frame refused: unfinished frames across connections would exceed the server's limit of ${limits.maxBufferedBytes} bytes; send it again later`,
      )
      : errorReply(
        id,
        ErrorCode.INVALID_REQUEST,
        `frame exceeds the limit of ${limits.maxFrameBytes} bytes`,
      );
    return { error, fatal: true };
  }
  let value: unknown;
  try {
    value = parseLine(frame.line, limits.maxJsonDepth, PARSE);
  } catch (err) {
    const id = peekId(frame.line) ?? null;
    const error = err instanceof RangeError
      ? errorReply(id, ErrorCode.INVALID_REQUEST, err.message)
      : errorReply(id, ErrorCode.PARSE_ERROR, `parse error: ${errorMessage(err)}`);
    return { error, fatal: false };
  }
  if (!isRecord(value)) {
    return {
      error: errorReply(null, ErrorCode.INVALID_REQUEST, "invalid request: expected a JSON object"),
      fatal: false,
    };
  }
  return { request: value };
}
