/**
 * The `shell` capability: {@linkcode addWorkspace} gives an environment an
 * SSH workspace on a directory, served from the environment's process, and
 * a file tracker of it; the {@linkcode Workspace} it returns runs grading
 * commands in the same sandbox. This is where the SSH server and the file
 * tracker meet an {@linkcode Environment}; the core knows neither. The
 * `browser` capability, {@linkcode addBrowser}, runs headless Chromium in a
 * workspace's sandbox, or in one of its own; the `screen` capability,
 * {@linkcode addDesktop}, an X desktop served over VNC, the same way.
 *
 * @module
 */

export {
  addWorkspace,
  type NetworkAllowlist,
  type NetworkPolicy,
  type Workspace,
  type WorkspaceExecOptions,
  type WorkspaceExecResult,
  type WorkspaceGrading,
  type WorkspaceIsolation,
  type WorkspaceLifetime,
  type WorkspaceLimits,
  type WorkspaceLimitsInForce,
  type WorkspaceOptions,
  type WorkspaceSnapshot,
  type WorkspaceSnapshotOptions,
  type WorkspaceSpawnOptions,
} from "./workspace.ts";
export { addBrowser, type BrowserOptions } from "./browser.ts";
export type { ExitStatus } from "../_internal/exit.ts";
export {
  addDesktop,
  type Desktop,
  type DesktopExecOptions,
  type DesktopExecResult,
  type DesktopOptions,
  type DesktopProgram,
  type DesktopRunOptions,
  type DesktopServer,
} from "./desktop.ts";
