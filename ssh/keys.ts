/**
 * Ed25519 keys in OpenSSH's text formats, made and read with WebCrypto:
 * what an SSH server needs for its host key and an agent to log in.
 *
 * @module
 */

import {
  fingerprint,
  formatPrivateKey,
  formatPublicKey,
  generateEd25519,
  parsePrivateKey,
  parsePublicKey,
} from "./_keys.ts";

/** An Ed25519 key pair in OpenSSH text formats. */
export interface SshKeyPair {
  /** `ssh-ed25519 AAAA... comment`, one line, as in `authorized_keys`. */
  publicKey: string;
  /** An unencrypted `-----BEGIN OPENSSH PRIVATE KEY-----` block, usable with `ssh -i`. */
  privateKey: string;
}

/** Options for {@linkcode generateSshKeyPair}. */
export interface GenerateSshKeyPairOptions {
  /**
   * Comment stored in both keys.
   * @default ""
   */
  comment?: string;
}

/** A public key read by {@linkcode parseSshPublicKey}. */
export interface SshPublicKey {
  /** Always `ssh-ed25519`. */
  algorithm: string;
  /** The raw 32-byte key. */
  key: Uint8Array;
  /** The comment after the key, or `""`. */
  comment: string;
}

/**
 * Generates an Ed25519 key pair with WebCrypto.
 *
 * @example Generate keys
 * ```ts
 * import { generateSshKeyPair } from "./keys.ts";
 * import assert from "node:assert/strict";
 *
 * const { publicKey, privateKey } = await generateSshKeyPair({ comment: "agent" });
 * assert.match(publicKey, /^ssh-ed25519 AAAA\S+ agent$/);
 * assert.match(privateKey, /^-----BEGIN OPENSSH PRIVATE KEY-----\n/);
 * ```
 *
 * @param options the comment
 * @returns both keys as OpenSSH text
 */
export async function generateSshKeyPair(
  options: GenerateSshKeyPairOptions = {},
): Promise<SshKeyPair> {
  const comment = options.comment ?? "";
  if (typeof comment !== "string" || /[\r\n]/.test(comment)) {
    throw new TypeError(`Cannot generate SSH key: invalid comment "${comment}"`);
  }
  const { seed, publicKey } = await generateEd25519();
  return {
    publicKey: formatPublicKey(publicKey, comment),
    privateKey: formatPrivateKey(seed, publicKey, comment),
  };
}

/**
 * Reads an `ssh-ed25519 AAAA... [comment]` public key line.
 * @param text the key line
 * @returns the key
 * @throws {TypeError} when it is not an Ed25519 public key
 */
export function parseSshPublicKey(text: string): SshPublicKey {
  const k = parsePublicKey(text);
  return { algorithm: k.algorithm, key: k.key, comment: k.comment };
}

/**
 * The public key line (`ssh-ed25519 AAAA... comment`) of an OpenSSH private key.
 * @param privateKey an unencrypted OpenSSH Ed25519 private key
 * @returns the public key line
 * @throws {TypeError} when the private key does not parse
 */
export function sshPublicKeyOf(privateKey: string): string {
  const k = parsePrivateKey(privateKey);
  return formatPublicKey(k.publicKey, k.comment);
}

/**
 * The `SHA256:...` fingerprint of a public key, as `ssh-keygen -l` shows it.
 * @param publicKey an `ssh-ed25519 AAAA...` line
 * @returns the fingerprint
 * @throws {TypeError} when the key does not parse
 */
export function sshFingerprint(publicKey: string): Promise<string> {
  return fingerprint(parsePublicKey(publicKey).blob);
}
