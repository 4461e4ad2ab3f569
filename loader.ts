/**
 * Loading an {@linkcode Environment} from a TypeScript module, as the
 * command line and `SubprocessRuntime` do.
 *
 * @module
 */

import { Environment } from "./env.ts";
import { errorMessage } from "./_internal/util.ts";
import { importEnvironmentModule } from "./_internal/serving.ts";
import { loadLocation } from "./_internal/stack.ts";

/** Options for {@linkcode loadEnvironment}. */
export interface LoadEnvironmentOptions {
  /**
   * Which environment to pick: an export name, or an environment's name.
   * @default the module's only environment
   */
  name?: string;
}

// A Windows drive ("C:\") is a path, not a URL scheme.
const URL_SCHEME = /^[a-zA-Z][a-zA-Z0-9+.-]+:/;

/**
 * The module URL for `path`: a URL as is, a file path relative to the cwd,
 * each segment encoded so that `#`, `?` and `%` in names survive.
 */
export function moduleUrl(path: string | URL): URL {
  if (path instanceof URL) return path;
  if (URL_SCHEME.test(path)) return new URL(path);
  const windows = Deno.build.os === "windows";
  let abs = windows ? path.replaceAll("\\", "/") : path;
  const isAbsolute = windows ? /^([a-zA-Z]:)?\//.test(abs) : abs.startsWith("/");
  if (!isAbsolute) {
    const cwd = windows ? Deno.cwd().replaceAll("\\", "/") : Deno.cwd();
    abs = `${cwd.replace(/\/$/, "")}/${abs}`;
  }
  // Encode each segment so that "#", "?" and "%" in names survive.
  const encoded = abs.split("/").map((seg, i) =>
    windows && i === 0 && /^[a-zA-Z]:$/.test(seg) ? seg : encodeURIComponent(seg)
  ).join("/");
  return new URL(`file://${encoded.startsWith("/") ? "" : "/"}${encoded}`);
}

/**
 * Whether `value` is an environment. A module that imports the SDK from
 * another copy (another version, or jsr beside a local checkout) has its own
 * `Environment` class, so a structural check backs up `instanceof`.
 */
function isEnvironment(value: unknown): value is Environment {
  if (value instanceof Environment) return true;
  if (typeof value !== "object" || value === null) return false;
  const v = value as Record<string, unknown>;
  return typeof v.name === "string" && typeof v.listTasks === "function" &&
    typeof v.startTask === "function" && typeof v.hasTemplate === "function" &&
    typeof v.start === "function" && typeof v.stop === "function" &&
    typeof v.capability === "function";
}

/**
 * The way out when the SDK's own specifiers did not resolve: the config in
 * use maps no "@hud/sdk..." (an installed CLI has its own config).
 */
function importHint(first: string): string {
  if (/"@hud\/sdk[^"]*" not a dependency/.test(first)) {
    return " (map it in your deno.json, and install hud with --config deno.json: see the README)";
  }
  return "";
}

function describe(found: Found[]): string {
  return found.map(({ exportName, env }) => `"${exportName}" (environment "${env.name}")`)
    .join(", ");
}

/**
 * Imports a TypeScript (or JavaScript) module and returns the
 * {@linkcode Environment} it exports. With `name`, the environment exported
 * under that name, or else the one whose own name it is; without, the
 * module's only environment. An environment exported under several names
 * counts once.
 *
 * @example
 * ```ts ignore
 * import { loadEnvironment } from "./loader.ts";
 *
 * const env = await loadEnvironment("./my_env.ts", { name: "robolab" });
 * console.log(env.listTasks().map((t) => t.id));
 * ```
 *
 * @param path a file path (relative to the current directory) or a URL
 * @returns the environment
 * @throws {Deno.errors.NotFound} when the file does not exist
 * @throws {TypeError} when `path` is not a string or URL, or the module
 *   exports no environment
 * @throws {RangeError} when `name` matches nothing, or no `name` is given and
 *   the module exports several environments (the message lists them)
 * @throws {Error} when importing the module fails (the cause is the import error)
 */
export async function loadEnvironment(
  path: string | URL,
  options: LoadEnvironmentOptions = {},
): Promise<Environment> {
  if (typeof path !== "string" && !(path instanceof URL)) {
    throw new TypeError("Cannot load environment: path must be a string or URL");
  }
  if (path === "") throw new TypeError("Cannot load environment: path must not be empty");
  const name = options.name;
  if (name !== undefined && (typeof name !== "string" || name === "")) {
    throw new TypeError("Cannot load environment: name must be a non-empty string");
  }
  const shown = String(path);
  const mod = await importModule(moduleUrl(path), shown);
  const found: Found[] = [];
  for (const [exportName, value] of Object.entries(mod)) {
    if (!isEnvironment(value)) continue;
    if (found.some((f) => f.env === value)) continue;
    found.push({ exportName, env: value });
  }
  if (found.length === 0) {
    throw new TypeError(`Cannot load environment: "${shown}" exports no Environment`);
  }
  return name === undefined
    ? onlyEnvironment(found, shown)
    : pickEnvironment(mod, found, name, shown);
}

/** An environment a module exports, and one name it is exported under. */
type Found = { exportName: string; env: Environment };

/**
 * Imports the module at `url` (`shown` as the caller gave it).
 * @throws {Deno.errors.NotFound} for a file that does not exist
 * @throws {Error} when the import fails, its first line with a hint
 */
async function importModule(url: URL, shown: string): Promise<Record<string, unknown>> {
  if (url.protocol === "file:") {
    try {
      await Deno.stat(url);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) {
        throw new Deno.errors.NotFound(`Cannot load environment: file "${shown}" not found`, {
          cause: err,
        });
      }
      throw err;
    }
  }
  try {
    // A user's module, by absolute URL: `deno publish` warns that it cannot
    // analyze this import, which is expected (and cannot be silenced).
    return await importEnvironmentModule(url.href);
  } catch (err) {
    // The hint and the place go on the first line, which is what the
    // command line prints: the file and line of a syntax error, or of code
    // that threw as the module ran, in the module or a file it imports.
    const [first, ...rest] = errorMessage(err).split("\n");
    const at = loadLocation(err);
    const where = at === null || first.includes(at) ? "" : ` (at ${at})`;
    const message = [first + where + importHint(first), ...rest].join("\n");
    throw new Error(`Cannot load environment from "${shown}": ${message}`, { cause: err });
  }
}

/**
 * The module's only environment.
 * @throws {RangeError} when it exports several, listing them
 */
function onlyEnvironment(found: Found[], shown: string): Environment {
  if (found.length === 1) return found[0].env;
  throw new RangeError(
    `Cannot load environment: "${shown}" exports several environments: ${
      describe(found)
    }; pick one by export or environment name`,
  );
}

/**
 * The environment exported as `name`, or else the one named `name`.
 * @throws {RangeError} when none is, or several are named so
 */
function pickEnvironment(
  mod: Record<string, unknown>,
  found: Found[],
  name: string,
  shown: string,
): Environment {
  const byExport = mod[name];
  if (isEnvironment(byExport)) return byExport;
  const byName = found.filter((f) => f.env.name === name);
  if (byName.length === 1) return byName[0].env;
  if (byName.length > 1) {
    throw new RangeError(
      `Cannot load environment: "${shown}" has several environments named "${name}": ${
        describe(byName)
      }; pick one by export name`,
    );
  }
  throw new RangeError(
    `Cannot load environment: "${shown}" has no environment "${name}"; available: ${
      describe(found)
    }`,
  );
}
