/**
 * Token data of model calls, kept compactly in traces: what the policy
 * sampled (completion token ids and their log-probabilities) and, where
 * the server gave them, the prompt's token ids. A model step of a trace
 * holds them in `info.tokens` as base64 of little-endian arrays, the
 * prompt only past what it shares with the previous call's prompt and
 * completion, so that a long rollout does not store its history once per
 * turn. {@linkcode traceTokens} reads them back as plain arrays.
 *
 * @example
 * ```ts
 * import { decodeTurnTokens, encodeTurnTokens } from "./tokens.ts";
 * import assert from "node:assert/strict";
 *
 * const first = { promptIds: [1, 2, 3], completionIds: [7, 8], logprobs: [-0.5, -0.25] };
 * const stored = encodeTurnTokens(first, null);
 * assert.deepEqual(decodeTurnTokens(stored, null), first);
 * const second = { promptIds: [1, 2, 3, 7, 8, 9], completionIds: [4], logprobs: [-1] };
 * const next = encodeTurnTokens(second, first);
 * assert.equal(next.prompt_shared, 5); // only [9] is stored
 * assert.deepEqual(decodeTurnTokens(next, first), second);
 * ```
 *
 * @module
 */

import { isRecord } from "../_internal/util.ts";

/** The tokens of one model call, as plain arrays. */
export interface TurnTokens {
  /** The prompt's token ids as the server tokenized it, or `null` when it did not say. */
  promptIds: number[] | null;
  /** The completion's token ids, or `null` when the server gave log-probabilities only. */
  completionIds: number[] | null;
  /** The log-probability of each completion token, aligned with `completionIds`; `null` when not given. */
  logprobs: number[] | null;
}

/** {@linkcode TurnTokens} as a model step's `info.tokens` holds them. */
export interface StoredTokens {
  /** Completion token ids: base64 of little-endian int32. */
  completion_ids?: string;
  /** Their log-probabilities: base64 of little-endian float32. */
  logprobs?: string;
  /** The prompt's ids past the first `prompt_shared`: base64 of little-endian int32. */
  prompt_ids?: string;
  /** How many leading prompt ids equal the previous call's prompt then completion. */
  prompt_shared?: number;
  /** The number of completion tokens (so that a reader needs no decoding to count). */
  n: number;
}

function encodeInts(values: readonly number[]): string {
  const view = new DataView(new ArrayBuffer(values.length * 4));
  values.forEach((v, i) => view.setInt32(i * 4, v, true));
  return new Uint8Array(view.buffer).toBase64();
}

function encodeFloats(values: readonly number[]): string {
  const view = new DataView(new ArrayBuffer(values.length * 4));
  values.forEach((v, i) => view.setFloat32(i * 4, v, true));
  return new Uint8Array(view.buffer).toBase64();
}

function decode(text: unknown, float: boolean): number[] | null {
  if (typeof text !== "string") return null;
  let bytes: Uint8Array;
  try {
    bytes = Uint8Array.fromBase64(text);
  } catch {
    return null;
  }
  if (bytes.length % 4 !== 0) return null;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out: number[] = [];
  for (let i = 0; i < bytes.length; i += 4) {
    // float32 to the nearest double that prints short: 7 significant digits.
    out.push(float ? Number(view.getFloat32(i, true).toPrecision(7)) : view.getInt32(i, true));
  }
  return out;
}

/** The previous call's prompt then completion: what the next prompt is stored against. */
function history(previous: TurnTokens | null): number[] {
  if (previous === null || previous.promptIds === null) return [];
  return [...previous.promptIds, ...(previous.completionIds ?? [])];
}

/**
 * `tokens` as a trace stores them; `previous` is the call before (decoded),
 * whose prompt and completion the prompt's shared prefix is measured against.
 */
export function encodeTurnTokens(tokens: TurnTokens, previous: TurnTokens | null): StoredTokens {
  const out: StoredTokens = {
    n: tokens.completionIds?.length ?? tokens.logprobs?.length ?? 0,
  };
  if (tokens.completionIds !== null) out.completion_ids = encodeInts(tokens.completionIds);
  if (tokens.logprobs !== null) out.logprobs = encodeFloats(tokens.logprobs);
  if (tokens.promptIds !== null) {
    const before = history(previous);
    let shared = 0;
    const max = Math.min(before.length, tokens.promptIds.length);
    while (shared < max && before[shared] === tokens.promptIds[shared]) shared++;
    out.prompt_ids = encodeInts(tokens.promptIds.slice(shared));
    if (shared > 0) out.prompt_shared = shared;
  }
  return out;
}

/**
 * A model step's `info.tokens` back as arrays, or `null` when it holds none;
 * `previous` is the call before, decoded.
 */
export function decodeTurnTokens(stored: unknown, previous: TurnTokens | null): TurnTokens | null {
  if (!isRecord(stored)) return null;
  const completionIds = decode(stored.completion_ids, false);
  const logprobs = decode(stored.logprobs, true);
  let promptIds: number[] | null = null;
  const rest = decode(stored.prompt_ids, false);
  if (rest !== null) {
    const shared = typeof stored.prompt_shared === "number" ? stored.prompt_shared : 0;
    const before = history(previous);
    // A prefix that the previous call cannot supply: the prompt is unknown.
    promptIds = shared <= before.length ? [...before.slice(0, shared), ...rest] : null;
  }
  if (completionIds === null && logprobs === null && promptIds === null) return null;
  return { promptIds, completionIds, logprobs };
}

/**
 * The tokens of each `model` step of a trace's steps, in order: one entry
 * per model step, `null` for a step that holds none.
 */
export function traceTokens(steps: readonly unknown[]): (TurnTokens | null)[] {
  const out: (TurnTokens | null)[] = [];
  let previous: TurnTokens | null = null;
  for (const step of steps) {
    if (!isRecord(step) || step.type !== "model") continue;
    const info = isRecord(step.info) ? step.info : {};
    const tokens = decodeTurnTokens(info.tokens, previous);
    out.push(tokens);
    previous = tokens;
  }
  return out;
}
