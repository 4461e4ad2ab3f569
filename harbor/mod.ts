/**
 * Harbor task directories (the format of Terminal-Bench 2.x) in: read a
 * task or a dataset with {@linkcode loadHarborTasks}, build its image with
 * {@linkcode buildHarborImage}, run it with {@linkcode runHarborTasks}
 * (`"oracle"` for {@linkcode oracleAgent}, each task's own solution); and
 * the TOML reader their `task.toml` needs, {@linkcode parseToml}. Tasks
 * out: {@linkcode exportHarborTasks} writes an environment's tasks as Harbor
 * task folders, with images that start the task and a `tests/test.sh` that
 * grades it through the environment.
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
export {
  type HarborArtifact,
  type HarborEnvironmentConfig,
  type HarborHealthcheckConfig,
  type HarborNetworkMode,
  type HarborNetworkPhases,
  type HarborNetworkPolicy,
  type HarborStepConfig,
  type HarborTaskConfig,
  parseHarborConfig,
} from "./config.ts";
export {
  type HarborDataset,
  type HarborSkipCode,
  type HarborSkipped,
  type HarborStep,
  type HarborTask,
  loadHarborTasks,
} from "./loader.ts";
export type {
  ComposeCondition,
  ComposeHealthcheck,
  ComposeMount,
  ComposeProject,
  ComposeService,
} from "./_compose.ts";
export {
  buildHarborImage,
  type BuildHarborImageOptions,
  buildVerifierImage,
  HarborBuildError,
  type HarborImage,
  type HarborVerifierImage,
} from "./image.ts";
export { type HarborResult, oracleAgent, type RunHarborOptions, runHarborTasks } from "./run.ts";
export {
  type ExportedHarborTask,
  type ExportHarborOptions,
  exportHarborTasks,
  type HarborExport,
} from "./export.ts";
