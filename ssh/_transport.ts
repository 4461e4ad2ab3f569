// The SSH transport layer (RFC 4253) for both ends: version exchange, key
// exchange (curve25519-sha256, RFC 8731) with ssh-ed25519 host keys, strict
// key exchange (OpenSSH PROTOCOL, "kex-strict"), ext-info, rekeying, and the
// packet queue the upper layers send through.

import { DISCONNECT, SshError } from "./_errors.ts";
import { CIPHERS, MACS } from "./_cipher.ts";
import { ByteReader, PacketOpener, PacketSealer, type Payload } from "./_packet.ts";
import {
  DEFAULT_CIPHERS,
  DEFAULT_MACS,
  deriveKey,
  KEX_ALGS,
  kexError,
  type KexState,
  KeySwitch,
  negotiate,
  SERVER_CIPHERS,
  sha256,
  sharedSecret,
  STRICT_C,
  STRICT_S,
} from "./_kex.ts";
import { ED25519, type Ed25519Signer, parsePublicBlob, verifyEd25519 } from "./_keys.ts";
import { SshReader, SshWireError, SshWriter, utf8 } from "./_wire.ts";
import { closeQuietly, isPeerGone, writeAll } from "../_internal/io.ts";
import { asError } from "../_internal/util.ts";

export const MSG = {
  DISCONNECT: 1,
  IGNORE: 2,
  UNIMPLEMENTED: 3,
  DEBUG: 4,
  SERVICE_REQUEST: 5,
  SERVICE_ACCEPT: 6,
  EXT_INFO: 7,
  KEXINIT: 20,
  NEWKEYS: 21,
  KEX_ECDH_INIT: 30,
  KEX_ECDH_REPLY: 31,
  USERAUTH_REQUEST: 50,
  USERAUTH_FAILURE: 51,
  USERAUTH_SUCCESS: 52,
  USERAUTH_BANNER: 53,
  USERAUTH_PK_OK: 60,
  GLOBAL_REQUEST: 80,
  REQUEST_SUCCESS: 81,
  REQUEST_FAILURE: 82,
  CHANNEL_OPEN: 90,
  CHANNEL_OPEN_CONFIRMATION: 91,
  CHANNEL_OPEN_FAILURE: 92,
  CHANNEL_WINDOW_ADJUST: 93,
  CHANNEL_DATA: 94,
  CHANNEL_EXTENDED_DATA: 95,
  CHANNEL_EOF: 96,
  CHANNEL_CLOSE: 97,
  CHANNEL_REQUEST: 98,
  CHANNEL_SUCCESS: 99,
  CHANNEL_FAILURE: 100,
} as const;

export const VERSION = "SSH-2.0-HudSdk_0.1";
/** Rekey after this many bytes either way (RFC 4253 recommends 1 GB). */
const REKEY_BYTES = 1 << 30;
/** And after an hour. */
const REKEY_MS = 3600_000;
const MAX_BATCH = 64;

export interface TransportOptions {
  role: "client" | "server";
  /** Server: the host key. */
  hostKey?: Promise<Ed25519Signer>;
  /** Client: checks the server's host key blob; throws to refuse it. */
  checkHostKey?: (blob: Uint8Array) => void;
  /** Upper-layer packets, in order; throwing SshError ends the connection. */
  onPacket: (payload: Uint8Array) => void | Promise<void>;
  /** Preference lists (the client's order wins). */
  ciphers?: readonly string[];
  macs?: readonly string[];
  /** Rekey limits. */
  rekeyBytes?: number;
  rekeyMs?: number;
}

/** {@linkcode TransportOptions} with every default applied. */
interface TransportSettings extends TransportOptions {
  ciphers: readonly string[];
  macs: readonly string[];
  rekeyBytes: number;
  rekeyMs: number;
}

function transportSettings(options: TransportOptions): TransportSettings {
  const server = options.role === "server";
  return {
    ...options,
    ciphers: options.ciphers ?? (server ? SERVER_CIPHERS : DEFAULT_CIPHERS),
    macs: options.macs ?? DEFAULT_MACS,
    rekeyBytes: options.rekeyBytes ?? REKEY_BYTES,
    rekeyMs: options.rekeyMs ?? REKEY_MS,
  };
}

interface Deferred {
  promise: Promise<void>;
  resolve(): void;
  reject(err: unknown): void;
}

function deferred(): Deferred {
  let resolve!: () => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // A batch nobody awaits must not become an unhandled rejection.
  promise.catch(() => {});
  return { promise, resolve, reject };
}

function protocolError(what: string): SshError {
  return new SshError(`Cannot continue: ${what}`, { reason: DISCONNECT.PROTOCOL_ERROR });
}

/**
 * Writes sealed batches to the socket one after another, so that sealing
 * the next batch overlaps writing the previous one. The batches a write
 * carries are resolved once it is done.
 */
class WireWriter {
  readonly #conn: Deno.Conn;
  #writing: Promise<void> = Promise.resolve();
  /** The batches whose bytes are in the write under way. */
  #waiting: Deferred[] = [];

  constructor(conn: Deno.Conn) {
    this.#conn = conn;
  }

  /** Waits for the write under way; then the batches it carried are sent. */
  async settle(): Promise<void> {
    await this.#writing;
    for (const d of this.#waiting) d.resolve();
    this.#waiting = [];
  }

  /** Starts writing `bytes` once the write under way is done. */
  async write(bytes: Uint8Array): Promise<void> {
    await this.settle();
    this.#writing = writeAll(this.#conn, bytes);
    this.#writing.catch(() => {});
  }

  /** `batch` is sent once the write under way (its last) is done. */
  carries(batch: Deferred): void {
    this.#waiting.push(batch);
  }

  /** Fails the batches not yet sent. */
  fail(err: unknown): void {
    for (const d of this.#waiting) d.reject(err);
  }
}

/** The error a DISCONNECT from the peer ends the connection with (none is sent back). */
function peerDisconnect(payload: Uint8Array): SshError {
  const r = new SshReader(payload, 1);
  const code = r.uint32();
  const text = r.text();
  const err = new SshError(`Disconnected by peer: ${text || "no reason"} (${code})`, {
    reason: code,
  });
  (err as { fromPeer?: boolean }).fromPeer = true;
  return err;
}

/** Message numbers some layer here handles; others get UNIMPLEMENTED. */
const KNOWN_MESSAGES: ReadonlySet<number> = new Set(Object.values(MSG));

/** One SSH connection's transport. */
export class SshTransport {
  readonly #conn: Deno.Conn;
  readonly #opts: TransportSettings;
  readonly #reader: ByteReader;
  #sealer = PacketSealer.plain();
  #opener = PacketOpener.plain();
  #localVersion = VERSION;
  #peerVersion = "";
  #sessionId: Uint8Array | null = null;
  #strict = false;
  #kex: KexState | null = null;
  #kexCount = 0;
  #firstKex = deferred();
  #closedResolve!: (err: Error | null) => void;
  #closed: Promise<Error | null>;
  #isClosed = false;
  #readLoop: Promise<void> | null = null;
  #peerExtInfo = false;
  #peerStrict = false;
  // Outgoing.
  #queue: (Payload | KeySwitch)[] = [];
  #batch = deferred();
  #held: Payload[] = [];
  #heldBatch = deferred();
  #writing = false;
  #writeIdle: Promise<void> = Promise.resolve();
  #bytesSinceKex = 0;
  #kexAt = Date.now();
  #received = 0;
  #unimplemented: number[] = [];

  constructor(conn: Deno.Conn, options: TransportOptions) {
    this.#conn = conn;
    this.#opts = transportSettings(options);
    this.#reader = new ByteReader(conn);
    this.#closed = new Promise((resolve) => this.#closedResolve = resolve);
  }

  /** The session identifier (the first exchange hash). */
  get sessionId(): Uint8Array {
    if (this.#sessionId === null) throw new SshError("Cannot use transport: no key exchange yet");
    return this.#sessionId;
  }

  /** The peer's version line. */
  get peerVersion(): string {
    return this.#peerVersion;
  }

  /** Sequence numbers of our packets the peer answered with UNIMPLEMENTED. */
  get peerUnimplemented(): readonly number[] {
    return this.#unimplemented;
  }

  /** Whether strict key exchange is in force. */
  get strict(): boolean {
    return this.#strict;
  }

  /** Resolves with what ended the connection (null: closed locally). */
  get closed(): Promise<Error | null> {
    return this.#closed;
  }

  get isClosed(): boolean {
    return this.#isClosed;
  }

  /** Version exchange and first key exchange. Rejects (and closes) on failure. */
  async handshake(): Promise<void> {
    try {
      await writeAll(this.#conn, utf8(`${this.#localVersion}\r\n`));
      await this.#readVersion();
    } catch (err) {
      this.#finish(asError(err));
      throw err instanceof SshError
        ? err
        : new SshError("Cannot connect: version exchange failed", {
          reason: DISCONNECT.PROTOCOL_ERROR,
          cause: err,
        });
    }
    this.#startKex();
    this.#readLoop = this.#runReadLoop();
    await this.#firstKex.promise;
  }

  async #readVersion(): Promise<void> {
    const server = this.#opts.role === "server";
    for (let lines = 0; lines < (server ? 1 : 64); lines++) {
      // RFC 4253 section 4.2: at most 255 bytes with CR LF.
      const line = await this.#reader.readLine(server ? 255 : 1024);
      if (line === null) {
        throw new SshError("Cannot connect: connection closed during version exchange", {
          reason: DISCONNECT.CONNECTION_LOST,
        });
      }
      if (line.startsWith("SSH-")) {
        if (!line.startsWith("SSH-2.0-") && !line.startsWith("SSH-1.99-")) {
          throw new SshError(`Cannot connect: unsupported protocol version "${line}"`, {
            reason: DISCONNECT.PROTOCOL_ERROR,
          });
        }
        this.#peerVersion = line;
        return;
      }
    }
    if (server) {
      // No binary protocol yet, so a text reply is the only way to say why.
      await writeAll(this.#conn, utf8("Invalid SSH identification string.\r\n")).catch(() => {});
    }
    throw new SshError("Cannot connect: no SSH identification string", {
      reason: DISCONNECT.PROTOCOL_ERROR,
    });
  }

  // ---- sending ----

  /** Sends an upper-layer packet; held while keys are being exchanged. */
  send(payload: Payload): Promise<void> {
    if (this.#isClosed) return Promise.reject(new SshError("Cannot send: connection closed"));
    if (this.#kex !== null && !this.#kex.sentNewKeys) {
      this.#held.push(payload);
      return this.#heldBatch.promise;
    }
    return this.#enqueue(payload);
  }

  /** Sends and ignores failure (the read loop reports a dead connection). */
  post(payload: Uint8Array): void {
    this.send(payload).catch(() => {});
  }

  #enqueue(item: Payload | KeySwitch): Promise<void> {
    this.#queue.push(item);
    const p = this.#batch.promise;
    if (!this.#writing) {
      this.#writing = true;
      this.#writeIdle = this.#runWriteLoop();
    }
    return p;
  }

  async #runWriteLoop(): Promise<void> {
    const wire = new WireWriter(this.#conn);
    let current: Deferred | null = null;
    try {
      while (true) {
        if (this.#queue.length === 0) {
          await wire.settle();
          if (this.#queue.length === 0) break;
        }
        const items = this.#queue;
        current = this.#batch;
        this.#queue = [];
        this.#batch = deferred();
        await this.#writeItems(items, wire);
        wire.carries(current);
        current = null;
        this.#maybeRekey();
      }
    } catch (err) {
      const e = isPeerGone(err) || err instanceof SshError
        ? new SshError("Cannot send: connection closed", { cause: err })
        : err;
      current?.reject(e);
      wire.fail(e);
      this.#batch.reject(e);
      this.#heldBatch.reject(e);
      this.#finish(asError(err));
    } finally {
      this.#writing = false;
    }
  }

  /**
   * Seals and writes one batch of queued items, at most MAX_BATCH packets a
   * write; a key switch takes effect between the packets around it.
   */
  async #writeItems(items: (Payload | KeySwitch)[], wire: WireWriter): Promise<void> {
    let payloads: Payload[] = [];
    const flush = async () => {
      if (payloads.length === 0) return;
      const sealed = await this.#sealer.seal(payloads);
      payloads = [];
      this.#bytesSinceKex += sealed.length;
      await wire.write(sealed);
    };
    for (const item of items) {
      if (item instanceof KeySwitch) {
        await flush();
        const old = this.#sealer;
        this.#sealer = await PacketSealer.create(item.keys, item.strict ? 0 : old.seq);
        await old.drain();
      } else {
        payloads.push(item);
        if (payloads.length >= MAX_BATCH) await flush();
      }
    }
    await flush();
  }

  // ---- receiving ----

  async #runReadLoop(): Promise<void> {
    let failure: Error | null = null;
    try {
      while (!this.#isClosed) {
        const payload = await this.#opener.next(this.#reader);
        if (payload === null) {
          throw new SshError("Cannot continue: connection closed by peer", {
            reason: DISCONNECT.CONNECTION_LOST,
          });
        }
        if (payload.length === 0) throw protocolError("empty packet");
        await this.#dispatch(payload);
        this.#maybeRekey();
      }
    } catch (err) {
      failure = asError(err);
      if (err instanceof SshWireError) {
        failure = new SshError(`Cannot continue: malformed message`, {
          reason: DISCONNECT.PROTOCOL_ERROR,
          cause: err,
        });
      }
    }
    if (this.#isClosed) return;
    const reason = failure instanceof SshError ? failure.reason : DISCONNECT.BY_APPLICATION;
    if (
      reason !== 0 && reason !== DISCONNECT.CONNECTION_LOST && !isPeerGone(failure) &&
      !(failure as { fromPeer?: boolean }).fromPeer
    ) {
      await this.#sendDisconnect(reason, failure!.message);
    }
    this.#firstKex.reject(failure);
    this.#finish(failure);
  }

  async #dispatch(payload: Uint8Array): Promise<void> {
    const type = payload[0];
    const seq = (this.#opener.seq - 1) >>> 0;
    this.#received++;
    const kex = this.#kex;
    if (kex?.skipNext) {
      kex.skipNext = false;
      return;
    }
    const initial = this.#kexCount === 0;
    switch (type) {
      case MSG.DISCONNECT:
        throw peerDisconnect(payload);
      case MSG.IGNORE:
      case MSG.DEBUG:
      case MSG.UNIMPLEMENTED:
        // Strict key exchange allows nothing but the exchange before the first NEWKEYS.
        if (initial && this.#strict) throw protocolError(`message ${type} during strict kex`);
        if (type === MSG.UNIMPLEMENTED) {
          this.#unimplemented.push(new SshReader(payload, 1).uint32());
        }
        return;
      case MSG.KEXINIT:
        return await this.#onKexinit(payload);
      case MSG.KEX_ECDH_INIT:
        return await this.#onEcdhInit(payload);
      case MSG.KEX_ECDH_REPLY:
        return await this.#onEcdhReply(payload);
      case MSG.NEWKEYS:
        return await this.#onNewKeys();
      case MSG.EXT_INFO:
        if (initial) throw protocolError("ext-info before keys");
        return;
    }
    if (initial) throw protocolError(`unexpected message ${type} before keys`);
    if (!KNOWN_MESSAGES.has(type)) {
      // RFC 4253 section 11.4: answer, and carry on.
      this.post(new SshWriter(5).byte(MSG.UNIMPLEMENTED).uint32(seq).bytes().slice());
      return;
    }
    if (kex !== null && kex.theirs !== null) {
      throw protocolError(`message ${type} during key exchange`);
    }
    await this.#opts.onPacket(payload);
  }

  // ---- key exchange ----

  #kexinitPayload(): Uint8Array {
    const server = this.#opts.role === "server";
    const kexAlgs = this.#kexCount === 0
      ? [...KEX_ALGS, server ? STRICT_S : STRICT_C, ...(server ? [] : ["ext-info-c"])]
      : KEX_ALGS;
    const { ciphers, macs } = this.#opts;
    const w = new SshWriter(512).byte(MSG.KEXINIT).raw(crypto.getRandomValues(new Uint8Array(16)))
      .nameList(kexAlgs)
      .nameList([ED25519])
      .nameList(ciphers)
      .nameList(ciphers)
      .nameList(macs)
      .nameList(macs)
      .nameList(["none"])
      .nameList(["none"])
      .nameList([])
      .nameList([])
      .boolean(false)
      .uint32(0);
    return w.bytes().slice();
  }

  #startKex(): void {
    if (this.#kex !== null || this.#isClosed) return;
    const ours = this.#kexinitPayload();
    this.#kex = {
      ours,
      theirs: null,
      algs: null,
      ephemeral: null,
      ephemeralPub: null,
      inKeys: null,
      skipNext: false,
      sentNewKeys: false,
    };
    this.#enqueue(ours).catch(() => {});
  }

  #maybeRekey(): void {
    if (this.#kexCount === 0 || this.#kex !== null || this.#isClosed) return;
    const limit = this.#opts.rekeyBytes;
    const total = this.#bytesSinceKex + this.#reader.received;
    if (total > limit || Date.now() - this.#kexAt > this.#opts.rekeyMs) {
      this.#startKex();
    }
  }

  async #onKexinit(payload: Uint8Array): Promise<void> {
    if (this.#kex === null) this.#startKex();
    const kex = this.#kex!;
    if (kex.theirs !== null) throw protocolError("duplicate KEXINIT");
    kex.theirs = payload.slice();
    const r = new SshReader(payload, 17);
    const lists: string[][] = [];
    for (let i = 0; i < 10; i++) lists.push(r.nameList());
    const follows = r.boolean();
    r.uint32();
    const server = this.#opts.role === "server";
    const ours = new SshReader(kex.ours, 17);
    const mine: string[][] = [];
    for (let i = 0; i < 10; i++) mine.push(ours.nameList());
    const [c, s] = server ? [lists, mine] : [mine, lists];
    const algs = negotiate(c, s);
    kex.algs = algs;
    if (this.#kexCount === 0) {
      this.#peerStrict = lists[0].includes(server ? STRICT_C : STRICT_S);
      this.#strict = this.#peerStrict;
      this.#peerExtInfo = server && lists[0].includes("ext-info-c");
      if (this.#strict && this.#received !== 1) {
        throw protocolError("strict kex: KEXINIT was not the first message");
      }
    }
    if (follows && (lists[0][0] !== algs.kex || lists[1][0] !== ED25519)) kex.skipNext = true;
    if (!server) {
      const pair = await crypto.subtle.generateKey({ name: "X25519" }, true, [
        "deriveBits",
      ]) as CryptoKeyPair;
      kex.ephemeral = pair;
      kex.ephemeralPub = new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey));
      this.#enqueue(new SshWriter(40).byte(MSG.KEX_ECDH_INIT).string(kex.ephemeralPub).bytes())
        .catch(() => {});
    }
  }

  #exchangeHash(
    hostKey: Uint8Array,
    qc: Uint8Array,
    qs: Uint8Array,
    k: Uint8Array,
  ): Promise<Uint8Array> {
    const kex = this.#kex!;
    const server = this.#opts.role === "server";
    const w = new SshWriter(1024)
      .string(server ? this.#peerVersion : this.#localVersion)
      .string(server ? this.#localVersion : this.#peerVersion)
      .string(server ? kex.theirs! : kex.ours)
      .string(server ? kex.ours : kex.theirs!)
      .string(hostKey)
      .string(qc)
      .string(qs)
      .raw(k);
    return sha256(w.bytes());
  }

  async #onEcdhInit(payload: Uint8Array): Promise<void> {
    const kex = this.#kex;
    if (this.#opts.role !== "server" || kex === null || kex.algs === null || kex.inKeys) {
      throw protocolError("unexpected KEX_ECDH_INIT");
    }
    const qc = new SshReader(payload, 1).string();
    const pair = await crypto.subtle.generateKey({ name: "X25519" }, true, [
      "deriveBits",
    ]) as CryptoKeyPair;
    const qs = new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey));
    const k = await sharedSecret(pair.privateKey, qc);
    const hostKey = await this.#opts.hostKey!;
    const h = await this.#exchangeHash(hostKey.blob, qc, qs, k);
    const sig = await hostKey.sign(h);
    this.#enqueue(
      new SshWriter(256).byte(MSG.KEX_ECDH_REPLY).string(hostKey.blob).string(qs).string(sig)
        .bytes(),
    ).catch(() => {});
    await this.#finishKex(k, h);
  }

  async #onEcdhReply(payload: Uint8Array): Promise<void> {
    const kex = this.#kex;
    if (this.#opts.role !== "client" || kex === null || kex.ephemeral === null || kex.inKeys) {
      throw protocolError("unexpected KEX_ECDH_REPLY");
    }
    const r = new SshReader(payload, 1);
    const hostBlob = r.string().slice();
    const qs = r.string();
    const sig = r.string();
    let hostKey: Uint8Array;
    try {
      hostKey = parsePublicBlob(hostBlob);
    } catch (err) {
      throw kexError("unsupported host key", err);
    }
    this.#opts.checkHostKey?.(hostBlob);
    const k = await sharedSecret(kex.ephemeral.privateKey, qs);
    const h = await this.#exchangeHash(hostBlob, kex.ephemeralPub!, qs, k);
    if (!(await verifyEd25519(hostKey, sig, h))) {
      throw new SshError("Cannot exchange keys: bad host key signature", {
        reason: DISCONNECT.HOST_KEY_NOT_VERIFIABLE,
      });
    }
    await this.#finishKex(k, h);
  }

  async #finishKex(k: Uint8Array, h: Uint8Array): Promise<void> {
    const kex = this.#kex!;
    const algs = kex.algs!;
    this.#sessionId ??= h.slice();
    const sid = this.#sessionId;
    const derive = async (cipher: string, mac: string, iv: string, key: string, mk: string) => {
      const c = CIPHERS[cipher];
      return {
        cipher,
        mac,
        iv: await deriveKey(k, h, iv, sid, c.ivLen),
        key: await deriveKey(k, h, key, sid, c.keyLen),
        macKey: mac === "" ? new Uint8Array(0) : await deriveKey(k, h, mk, sid, MACS[mac].keyLen),
      };
    };
    const cs = await derive(algs.cipherCs, algs.macCs, "A", "C", "E");
    const sc = await derive(algs.cipherSc, algs.macSc, "B", "D", "F");
    const server = this.#opts.role === "server";
    kex.inKeys = server ? cs : sc;
    this.#enqueue(new Uint8Array([MSG.NEWKEYS])).catch(() => {});
    this.#enqueue(new KeySwitch(server ? sc : cs, this.#strict)).catch(() => {});
    kex.sentNewKeys = true;
    if (server && this.#kexCount === 0 && this.#peerExtInfo) {
      this.#enqueue(
        new SshWriter(64).byte(MSG.EXT_INFO).uint32(1).string("server-sig-algs").string(ED25519)
          .bytes(),
      ).catch(() => {});
    }
    const held = this.#held;
    const heldDone = this.#heldBatch;
    this.#held = [];
    this.#heldBatch = deferred();
    let last: Promise<void> | null = null;
    for (const p of held) last = this.#enqueue(p);
    if (last === null) heldDone.resolve();
    else last.then(heldDone.resolve, heldDone.reject);
  }

  async #onNewKeys(): Promise<void> {
    const kex = this.#kex;
    if (kex === null || kex.inKeys === null) throw protocolError("unexpected NEWKEYS");
    const old = this.#opener;
    this.#opener = await PacketOpener.create(kex.inKeys, this.#strict ? 0 : old.seq);
    await old.drain();
    this.#kex = null;
    this.#kexCount++;
    this.#bytesSinceKex = 0;
    this.#reader.received = 0;
    this.#kexAt = Date.now();
    this.#firstKex.resolve();
  }

  // ---- ending ----

  async #sendDisconnect(reason: number, description: string): Promise<void> {
    const msg = new SshWriter(128).byte(MSG.DISCONNECT).uint32(reason).string(description)
      .string("").bytes();
    const sent = this.#enqueue(msg);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<void>((resolve) => timer = setTimeout(resolve, 1000));
    await Promise.race([sent.catch(() => {}), timeout]);
    clearTimeout(timer);
  }

  /** Sends DISCONNECT with `reason` and closes. */
  async disconnect(reason: number, description: string): Promise<void> {
    if (this.#isClosed) return;
    await this.#sendDisconnect(reason, description);
    this.#finish(null);
    await this.wait();
  }

  /** Closes the connection at once. */
  close(): void {
    this.#finish(null);
  }

  /** Waits until the read and write loops and background crypto are done. */
  async wait(): Promise<void> {
    await this.#readLoop;
    await this.#writeIdle.catch(() => {});
    await this.#sealer.drain();
    await this.#opener.drain();
  }

  #finish(err: Error | null): void {
    if (this.#isClosed) return;
    this.#isClosed = true;
    closeQuietly(this.#conn);
    const e = new SshError("Cannot send: connection closed", { cause: err ?? undefined });
    this.#batch.reject(e);
    this.#heldBatch.reject(e);
    this.#firstKex.reject(err ?? e);
    this.#firstKex.promise.catch(() => {});
    this.#closedResolve(err);
  }
}
