// The task rows a module exports as `tasks` (an array of rows or a Taskset),
// which `eval` runs, `tasks FILE` lists and `export-harbor` exports

import { type Environment, environmentOf, type TaskRow } from "../env.ts";
import { moduleUrl } from "../loader.ts";
import { Taskset } from "./taskset.ts";

/** The module's exported `tasks` rows for `env`, or null when it exports none. */
export async function exportedRows(file: string, env: Environment): Promise<TaskRow[] | null> {
  // The module is in the cache already: loadEnvironment imported it.
  const mod = await import(moduleUrl(file).href) as Record<string, unknown>;
  const exported = mod.tasks instanceof Taskset ? [...mod.tasks.rows] : mod.tasks;
  if (!Array.isArray(exported)) return null;
  return (exported as TaskRow[]).filter((r) => environmentOf(r) === env || r.env === env.name);
}
