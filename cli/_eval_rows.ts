// The task rows `hud eval` runs: `--tasks FILE`, else the module's `tasks`
// export, else its templates that need no arguments; then `--filter` and
// `--limit`.

import type { Environment, TaskRow } from "../env.ts";
import { exportedRows } from "../eval/_rows.ts";
import { Taskset } from "../eval/taskset.ts";
import { errorMessage } from "../_internal/util.ts";
import { unknownTemplate, UsageError } from "./_common.ts";

/**
 * The rows to run: `--tasks FILE` (`tasksFile`), else the module's `tasks`
 * export, else argument-free templates.
 * @throws {UsageError} when that source holds no rows
 * @throws {RangeError} for rows of another environment
 */
export async function evalRows(
  file: string,
  env: Environment,
  tasksFile: string | undefined,
): Promise<TaskRow[]> {
  if (tasksFile !== undefined) {
    const set = await Taskset.load(tasksFile);
    const foreign = set.rows.filter((r) => r.env !== env.name).map((r) => r.slug);
    if (foreign.length > 0) {
      throw new RangeError(
        `Cannot evaluate: rows ${
          foreign.map((s) => `"${s}"`).join(", ")
        } are not for environment "${env.name}"`,
      );
    }
    if (set.rows.length === 0) {
      throw new UsageError(`${tasksFile} holds no rows: add tasks to it, or leave out --tasks`);
    }
    checkRows(set.rows, env, tasksFile);
    return [...set.rows];
  }
  const rows = await exportedRows(file, env);
  if (rows !== null) {
    if (rows.length === 0) {
      throw new UsageError(
        `${file} exports "tasks" with no rows for environment "${env.name}"; ` +
          `add some, or pass --tasks`,
      );
    }
    return rows;
  }
  const free = env.listTasks().filter((t) => !Array.isArray(t.args.required));
  if (free.length === 0) {
    throw new UsageError(
      `${file} exports no "tasks" and every template needs arguments; export tasks or pass --tasks`,
    );
  }
  return free.map((t) => ({ env: env.name, id: t.id, args: {}, slug: t.id }));
}

/**
 * Refuses, before anything starts, a row whose template the environment
 * does not have (listing those it has) or whose arguments it would refuse:
 * else each rollout would fail on its own, with "unknown task".
 * @throws {RangeError} for an unknown template
 * @throws {TypeError} for refused arguments
 */
export function checkRows(rows: readonly TaskRow[], env: Environment, file: string): void {
  for (const [i, row] of rows.entries()) {
    const where = `evaluate row ${i + 1} of ${file} ("${row.slug}")`;
    if (!env.hasTemplate(row.id)) throw unknownTemplate(where, row.id, env.listTasks());
    // An environment of another copy of the SDK (an older one) may not check.
    if (typeof env.checkTask !== "function") continue;
    try {
      env.checkTask(row.id, row.args);
    } catch (err) {
      const why = errorMessage(err).replace(/^Cannot start task "[^"]*": /, "");
      throw new TypeError(`Cannot ${where}: ${why}`, { cause: err });
    }
  }
}

/** `*` as any run of characters, the rest literal. */
function globMatcher(pattern: string): RegExp {
  return new RegExp(
    `^${pattern.split("*").map((p) => p.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`,
  );
}

/**
 * The rows `--filter` (globs over slug or id, any of them) and `--limit`
 * (the first N of those) keep.
 * @throws {UsageError} when the filters match no row
 */
export function selectRows(
  rows: TaskRow[],
  filters: readonly string[],
  limit: number | undefined,
): TaskRow[] {
  let kept = rows;
  if (filters.length > 0) {
    const patterns = filters.map(globMatcher);
    kept = rows.filter((r) => patterns.some((p) => p.test(r.slug) || p.test(r.id)));
    if (kept.length === 0) {
      throw new UsageError(
        `--filter ${
          filters.map((f) => `"${f}"`).join(", ")
        } matches none of the ${rows.length} tasks (slugs such as "${rows[0]?.slug}")`,
      );
    }
  }
  return limit === undefined ? kept : kept.slice(0, limit);
}
