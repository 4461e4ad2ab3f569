/**
 * The `shell` capability: {@linkcode addWorkspace} gives an environment an
 * SSH workspace on a directory, served from the environment's process, and
 * a file tracker of it. This is where the SSH server and the file tracker
 * meet an {@linkcode Environment}; the core knows neither.
 *
 * @module
 */

export { addWorkspace, type WorkspaceIsolation, type WorkspaceOptions } from "./workspace.ts";
