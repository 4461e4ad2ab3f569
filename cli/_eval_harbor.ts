// `hud eval harbor:PATH`: Harbor tasks (one task directory or a dataset)
// run in containers built from their own Dockerfiles, graded by their own
// verifiers. `--agent oracle` runs each task's solution/solve.sh, so a
// dataset validates: every task that can be adapted should score 1.0.
// Loaded only when the FILE argument starts with `harbor:`.

import { CommandAgent } from "../agents/command.ts";
import { MODEL_FLAGS, modelAgentFromFlags } from "../agents/_cli.ts";
import { type HarborSkipped, loadHarborTasks } from "../harbor/loader.ts";
import { type HarborResult, runHarborTasks } from "../harbor/run.ts";
import type { Agent } from "../eval/agent.ts";
import {
  EXIT_FAILURE,
  EXIT_INTERRUPTED,
  EXIT_OK,
  type Io,
  positiveIntOption,
  stringOption,
  UsageError,
  type Values,
} from "./_common.ts";
import { runOptions } from "./_eval_options.ts";
import { selectRows } from "./_eval_rows.ts";
import type { HarborTask } from "../harbor/loader.ts";

/** The options of `hud eval` that mean something for harbor:PATH. */
const HARBOR_OPTIONS = new Set([
  "agent",
  "group",
  "json",
  "filter",
  "limit",
  "max-concurrent",
  ...Object.keys(MODEL_FLAGS),
]);

function line(r: HarborResult): string {
  const what = r.error !== null
    ? `error (${r.error.split("\n")[0]})`
    : `${r.reward}${
      Object.keys(r.subscores).length > 0
        ? ` (${Object.entries(r.subscores).map(([k, v]) => `${k} ${v}`).join(", ")})`
        : ""
    }`;
  return `${r.task}: ${what}${r.built ? "" : " [image cached]"}`;
}

/**
 * Checks the flags harbor:PATH takes (and that no other is given); returns
 * the agent (`"oracle"`, a model, or a command) and the group size.
 * @throws {UsageError} for a flag that does not apply, or a bad one
 */
async function harborFlags(path: string, values: Values) {
  for (const [name, value] of Object.entries(values)) {
    if (value !== undefined && !HARBOR_OPTIONS.has(name) && name !== "help") {
      throw new UsageError(`--${name} does not apply to harbor:PATH; leave it out`);
    }
  }
  if (path === "") throw new UsageError('harbor: needs a path: "harbor:DIR"');
  const command = stringOption(values, "agent");
  const model = await modelAgentFromFlags(values, (m) => new UsageError(m));
  if (model && command !== undefined) throw new UsageError("pass --agent or --model, not both");
  if (!model && (command === undefined || command.trim() === "")) {
    throw new UsageError('missing --agent (a command, or "oracle") or --model');
  }
  // --group is checked as Taskset.run() checks it (harbor/run.ts runs one).
  const { group } = runOptions(values).config;
  const oracle = command === "oracle";
  const commandAgent = model || oracle ? null : new CommandAgent(command!);
  const agent: Agent | "oracle" = oracle ? "oracle" : model?.agent ?? commandAgent!;
  const label = oracle ? "oracle" : model?.label ?? "command";
  return { agent, commandAgent, oracle, label, group };
}

/** Prints the results: with `json` as one JSON line, else a summary line. */
function printResults(
  io: Io,
  results: HarborResult[],
  skipped: HarborSkipped[],
  how: { json: boolean; oracle: boolean; failed: number },
): void {
  if (how.json) {
    io.out(
      JSON.stringify({
        tasks: results.map(({ runs: _runs, ...r }) => r),
        skipped: skipped.map(({ name, code, reason }) => ({ name, code, reason })),
      }) + "\n",
    );
    return;
  }
  const scored = results.filter((r) => r.reward !== null);
  const mean = scored.length === 0
    ? "-"
    : (scored.reduce((a, r) => a + r.reward!, 0) / scored.length).toFixed(3);
  io.out(
    `harbor: ${results.length} tasks, mean reward ${mean}, ${how.failed} ${
      how.oracle ? "not 1.0" : "failed"
    }, ${skipped.length} skipped\n`,
  );
}

/**
 * The tasks `--filter` (globs over the task's name) and `--limit` (the
 * first N of those) keep, as `hud eval FILE` selects rows.
 * @throws {UsageError} when the filters match no task
 */
function selectTasks(tasks: HarborTask[], values: Values): HarborTask[] {
  const rows = tasks.map((t) => ({ env: "harbor", id: t.name, args: {}, slug: t.name }));
  const limit = positiveIntOption("--limit", stringOption(values, "limit"));
  const kept = new Set(
    selectRows(rows, (values.filter ?? []) as string[], limit).map((r) => r.slug),
  );
  return tasks.filter((t) => kept.has(t.name));
}

/** Runs `hud eval harbor:PATH` with the parsed `values`; returns the exit code. */
export async function runHarborEval(path: string, values: Values, io: Io): Promise<number> {
  const { agent, commandAgent, oracle, label, group } = await harborFlags(path, values);
  const loaded = await loadHarborTasks(path);
  const { skipped } = loaded;
  const tasks = selectTasks(loaded.tasks, values);
  io.onHurry = () => commandAgent?.kill();
  const cannot = skipped.length > 0 ? ` (${skipped.length} cannot be adapted)` : "";
  io.err(`eval: ${tasks.length} Harbor tasks from ${path}${cannot}, agent: ${label}\n`);
  for (const s of skipped) io.err(`${s.name}: skipped: ${s.code}: ${s.reason}\n`);
  let results: HarborResult[];
  try {
    results = await runHarborTasks(tasks, agent, {
      group,
      maxConcurrent: positiveIntOption(
        "--max-concurrent",
        stringOption(values, "max-concurrent"),
        1,
      ),
      signal: io.signal,
      onResult: (r) => {
        if (!values.json) io.err(`${line(r)}\n`);
      },
    });
  } catch (err) {
    if (io.signal?.aborted) {
      io.err("interrupted\n");
      return EXIT_INTERRUPTED;
    }
    throw err;
  } finally {
    await commandAgent?.whenIdle();
  }
  const failed = results.filter((r) => r.error !== null || (oracle && r.reward !== 1));
  printResults(io, results, skipped, { json: values.json === true, oracle, failed: failed.length });
  return failed.length === 0 ? EXIT_OK : EXIT_FAILURE;
}
