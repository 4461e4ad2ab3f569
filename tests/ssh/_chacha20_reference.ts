/**
 * ChaCha20 (RFC 8439 and the original 64-bit-nonce variant) and Poly1305 in
 * TypeScript: the reference the WebAssembly cipher (ssh/_chacha.ts) is
 * checked against. The library itself no longer uses it.
 * @module
 */

/** Number of 32-bit words in a ChaCha20 state. */
export const CHACHA_STATE_WORDS = 16;

const SIGMA0 = 0x61707865;
const SIGMA1 = 0x3320646e;
const SIGMA2 = 0x79622d32;
const SIGMA3 = 0x6b206574;

/** Scratch keystream block, reused to avoid allocation per block. */
const KS = new Uint32Array(16);

function le32(b: Uint8Array, i: number): number {
  return (b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)) >>> 0;
}

function checkLength(name: string, b: Uint8Array, n: number): void {
  if (b.length !== n) throw new RangeError(`${name} must be ${n} bytes, got ${b.length}`);
}

/**
 * ChaCha20 block function: runs 20 rounds over the 16-word `input` state and writes
 * `rounds(input) + input` to `out` (which may alias `input`).
 */
export function chachaBlock(input: Uint32Array, out: Uint32Array): void {
  const j0 = input[0] | 0, j1 = input[1] | 0, j2 = input[2] | 0, j3 = input[3] | 0;
  const j4 = input[4] | 0, j5 = input[5] | 0, j6 = input[6] | 0, j7 = input[7] | 0;
  const j8 = input[8] | 0, j9 = input[9] | 0, j10 = input[10] | 0, j11 = input[11] | 0;
  const j12 = input[12] | 0, j13 = input[13] | 0, j14 = input[14] | 0, j15 = input[15] | 0;
  let x0 = j0, x1 = j1, x2 = j2, x3 = j3, x4 = j4, x5 = j5, x6 = j6, x7 = j7;
  let x8 = j8, x9 = j9, x10 = j10, x11 = j11, x12 = j12, x13 = j13, x14 = j14, x15 = j15;
  for (let i = 0; i < 10; i++) {
    x0 = (x0 + x4) | 0;
    x12 ^= x0;
    x12 = (x12 << 16) | (x12 >>> 16);
    x8 = (x8 + x12) | 0;
    x4 ^= x8;
    x4 = (x4 << 12) | (x4 >>> 20);
    x0 = (x0 + x4) | 0;
    x12 ^= x0;
    x12 = (x12 << 8) | (x12 >>> 24);
    x8 = (x8 + x12) | 0;
    x4 ^= x8;
    x4 = (x4 << 7) | (x4 >>> 25);
    x1 = (x1 + x5) | 0;
    x13 ^= x1;
    x13 = (x13 << 16) | (x13 >>> 16);
    x9 = (x9 + x13) | 0;
    x5 ^= x9;
    x5 = (x5 << 12) | (x5 >>> 20);
    x1 = (x1 + x5) | 0;
    x13 ^= x1;
    x13 = (x13 << 8) | (x13 >>> 24);
    x9 = (x9 + x13) | 0;
    x5 ^= x9;
    x5 = (x5 << 7) | (x5 >>> 25);
    x2 = (x2 + x6) | 0;
    x14 ^= x2;
    x14 = (x14 << 16) | (x14 >>> 16);
    x10 = (x10 + x14) | 0;
    x6 ^= x10;
    x6 = (x6 << 12) | (x6 >>> 20);
    x2 = (x2 + x6) | 0;
    x14 ^= x2;
    x14 = (x14 << 8) | (x14 >>> 24);
    x10 = (x10 + x14) | 0;
    x6 ^= x10;
    x6 = (x6 << 7) | (x6 >>> 25);
    x3 = (x3 + x7) | 0;
    x15 ^= x3;
    x15 = (x15 << 16) | (x15 >>> 16);
    x11 = (x11 + x15) | 0;
    x7 ^= x11;
    x7 = (x7 << 12) | (x7 >>> 20);
    x3 = (x3 + x7) | 0;
    x15 ^= x3;
    x15 = (x15 << 8) | (x15 >>> 24);
    x11 = (x11 + x15) | 0;
    x7 ^= x11;
    x7 = (x7 << 7) | (x7 >>> 25);
    x0 = (x0 + x5) | 0;
    x15 ^= x0;
    x15 = (x15 << 16) | (x15 >>> 16);
    x10 = (x10 + x15) | 0;
    x5 ^= x10;
    x5 = (x5 << 12) | (x5 >>> 20);
    x0 = (x0 + x5) | 0;
    x15 ^= x0;
    x15 = (x15 << 8) | (x15 >>> 24);
    x10 = (x10 + x15) | 0;
    x5 ^= x10;
    x5 = (x5 << 7) | (x5 >>> 25);
    x1 = (x1 + x6) | 0;
    x12 ^= x1;
    x12 = (x12 << 16) | (x12 >>> 16);
    x11 = (x11 + x12) | 0;
    x6 ^= x11;
    x6 = (x6 << 12) | (x6 >>> 20);
    x1 = (x1 + x6) | 0;
    x12 ^= x1;
    x12 = (x12 << 8) | (x12 >>> 24);
    x11 = (x11 + x12) | 0;
    x6 ^= x11;
    x6 = (x6 << 7) | (x6 >>> 25);
    x2 = (x2 + x7) | 0;
    x13 ^= x2;
    x13 = (x13 << 16) | (x13 >>> 16);
    x8 = (x8 + x13) | 0;
    x7 ^= x8;
    x7 = (x7 << 12) | (x7 >>> 20);
    x2 = (x2 + x7) | 0;
    x13 ^= x2;
    x13 = (x13 << 8) | (x13 >>> 24);
    x8 = (x8 + x13) | 0;
    x7 ^= x8;
    x7 = (x7 << 7) | (x7 >>> 25);
    x3 = (x3 + x4) | 0;
    x14 ^= x3;
    x14 = (x14 << 16) | (x14 >>> 16);
    x9 = (x9 + x14) | 0;
    x4 ^= x9;
    x4 = (x4 << 12) | (x4 >>> 20);
    x3 = (x3 + x4) | 0;
    x14 ^= x3;
    x14 = (x14 << 8) | (x14 >>> 24);
    x9 = (x9 + x14) | 0;
    x4 ^= x9;
    x4 = (x4 << 7) | (x4 >>> 25);
  }
  out[0] = x0 + j0;
  out[1] = x1 + j1;
  out[2] = x2 + j2;
  out[3] = x3 + j3;
  out[4] = x4 + j4;
  out[5] = x5 + j5;
  out[6] = x6 + j6;
  out[7] = x7 + j7;
  out[8] = x8 + j8;
  out[9] = x9 + j9;
  out[10] = x10 + j10;
  out[11] = x11 + j11;
  out[12] = x12 + j12;
  out[13] = x13 + j13;
  out[14] = x14 + j14;
  out[15] = x15 + j15;
}

/** Fills words 0..11 of `state` (constants and 256-bit key); words 12..15 are left as is. */
export function chachaSetKey(state: Uint32Array, key: Uint8Array): void {
  checkLength("key", key, 32);
  state[0] = SIGMA0;
  state[1] = SIGMA1;
  state[2] = SIGMA2;
  state[3] = SIGMA3;
  for (let i = 0; i < 8; i++) state[4 + i] = le32(key, 4 * i);
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

function incrementCounter(state: Uint32Array, wide: boolean): void {
  const c = (state[12] + 1) >>> 0;
  state[12] = c;
  if (c === 0) {
    if (!wide) throw new RangeError("ChaCha20 32-bit block counter overflow");
    state[13] = (state[13] + 1) >>> 0;
  }
}

/**
 * XORs the keystream of `state` into `src`, writing to `dst` (same length; may be the same
 * array for in-place operation). Advances the block counter in `state`: a 32-bit counter in
 * word 12 (RFC 8439) or, when `wide` is true, a 64-bit counter in words 12..13 (original
 * ChaCha20, as used by OpenSSH).
 */
export function chachaXorState(
  state: Uint32Array,
  src: Uint8Array,
  dst: Uint8Array,
  wide: boolean,
): void {
  const len = src.length;
  if (dst.length < len) throw new RangeError("output too short");
  const ks = KS;
  let pos = 0;
  if (LITTLE_ENDIAN && len >= 64 && ((src.byteOffset | dst.byteOffset) & 3) === 0) {
    // Fast path: XOR whole 32-bit words through aligned views (little-endian hosts).
    const words = len >>> 6 << 4;
    const s32 = new Uint32Array(src.buffer, src.byteOffset, words);
    const d32 = new Uint32Array(dst.buffer, dst.byteOffset, words);
    for (let w = 0; w < words; w += 16) {
      chachaBlock(state, ks);
      incrementCounter(state, wide);
      for (let i = 0; i < 16; i++) d32[w + i] = s32[w + i] ^ ks[i];
    }
    pos = words << 2;
  }
  while (pos < len) {
    chachaBlock(state, ks);
    incrementCounter(state, wide);
    if (len - pos >= 64) {
      for (let w = 0; w < 16; w++, pos += 4) {
        const k = ks[w];
        dst[pos] = src[pos] ^ k;
        dst[pos + 1] = src[pos + 1] ^ (k >>> 8);
        dst[pos + 2] = src[pos + 2] ^ (k >>> 16);
        dst[pos + 3] = src[pos + 3] ^ (k >>> 24);
      }
    } else {
      for (let i = 0; pos < len; i++, pos++) {
        dst[pos] = src[pos] ^ (ks[i >>> 2] >>> ((i & 3) << 3));
      }
    }
  }
}

function rfcState(key: Uint8Array, nonce: Uint8Array, counter: number): Uint32Array {
  checkLength("nonce", nonce, 12);
  if (!Number.isInteger(counter) || counter < 0 || counter > 0xffffffff) {
    throw new RangeError("counter must be a uint32");
  }
  const state = new Uint32Array(16);
  chachaSetKey(state, key);
  state[12] = counter;
  state[13] = le32(nonce, 0);
  state[14] = le32(nonce, 4);
  state[15] = le32(nonce, 8);
  return state;
}

/** RFC 8439 §2.3 block function: returns the 64-byte keystream block for (key, nonce, counter). */
export function chacha20Block(key: Uint8Array, nonce: Uint8Array, counter: number): Uint8Array {
  const out = new Uint8Array(64);
  chachaXorState(rfcState(key, nonce, counter), out, out, false);
  return out;
}

/**
 * RFC 8439 §2.4 ChaCha20 encryption/decryption (32-bit counter, 96-bit nonce).
 * Writes into `output` if given (may equal `input`), otherwise into a new array.
 */
export function chacha20Xor(
  key: Uint8Array,
  nonce: Uint8Array,
  counter: number,
  input: Uint8Array,
  output: Uint8Array = new Uint8Array(input.length),
): Uint8Array {
  chachaXorState(rfcState(key, nonce, counter), input, output, false);
  return output;
}

/**
 * Original ChaCha20 (64-bit little-endian block counter, 64-bit nonce), as used by
 * OpenSSH. `counter` is a non-negative safe integer. Writes into `output` if given.
 */
export function chacha20XorOriginal(
  key: Uint8Array,
  nonce: Uint8Array,
  counter: number,
  input: Uint8Array,
  output: Uint8Array = new Uint8Array(input.length),
): Uint8Array {
  checkLength("nonce", nonce, 8);
  if (!Number.isSafeInteger(counter) || counter < 0) {
    throw new RangeError("counter must be a non-negative safe integer");
  }
  const state = new Uint32Array(16);
  chachaSetKey(state, key);
  state[12] = counter >>> 0;
  state[13] = Math.floor(counter / 4294967296);
  state[14] = le32(nonce, 0);
  state[15] = le32(nonce, 4);
  chachaXorState(state, input, output, true);
  return output;
}

// ---------------------------------------------------------------------------------------------
// Poly1305 with six 22-bit limbs held in doubles. 2^132 = 4 * 2^130 ≡ 20 (mod 2^130 - 5), so
// the folded multipliers are 20 * r_j < 2^26.4. Accumulator limbs stay < 2^23 before each
// multiplication, so every product is < 2^49.4 and a sum of six products plus carry is
// < 2^52: all arithmetic is exact in IEEE doubles.

const M22 = 0x3fffff;
const TWO22 = 4194304;
const INV22 = 1 / TWO22;
const PAD = new Uint8Array(16);

/** One-shot Poly1305 (RFC 8439 §2.5): returns the 16-byte tag of `msg` under a 32-byte key. */
export function poly1305(key: Uint8Array, msg: Uint8Array): Uint8Array {
  checkLength("key", key, 32);
  const t0 = le32(key, 0) & 0x0fffffff;
  const t1 = le32(key, 4) & 0x0ffffffc;
  const t2 = le32(key, 8) & 0x0ffffffc;
  const t3 = le32(key, 12) & 0x0ffffffc;
  const r0 = t0 & M22;
  const r1 = ((t0 >>> 22) | (t1 << 10)) & M22;
  const r2 = ((t1 >>> 12) | (t2 << 20)) & M22;
  const r3 = (t2 >>> 2) & M22;
  const r4 = ((t2 >>> 24) | (t3 << 8)) & M22;
  const r5 = t3 >>> 14;
  const s1 = 20 * r1, s2 = 20 * r2, s3 = 20 * r3, s4 = 20 * r4, s5 = 20 * r5;
  let h0 = 0, h1 = 0, h2 = 0, h3 = 0, h4 = 0, h5 = 0;

  let len = msg.length;
  let full = len & ~15;
  let m = msg;
  let off = 0;
  let hibit = 1 << 18;
  while (true) {
    if (off === full) {
      if (off === len) break;
      // Final partial block: copy, append 0x01, zero-pad; no 2^128 bit.
      const rem = len - off;
      PAD.fill(0);
      PAD.set(msg.subarray(off, len));
      PAD[rem] = 1;
      m = PAD;
      off = 0;
      full = len = 16;
      hibit = 0;
    }
    const w0 = m[off] | (m[off + 1] << 8) | (m[off + 2] << 16) | (m[off + 3] << 24);
    const w1 = m[off + 4] | (m[off + 5] << 8) | (m[off + 6] << 16) | (m[off + 7] << 24);
    const w2 = m[off + 8] | (m[off + 9] << 8) | (m[off + 10] << 16) | (m[off + 11] << 24);
    const w3 = m[off + 12] | (m[off + 13] << 8) | (m[off + 14] << 16) | (m[off + 15] << 24);
    h0 += w0 & M22;
    h1 += ((w0 >>> 22) | (w1 << 10)) & M22;
    h2 += ((w1 >>> 12) | (w2 << 20)) & M22;
    h3 += (w2 >>> 2) & M22;
    h4 += ((w2 >>> 24) | (w3 << 8)) & M22;
    h5 += (w3 >>> 14) | hibit;

    let d0 = h0 * r0 + h1 * s5 + h2 * s4 + h3 * s3 + h4 * s2 + h5 * s1;
    let d1 = h0 * r1 + h1 * r0 + h2 * s5 + h3 * s4 + h4 * s3 + h5 * s2;
    let d2 = h0 * r2 + h1 * r1 + h2 * r0 + h3 * s5 + h4 * s4 + h5 * s3;
    let d3 = h0 * r3 + h1 * r2 + h2 * r1 + h3 * r0 + h4 * s5 + h5 * s4;
    let d4 = h0 * r4 + h1 * r3 + h2 * r2 + h3 * r1 + h4 * r0 + h5 * s5;
    let d5 = h0 * r5 + h1 * r4 + h2 * r3 + h3 * r2 + h4 * r1 + h5 * r0;
    // Carries: each d < 2^52, so d * 2^-22 < 2^30 and `| 0` is an exact floor.
    let c = (d0 * INV22) | 0;
    d0 -= c * TWO22;
    d1 += c;
    c = (d1 * INV22) | 0;
    d1 -= c * TWO22;
    d2 += c;
    c = (d2 * INV22) | 0;
    d2 -= c * TWO22;
    d3 += c;
    c = (d3 * INV22) | 0;
    d3 -= c * TWO22;
    d4 += c;
    c = (d4 * INV22) | 0;
    d4 -= c * TWO22;
    d5 += c;
    c = (d5 * INV22) | 0;
    h5 = d5 - c * TWO22;
    d0 += c * 20;
    c = (d0 * INV22) | 0;
    h0 = d0 - c * TWO22;
    h1 = d1 + c;
    h2 = d2;
    h3 = d3;
    h4 = d4;
    off += 16;
  }

  // Full carry, fold bits >= 2^130, carry again.
  let c = h1 >>> 22;
  h1 &= M22;
  h2 += c;
  c = h2 >>> 22;
  h2 &= M22;
  h3 += c;
  c = h3 >>> 22;
  h3 &= M22;
  h4 += c;
  c = h4 >>> 22;
  h4 &= M22;
  h5 += c;
  c = h5 >>> 20;
  h5 &= 0xfffff;
  h0 += c * 5;
  c = h0 >>> 22;
  h0 &= M22;
  h1 += c;
  c = h1 >>> 22;
  h1 &= M22;
  h2 += c;
  c = h2 >>> 22;
  h2 &= M22;
  h3 += c;
  c = h3 >>> 22;
  h3 &= M22;
  h4 += c;
  c = h4 >>> 22;
  h4 &= M22;
  h5 += c;

  // g = h + 5 - 2^130; select g if non-negative (h >= p), without branching.
  let g0 = h0 + 5;
  c = g0 >>> 22;
  g0 &= M22;
  let g1 = h1 + c;
  c = g1 >>> 22;
  g1 &= M22;
  let g2 = h2 + c;
  c = g2 >>> 22;
  g2 &= M22;
  let g3 = h3 + c;
  c = g3 >>> 22;
  g3 &= M22;
  let g4 = h4 + c;
  c = g4 >>> 22;
  g4 &= M22;
  const g5 = (h5 + c - (1 << 20)) | 0;
  const keepH = g5 >> 31; // -1 if g < 0 (keep h), 0 otherwise
  const useG = ~keepH;
  h0 = (h0 & keepH) | (g0 & useG);
  h1 = (h1 & keepH) | (g1 & useG);
  h2 = (h2 & keepH) | (g2 & useG);
  h3 = (h3 & keepH) | (g3 & useG);
  h4 = (h4 & keepH) | (g4 & useG);
  h5 = (h5 & keepH) | (g5 & useG);

  // tag = (h + s) mod 2^128
  const out = new Uint8Array(16);
  let f = ((h0 | (h1 << 22)) >>> 0) + le32(key, 16);
  writeLe32(out, 0, f);
  f = (((h1 >>> 10) | (h2 << 12)) >>> 0) + le32(key, 20) + (f > 0xffffffff ? 1 : 0);
  writeLe32(out, 4, f);
  f = (((h2 >>> 20) | (h3 << 2) | (h4 << 24)) >>> 0) + le32(key, 24) + (f > 0xffffffff ? 1 : 0);
  writeLe32(out, 8, f);
  f = (((h4 >>> 8) | (h5 << 14)) >>> 0) + le32(key, 28) + (f > 0xffffffff ? 1 : 0);
  writeLe32(out, 12, f);
  return out;
}

function writeLe32(b: Uint8Array, i: number, v: number): void {
  b[i] = v;
  b[i + 1] = v >>> 8;
  b[i + 2] = v >>> 16;
  b[i + 3] = v >>> 24;
}

/** Constant-time (data-independent) equality of two byte arrays of equal length. */
export function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}
