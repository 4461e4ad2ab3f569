/**
 * The SSH cipher `chacha20-poly1305@openssh.com` (OpenSSH PROTOCOL.chacha20poly1305).
 * @module
 */

import { chachaSetKey, chachaXorState, constantTimeEqual, poly1305 } from "./_chacha20.ts";

/** Length in bytes of the Poly1305 tag appended to each packet. */
export const OPENSSH_CHACHA_TAG_LENGTH = 16;

const ZERO32 = new Uint8Array(32);

function bswap32(v: number): number {
  return ((v << 24) | ((v & 0xff00) << 8) | ((v >>> 8) & 0xff00) | (v >>> 24)) >>> 0;
}

/** Loads the nonce (seq as big-endian uint64) and a zero 64-bit block counter into `state`. */
function setNonce(state: Uint32Array, seq: number): void {
  if (!Number.isSafeInteger(seq) || seq < 0) {
    throw new RangeError("sequence number must be a non-negative safe integer");
  }
  state[12] = 0;
  state[13] = 0;
  state[14] = bswap32(Math.floor(seq / 4294967296));
  state[15] = bswap32(seq >>> 0);
}

/**
 * `chacha20-poly1305@openssh.com` packet protection. The 64-byte key is K_2 || K_1:
 * K_2 (first 32 bytes) encrypts the payload and derives the Poly1305 key, K_1 (last 32
 * bytes) encrypts the 4-byte packet length. The nonce is the packet sequence number.
 */
export class ChaChaPolyOpenSsh {
  /** K_2 state: payload and Poly1305 key. */
  #main = new Uint32Array(16);
  /** K_1 state: packet length only. */
  #header = new Uint32Array(16);
  #polyKey = new Uint8Array(32);

  /** Creates the cipher from 64 bytes of key material (K_2 || K_1). */
  constructor(key: Uint8Array) {
    if (key.length !== 64) throw new RangeError(`key must be 64 bytes, got ${key.length}`);
    chachaSetKey(this.#main, key.subarray(0, 32));
    chachaSetKey(this.#header, key.subarray(32, 64));
  }

  /** Decrypts the 4-byte encrypted packet length of packet `seq` (K_1, counter 0). */
  decryptLength(seq: number, encLen4: Uint8Array): number {
    if (encLen4.length < 4) throw new RangeError("need 4 bytes of encrypted length");
    const out = new Uint8Array(4);
    setNonce(this.#header, seq);
    chachaXorState(this.#header, encLen4.subarray(0, 4), out, true);
    return ((out[0] << 24) | (out[1] << 16) | (out[2] << 8) | out[3]) >>> 0;
  }

  /**
   * Encrypts a plaintext packet (4-byte length || rest) with sequence number `seq`.
   * Returns encrypted length || encrypted rest || 16-byte tag.
   */
  seal(seq: number, plaintextPacket: Uint8Array): Uint8Array {
    const n = plaintextPacket.length;
    if (n < 4) throw new RangeError("packet must include the 4-byte length");
    const out = new Uint8Array(n + OPENSSH_CHACHA_TAG_LENGTH);
    setNonce(this.#header, seq);
    chachaXorState(this.#header, plaintextPacket.subarray(0, 4), out.subarray(0, 4), true);
    this.#derivePolyKey(seq);
    chachaXorState(this.#main, plaintextPacket.subarray(4), out.subarray(4, n), true);
    out.set(poly1305(this.#polyKey, out.subarray(0, n)), n);
    this.#polyKey.fill(0);
    return out;
  }

  /**
   * Verifies the tag of `packetWithTag` (encrypted length || ciphertext || tag) and returns
   * the plaintext packet including its 4-byte length, or null if authentication fails.
   */
  open(seq: number, packetWithTag: Uint8Array): Uint8Array | null {
    const n = packetWithTag.length - OPENSSH_CHACHA_TAG_LENGTH;
    if (n < 4) return null;
    this.#derivePolyKey(seq);
    const tag = poly1305(this.#polyKey, packetWithTag.subarray(0, n));
    this.#polyKey.fill(0);
    if (!constantTimeEqual(tag, packetWithTag.subarray(n))) return null;
    const out = new Uint8Array(n);
    setNonce(this.#header, seq);
    chachaXorState(this.#header, packetWithTag.subarray(0, 4), out.subarray(0, 4), true);
    chachaXorState(this.#main, packetWithTag.subarray(4, n), out.subarray(4), true);
    return out;
  }

  /**
   * Seals in place: `buf` holds the plaintext packet (4-byte length || rest) followed by 16
   * bytes of room for the tag.
   */
  sealInPlace(seq: number, buf: Uint8Array): void {
    const n = buf.length - OPENSSH_CHACHA_TAG_LENGTH;
    if (n < 4) throw new RangeError("packet must include the 4-byte length");
    setNonce(this.#header, seq);
    chachaXorState(this.#header, buf.subarray(0, 4), buf.subarray(0, 4), true);
    this.#derivePolyKey(seq);
    chachaXorState(this.#main, buf.subarray(4, n), buf.subarray(4, n), true);
    buf.set(poly1305(this.#polyKey, buf.subarray(0, n)), n);
    this.#polyKey.fill(0);
  }

  /**
   * Verifies `tag` over `sealed` (encrypted length || ciphertext) and returns the decrypted
   * part after the length in a new array, or null if authentication fails.
   */
  openBody(seq: number, sealed: Uint8Array, tag: Uint8Array): Uint8Array | null {
    this.#derivePolyKey(seq);
    const expect = poly1305(this.#polyKey, sealed);
    this.#polyKey.fill(0);
    if (!constantTimeEqual(expect, tag)) return null;
    const out = new Uint8Array(sealed.length - 4);
    chachaXorState(this.#main, sealed.subarray(4), out, true);
    return out;
  }

  /** Poly1305 key = first 32 bytes of K_2 block 0; leaves the K_2 counter at 1. */
  #derivePolyKey(seq: number): void {
    setNonce(this.#main, seq);
    chachaXorState(this.#main, ZERO32, this.#polyKey, true);
  }
}
