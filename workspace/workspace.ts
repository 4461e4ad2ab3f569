/**
 * The `shell` capability: an SSH workspace served from this process. At
 * start it makes fresh host and client keys, starts an {@linkcode SshServer}
 * on 127.0.0.1 and publishes an `ssh/2` binding whose `client_key` lets an
 * agent log in; at stop it ends every session and removes the keys. Commands
 * run in a sandbox (bubblewrap, else util-linux `unshare`) with a private
 * HOME that lives for one start-to-stop episode.
 *
 * @module
 */

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { generateSshKeyPair } from "../ssh/keys.ts";
import { type SshServer, startSshServer } from "../ssh/server.ts";
import { type FileTracker, startFileTracker } from "../filetracking/tracker.ts";
import { chooseSandbox, type SandboxConfig, spawnInSandbox } from "./_sandbox.ts";

/**
 * How commands are isolated: bubblewrap, util-linux `unshare`, nothing, or
 * "auto" for the first of bubblewrap and `unshare` that works here.
 */
export type WorkspaceIsolation = "auto" | "bwrap" | "unshare" | "none";

/** Unauthenticated SSH connections: random early drop from 32, all from 128. */
const WORKSPACE_STARTUPS = { start: 32, rate: 30, full: 128 };

/** The uid (and gid) commands run as when this process is root: `nobody`. */
const NOBODY = 65534;

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
   * Variables for commands, on top of PATH and LANG from this process, HOME
   * (a private directory made for each episode) and USER (the login `user`);
   * nothing else of this process's environment reaches commands. A HOME
   * given here replaces the private one and is only writable in the sandbox
   * when it lies inside the root.
   * @default {}
   */
  env?: Record<string, string>;
  /**
   * How commands are isolated. "auto" takes bubblewrap (`bwrap`), else
   * util-linux `unshare`, and refuses to start when neither works here;
   * "none" runs commands unconfined, publishes `isolation: "none"` and
   * reports one warning line through `onError`.
   * @default "auto"
   */
  isolation?: WorkspaceIsolation;
  /**
   * Whether commands keep this host's network. Off, they get an empty
   * network namespace: not even this host's loopback (where the control
   * port and the SSH port listen) is reachable.
   * @default false
   */
  network?: boolean;
  /**
   * Uid commands run as when this process is root; 0 keeps root (without
   * capabilities). The root's tree is given to this uid at start so the
   * agent can edit it, and in a sandbox what this process adds there as
   * root is handed over before each command. Ignored when this process is
   * not root.
   * @default 65534 (nobody)
   */
  uid?: number;
  /**
   * Gid commands run as when this process is root.
   * @default 65534 (nogroup), or 0 when `uid` is 0
   */
  gid?: number;
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

function checkId(what: string, id: number | undefined): void {
  if (id !== undefined && !(Number.isInteger(id) && id >= 0 && id < 2 ** 32 - 1)) {
    throw new RangeError(`Cannot add workspace: invalid ${what} "${id}"`);
  }
}

/** Gives `paths` (recursively, links not followed) to `uid`:`gid`. */
async function chownTree(paths: string[], uid: number, gid: number): Promise<void> {
  const out = await new Deno.Command("chown", {
    args: ["-R", "-P", "-h", `${uid}:${gid}`, "--", ...paths],
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!out.success) {
    const why = new TextDecoder().decode(out.stderr).trim().split("\n")[0];
    throw new Error(`Cannot start workspace: cannot give the root to uid ${uid}: ${why}`);
  }
}

async function chooseIsolation(
  wanted: WorkspaceIsolation,
  base: Omit<SandboxConfig, "isolation">,
  cwd: string,
): Promise<SandboxConfig> {
  const chosen = await chooseSandbox(wanted, base, cwd);
  if (!("failures" in chosen)) return chosen;
  throw new Error(
    `Cannot start workspace: no sandbox works here (${
      chosen.failures.join("; ")
    }); install bubblewrap, or set isolation: "none" to run commands unconfined`,
  );
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
 * const root = await Deno.makeTempDir();
 * const env = new Environment("demo");
 * addWorkspace(env, root, { env: { GREETING: "hi" } });
 * await env.start();
 * try {
 *   await using shell = SshClient.fromBinding(env.capability("shell")!);
 *   const r = await shell.exec("echo $GREETING");
 *   assert.equal(r.stdoutText, "hi\n");
 * } finally {
 *   await env.stop();
 *   await Deno.remove(root, { recursive: true });
 * }
 * ```
 *
 * @param env the environment to add it to
 * @param root the directory commands run in
 * @param options name, user, environment variables, isolation
 * @throws {TypeError} when `root` is not a non-empty string
 * @throws {RangeError} when `isolation`, `uid` or `gid` is out of range
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
  const wanted = options.isolation ?? "auto";
  if (!["auto", "bwrap", "unshare", "none"].includes(wanted)) {
    throw new RangeError(
      `Cannot add workspace: unknown isolation "${wanted}" (use "auto", "bwrap", "unshare" or "none")`,
    );
  }
  checkId("uid", options.uid);
  checkId("gid", options.gid);
  let server: SshServer | null = null;
  let keyDir: string | null = null;
  let home: string | null = null;
  let tracker: FileTracker | null = null;

  env.initialize(async () => {
    const info = await Deno.stat(cwd).catch(() => null);
    if (info === null || !info.isDirectory) {
      throw new TypeError(`Cannot start workspace: root "${cwd}" is not a directory`);
    }
    home = await Deno.makeTempDir({ prefix: "hud-home-" });
    const uid = options.uid ?? NOBODY;
    const gid = options.gid ?? (uid === 0 ? 0 : NOBODY);
    const drop = Deno.uid() === 0 && uid !== 0 ? { uid, gid } : null;
    let sandbox: SandboxConfig;
    try {
      if (drop !== null) await chownTree([cwd, home], uid, gid);
      sandbox = await chooseIsolation(wanted, {
        writable: [cwd, home],
        network: options.network ?? false,
        user: drop,
      }, cwd);
    } catch (err) {
      await Deno.remove(home, { recursive: true }).catch(() => {});
      home = null;
      throw err;
    }
    if (sandbox.isolation === "none") {
      options.onError?.(
        new Error(
          `Workspace "${name}" runs commands without a sandbox (isolation: "none"): they see this host's processes, files and network${
            drop === null ? " as this process's user" : ""
          }`,
        ),
      );
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
      env: { HOME: home, USER: user, ...options.env },
      spawn: (argv, o) => spawnInSandbox(argv, { ...o, sandbox }),
      // Rollouts in parallel log in at once: OpenSSH's 10:30:100 would drop
      // some of a burst of twenty.
      maxStartups: WORKSPACE_STARTUPS,
      onError: options.onError,
    });
    const addr = server.addr;
    const hostname = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
    const ssh = server;
    // A tunnel.open for the shell hands the control connection to the SSH
    // server in this process: no loopback hop, one copy fewer each way.
    env.addCapability(
      Capability.ssh({
        name,
        url: `ssh://${hostname}:${addr.port}`,
        user,
        hostPubkey: server.hostPublicKey,
        clientKey: client.privateKey,
        clientKeyPath,
        cwd,
        isolation: sandbox.isolation,
      }),
      { attach: (conn, head) => ssh.serveConnection(conn, head) },
    );
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
    const h = home;
    const t = tracker;
    server = null;
    keyDir = null;
    home = null;
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
      if (h !== null) await Deno.remove(h, { recursive: true }).catch(() => {});
    }
  });
}
