/**
 * The `shell` capability: an SSH workspace served from this process. At
 * start it makes fresh host and client keys, starts an {@linkcode SshServer}
 * on 127.0.0.1 and publishes an `ssh/2` binding whose `client_key` lets an
 * agent log in; at stop it ends every session and removes the keys.
 * Commands, and SFTP, run in a sandbox (bubblewrap, else util-linux
 * `unshare`) as a uid of the workspace's own, with a private HOME that lives
 * for one start-to-stop episode, under memory, process and disk limits.
 *
 * {@linkcode addWorkspace} returns a {@linkcode Workspace}: grading code runs
 * its checks with `workspace.exec()`, in the same sandbox, while every
 * process of the agent is stopped, with hidden files the agent never saw.
 *
 * @module
 */

import type { Environment } from "../env.ts";
import { workspaceConfig } from "./_config.ts";
import { WorkspaceHandle } from "./_handle.ts";
import type { Workspace, WorkspaceOptions } from "./_types.ts";

export type {
  Workspace,
  WorkspaceExecOptions,
  WorkspaceExecResult,
  WorkspaceGrading,
  WorkspaceIsolation,
  WorkspaceLifetime,
  WorkspaceOptions,
  WorkspaceSpawnOptions,
} from "./_types.ts";
export type { WorkspaceLimits, WorkspaceLimitsInForce } from "./_limits.ts";
export type { NetworkAllowlist, NetworkPolicy } from "./_netpolicy.ts";
export type { WorkspaceSnapshot, WorkspaceSnapshotOptions } from "./_snapshot.ts";

/**
 * Adds an SSH workspace rooted at `root` to `env`: an initialize hook that
 * starts the server and publishes the capability, and a shutdown hook that
 * stops it, every process it started and removes the key material. The
 * returned {@linkcode Workspace} grades inside the same sandbox.
 *
 * @example Serve a workspace, let the agent work, grade what it left
 * ```ts ignore
 * import { addWorkspace } from "./workspace.ts";
 * import { Environment } from "../env.ts";
 * import { SshClient } from "../ssh/mod.ts";
 * import assert from "node:assert/strict";
 *
 * const root = await Deno.makeTempDir();
 * const env = new Environment("demo");
 * const workspace = addWorkspace(env, root, { env: { GREETING: "hi" } });
 * await env.start();
 * try {
 *   await using shell = SshClient.fromBinding(env.capability("shell")!);
 *   const r = await shell.exec("echo $GREETING > hello.txt");
 *   assert.equal(r.code, 0);
 *   // The check comes from this code, not from a file the agent could write.
 *   const check = await workspace.exec(["grep", "-qx", "hi", "hello.txt"], { timeout: 10_000 });
 *   assert.equal(check.code, 0);
 * } finally {
 *   await env.stop();
 *   await Deno.remove(root, { recursive: true });
 * }
 * ```
 *
 * @param env the environment to add it to
 * @param root the directory commands run in
 * @param options name, user, environment variables, isolation, limits
 * @returns the workspace, for grading
 * @throws {TypeError} when `root` is not a non-empty string
 * @throws {RangeError} when `isolation`, `uid`, `gid`, `uidRange` or a limit is out of range
 */
export function addWorkspace(
  env: Environment,
  root: string,
  options: WorkspaceOptions = {},
): Workspace {
  const workspace = new WorkspaceHandle(env, workspaceConfig(root, options));
  env.initialize(() => workspace.start());
  env.shutdown(() => workspace.stop());
  return workspace;
}
