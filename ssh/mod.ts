/**
 * SSH with no dependencies, on Deno's WebCrypto: Ed25519 keys in OpenSSH's
 * formats, {@linkcode SshClient} (verifies the host key, runs commands,
 * with a terminal when asked, moves files over SFTP) and
 * {@linkcode startSshServer} (a server whose commands run in a directory,
 * for an agent's workspace, with SFTP and `scp` confined to it).
 *
 * Both ends speak what OpenSSH 9 speaks, checked against its `ssh` and
 * `sshd`: key exchange `curve25519-sha256` (and `@libssh.org`) with strict
 * key exchange (`kex-strict-*-v00@openssh.com`), host keys and user keys
 * `ssh-ed25519`, ciphers `aes128-gcm@openssh.com`, `aes256-gcm@openssh.com`,
 * `chacha20-poly1305@openssh.com`, `aes128-ctr` and `aes256-ctr`, MACs `hmac-sha2-256-etm@openssh.com` and
 * `hmac-sha2-256`, `ext-info` with `server-sig-algs`, rekeying either way.
 *
 * @example Generate keys, serve a directory, run a command in it
 * ```ts
 * import { generateSshKeyPair, SshClient, startSshServer } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const host = await generateSshKeyPair();
 * const user = await generateSshKeyPair();
 * await using server = startSshServer({
 *   hostKey: host.privateKey,
 *   authorizedKeys: [user.publicKey],
 *   cwd: Deno.cwd(),
 * });
 * await using client = new SshClient({
 *   port: server.addr.port,
 *   user: "agent",
 *   privateKey: user.privateKey,
 *   hostPublicKey: server.hostPublicKey,
 * });
 * assert.equal((await client.exec("echo hi")).stdoutText, "hi\n");
 * ```
 *
 * @module
 */

export {
  generateSshKeyPair,
  type GenerateSshKeyPairOptions,
  parseSshPublicKey,
  sshFingerprint,
  type SshKeyPair,
  type SshPublicKey,
  sshPublicKeyOf,
} from "./keys.ts";
export {
  SshAuthError,
  type SshBindingOptions,
  SshClient,
  type SshClientOptions,
  SshCommandError,
  type SshDirEntry,
  SshError,
  type SshExecOptions,
  type SshExecResult,
  type SshExitStatus,
  SshFileError,
  type SshFileInfo,
  type SshFileOptions,
  SshHostKeyError,
  type SshProcess,
  type SshPtyOptions,
} from "./client.ts";
export type { ExitStatus } from "../_internal/exit.ts";
export {
  type SshServer,
  type SshServerOptions,
  type SshSpawner,
  type SshSpawnOptions,
  type SshStartupLimits,
  startSshServer,
} from "./server.ts";
