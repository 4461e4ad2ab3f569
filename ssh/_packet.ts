// The binary packet protocol (RFC 4253 section 6) over the modes of
// `_cipher.ts`: the writer seals a whole batch of queued packets at once,
// starting every MAC or GCM call before awaiting any of them, and writes the
// batch in one go; the reader frames packets (and the version line) out of
// what the socket gives.

import { SshError } from "./_errors.ts";
import { bs, bytesEqual } from "./_wire.ts";
import {
  type DirectionKeys,
  incrementGcmIv,
  makeMode,
  MAX_PACKET,
  type Mode,
  plainMode,
} from "./_cipher.ts";

/** A packet payload, whole or as a head and a body (saving a copy of the body). */
export type Payload = Uint8Array | readonly [Uint8Array, Uint8Array];

function payloadLength(p: Payload): number {
  return p instanceof Uint8Array ? p.length : p[0].length + p[1].length;
}

/** Writes packet_length || padding_length || payload || padding at `dst[at..]`. */
function writePacket(
  dst: Uint8Array,
  at: number,
  payload: Payload,
  packetLen: number,
  random: Uint8Array,
): void {
  let size: number;
  if (payload instanceof Uint8Array) {
    dst.set(payload, at + 5);
    size = payload.length;
  } else {
    dst.set(payload[0], at + 5);
    dst.set(payload[1], at + 5 + payload[0].length);
    size = payload[0].length + payload[1].length;
  }
  const pad = packetLen - 1 - size;
  dst[at] = packetLen >>> 24;
  dst[at + 1] = packetLen >>> 16;
  dst[at + 2] = packetLen >>> 8;
  dst[at + 3] = packetLen;
  dst[at + 4] = pad;
  dst.set(random.subarray(0, pad), at + 5 + size);
}

/**
 * Largest batch sealed into a reused buffer (two per direction, grown on
 * demand): a full batch of 32 KiB packets fits. Writing into fresh memory
 * costs a page fault per 4 KiB here, more than sealing it.
 */
const OUTPUT_REUSE = 4 * 1024 * 1024;

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

  /**
   * Two output buffers, used in turn, instead of a fresh one per batch
   * (BENCHMARKS.md). Only batches up to OUTPUT_REUSE bytes reuse them.
   */
  #outputs: Uint8Array<ArrayBuffer>[] = [new Uint8Array(0), new Uint8Array(0)];
  #turn = 0;

  #output(total: number): Uint8Array<ArrayBuffer> {
    if (total > OUTPUT_REUSE) return new Uint8Array(total);
    this.#turn ^= 1;
    let out = this.#outputs[this.#turn];
    if (out.length < total) {
      out = new Uint8Array(Math.min(OUTPUT_REUSE, Math.max(total, 2 * out.length)));
      this.#outputs[this.#turn] = out;
    }
    return out.subarray(0, total);
  }

  /**
   * Seals payloads into one buffer of consecutive packets, valid until the
   * next-but-one call (the write loop writes a batch while sealing the next).
   * Every MAC or GCM call starts before any is awaited.
   */
  async seal(payloads: readonly Payload[]): Promise<Uint8Array> {
    const mode = this.#mode;
    const { sizes, total, streamBytes } = layout(mode, payloads);
    const out = this.#output(total);
    const view = new DataView(out.buffer);
    if (mode.ks !== null) {
      const wait = mode.ks.ensure(streamBytes);
      if (wait !== null) await wait;
    }
    const random = crypto.getRandomValues(new Uint8Array(32));
    const pending: Promise<ArrayBuffer>[] = [];
    let off = 4;
    for (let i = 0; i < payloads.length; i++) {
      const packetLen = sizes[i];
      const end = off + 4 + packetLen;
      if (mode.kind === "chacha") {
        // Built and sealed in the module's memory: one copy in, one copy out.
        const buf = mode.chacha!.packetBuffer(4 + packetLen);
        writePacket(buf, 0, payloads[i], packetLen, random);
        mode.chacha!.sealPacket(this.#seq, 4 + packetLen);
        out.set(buf, off);
      } else {
        writePacket(out, off, payloads[i], packetLen, random);
        const sealing = this.#sealInPlace(out, view, off, end);
        if (sealing !== null) pending.push(sealing);
      }
      this.#seq = (this.#seq + 1) >>> 0;
      off = end + mode.macLen;
    }
    if (pending.length > 0) placeSealed(mode, out, sizes, await Promise.all(pending));
    return out.subarray(4);
  }

  /**
   * Encrypts the packet at `out[off..end]` (its sequence number goes in the
   * four bytes before it) and starts its MAC, or its GCM encryption; null
   * for the plain mode.
   */
  #sealInPlace(
    out: Uint8Array<ArrayBuffer>,
    view: DataView,
    off: number,
    end: number,
  ): Promise<ArrayBuffer> | null {
    const mode = this.#mode;
    switch (mode.kind) {
      case "ctr": {
        // The MAC is over the plaintext; sign() copies its input at once.
        view.setUint32(off - 4, this.#seq);
        const mac = crypto.subtle.sign("HMAC", mode.hmac!, out.subarray(off - 4, end));
        mode.ks!.xor(out.subarray(off, end));
        return mac;
      }
      case "etm":
        mode.ks!.xor(out.subarray(off + 4, end));
        view.setUint32(off - 4, this.#seq);
        return crypto.subtle.sign("HMAC", mode.hmac!, out.subarray(off - 4, end));
      case "gcm": {
        const sealed = crypto.subtle.encrypt(
          { name: "AES-GCM", iv: bs(mode.iv), additionalData: out.subarray(off, off + 4) },
          mode.aes!,
          out.subarray(off + 4, end),
        );
        incrementGcmIv(mode.iv);
        return sealed;
      }
      default:
        return null;
    }
  }
}

/**
 * The wire size of each packet (length and padding), of the whole batch
 * (with a spare four bytes in front for the first sequence number), and the
 * bytes of key stream the batch uses.
 */
function layout(
  mode: Mode,
  payloads: readonly Payload[],
): { sizes: number[]; total: number; streamBytes: number } {
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
  return { sizes, total, streamBytes };
}

/** Puts each MAC after its packet, or each GCM ciphertext and tag over its body. */
function placeSealed(mode: Mode, out: Uint8Array, sizes: number[], results: ArrayBuffer[]): void {
  let off = 4;
  for (let i = 0; i < sizes.length; i++) {
    const end = off + 4 + sizes[i];
    const r = new Uint8Array(results[i]);
    if (mode.kind === "gcm") out.set(r, off + 4);
    else out.set(r, end);
    off = end + mode.macLen;
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

/** A packet that fails its MAC or tag (disconnect reason 5). */
function macMismatch(what: string, cause?: unknown): SshError {
  return new SshError(
    `Cannot read packet: ${what}`,
    cause === undefined ? { reason: 5 } : { reason: 5, cause },
  );
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
    // padding_length || payload || padding
    const packet = await this.#open(r);
    this.#seq = (this.#seq + 1) >>> 0;
    const pad = packet[0];
    if (pad < 4 || pad >= packet.length) throw packetError(`bad padding length "${pad}"`);
    return packet.subarray(1, packet.length - pad);
  }

  /** The next packet, its length's bytes at hand, opened by the mode in force. */
  #open(r: ByteReader): Promise<Uint8Array> {
    switch (this.#mode.kind) {
      case "plain":
        return this.#openPlain(r);
      case "ctr":
        return this.#openCtr(r);
      case "etm":
        return this.#openEtm(r);
      case "chacha":
        return this.#openChacha(r);
      case "gcm":
        return this.#openGcm(r);
    }
  }

  async #openPlain(r: ByteReader): Promise<Uint8Array> {
    const len = new DataView(r.peek(4).slice().buffer).getUint32(0);
    if (len > MAX_PACKET) throw packetError(`oversized packet "${len}"`);
    if (len < 5) throw packetError(`bad packet length "${len}"`);
    if (!(await r.fill(4 + len))) throw packetError("truncated packet");
    const packet = r.peek(4 + len).slice(4);
    r.consume(4 + len);
    return packet;
  }

  /** AES-CTR, then HMAC over the sequence number and the plaintext. */
  async #openCtr(r: ByteReader): Promise<Uint8Array> {
    const mode = this.#mode;
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
    if (!bytesEqual(expect, mac)) throw macMismatch("MAC mismatch");
    return buf.subarray(8);
  }

  /** Encrypt-then-MAC: the MAC checked over the ciphertext first. */
  async #openEtm(r: ByteReader): Promise<Uint8Array> {
    const mode = this.#mode;
    const len = new DataView(r.peek(4).slice().buffer).getUint32(0);
    this.#checkLength(len, 16, true);
    if (!(await r.fill(4 + len + 32))) throw packetError("truncated packet");
    const buf = new Uint8Array(8 + len);
    new DataView(buf.buffer).setUint32(0, this.#seq);
    buf.set(r.peek(4 + len), 4);
    const mac = r.peek(4 + len + 32).slice(4 + len);
    r.consume(4 + len + 32);
    const ok = await crypto.subtle.verify("HMAC", mode.hmac!, mac, buf);
    if (!ok) throw macMismatch("MAC mismatch");
    const wait = mode.ks!.ensure(len);
    if (wait !== null) await wait;
    const packet = buf.subarray(8);
    mode.ks!.xor(packet);
    return packet;
  }

  async #openChacha(r: ByteReader): Promise<Uint8Array> {
    const chacha = this.#mode.chacha!;
    const len = chacha.decryptLength(this.#seq, r.peek(4));
    this.#checkLength(len, 8, true);
    if (!(await r.fill(4 + len + 16))) throw packetError("truncated packet");
    const all = r.peek(4 + len + 16);
    const body = chacha.openBody(this.#seq, all.subarray(0, 4 + len), all.subarray(4 + len));
    r.consume(4 + len + 16);
    if (body === null) throw macMismatch("authentication tag mismatch");
    return body;
  }

  async #openGcm(r: ByteReader): Promise<Uint8Array> {
    const mode = this.#mode;
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
      return new Uint8Array(await decrypting);
    } catch (err) {
      throw macMismatch("authentication tag mismatch", err);
    }
  }
}
