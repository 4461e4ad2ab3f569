// The binary packet protocol (RFC 4253 section 6) with the ciphers and MACs
// OpenSSH 9 offers that WebCrypto can do: aes{128,256}-ctr with hmac-sha2-256
// (plain or -etm) and aes{128,256}-gcm@openssh.com; and
// chacha20-poly1305@openssh.com, which WebCrypto lacks, in TypeScript
// (_chacha.ts), synchronous.
//
// WebCrypto calls are asynchronous and cost tens of microseconds each, so:
// CTR runs from a keystream made in large chunks ahead of time (AES-CTR over
// zeros, one call per 128 KiB) and XORed in 32-bit words, which also lets the
// reader decrypt the first block for the length without a round trip; the
// writer seals a whole batch of queued packets at once, starting every MAC or
// GCM call before awaiting any of them, and writes the batch in one go.

import { ChaChaPolyOpenSsh } from "./_chacha.ts";
import { SshError } from "./_errors.ts";
import { bs, bytesEqual } from "./_wire.ts";

/** Largest packet_length accepted (OpenSSH's PACKET_MAX_SIZE). */
export const MAX_PACKET = 256 * 1024;

/** Ciphers by name; `aead` ones carry their own tag and use no MAC. */
export const CIPHERS: Record<string, { keyLen: number; ivLen: number; aead: boolean }> = {
  "chacha20-poly1305@openssh.com": { keyLen: 64, ivLen: 0, aead: true },
  "aes128-gcm@openssh.com": { keyLen: 16, ivLen: 12, aead: true },
  "aes256-gcm@openssh.com": { keyLen: 32, ivLen: 12, aead: true },
  "aes128-ctr": { keyLen: 16, ivLen: 16, aead: false },
  "aes256-ctr": { keyLen: 32, ivLen: 16, aead: false },
};

export const MACS: Record<string, { keyLen: number; etm: boolean }> = {
  "hmac-sha2-256-etm@openssh.com": { keyLen: 32, etm: true },
  "hmac-sha2-256": { keyLen: 32, etm: false },
};

/** Keys for one direction, as derived by the key exchange. */
export interface DirectionKeys {
  cipher: string;
  /** Ignored for AEAD ciphers. */
  mac: string;
  key: Uint8Array;
  iv: Uint8Array;
  macKey: Uint8Array;
}

const KEYSTREAM_CHUNK = 128 * 1024;
const ZEROS = new Uint8Array(KEYSTREAM_CHUNK);

function incrementCounter(counter: Uint8Array, blocks: number): void {
  let carry = blocks;
  for (let i = 15; i >= 0 && carry > 0; i--) {
    const v = counter[i] + (carry & 0xff);
    counter[i] = v & 0xff;
    carry = (carry >>> 8) + (v >>> 8);
  }
}

/** XORs `ks[ksPos..]` into `dst`, by words when both are 4-byte aligned. */
function xorInto(dst: Uint8Array, ks: Uint8Array, ksPos: number): void {
  const n = dst.length;
  let i = 0;
  if ((dst.byteOffset & 3) === 0 && ((ks.byteOffset + ksPos) & 3) === 0) {
    const words = n >>> 2;
    const d = new Uint32Array(dst.buffer, dst.byteOffset, words);
    const k = new Uint32Array(ks.buffer, ks.byteOffset + ksPos, words);
    for (let w = 0; w < words; w++) d[w] ^= k[w];
    i = words << 2;
  }
  for (; i < n; i++) dst[i] ^= ks[ksPos + i];
}

/** AES-CTR keystream generated ahead in chunks. */
class Keystream {
  readonly #key: CryptoKey;
  readonly #counter: Uint8Array;
  #buf: Uint8Array = new Uint8Array(0);
  #pos = 0;
  #pending: Promise<Uint8Array> | null = null;

  constructor(key: CryptoKey, iv: Uint8Array) {
    this.#key = key;
    this.#counter = iv.slice();
    this.#pending = this.#generate(KEYSTREAM_CHUNK);
  }

  #generate(n: number): Promise<Uint8Array> {
    const counter = this.#counter.slice();
    incrementCounter(this.#counter, n / 16);
    const zeros = n <= ZEROS.length ? ZEROS.subarray(0, n) : new Uint8Array(n);
    return crypto.subtle.encrypt({ name: "AES-CTR", counter, length: 128 }, this.#key, zeros)
      .then((b) => new Uint8Array(b));
  }

  /** Makes `n` bytes available; returns null when they already are. */
  ensure(n: number): Promise<void> | null {
    return this.#buf.length - this.#pos >= n ? null : this.#refill(n);
  }

  async #refill(n: number): Promise<void> {
    while (this.#buf.length - this.#pos < n) {
      const avail = this.#buf.length - this.#pos;
      const want = Math.max(KEYSTREAM_CHUNK, Math.ceil((n - avail) / 16) * 16);
      let next = this.#pending;
      this.#pending = null;
      // A prefetched chunk always comes first: the counter ran on past it.
      next ??= this.#generate(want);
      const chunk = await next;
      if (avail === 0) {
        this.#buf = chunk;
      } else {
        const merged = new Uint8Array(avail + chunk.length);
        merged.set(this.#buf.subarray(this.#pos));
        merged.set(chunk, avail);
        this.#buf = merged;
      }
      this.#pos = 0;
    }
    this.#pending = this.#generate(KEYSTREAM_CHUNK);
  }

  /** Waits for a chunk still being generated (so no crypto op outlives us). */
  async drain(): Promise<void> {
    await this.#pending?.catch(() => {});
  }

  /** XORs the next `dst.length` keystream bytes into `dst` (after ensure). */
  xor(dst: Uint8Array): void {
    xorInto(dst, this.#buf, this.#pos);
    this.#pos += dst.length;
  }
}

function importAes(name: "AES-CTR" | "AES-GCM", key: Uint8Array): Promise<CryptoKey> {
  return crypto.subtle.importKey("raw", bs(key), name, false, ["encrypt", "decrypt"]);
}

function importHmac(key: Uint8Array): Promise<CryptoKey> {
  return crypto.subtle.importKey("raw", bs(key), { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
    "verify",
  ]);
}

interface Mode {
  kind: "plain" | "ctr" | "etm" | "gcm" | "chacha";
  chacha?: ChaChaPolyOpenSsh;
  ks: Keystream | null;
  aes: CryptoKey | null;
  hmac: CryptoKey | null;
  iv: Uint8Array;
  macLen: number;
}

/** The mode before the first key exchange: no cipher, no MAC. */
function plainMode(): Mode {
  return { kind: "plain", ks: null, aes: null, hmac: null, iv: new Uint8Array(0), macLen: 0 };
}

async function makeMode(keys: DirectionKeys | null): Promise<Mode> {
  if (keys === null) return plainMode();
  const c = CIPHERS[keys.cipher];
  if (keys.cipher === "chacha20-poly1305@openssh.com") {
    return {
      kind: "chacha",
      chacha: new ChaChaPolyOpenSsh(keys.key.subarray(0, 64)),
      ks: null,
      aes: null,
      hmac: null,
      iv: new Uint8Array(0),
      macLen: 16,
    };
  }
  if (c.aead) {
    const aes = await importAes("AES-GCM", keys.key.subarray(0, c.keyLen));
    return { kind: "gcm", ks: null, aes, hmac: null, iv: keys.iv.slice(0, 12), macLen: 16 };
  }
  const m = MACS[keys.mac];
  const aes = await importAes("AES-CTR", keys.key.subarray(0, c.keyLen));
  const hmac = await importHmac(keys.macKey.subarray(0, m.keyLen));
  return {
    kind: m.etm ? "etm" : "ctr",
    ks: new Keystream(aes, keys.iv.subarray(0, 16)),
    aes,
    hmac,
    iv: new Uint8Array(0),
    macLen: 32,
  };
}

function incrementGcmIv(iv: Uint8Array): void {
  for (let i = 11; i >= 4; i--) {
    if (++iv[i] !== 256) {
      iv[i] &= 0xff;
      return;
    }
    iv[i] = 0;
  }
}

/** A packet payload, whole or as a head and a body (saving a copy of the body). */
export type Payload = Uint8Array | readonly [Uint8Array, Uint8Array];

function payloadLength(p: Payload): number {
  return p instanceof Uint8Array ? p.length : p[0].length + p[1].length;
}

/** Turns payloads into wire packets for one direction. */
export class PacketSealer {
  #mode: Mode;
  #seq = 0;

  constructor(mode: Mode, seq = 0) {
    this.#mode = mode;
    this.#seq = seq;
  }

  /** Sequence number of the next packet. */
  get seq(): number {
    return this.#seq;
  }

  static plain(): PacketSealer {
    return new PacketSealer(plainMode());
  }

  /** A sealer with new keys, continuing (or, strict, restarting) the sequence. */
  static async create(keys: DirectionKeys, seq: number): Promise<PacketSealer> {
    return new PacketSealer(await makeMode(keys), seq);
  }

  /** Waits for background crypto work. */
  async drain(): Promise<void> {
    await this.#mode.ks?.drain();
  }

  /** Seals payloads into one buffer of consecutive packets. */
  async seal(payloads: readonly Payload[]): Promise<Uint8Array> {
    const mode = this.#mode;
    const block = mode.kind === "plain" || mode.kind === "chacha" ? 8 : 16;
    const lenOutside = mode.kind === "etm" || mode.kind === "gcm" || mode.kind === "chacha";
    const sizes = new Array<number>(payloads.length);
    let total = 4;
    let streamBytes = 0;
    for (let i = 0; i < payloads.length; i++) {
      const size = payloadLength(payloads[i]);
      const base = (lenOutside ? 1 : 5) + size;
      let pad = block - (base % block);
      if (pad < 4) pad += block;
      const packetLen = 1 + size + pad;
      sizes[i] = packetLen;
      total += 4 + packetLen + mode.macLen;
      streamBytes += lenOutside ? packetLen : 4 + packetLen;
    }
    const out = new Uint8Array(total);
    const view = new DataView(out.buffer);
    if (mode.ks !== null) {
      const wait = mode.ks.ensure(streamBytes);
      if (wait !== null) await wait;
    }
    const random = crypto.getRandomValues(new Uint8Array(32));
    const pending: Promise<ArrayBuffer>[] = [];
    let off = 4;
    for (let i = 0; i < payloads.length; i++) {
      const payload = payloads[i];
      const packetLen = sizes[i];
      let size: number;
      if (payload instanceof Uint8Array) {
        out.set(payload, off + 5);
        size = payload.length;
      } else {
        out.set(payload[0], off + 5);
        out.set(payload[1], off + 5 + payload[0].length);
        size = payload[0].length + payload[1].length;
      }
      const pad = packetLen - 1 - size;
      view.setUint32(off, packetLen);
      out[off + 4] = pad;
      out.set(random.subarray(0, pad), off + 5 + size);
      const end = off + 4 + packetLen;
      switch (mode.kind) {
        case "ctr":
          // The MAC is over the plaintext; sign() copies its input at once.
          view.setUint32(off - 4, this.#seq);
          pending.push(crypto.subtle.sign("HMAC", mode.hmac!, out.subarray(off - 4, end)));
          mode.ks!.xor(out.subarray(off, end));
          break;
        case "etm":
          mode.ks!.xor(out.subarray(off + 4, end));
          view.setUint32(off - 4, this.#seq);
          pending.push(crypto.subtle.sign("HMAC", mode.hmac!, out.subarray(off - 4, end)));
          break;
        case "gcm":
          pending.push(
            crypto.subtle.encrypt(
              { name: "AES-GCM", iv: bs(mode.iv), additionalData: out.subarray(off, off + 4) },
              mode.aes!,
              out.subarray(off + 4, end),
            ),
          );
          incrementGcmIv(mode.iv);
          break;
        case "chacha":
          mode.chacha!.sealInPlace(this.#seq, out.subarray(off, end + 16));
          break;
      }
      this.#seq = (this.#seq + 1) >>> 0;
      off = end + mode.macLen;
    }
    if (pending.length > 0) {
      const results = await Promise.all(pending);
      off = 4;
      for (let i = 0; i < payloads.length; i++) {
        const end = off + 4 + sizes[i];
        const r = new Uint8Array(results[i]);
        if (mode.kind === "gcm") out.set(r, off + 4);
        else out.set(r, end);
        off = end + mode.macLen;
      }
    }
    return out.subarray(4);
  }
}

/** Buffered reads from a connection. */
export class ByteReader {
  readonly #conn: { read(p: Uint8Array): Promise<number | null> };
  #buf = new Uint8Array(MAX_PACKET * 2);
  #start = 0;
  #end = 0;
  /** Total bytes received. */
  received = 0;

  constructor(conn: { read(p: Uint8Array): Promise<number | null> }) {
    this.#conn = conn;
  }

  get available(): number {
    return this.#end - this.#start;
  }

  /** Ensures `n` buffered bytes; false at end of stream. */
  async fill(n: number): Promise<boolean> {
    if (this.#end - this.#start >= n) return true;
    if (this.#start + n > this.#buf.length) {
      this.#buf.copyWithin(0, this.#start, this.#end);
      this.#end -= this.#start;
      this.#start = 0;
    }
    while (this.#end - this.#start < n) {
      const got = await this.#conn.read(this.#buf.subarray(this.#end));
      if (got === null) return false;
      this.#end += got;
      this.received += got;
    }
    return true;
  }

  /** A view of the next `n` bytes (valid until the next fill). */
  peek(n: number): Uint8Array {
    return this.#buf.subarray(this.#start, this.#start + n);
  }

  consume(n: number): void {
    this.#start += n;
    if (this.#start === this.#end) this.#start = this.#end = 0;
  }

  /**
   * Reads a CR LF (or LF) terminated line of at most `max` bytes counting its
   * terminator, however the bytes were split into reads; null at end of
   * stream; throws SshError when the line is longer.
   */
  async readLine(max: number): Promise<string | null> {
    let scanned = 0;
    while (true) {
      const view = this.#buf.subarray(this.#start, this.#end);
      const nl = view.indexOf(10, scanned);
      if (nl >= max) throw new SshError("Cannot read version: line too long", { reason: 2 });
      if (nl >= 0) {
        let line = view.subarray(0, nl);
        if (line.length > 0 && line[line.length - 1] === 13) line = line.subarray(0, -1);
        const text = new TextDecoder().decode(line);
        this.consume(nl + 1);
        return text;
      }
      scanned = view.length;
      if (scanned >= max) throw new SshError("Cannot read version: line too long", { reason: 2 });
      if (!(await this.fill(scanned + 1))) return null;
    }
  }
}

function packetError(what: string): SshError {
  return new SshError(`Cannot read packet: ${what}`, { reason: 2 });
}

/** Reads packets for one direction. */
export class PacketOpener {
  #mode: Mode;
  #seq = 0;

  constructor(mode: Mode, seq = 0) {
    this.#mode = mode;
    this.#seq = seq;
  }

  /** Sequence number of the next packet. */
  get seq(): number {
    return this.#seq;
  }

  static plain(): PacketOpener {
    return new PacketOpener(plainMode());
  }

  static async create(keys: DirectionKeys, seq: number): Promise<PacketOpener> {
    return new PacketOpener(await makeMode(keys), seq);
  }

  #checkLength(len: number, block: number, lenOutside: boolean): void {
    if (len > MAX_PACKET) throw packetError(`oversized packet "${len}"`);
    if (len < (lenOutside ? block : block - 4) || (len + (lenOutside ? 0 : 4)) % block !== 0) {
      throw packetError(`bad packet length "${len}"`);
    }
  }

  /** Waits for background crypto work. */
  async drain(): Promise<void> {
    await this.#mode.ks?.drain();
  }

  /** The next payload; null at a clean end of stream. Throws SshError. */
  async next(r: ByteReader): Promise<Uint8Array | null> {
    const mode = this.#mode;
    if (!(await r.fill(mode.kind === "ctr" ? 16 : 4))) {
      if (r.available === 0) return null;
      throw packetError("truncated packet");
    }
    let packet: Uint8Array; // padding_length || payload || padding
    switch (mode.kind) {
      case "plain": {
        const len = new DataView(r.peek(4).slice().buffer).getUint32(0);
        if (len > MAX_PACKET) throw packetError(`oversized packet "${len}"`);
        if (len < 5) throw packetError(`bad packet length "${len}"`);
        if (!(await r.fill(4 + len))) throw packetError("truncated packet");
        packet = r.peek(4 + len).slice(4);
        r.consume(4 + len);
        break;
      }
      case "ctr": {
        const ks = mode.ks!;
        let wait = ks.ensure(16);
        if (wait !== null) await wait;
        const first = r.peek(16).slice();
        ks.xor(first);
        const len = new DataView(first.buffer).getUint32(0);
        this.#checkLength(len, 16, false);
        if (!(await r.fill(4 + len + 32))) throw packetError("truncated packet");
        const buf = new Uint8Array(8 + len);
        new DataView(buf.buffer).setUint32(0, this.#seq);
        buf.set(first, 4);
        buf.set(r.peek(4 + len).subarray(16), 20);
        const mac = r.peek(4 + len + 32).slice(4 + len);
        r.consume(4 + len + 32);
        wait = ks.ensure(len - 12);
        if (wait !== null) await wait;
        ks.xor(buf.subarray(20));
        const expect = new Uint8Array(await crypto.subtle.sign("HMAC", mode.hmac!, buf));
        if (!bytesEqual(expect, mac)) {
          throw new SshError("Cannot read packet: MAC mismatch", { reason: 5 });
        }
        packet = buf.subarray(8);
        break;
      }
      case "etm": {
        const len = new DataView(r.peek(4).slice().buffer).getUint32(0);
        this.#checkLength(len, 16, true);
        if (!(await r.fill(4 + len + 32))) throw packetError("truncated packet");
        const buf = new Uint8Array(8 + len);
        new DataView(buf.buffer).setUint32(0, this.#seq);
        buf.set(r.peek(4 + len), 4);
        const mac = r.peek(4 + len + 32).slice(4 + len);
        r.consume(4 + len + 32);
        const ok = await crypto.subtle.verify("HMAC", mode.hmac!, mac, buf);
        if (!ok) throw new SshError("Cannot read packet: MAC mismatch", { reason: 5 });
        const wait = mode.ks!.ensure(len);
        if (wait !== null) await wait;
        packet = buf.subarray(8);
        mode.ks!.xor(packet);
        break;
      }
      case "chacha": {
        const len = mode.chacha!.decryptLength(this.#seq, r.peek(4));
        this.#checkLength(len, 8, true);
        if (!(await r.fill(4 + len + 16))) throw packetError("truncated packet");
        const all = r.peek(4 + len + 16);
        const body = mode.chacha!.openBody(
          this.#seq,
          all.subarray(0, 4 + len),
          all.subarray(4 + len),
        );
        r.consume(4 + len + 16);
        if (body === null) {
          throw new SshError("Cannot read packet: authentication tag mismatch", { reason: 5 });
        }
        packet = body;
        break;
      }
      case "gcm": {
        const head = r.peek(4).slice();
        const len = new DataView(head.buffer).getUint32(0);
        this.#checkLength(len, 16, true);
        if (!(await r.fill(4 + len + 16))) throw packetError("truncated packet");
        const sealed = r.peek(4 + len + 16).subarray(4);
        const iv = mode.iv.slice();
        incrementGcmIv(mode.iv);
        const decrypting = crypto.subtle.decrypt(
          { name: "AES-GCM", iv, additionalData: head },
          mode.aes!,
          bs(sealed),
        );
        r.consume(4 + len + 16);
        try {
          packet = new Uint8Array(await decrypting);
        } catch (err) {
          throw new SshError("Cannot read packet: authentication tag mismatch", {
            reason: 5,
            cause: err,
          });
        }
        break;
      }
    }
    this.#seq = (this.#seq + 1) >>> 0;
    const pad = packet[0];
    if (pad < 4 || pad >= packet.length) throw packetError(`bad padding length "${pad}"`);
    return packet.subarray(1, packet.length - pad);
  }
}
