// Ed25519 keys in the OpenSSH formats: `ssh-ed25519 AAAA... comment` public
// keys and the unencrypted `openssh-key-v1` private key (PROTOCOL.key in the
// OpenSSH sources), plus SSH signature blobs.

import {
  bs,
  bytesEqual,
  concat,
  fromBase64,
  fromBase64Url,
  fromUtf8,
  SshReader,
  SshWireError,
  SshWriter,
  toBase64,
  toBase64Url,
} from "./_wire.ts";

export const ED25519 = "ssh-ed25519";
const MAGIC = "openssh-key-v1\0";
const PEM_BEGIN = "-----BEGIN OPENSSH PRIVATE KEY-----";
const PEM_END = "-----END OPENSSH PRIVATE KEY-----";

/** A parsed public key. */
export interface ParsedPublicKey {
  algorithm: string;
  /** The raw 32-byte Ed25519 key. */
  key: Uint8Array;
  /** The SSH wire blob: string algorithm, string key. */
  blob: Uint8Array;
  comment: string;
}

/** A parsed private key. */
export interface ParsedPrivateKey {
  algorithm: string;
  /** The 32-byte seed (the Ed25519 private key proper). */
  seed: Uint8Array;
  /** The raw 32-byte public key. */
  publicKey: Uint8Array;
  comment: string;
}

/** The wire blob of an Ed25519 public key. */
function ed25519Blob(key: Uint8Array): Uint8Array {
  return new SshWriter(51).string(ED25519).string(key).bytes().slice();
}

/** Parses a public key blob; throws SshWireError unless it is ssh-ed25519. */
export function parsePublicBlob(blob: Uint8Array): Uint8Array {
  const r = new SshReader(blob);
  const alg = r.text();
  if (alg !== ED25519) throw new SshWireError(`Cannot use public key: unsupported type "${alg}"`);
  const key = r.string();
  if (key.length !== 32 || r.remaining !== 0) {
    throw new SshWireError("Cannot use public key: malformed ssh-ed25519 key");
  }
  return key.slice();
}

/** Formats a public key line. */
export function formatPublicKey(key: Uint8Array, comment = ""): string {
  const line = `${ED25519} ${toBase64(ed25519Blob(key))}`;
  return comment === "" ? line : `${line} ${comment}`;
}

/** Parses `ssh-ed25519 AAAA... [comment]`; throws TypeError when it is not one. */
export function parsePublicKey(text: string): ParsedPublicKey {
  if (typeof text !== "string") throw new TypeError("Cannot parse SSH public key: not a string");
  const parts = text.trim().split(/\s+/);
  if (parts.length < 2) {
    throw new TypeError(`Cannot parse SSH public key: expected "type base64", got "${text}"`);
  }
  if (parts[0] !== ED25519) {
    throw new TypeError(`Cannot parse SSH public key: unsupported type "${parts[0]}"`);
  }
  let blob: Uint8Array;
  let key: Uint8Array;
  try {
    blob = fromBase64(parts[1]);
    key = parsePublicBlob(blob);
  } catch (err) {
    throw new TypeError(`Cannot parse SSH public key: malformed key "${parts[1]}"`, {
      cause: err,
    });
  }
  return { algorithm: ED25519, key, blob, comment: parts.slice(2).join(" ") };
}

/** Formats an unencrypted OpenSSH private key. */
export function formatPrivateKey(seed: Uint8Array, publicKey: Uint8Array, comment = ""): string {
  const check = crypto.getRandomValues(new Uint32Array(1))[0];
  const inner = new SshWriter(256)
    .uint32(check)
    .uint32(check)
    .string(ED25519)
    .string(publicKey)
    .string(concat([seed, publicKey]))
    .string(comment);
  for (let pad = 1; inner.length % 8 !== 0; pad++) inner.byte(pad);
  const body = new SshWriter(512)
    .raw(new TextEncoder().encode(MAGIC))
    .string("none")
    .string("none")
    .string("")
    .uint32(1)
    .string(ed25519Blob(publicKey))
    .string(inner.bytes())
    .bytes();
  const b64 = toBase64(body);
  const lines: string[] = [];
  for (let i = 0; i < b64.length; i += 70) lines.push(b64.slice(i, i + 70));
  return `${PEM_BEGIN}\n${lines.join("\n")}\n${PEM_END}\n`;
}

/** Parses an unencrypted OpenSSH Ed25519 private key; TypeError otherwise. */
export function parsePrivateKey(text: string): ParsedPrivateKey {
  if (typeof text !== "string") throw new TypeError("Cannot parse SSH private key: not a string");
  const begin = text.indexOf(PEM_BEGIN);
  const end = text.indexOf(PEM_END);
  if (begin < 0 || end < begin) {
    throw new TypeError("Cannot parse SSH private key: no OPENSSH PRIVATE KEY block");
  }
  const b64 = text.slice(begin + PEM_BEGIN.length, end).replace(/\s+/g, "");
  try {
    const r = new SshReader(fromBase64(b64));
    if (fromUtf8(r.raw(MAGIC.length)) !== MAGIC) throw new SshWireError("bad magic");
    const cipher = r.text();
    const kdf = r.text();
    r.string();
    if (cipher !== "none" || kdf !== "none") {
      throw new TypeError(
        `Cannot parse SSH private key: encrypted keys are not supported ("${cipher}")`,
      );
    }
    if (r.uint32() !== 1) throw new SshWireError("expected one key");
    const outerPub = parsePublicBlob(r.string());
    const inner = new SshReader(r.string());
    if (inner.uint32() !== inner.uint32()) throw new SshWireError("check bytes differ");
    const alg = inner.text();
    if (alg !== ED25519) {
      throw new TypeError(`Cannot parse SSH private key: unsupported type "${alg}"`);
    }
    const pub = inner.string();
    const priv = inner.string();
    const comment = inner.text();
    if (
      pub.length !== 32 || priv.length !== 64 || !bytesEqual(pub, outerPub) ||
      !bytesEqual(priv.subarray(32), pub)
    ) {
      throw new SshWireError("inconsistent key");
    }
    return { algorithm: ED25519, seed: priv.slice(0, 32), publicKey: pub.slice(), comment };
  } catch (err) {
    if (err instanceof TypeError) throw err;
    throw new TypeError("Cannot parse SSH private key: malformed key", { cause: err });
  }
}

/** An Ed25519 private key ready to sign SSH data. */
export class Ed25519Signer {
  readonly publicKey: Uint8Array;
  readonly blob: Uint8Array;
  readonly #key: CryptoKey;

  constructor(key: CryptoKey, publicKey: Uint8Array) {
    this.#key = key;
    this.publicKey = publicKey;
    this.blob = ed25519Blob(publicKey);
  }

  static async fromParsed(k: ParsedPrivateKey): Promise<Ed25519Signer> {
    const key = await crypto.subtle.importKey(
      "jwk",
      { kty: "OKP", crv: "Ed25519", d: toBase64Url(k.seed), x: toBase64Url(k.publicKey) },
      { name: "Ed25519" },
      false,
      ["sign"],
    );
    return new Ed25519Signer(key, k.publicKey);
  }

  /** The SSH signature blob: string "ssh-ed25519", string signature. */
  async sign(data: Uint8Array): Promise<Uint8Array> {
    const sig = new Uint8Array(await crypto.subtle.sign("Ed25519", this.#key, bs(data)));
    return new SshWriter(83).string(ED25519).string(sig).bytes().slice();
  }
}

/** Verifies an SSH signature blob made by the raw Ed25519 `key`. */
export async function verifyEd25519(
  key: Uint8Array,
  signatureBlob: Uint8Array,
  data: Uint8Array,
): Promise<boolean> {
  let sig: Uint8Array;
  try {
    const r = new SshReader(signatureBlob);
    if (r.text() !== ED25519) return false;
    sig = r.string();
  } catch {
    return false;
  }
  if (sig.length !== 64) return false;
  const pub = await crypto.subtle.importKey("raw", bs(key), { name: "Ed25519" }, false, ["verify"]);
  return await crypto.subtle.verify("Ed25519", pub, bs(sig), bs(data));
}

/** Generates an Ed25519 key pair: raw seed and public key. */
export async function generateEd25519(): Promise<{ seed: Uint8Array; publicKey: Uint8Array }> {
  const pair = await crypto.subtle.generateKey({ name: "Ed25519" }, true, [
    "sign",
    "verify",
  ]) as CryptoKeyPair;
  const publicKey = new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey));
  const jwk = await crypto.subtle.exportKey("jwk", pair.privateKey);
  return { seed: fromBase64Url(jwk.d!), publicKey };
}

/** `SHA256:...` fingerprint of a public key blob, as `ssh-keygen -l` prints it. */
export async function fingerprint(blob: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bs(blob)));
  return `SHA256:${toBase64(digest).replace(/=+$/, "")}`;
}
