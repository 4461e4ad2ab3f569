/**
 * Rollouts as training data: {@linkcode trainingRows} turns a job's
 * records into one {@linkcode TrainingRow} per rollout, with what the
 * model sampled in each turn (token ids and log-probabilities, kept by
 * `ChatAgent` with `tokens: true`), token sequences with a loss mask over
 * the model's own tokens, the reward, and the rewards of its group, so
 * that a trainer can compute group-relative advantages and skip a group
 * that is not whole.
 *
 * A rollout that was not graded (it errored: see `FAILURE_CLASSES`) is
 * never a reward of 0: its row has `reward: null`, its `error_class`, and
 * `masked: true`, with every loss mask 0, so that a trainer that sums its
 * loss over the mask learns nothing from it; in its siblings' rows its
 * place in `group_rewards` is `null` too.
 *
 * A sequence starts with a turn's prompt ids and goes on with its
 * completion; each next turn whose prompt extends the sequence appends
 * the new part of its prompt (tool results, the chat template's glue:
 * masked out) and then its completion (the model's tokens: in the loss).
 * This is the extension property that trainers check before merging the
 * turns of an episode into one sample (prime-rl's rule): where a prompt
 * does not extend the tokens before it (the harness re-rendered or
 * truncated its history, or the chat template re-tokenized a reply), a
 * new sequence starts there and says why ({@linkcode TrainingSplit}: the
 * turn, the first differing position), so that every sequence is exactly
 * what the model saw and sampled and no trainer learns from tokens the
 * model never produced.
 *
 * @example
 * ```ts
 * import { trainingRows } from "./training.ts";
 * import { encodeTurnTokens } from "./tokens.ts";
 * import assert from "node:assert/strict";
 *
 * const t1 = { promptIds: [1, 2], completionIds: [3, 4], logprobs: [-0.5, -0.25] };
 * const t2 = { promptIds: [1, 2, 3, 4, 5], completionIds: [6], logprobs: [-1] };
 * const step = (t: typeof t1, prev: typeof t1 | null) => ({
 *   type: "model", timestamp: "", content: { request: [], reply: { role: "assistant", content: "" } },
 *   info: { tokens: encodeTurnTokens(t, prev) },
 * });
 * const [row] = trainingRows([{
 *   job_id: "j", group_id: "j:t", task: { env: "e", id: "t", args: {}, slug: "t" }, repeat: 0,
 *   status: "completed", reward: 1, failed_phase: null,
 *   trace: { status: "completed", stop_reason: "graded", content: null, started_at: "",
 *     ended_at: "", errors: [], steps: [step(t1, null), step(t2, t1)] },
 * }]);
 * assert.deepEqual(row.sequences[0].tokens, [1, 2, 3, 4, 5, 6]);
 * assert.deepEqual(row.sequences[0].loss_mask, [0, 0, 1, 1, 0, 1]);
 * assert.equal(row.sequences[0].split, null);
 * assert.deepEqual(row.group_rewards, [1]);
 * ```
 *
 * @module
 */

import type { TaskRow } from "../env.ts";
import { isRecord } from "../_internal/util.ts";
import { redactDeep } from "../_internal/redact.ts";
import { MAX_JSON_DEPTH } from "../_internal/framing.ts";
import type { RunRecord } from "./results.ts";
import { traceTokens } from "./tokens.ts";
import { isGraded, recordClass, rolloutFinished } from "./failure.ts";

/** How deep a row is redacted: what the wire carries, and the levels above a message. */
const ROW_DEPTH = MAX_JSON_DEPTH + 8;

/** One model call of a {@linkcode TrainingRow}. */
export interface TrainingTurn {
  /** The prompt's token ids, or `null` when the server did not give them. */
  prompt_token_ids: number[] | null;
  /** The sampled completion's token ids, or `null` when not kept. */
  completion_token_ids: number[] | null;
  /** Their log-probabilities, or `null` when not kept. */
  logprobs: number[] | null;
  /** Why the model stopped. */
  finish_reason: string | null;
}

/** A token sequence of a {@linkcode TrainingRow}, ready for a trainer. */
export interface TrainingSequence {
  /** Token ids: a prompt, then completions and what came between them. */
  tokens: number[];
  /** 1 on the model's sampled tokens, 0 on the rest. */
  loss_mask: number[];
  /** The sampled tokens' log-probabilities where the mask is 1, 0 elsewhere; `null` when not kept. */
  logprobs: number[] | null;
  /** The turns (indices into `turns`) it holds. */
  turns: number[];
  /**
   * Why this sequence starts a new sample: `null` for the episode's first,
   * when no turn before it was left out.
   */
  split: TrainingSplit | null;
}

/**
 * Where, and why, a turn's prompt does not extend the tokens before it (the
 * previous turns' prompts and completions), so that it starts a new sequence.
 */
export interface TrainingSplit {
  /** The turn (an index into `turns`) that starts the new sequence. */
  turn: number;
  /**
   * `diverged`: the prompt differs from the tokens before at `position`
   * (the history was re-rendered or edited, or a reply re-tokenized);
   * `shortened`: the prompt is those tokens cut off at `position` (the
   * history was truncated); `unknown`: a turn in between lacks prompt or
   * completion ids, so the property cannot be checked.
   */
  reason: "diverged" | "shortened" | "unknown";
  /** The first position at which the prompt and the tokens before differ; `null` for `unknown`. */
  position: number | null;
  /** The token the sequence had there (`null` past its end or for `unknown`). */
  expected: number | null;
  /** The prompt's token there (`null` past its end or for `unknown`). */
  got: number | null;
}

/** One rollout as training data. */
export interface TrainingRow {
  /** The job. */
  job_id: string;
  /** The group (a task's repeats share it). */
  group_id: string;
  /** The task. */
  task: TaskRow;
  /** Which repeat of the task. */
  repeat: number;
  /** Which attempt the record was (retries make more). */
  attempt: number;
  /** `completed`, `error` or `cancelled`. */
  status: string;
  /** The reward, or `null` when the rollout was not graded (it errored). */
  reward: number | null;
  /** Why it failed (one of `FAILURE_CLASSES`), or `null` when it did not. */
  error_class: string | null;
  /**
   * Whether the row is out of the loss: the rollout was not graded, and
   * every loss mask of its sequences is 0.
   */
  masked: boolean;
  /** The rewards of the group's rollouts by repeat, `null` for one not graded. */
  group_rewards: (number | null)[];
  /**
   * Whether every rollout of the group finished: graded, and not failed
   * for an infrastructure reason (see {@linkcode rolloutFinished}).
   */
  group_complete: boolean;
  /** The model, when the trace names it. */
  model: string | null;
  /** The conversation as the model saw it (Chat Completions shape). */
  messages: Record<string, unknown>[];
  /** Each model call, in order. */
  turns: TrainingTurn[];
  /** The token sequences (see the module doc); empty when no turn has prompt and completion ids. */
  sequences: TrainingSequence[];
  /** Whether every turn has prompt and completion ids (and so is in a sequence). */
  tokens_complete: boolean;
}

/** Options for {@linkcode trainingRows}. */
export interface TrainingRowsOptions {
  /**
   * Leave out the rows of groups that are not whole.
   * @default false
   */
  completeGroupsOnly?: boolean;
}

/** Where `prompt` stops extending `before`, or `null` when it extends it. */
function firstDifference(
  before: readonly number[],
  prompt: readonly number[],
): Omit<TrainingSplit, "turn"> | null {
  const n = Math.min(before.length, prompt.length);
  for (let i = 0; i < n; i++) {
    if (before[i] !== prompt[i]) {
      return { reason: "diverged", position: i, expected: before[i], got: prompt[i] };
    }
  }
  if (prompt.length >= before.length) return null;
  return { reason: "shortened", position: n, expected: before[n], got: null };
}

const UNKNOWN: Omit<TrainingSplit, "turn"> = {
  reason: "unknown",
  position: null,
  expected: null,
  got: null,
};

function sequencesOf(turns: TrainingTurn[]): TrainingSequence[] {
  const out: TrainingSequence[] = [];
  let current: TrainingSequence | null = null;
  let gap = false; // a turn without ids since the current sequence's last
  turns.forEach((turn, index) => {
    const prompt = turn.prompt_token_ids;
    const completion = turn.completion_token_ids;
    if (prompt === null || completion === null) {
      gap = true; // What came between is unknown: the next turn starts afresh.
      return;
    }
    let seq: TrainingSequence | null = current;
    const split = gap ? UNKNOWN : seq === null ? null : firstDifference(seq.tokens, prompt);
    if (seq === null || split !== null) {
      seq = {
        tokens: [],
        loss_mask: [],
        logprobs: [],
        turns: [],
        split: split === null ? null : { turn: index, ...split },
      };
      out.push(seq);
    }
    gap = false;
    const added = prompt.slice(seq.tokens.length);
    seq.tokens.push(...added, ...completion);
    seq.loss_mask.push(...added.map(() => 0), ...completion.map(() => 1));
    if (seq.logprobs !== null && turn.logprobs !== null) {
      seq.logprobs.push(...added.map(() => 0), ...turn.logprobs);
    } else seq.logprobs = null;
    seq.turns.push(index);
    current = seq;
  });
  return out;
}

/**
 * The conversation of a trace's model steps. A step that a recording
 * proxy made holds the messages past the first `info.messages_shared` of
 * the call before it; the conversation is then the last call's messages
 * and its reply. A `ChatAgent` step holds the messages new since its call
 * before, whose reply it follows.
 */
function messagesOf(steps: Record<string, unknown>[]): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  let proxied: Record<string, unknown>[] | null = null;
  let lastReply: Record<string, unknown> | null = null;
  for (const s of steps) {
    if (s.type !== "model" || !isRecord(s.content)) continue;
    const request = Array.isArray(s.content.request) ? s.content.request.filter(isRecord) : [];
    const reply = isRecord(s.content.reply) ? s.content.reply : null;
    const shared = isRecord(s.info) ? s.info.messages_shared : undefined;
    if (typeof shared === "number") {
      proxied = [...(proxied ?? []).slice(0, shared), ...request];
      lastReply = reply;
      continue;
    }
    out.push(...request);
    if (reply !== null) out.push(reply);
  }
  if (proxied === null) return out;
  return lastReply === null ? proxied : [...proxied, lastReply];
}

/** A row with its text redacted; its token ids and numbers are left alone (no text in them). */
function redactRow(row: TrainingRow): TrainingRow {
  const { turns, sequences, ...text } = row;
  return { ...redactDeep(text, ROW_DEPTH) as typeof text, turns, sequences };
}

/** Each model step's turn: its tokens, as the trace kept them, and why the model stopped. */
function turnsOf(steps: Record<string, unknown>[]): TrainingTurn[] {
  const tokens = traceTokens(steps);
  return steps.filter((s) => s.type === "model").map((s, i) => {
    const info = isRecord(s.info) ? s.info : {};
    return {
      prompt_token_ids: tokens[i]?.promptIds ?? null,
      completion_token_ids: tokens[i]?.completionIds ?? null,
      logprobs: tokens[i]?.logprobs ?? null,
      finish_reason: typeof info.finish_reason === "string" ? info.finish_reason : null,
    };
  });
}

/** The row of `r`, one of `siblings` (its group, by repeat), `complete` when the group is whole. */
function trainingRow(r: RunRecord, siblings: readonly RunRecord[], complete: boolean): TrainingRow {
  const trace: Record<string, unknown> = isRecord(r.trace) ? r.trace : {};
  const steps = (Array.isArray(trace.steps) ? trace.steps as unknown[] : []).filter(isRecord);
  const turns = turnsOf(steps);
  const model = steps.filter((s) => s.type === "model")
    .map((s) => isRecord(s.info) ? s.info.model : undefined)
    .find((m) => typeof m === "string") as string | undefined;
  const graded = isGraded(r);
  const sequences = sequencesOf(turns);
  // An errored rollout teaches nothing: out of the loss, never a reward of 0.
  if (!graded) { for (const seq of sequences) seq.loss_mask.fill(0); }
  return {
    job_id: r.job_id,
    group_id: r.group_id,
    task: r.task,
    repeat: r.repeat,
    attempt: r.attempt ?? 1,
    status: r.status,
    reward: graded ? r.reward : null,
    error_class: recordClass(r),
    masked: !graded,
    group_rewards: siblings.map((x) => isGraded(x) ? x.reward : null),
    group_complete: complete,
    model: model ?? null,
    messages: messagesOf(steps),
    turns,
    sequences,
    tokens_complete: turns.length > 0 &&
      turns.every((t) => t.prompt_token_ids !== null && t.completion_token_ids !== null),
  };
}

/**
 * One row per record (the latest attempt of each task and repeat, as a
 * {@linkcode Job} holds them); see the module doc.
 */
export function trainingRows(
  records: readonly RunRecord[],
  options: TrainingRowsOptions = {},
): TrainingRow[] {
  const groups = new Map<string, RunRecord[]>();
  for (const r of records) {
    const list = groups.get(r.group_id) ?? [];
    list.push(r);
    groups.set(r.group_id, list);
  }
  const rows: TrainingRow[] = [];
  for (const r of records) {
    const siblings = [...groups.get(r.group_id)!].sort((a, b) => a.repeat - b.repeat);
    const complete = siblings.every(rolloutFinished);
    if (options.completeGroupsOnly && !complete) continue;
    // Redacted as a results file is, whatever file the records came from.
    rows.push(redactRow(trainingRow(r, siblings, complete)));
  }
  return rows;
}
