/**
 * The `shell` capability: an SSH workspace served from this process. At
 * start it makes fresh host and client keys, starts an {@linkcode SshServer}
 * on 127.0.0.1 and publishes an `ssh/2` binding whose `client_key` lets an
 * agent log in; at stop it ends every session and removes the keys.
 *
 * @module
 */

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { generateSshKeyPair } from "../ssh/keys.ts";
import { type SshServer, startSshServer } from "../ssh/server.ts";
import { type FileTracker, startFileTracker } from "../filetracking/tracker.ts";

/** Options for {@linkcode addWorkspace}. */
export interface WorkspaceOptions {
  /**
   * Capability name.
   * @default "shell"
   */
  name?: string;
  /**
   * User name the agent logs in as (only this one is accepted).
   * @default "agent"
   */
  user?: string;
  /**
   * Variables for commands, on top of PATH, HOME, USER and LANG from this
   * process; nothing else of this process's environment reaches commands.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * Address the SSH server listens on.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Port the SSH server listens on; 0 picks a free one.
   * @default 0
   */
  port?: number;
  /**
   * Also write the client key to a private temporary file and publish its
   * path as `client_key_path` (for `ssh -i`). The file is removed at stop.
   * @default true
   */
  writeKeyFile?: boolean;
  /**
   * Also serve a `filetracking/1` tracker of the root and publish it as the
   * `filetracking` capability, so that rollouts record what the agent
   * changed as unified diffs in their traces. The tracker has no port of
   * its own: it is attached to the environment, so only the control
   * server's authenticated `tunnel.open` reaches it.
   * @default true
   */
  trackFiles?: boolean;
  /**
   * Called with unexpected server errors.
   * @default ignores them
   */
  onError?: (error: unknown) => void;
}

function absolute(path: string): string {
  if (path.startsWith("/")) return path;
  const cwd = Deno.cwd();
  return path === "." ? cwd : `${cwd.replace(/\/$/, "")}/${path.replace(/^\.\//, "")}`;
}

/**
 * Adds an SSH workspace rooted at `root` to `env`: an initialize hook that
 * starts the server and publishes the capability, and a shutdown hook that
 * stops it and removes the key material.
 *
 * @example Serve a workspace and run a command in it
 * ```ts
 * import { addWorkspace } from "./workspace.ts";
 * import { Environment } from "../env.ts";
 * import { SshClient } from "../ssh/mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo");
 * addWorkspace(env, Deno.cwd(), { env: { GREETING: "hi" } });
 * await env.start();
 * try {
 *   await using shell = SshClient.fromBinding(env.capability("shell")!);
 *   const r = await shell.exec("echo $GREETING");
 *   assert.equal(r.stdoutText, "hi\n");
 * } finally {
 *   await env.stop();
 * }
 * ```
 *
 * @param env the environment to add it to
 * @param root the directory commands run in
 * @param options name, user, environment variables
 * @throws {TypeError} when `root` is not a non-empty string
 */
export function addWorkspace(
  env: Environment,
  root: string,
  options: WorkspaceOptions = {},
): void {
  if (typeof root !== "string" || root === "") {
    throw new TypeError("Cannot add workspace: root must be a non-empty string");
  }
  const name = options.name ?? "shell";
  const user = options.user ?? "agent";
  const cwd = absolute(root);
  let server: SshServer | null = null;
  let keyDir: string | null = null;
  let tracker: FileTracker | null = null;

  env.initialize(async () => {
    const info = await Deno.stat(cwd).catch(() => null);
    if (info === null || !info.isDirectory) {
      throw new TypeError(`Cannot start workspace: root "${cwd}" is not a directory`);
    }
    const host = await generateSshKeyPair({ comment: `${env.name}-host` });
    const client = await generateSshKeyPair({ comment: `${env.name}-${user}` });
    let clientKeyPath: string | undefined;
    if (options.writeKeyFile ?? true) {
      keyDir = await Deno.makeTempDir({ prefix: "hud-ssh-" });
      clientKeyPath = `${keyDir}/id_ed25519`;
      await Deno.writeTextFile(clientKeyPath, client.privateKey, { mode: 0o600 });
    }
    server = startSshServer({
      hostname: options.hostname ?? "127.0.0.1",
      port: options.port ?? 0,
      hostKey: host.privateKey,
      authorizedKeys: [client.publicKey],
      user,
      cwd,
      env: options.env,
      onError: options.onError,
    });
    const addr = server.addr;
    const hostname = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
    env.addCapability(Capability.ssh({
      name,
      url: `ssh://${hostname}:${addr.port}`,
      user,
      hostPubkey: server.hostPublicKey,
      clientKey: client.privateKey,
      clientKeyPath,
      cwd,
      isolation: "none",
    }));
    if (options.trackFiles ?? true) {
      const t = await startFileTracker(cwd, { onError: options.onError, listen: false });
      tracker = t;
      env.addCapability(t.capability(), {
        attach: (conn, head) => t.serveConnection(conn, head),
      });
    }
  });

  env.shutdown(async () => {
    const s = server;
    const dir = keyDir;
    const t = tracker;
    server = null;
    keyDir = null;
    tracker = null;
    if (s !== null) env.removeCapability(name);
    try {
      if (t !== null) {
        env.removeCapability(t.capability().name);
        await t.shutdown();
      }
      if (s !== null) await s.shutdown();
    } finally {
      if (dir !== null) await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  });
}
