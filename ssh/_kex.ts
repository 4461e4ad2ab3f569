// The key exchange's parts that hold no connection state, for the transport
// (`_transport.ts`): the algorithms each end offers, choosing among two
// KEXINITs' lists, the curve25519 shared secret, the exchange hash's digest
// and the key derivation (RFC 4253 section 7.2), and the state of one
// exchange in progress.

import { DISCONNECT, SshError } from "./_errors.ts";
import { CIPHERS, type DirectionKeys } from "./_cipher.ts";
import { bs, concat, SshWriter, utf8 } from "./_wire.ts";

export const KEX_ALGS = ["curve25519-sha256", "curve25519-sha256@libssh.org"];
export const STRICT_C = "kex-strict-c-v00@openssh.com";
export const STRICT_S = "kex-strict-s-v00@openssh.com";
// What our client offers, in its order of preference: chacha20-poly1305
// first, as OpenSSH's `ssh` does. Ours runs in WebAssembly, one call per
// packet; AES-GCM and AES-CTR go through WebCrypto calls that cost tens of
// microseconds each, whatever their size (BENCHMARKS.md).
export const DEFAULT_CIPHERS: readonly string[] = [
  "chacha20-poly1305@openssh.com",
  "aes128-gcm@openssh.com",
  "aes256-gcm@openssh.com",
  "aes128-ctr",
  "aes256-ctr",
];
/**
 * What a server offers by default. A client takes the first of its own list
 * the server also offers, and OpenSSH's `ssh` lists chacha20-poly1305 first:
 * ours runs in WebAssembly, one call per packet, and streams a command's
 * output with about half the CPU of aes128-ctr + hmac-sha2-256-etm, whose
 * WebCrypto calls cost tens of microseconds each (BENCHMARKS.md). Dropbear's
 * client picks chacha20-poly1305 too, PuTTY aes256-ctr.
 */
export const SERVER_CIPHERS: readonly string[] = [
  "chacha20-poly1305@openssh.com",
  "aes128-gcm@openssh.com",
  "aes256-gcm@openssh.com",
  "aes128-ctr",
  "aes256-ctr",
];
export const DEFAULT_MACS: readonly string[] = ["hmac-sha2-256-etm@openssh.com", "hmac-sha2-256"];

export interface Negotiated {
  kex: string;
  cipherCs: string;
  cipherSc: string;
  macCs: string;
  macSc: string;
}

export interface KexState {
  ours: Uint8Array;
  theirs: Uint8Array | null;
  algs: Negotiated | null;
  ephemeral: CryptoKeyPair | null;
  ephemeralPub: Uint8Array | null;
  inKeys: DirectionKeys | null;
  skipNext: boolean;
  sentNewKeys: boolean;
}

/** Marks where the sender switches to new keys in the packet queue. */
export class KeySwitch {
  constructor(readonly keys: DirectionKeys, readonly strict: boolean) {}
}

export function kexError(what: string, cause?: unknown): SshError {
  return new SshError(`Cannot exchange keys: ${what}`, {
    reason: DISCONNECT.KEY_EXCHANGE_FAILED,
    cause,
  });
}

export async function sha256(data: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", bs(data)));
}

function choose(what: string, client: readonly string[], server: readonly string[]): string {
  for (const a of client) if (server.includes(a)) return a;
  throw kexError(
    `no common ${what} algorithm (client offers "${client.join(",")}", server offers "${
      server.join(",")
    }")`,
  );
}

/** Key material for one purpose (`letter`), RFC 4253 section 7.2. */
export async function deriveKey(
  k: Uint8Array,
  h: Uint8Array,
  letter: string,
  sessionId: Uint8Array,
  len: number,
): Promise<Uint8Array> {
  let out = await sha256(concat([k, h, utf8(letter), sessionId]));
  while (out.length < len) out = concat([out, await sha256(concat([k, h, out]))]);
  return out.subarray(0, len);
}

/**
 * The algorithms two KEXINITs agree on: `c` and `s` are the client's and
 * the server's ten name lists, in KEXINIT order.
 */
export function negotiate(c: readonly string[][], s: readonly string[][]): Negotiated {
  const realKex = (l: string[]) => l.filter((a) => KEX_ALGS.includes(a));
  const algs: Negotiated = {
    kex: choose("key exchange", realKex(c[0]), realKex(s[0])),
    cipherCs: choose("cipher", c[2], s[2]),
    cipherSc: choose("cipher", c[3], s[3]),
    macCs: "",
    macSc: "",
  };
  choose("host key", c[1], s[1]);
  if (!CIPHERS[algs.cipherCs].aead) algs.macCs = choose("MAC", c[4], s[4]);
  if (!CIPHERS[algs.cipherSc].aead) algs.macSc = choose("MAC", c[5], s[5]);
  choose("compression", c[6], s[6]);
  choose("compression", c[7], s[7]);
  return algs;
}

/** The curve25519 shared secret with `peer`'s public key, as an mpint. */
export async function sharedSecret(priv: CryptoKey, peer: Uint8Array): Promise<Uint8Array> {
  if (peer.length !== 32) throw kexError(`bad ephemeral key length "${peer.length}"`);
  try {
    const pub = await crypto.subtle.importKey("raw", bs(peer), { name: "X25519" }, false, []);
    const bits = new Uint8Array(
      await crypto.subtle.deriveBits({ name: "X25519", public: pub }, priv, 256),
    );
    if (bits.every((b) => b === 0)) throw new Error("all-zero shared secret");
    return new SshWriter(40).mpint(bits).bytes().slice();
  } catch (err) {
    throw kexError("bad ephemeral key", err);
  }
}
