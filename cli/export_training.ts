// `hud export-training FILE`: a results file as training data, one JSON
// line per counted rollout (eval/training.ts says what a row holds).

import { Job } from "../eval/job.ts";
import { writePrivateText } from "../_internal/private_file.ts";
import { EXIT_OK, type Io, parseCommand, PROGRAM, stringOption } from "./_common.ts";

/** The help of `hud export-training`. */
export const USAGE: string =
  `Usage: ${PROGRAM} export-training FILE [--out OUT.jsonl] [--complete-groups]

Writes the results FILE (the JSONL that "eval --out" writes) as training
data: one JSON line per counted rollout (the latest attempt of each task
and repeat) with its conversation, each model call's token ids and
log-probabilities (kept by "eval --model ... --tokens", or recorded by
"eval --agent ... --model-proxy"), token sequences with a loss mask that is
1 on the model's own tokens and 0 on the prompt, tool results and template
(a new sequence, with its "split" reason, where a prompt does not extend
the tokens before it), the reward, and the group's rewards
("group_complete" is false when a sibling could not finish; a rollout that
did not finish is "masked": reward null, there and in the group's
rewards, loss masks 0).

Options:
  --out OUT           write the rows to OUT (created 0600: rows hold what
                      the traces hold) instead of standard output
  --complete-groups   leave out the rows of groups that are not whole
  -h, --help          show this help
`;

/** Runs `hud export-training` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "export-training",
    usage: USAGE,
    options: { out: { type: "string" }, "complete-groups": { type: "boolean" } },
    positionals: { names: ["FILE"], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const [file] = parsed.positionals;
  let job: Job;
  try {
    job = await Job.load(file);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) {
      throw new Error(`Cannot export training rows: no results file "${file}"`, { cause: err });
    }
    throw err;
  }
  const rows = job.exportTraining({
    completeGroupsOnly: parsed.values["complete-groups"] === true,
  });
  const text = rows.map((r) => JSON.stringify(r) + "\n").join("");
  const out = stringOption(parsed.values, "out");
  if (out === undefined) io.out(text);
  else {
    await writePrivateText(out, text);
    const withTokens = rows.filter((r) => r.sequences.length > 0).length;
    io.err(`Wrote ${rows.length} rows (${withTokens} with token sequences) to ${out}\n`);
  }
  return EXIT_OK;
}
