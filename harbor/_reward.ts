// Harbor's reward files, read as its verifier reads them
// (`verifier/verifier.py`): reward.json (an object of numbers, each a
// subscore; the score is `reward` when given, else their mean) before
// reward.txt (one number).

import { reachableSync } from "../_internal/fs.ts";

/** Where the verifier writes its output and its reward. */
export const VERIFIER_LOGS = "/logs/verifier";

/** A reward read: the score and the subscores (empty for reward.txt). */
export interface Reward {
  score: number;
  subscores: Record<string, number>;
}

function fromJson(path: string, text: string): Reward {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new Error(`Cannot grade Harbor task: ${path} is not JSON: ${text.slice(0, 80)}`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new Error(`Cannot grade Harbor task: ${path} must be an object of numbers`);
  }
  const subscores: Record<string, number> = {};
  for (const [k, v] of Object.entries(parsed)) {
    const n = typeof v === "boolean" ? Number(v) : v;
    if (typeof n !== "number" || !Number.isFinite(n)) {
      throw new Error(`Cannot grade Harbor task: ${path}: "${k}" is not a number`);
    }
    subscores[k] = n;
  }
  const values = Object.values(subscores);
  if (values.length === 0) throw new Error(`Cannot grade Harbor task: ${path} has no rewards`);
  // "reward" is the score when given; else the mean of the keys.
  const score = subscores.reward ?? values.reduce((a, b) => a + b, 0) / values.length;
  return { score, subscores };
}

/**
 * Reads the reward in `dir` Harbor's way.
 * @throws {Error} when neither file is there, or one is empty or not of its shape
 */
export async function readReward(dir: string = VERIFIER_LOGS): Promise<Reward> {
  const read = async (path: string) => reachableSync(path) ? await Deno.readTextFile(path) : null;
  return await rewardOf(dir, read);
}

/**
 * The reward in `dir` Harbor's way, its files read by `read` (null: not
 * there): reward.json when there, else reward.txt. For a directory of
 * another container, read through the engine.
 * @throws {Error} when neither file is there, or one is empty or not of its shape
 */
export async function rewardOf(
  dir: string,
  read: (path: string) => Promise<string | null>,
): Promise<Reward> {
  const json = `${dir}/reward.json`;
  const jsonText = await read(json);
  if (jsonText !== null) {
    const text = jsonText.trim();
    if (text === "") throw new Error(`Cannot grade Harbor task: ${json} is empty`);
    return fromJson(json, text);
  }
  const txt = `${dir}/reward.txt`;
  const txtText = await read(txt);
  if (txtText !== null) {
    const text = txtText.trim();
    if (text === "") throw new Error(`Cannot grade Harbor task: ${txt} is empty`);
    const score = Number(text);
    if (!Number.isFinite(score)) {
      throw new Error(`Cannot grade Harbor task: ${txt} is not a number: "${text.slice(0, 80)}"`);
    }
    return { score, subscores: {} };
  }
  throw new Error(
    `Cannot grade Harbor task: no reward written: tests/test.sh wrote neither ${json} nor ${txt}`,
  );
}
