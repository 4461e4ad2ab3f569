/**
 * The SSH cipher `chacha20-poly1305@openssh.com` (OpenSSH PROTOCOL.chacha20poly1305), run by a
 * WebAssembly module (_wasm/chacha_poly.wat: SIMD ChaCha20, 64-bit-limb Poly1305) that seals or
 * opens a whole packet in one call. Several times faster than TypeScript (tests/ssh/_chacha20_reference.ts, which
 * the tests keep as the reference) and than WebCrypto's AES-CTR + HMAC here, which cost tens of
 * microseconds per call (BENCHMARKS.md).
 * @module
 */

import { CHACHA_POLY_WASM_BASE64 } from "./_wasm/chacha_poly.ts";

/** Length in bytes of the Poly1305 tag appended to each packet. */
const OPENSSH_CHACHA_TAG_LENGTH = 16;

/**
 * Largest packet sealed or opened, counting its 4-byte length (not the tag): OpenSSH's
 * PACKET_MAX_SIZE (256 KiB) plus the length.
 */
export const OPENSSH_CHACHA_MAX_PACKET = 4 + 256 * 1024;

/** What chacha_poly.wat exports; addresses are byte offsets in `memory`. */
interface ChaChaPolyExports {
  memory: WebAssembly.Memory;
  xor(state: number, at: number, length: number): void;
  poly1305(key: number, at: number, length: number, out: number): void;
  seal(length: number, nonceHi: number, nonceLo: number): void;
  open(length: number, nonceHi: number, nonceLo: number): number;
  length(nonceHi: number, nonceLo: number): void;
}

// The module's memory layout (see chacha_poly.wat).
const MAIN_STATE = 0;
const HEADER_STATE = 64;
const LENGTH_AT = 192;
const PACKET_AT = 1024;
/** Free for the test helpers below: past the module's fixed areas, before the packet. */
const SCRATCH_AT = 512;
const WASM_PAGE = 65536;
const SIGMA = [0x61707865, 0x3320646e, 0x79622d32, 0x6b206574];

let compiled: WebAssembly.Module | null = null;

function instantiate(): ChaChaPolyExports {
  if (compiled === null) {
    const text = atob(CHACHA_POLY_WASM_BASE64);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    compiled = new WebAssembly.Module(bytes);
  }
  return new WebAssembly.Instance(compiled).exports as unknown as ChaChaPolyExports;
}

/** Writes a ChaCha20 state's constants and 32-byte key at `at` (counter and nonce follow). */
function writeKey(mem: Uint8Array, at: number, key: Uint8Array): void {
  const view = new DataView(mem.buffer);
  for (let i = 0; i < 4; i++) view.setUint32(at + 4 * i, SIGMA[i], true);
  mem.set(key, at + 16);
}

function bswap32(v: number): number {
  return ((v << 24) | ((v & 0xff00) << 8) | ((v >>> 8) & 0xff00) | (v >>> 24)) >>> 0;
}

function checkSeq(seq: number): void {
  if (!Number.isSafeInteger(seq) || seq < 0) {
    throw new RangeError(`Invalid sequence number "${seq}": must be a non-negative safe integer`);
  }
}

// The nonce is the sequence number as a big-endian uint64, loaded as two little-endian words.
function nonceHi(seq: number): number {
  return bswap32(Math.floor(seq / 4294967296));
}

function nonceLo(seq: number): number {
  return bswap32(seq >>> 0);
}

/**
 * `chacha20-poly1305@openssh.com` packet protection. The 64-byte key is K_2 || K_1:
 * K_2 (first 32 bytes) encrypts the payload and derives the Poly1305 key, K_1 (last 32
 * bytes) encrypts the 4-byte packet length. The nonce is the packet sequence number.
 * Each instance owns a WebAssembly instance (64 KiB of memory, grown for large packets).
 */
export class ChaChaPolyOpenSsh {
  readonly #wasm: ChaChaPolyExports;
  /** The module's memory; replaced when it grows. */
  #mem: Uint8Array;

  /** Creates the cipher from 64 bytes of key material (K_2 || K_1). */
  constructor(key: Uint8Array) {
    if (key.length !== 64) throw new RangeError(`Invalid key: must be 64 bytes, got ${key.length}`);
    this.#wasm = instantiate();
    this.#mem = new Uint8Array(this.#wasm.memory.buffer);
    writeKey(this.#mem, MAIN_STATE, key.subarray(0, 32));
    writeKey(this.#mem, HEADER_STATE, key.subarray(32, 64));
  }

  /** The module's memory, with room for an `n`-byte packet and its tag. */
  #room(n: number, action: string): Uint8Array {
    if (n > OPENSSH_CHACHA_MAX_PACKET) {
      throw new RangeError(
        `Cannot ${action} packet: "${n}" bytes is over the limit of ${OPENSSH_CHACHA_MAX_PACKET}`,
      );
    }
    const need = PACKET_AT + n + OPENSSH_CHACHA_TAG_LENGTH;
    if (need > this.#mem.length) {
      this.#wasm.memory.grow(Math.ceil((need - this.#mem.length) / WASM_PAGE));
      this.#mem = new Uint8Array(this.#wasm.memory.buffer);
    }
    return this.#mem;
  }

  /** Decrypts the 4-byte encrypted packet length of packet `seq` (K_1, counter 0). */
  decryptLength(seq: number, encLen4: Uint8Array): number {
    if (encLen4.length < 4) throw new RangeError("Cannot decrypt length: need 4 bytes");
    checkSeq(seq);
    const mem = this.#mem;
    mem.set(encLen4.subarray(0, 4), LENGTH_AT);
    this.#wasm.length(nonceHi(seq), nonceLo(seq));
    const at = LENGTH_AT;
    return ((mem[at] << 24) | (mem[at + 1] << 16) | (mem[at + 2] << 8) | mem[at + 3]) >>> 0;
  }

  /**
   * Encrypts a plaintext packet (4-byte length || rest) with sequence number `seq`.
   * Returns encrypted length || encrypted rest || 16-byte tag.
   */
  seal(seq: number, plaintextPacket: Uint8Array): Uint8Array {
    const n = plaintextPacket.length;
    if (n < 4) throw new RangeError("Cannot seal packet: it must include the 4-byte length");
    checkSeq(seq);
    const mem = this.#room(n, "seal");
    mem.set(plaintextPacket, PACKET_AT);
    this.#wasm.seal(n, nonceHi(seq), nonceLo(seq));
    return mem.slice(PACKET_AT, PACKET_AT + n + OPENSSH_CHACHA_TAG_LENGTH);
  }

  /**
   * Verifies the tag of `packetWithTag` (encrypted length || ciphertext || tag) and returns
   * the plaintext packet including its 4-byte length, or null if authentication fails.
   */
  open(seq: number, packetWithTag: Uint8Array): Uint8Array | null {
    const n = packetWithTag.length - OPENSSH_CHACHA_TAG_LENGTH;
    if (n < 4) return null;
    checkSeq(seq);
    const mem = this.#room(n, "open");
    mem.set(packetWithTag, PACKET_AT);
    if (this.#wasm.open(n, nonceHi(seq), nonceLo(seq)) !== 1) return null;
    return mem.slice(PACKET_AT, PACKET_AT + n);
  }

  /**
   * Room in the module's memory for an `n`-byte plaintext packet (4-byte length || rest) and
   * its tag, to fill and then seal with sealPacket(): saves a copy of the packet. Valid until
   * the next call on this cipher.
   */
  packetBuffer(n: number): Uint8Array {
    if (n < 4) throw new RangeError("Cannot seal packet: it must include the 4-byte length");
    return this.#room(n, "seal").subarray(PACKET_AT, PACKET_AT + n + OPENSSH_CHACHA_TAG_LENGTH);
  }

  /**
   * Seals the `n`-byte packet written into packetBuffer(n) in place, tag after it, with
   * sequence number `seq`.
   */
  sealPacket(seq: number, n: number): void {
    if (n < 4 || PACKET_AT + n + OPENSSH_CHACHA_TAG_LENGTH > this.#mem.length) {
      throw new RangeError(
        `Cannot seal packet: "${n}" bytes is not what packetBuffer() made room for`,
      );
    }
    checkSeq(seq);
    this.#wasm.seal(n, nonceHi(seq), nonceLo(seq));
  }

  /**
   * Verifies `tag` over `sealed` (encrypted length || ciphertext) and returns the decrypted
   * part after the length in a new array, or null if authentication fails.
   */
  openBody(seq: number, sealed: Uint8Array, tag: Uint8Array): Uint8Array | null {
    const n = sealed.length;
    if (n < 4 || tag.length !== OPENSSH_CHACHA_TAG_LENGTH) return null;
    checkSeq(seq);
    const mem = this.#room(n, "open");
    mem.set(sealed, PACKET_AT);
    mem.set(tag, PACKET_AT + n);
    if (this.#wasm.open(n, nonceHi(seq), nonceLo(seq)) !== 1) return null;
    return mem.slice(PACKET_AT + 4, PACKET_AT + n);
  }
}

// Direct access to the module's primitives, for the tests (RFC 8439 vectors).

/**
 * XORs the ChaCha20 keystream of a 16-word `state` (constants, key, 64-bit block counter in
 * words 12..13, nonce in 14..15) into a copy of `data`, through the WebAssembly module.
 */
export function chachaXorWasm(state: Uint32Array, data: Uint8Array): Uint8Array {
  if (state.length !== 16) throw new RangeError("Invalid state: must be 16 words");
  const wasm = instantiate();
  const need = PACKET_AT + data.length;
  const have = wasm.memory.buffer.byteLength;
  if (need > have) wasm.memory.grow(Math.ceil((need - have) / WASM_PAGE));
  const mem = new Uint8Array(wasm.memory.buffer);
  const view = new DataView(wasm.memory.buffer);
  for (let i = 0; i < 16; i++) view.setUint32(SCRATCH_AT + 4 * i, state[i], true);
  mem.set(data, PACKET_AT);
  wasm.xor(SCRATCH_AT, PACKET_AT, data.length);
  return mem.slice(PACKET_AT, PACKET_AT + data.length);
}

/** Poly1305 (RFC 8439 §2.5) of `msg` under a 32-byte key, through the WebAssembly module. */
export function poly1305Wasm(key: Uint8Array, msg: Uint8Array): Uint8Array {
  if (key.length !== 32) throw new RangeError(`Invalid key: must be 32 bytes, got ${key.length}`);
  const wasm = instantiate();
  const need = PACKET_AT + msg.length;
  const have = wasm.memory.buffer.byteLength;
  if (need > have) wasm.memory.grow(Math.ceil((need - have) / WASM_PAGE));
  const mem = new Uint8Array(wasm.memory.buffer);
  mem.set(key, SCRATCH_AT);
  mem.set(msg, PACKET_AT);
  wasm.poly1305(SCRATCH_AT, PACKET_AT, msg.length, SCRATCH_AT + 32);
  return mem.slice(SCRATCH_AT + 32, SCRATCH_AT + 48);
}
