// `hud tasks`: list the task templates of an environment module or of a
// served environment, with their arguments.

import type { TaskEntry, TaskRow } from "../env.ts";
import type { JsonSchema } from "../schema.ts";
import { loadEnvironment } from "../loader.ts";
import { EXIT_OK, type Io, parseCommand, PROGRAM, stringOption, UsageError } from "./_common.ts";
import {
  connectTo,
  DEFAULT_URL,
  readyTimeoutHelp,
  resolveTarget,
  tokenFileHelp,
} from "./_connect.ts";

/** A JSON Schema type, briefly: `integer`, `"a"|"b"`, `string[]`... */
function typeName(schema: JsonSchema): string {
  if (Array.isArray(schema.enum)) return schema.enum.map((v) => JSON.stringify(v)).join("|");
  if ("const" in schema) return JSON.stringify(schema.const);
  if (Array.isArray(schema.anyOf)) return (schema.anyOf as JsonSchema[]).map(typeName).join("|");
  if (schema.type === "array") {
    const item = typeName((schema.items ?? {}) as JsonSchema);
    return item.includes("|") ? `(${item})[]` : `${item}[]`;
  }
  if (Array.isArray(schema.type)) return schema.type.join("|");
  return typeof schema.type === "string" ? schema.type : "any";
}

/** A template's arguments on one line: `a: integer, b?: string, c: integer = 2`. */
function argsSummary(schema: JsonSchema): string {
  const properties = (schema.properties ?? {}) as Record<string, JsonSchema>;
  const required = new Set(Array.isArray(schema.required) ? schema.required as string[] : []);
  const parts = Object.entries(properties).map(([name, p]) => {
    const hasDefault = "default" in p;
    const optional = !required.has(name) && !hasDefault ? "?" : "";
    const def = hasDefault ? ` = ${JSON.stringify(p.default)}` : "";
    return `${name}${optional}: ${typeName(p)}${def}`;
  });
  if (schema.additionalProperties === true) parts.push("...");
  return parts.length === 0 ? "-" : parts.join(", ");
}

function taskTable(tasks: TaskEntry[]): string {
  if (tasks.length === 0) return "No task templates.\n";
  const rows = [
    ["ID", "ARGS", "DESCRIPTION"],
    ...tasks.map((t) => [t.id, argsSummary(t.args), t.description.replace(/\s+/g, " ").trim()]),
  ];
  const widths = [0, 1].map((i) => Math.max(...rows.map((r) => r[i].length)));
  return rows.map((r) =>
    `${r[0].padEnd(widths[0])}  ${r[1].padEnd(widths[1])}  ${r[2]}`.trimEnd() + "\n"
  ).join("");
}

/** The module's `tasks` rows, after the templates: what `eval FILE` runs. */
function rowTable(rows: TaskRow[]): string {
  const head = `\n${rows.length} rows in the module's "tasks" export (what eval runs):\n`;
  if (rows.length === 0) return head;
  const lines = [
    ["SLUG", "TEMPLATE", "ARGS"],
    ...rows.map((r) => [r.slug, r.id, JSON.stringify(r.args)]),
  ];
  const widths = [0, 1].map((i) => Math.max(...lines.map((l) => l[i].length)));
  return head +
    lines.map((l) =>
      `${l[0].padEnd(widths[0])}  ${l[1].padEnd(widths[1])}  ${l[2]}`.trimEnd() + "\n"
    ).join("");
}

/** The help of `hud tasks`. */
export const USAGE: string = `Usage: ${PROGRAM} tasks FILE [--env NAME] [--json]
       ${PROGRAM} tasks [--url URL] [--token-file PATH] [--json]

Lists the task templates of an environment module (its hooks are not run)
or of a served environment, with their arguments: "name?" is optional,
"= value" is the default, "..." means any further arguments are accepted.
With FILE, the rows of the module's "tasks" export follow (what "eval FILE"
runs without --tasks).

Options:
  --url URL      a served environment (default: ${DEFAULT_URL})
${tokenFileHelp(21)}
  --env NAME     with FILE: the environment, by export or environment name
  --json         print the tasks.list entries as JSON
${readyTimeoutHelp(21)}
  -h, --help     show this help
`;

/** Runs `hud tasks` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "tasks",
    usage: USAGE,
    options: {
      url: { type: "string" },
      "token-file": { type: "string" },
      env: { type: "string" },
      json: { type: "boolean" },
      "ready-timeout": { type: "string" },
    },
    positionals: { names: ["FILE"], min: 0 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [file] } = parsed;
  const url = stringOption(values, "url");
  if (file !== undefined && url !== undefined) {
    throw new UsageError("give FILE or --url, not both");
  }
  if (file !== undefined && values["token-file"] !== undefined) {
    throw new UsageError("--token-file needs --url, not FILE");
  }
  if (file === undefined && values.env !== undefined) {
    throw new UsageError("--env needs FILE");
  }
  let tasks: TaskEntry[];
  let rows: TaskRow[] | null = null;
  if (file !== undefined) {
    const env = await loadEnvironment(file, { name: stringOption(values, "env") });
    tasks = env.listTasks();
    // Loaded only with FILE: the eval layer is not needed for --url.
    const { exportedRows } = await import("../eval/_rows.ts");
    rows = await exportedRows(file, env);
  } else {
    await using client = await connectTo(await resolveTarget(values, io), io, values);
    tasks = await client.listTasks();
  }
  if (values.json) {
    io.out(JSON.stringify(tasks) + "\n");
  } else {
    io.out(taskTable(tasks));
    if (rows !== null) io.out(rowTable(rows));
  }
  return EXIT_OK;
}
