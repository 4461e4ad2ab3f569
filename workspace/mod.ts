/**
 * The `shell` capability: {@linkcode addWorkspace} gives an environment an
 * SSH workspace on a directory, served from the environment's process, and
 * a file tracker of it. This is where the SSH server and the file tracker
 * meet an {@linkcode Environment}; the core knows neither. The `browser`
 * capability, {@linkcode addBrowser}, runs headless Chromium in the same
 * kind of sandbox.
 *
 * @module
 */

export { addWorkspace, type WorkspaceIsolation, type WorkspaceOptions } from "./workspace.ts";
export { addBrowser, type BrowserOptions } from "./browser.ts";
