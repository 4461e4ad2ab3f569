/**
 * Harbor task directories (the format of Terminal-Bench 2.x). For now the
 * TOML reader that their `task.toml` needs: {@linkcode parseToml}.
 *
 * @example
 * ```ts
 * import { parseToml } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const config = parseToml('[verifier]\ntimeout_sec = 120.0\nenv = { MODE = "ci" }\n');
 * assert.deepEqual(config.verifier, { timeout_sec: 120, env: { MODE: "ci" } });
 * ```
 *
 * @module
 */

export { parseToml, TomlSyntaxError, type TomlTable, type TomlValue } from "./toml.ts";
export { TomlDateTime, type TomlDateTimeKind } from "./toml_datetime.ts";
