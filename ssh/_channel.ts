// The SSH connection protocol (RFC 4254): channels with window flow control
// in both directions, channel requests, global requests. Shared by the
// server and the client.

import { DISCONNECT, SshError } from "./_errors.ts";
import { MSG, type SshTransport } from "./_transport.ts";
import { SshReader, SshWriter } from "./_wire.ts";

/** What we let a peer send before it must wait for a window adjust. */
const LOCAL_WINDOW = 2 * 1024 * 1024;
/** Largest data packet we accept. */
const LOCAL_MAX_PACKET = 32768;
/** Largest data packet we send, whatever the peer allows. */
const SEND_MAX_PACKET = 32768;
const MAX_CHANNELS = 256;
const MAX_INFLIGHT = 32;

function protocolError(what: string): SshError {
  return new SshError(`Cannot continue: ${what}`, { reason: DISCONNECT.PROTOCOL_ERROR });
}

/** Callbacks of one channel. */
export interface ChannelHandlers {
  /** Data (`ext` 0) or extended data (`ext` 1 is stderr). Call `consumed()` once used. */
  onData(data: Uint8Array, ext: number): void;
  onEof(): void;
  /** The channel is closed both ways. */
  onClose(): void;
  /** A channel request; return whether it succeeded. */
  onRequest(type: string, wantReply: boolean, r: SshReader): boolean | Promise<boolean>;
}

const NO_HANDLERS: ChannelHandlers = {
  onData() {},
  onEof() {},
  onClose() {},
  onRequest: () => false,
};

/** One open channel. */
export class Channel {
  readonly localId: number;
  readonly remoteId: number;
  readonly #mux: ChannelMux;
  readonly #transport: SshTransport;
  #handlers: ChannelHandlers = NO_HANDLERS;
  #remoteWindow: number;
  readonly #remoteMax: number;
  #localWindow = LOCAL_WINDOW;
  #consumed = 0;
  #windowWaiter: (() => void) | null = null;
  #replies: ((ok: boolean) => void)[] = [];
  // Sends not yet on the socket; a few in flight let the transport seal
  // packets in parallel (WebCrypto runs them on other threads).
  #inflight: Promise<void>[] = [];
  #sentEof = false;
  #sentClose = false;
  #gotEof = false;
  #gotClose = false;
  #closedResolve!: () => void;
  /** Resolves once closed both ways (or the connection ended). */
  readonly closed: Promise<void>;

  constructor(
    mux: ChannelMux,
    transport: SshTransport,
    localId: number,
    remoteId: number,
    remoteWindow: number,
    remoteMax: number,
  ) {
    this.#mux = mux;
    this.#transport = transport;
    this.localId = localId;
    this.remoteId = remoteId;
    this.#remoteWindow = remoteWindow;
    this.#remoteMax = Math.max(1, Math.min(remoteMax, SEND_MAX_PACKET));
    this.closed = new Promise((resolve) => this.#closedResolve = resolve);
  }

  setHandlers(handlers: ChannelHandlers): void {
    this.#handlers = handlers;
  }

  get isClosing(): boolean {
    return this.#sentClose || this.#gotClose;
  }

  get gotEof(): boolean {
    return this.#gotEof;
  }

  /** Largest data packet we send on this channel. */
  get maxPacket(): number {
    return this.#remoteMax;
  }

  /**
   * Sends data (ext 1: stderr), waiting for window as needed. Resolves once
   * all but the last few packets have reached the socket. `owned` data is
   * never changed afterwards, so packets may point into it instead of copying.
   */
  async write(data: Uint8Array, ext = 0, owned = false): Promise<void> {
    let off = 0;
    while (off < data.length) {
      if (this.#sentEof || this.isClosing || this.#transport.isClosed) {
        throw new SshError("Cannot write: channel closed");
      }
      if (this.#remoteWindow === 0) {
        await new Promise<void>((resolve) => this.#windowWaiter = resolve);
        continue;
      }
      const n = Math.min(data.length - off, this.#remoteWindow, this.#remoteMax);
      const head = new Uint8Array(ext === 0 ? 9 : 13);
      const view = new DataView(head.buffer);
      head[0] = ext === 0 ? MSG.CHANNEL_DATA : MSG.CHANNEL_EXTENDED_DATA;
      view.setUint32(1, this.remoteId);
      if (ext !== 0) view.setUint32(5, ext);
      view.setUint32(head.length - 4, n);
      // Data we own is not touched again, so the packet can point into it.
      const body = owned ? data.subarray(off, off + n) : data.slice(off, off + n);
      this.#remoteWindow -= n;
      off += n;
      this.#inflight.push(this.#transport.send([head, body]));
      if (this.#inflight.length > MAX_INFLIGHT) await this.#inflight.shift();
    }
  }

  /** Waits until everything written has reached the socket. */
  async flush(): Promise<void> {
    const all = this.#inflight;
    this.#inflight = [];
    await Promise.all(all);
  }

  /** Returns window for `n` bytes of data the handler has used. */
  consumed(n: number): void {
    if (this.isClosing) return;
    this.#consumed += n;
    if (this.#consumed >= LOCAL_WINDOW / 4) {
      this.#transport.post(
        new SshWriter(9).byte(MSG.CHANNEL_WINDOW_ADJUST).uint32(this.remoteId).uint32(
          this.#consumed,
        ).bytes(),
      );
      this.#localWindow += this.#consumed;
      this.#consumed = 0;
    }
  }

  /** Sends a channel request; resolves with the reply (true without one). */
  request(type: string, wantReply: boolean, extra?: (w: SshWriter) => void): Promise<boolean> {
    if (this.isClosing) return Promise.resolve(false);
    const w = new SshWriter(64).byte(MSG.CHANNEL_REQUEST).uint32(this.remoteId).string(type)
      .boolean(wantReply);
    extra?.(w);
    this.#transport.post(w.bytes().slice());
    if (!wantReply) return Promise.resolve(true);
    return new Promise((resolve) => this.#replies.push(resolve));
  }

  /** Sends EOF once. */
  eof(): void {
    if (this.#sentEof || this.isClosing) return;
    this.#sentEof = true;
    this.#transport.post(new SshWriter(5).byte(MSG.CHANNEL_EOF).uint32(this.remoteId).bytes());
  }

  /** Sends CLOSE once. */
  close(): void {
    if (this.#sentClose) return;
    this.#sentClose = true;
    this.#transport.post(new SshWriter(5).byte(MSG.CHANNEL_CLOSE).uint32(this.remoteId).bytes());
    this.#wake();
    if (this.#gotClose) this.#finish();
  }

  #wake(): void {
    const w = this.#windowWaiter;
    this.#windowWaiter = null;
    w?.();
  }

  #finish(): void {
    this.#mux.forget(this.localId);
    for (const r of this.#replies.splice(0)) r(false);
    this.#wake();
    this.#closedResolve();
    this.#handlers.onClose();
  }

  /** The connection ended. */
  abort(): void {
    if (this.#gotClose && this.#sentClose) return;
    this.#gotClose = this.#sentClose = true;
    this.#finish();
  }

  // Incoming messages, from the mux.

  async receive(type: number, r: SshReader): Promise<void> {
    if (this.#gotClose) throw protocolError(`message ${type} on a closed channel`);
    switch (type) {
      case MSG.CHANNEL_WINDOW_ADJUST: {
        const add = r.uint32();
        this.#remoteWindow = Math.min(this.#remoteWindow + add, 0xffffffff);
        this.#wake();
        return;
      }
      case MSG.CHANNEL_DATA:
      case MSG.CHANNEL_EXTENDED_DATA:
        return this.#onData(type === MSG.CHANNEL_DATA ? 0 : r.uint32(), r.string());
      case MSG.CHANNEL_EOF:
        this.#gotEof = true;
        this.#handlers.onEof();
        return;
      case MSG.CHANNEL_CLOSE:
        return this.#onClose();
      case MSG.CHANNEL_REQUEST:
        return await this.#onRequest(r);
      case MSG.CHANNEL_SUCCESS:
      case MSG.CHANNEL_FAILURE: {
        const reply = this.#replies.shift();
        if (reply === undefined) throw protocolError("unexpected channel reply");
        reply(type === MSG.CHANNEL_SUCCESS);
        return;
      }
    }
  }

  #onData(ext: number, data: Uint8Array): void {
    if (this.#gotEof) throw protocolError("data after EOF");
    if (data.length > this.#localWindow) throw protocolError("data beyond the window");
    this.#localWindow -= data.length;
    if (this.#sentClose) return;
    this.#handlers.onData(data, ext);
  }

  #onClose(): void {
    this.#gotClose = true;
    if (!this.#sentClose) {
      this.#sentClose = true;
      this.#transport.post(new SshWriter(5).byte(MSG.CHANNEL_CLOSE).uint32(this.remoteId).bytes());
    }
    this.#finish();
  }

  /** A channel request: the handler decides; a reply when one is wanted and the channel is open. */
  async #onRequest(r: SshReader): Promise<void> {
    const reqType = r.text();
    const wantReply = r.boolean();
    let ok = false;
    try {
      ok = await this.#handlers.onRequest(reqType, wantReply, r);
    } catch (err) {
      if (err instanceof SshError) throw err;
      ok = false;
    }
    if (wantReply && !this.#sentClose) {
      this.#transport.post(
        new SshWriter(5).byte(ok ? MSG.CHANNEL_SUCCESS : MSG.CHANNEL_FAILURE)
          .uint32(this.remoteId).bytes(),
      );
    }
  }
}

/** Decides on an incoming CHANNEL_OPEN: a channel's handlers, or a failure reason. */
export type OpenHandler = (
  type: string,
  channel: Channel,
  r: SshReader,
) => { handlers: ChannelHandlers } | { reason: number; message: string };

interface PendingOpen {
  handlers: ChannelHandlers;
  resolve(ch: Channel): void;
  reject(err: Error): void;
}

/** The channels of one connection. */
export class ChannelMux {
  readonly #transport: SshTransport;
  readonly #onOpen: OpenHandler | null;
  readonly #channels = new Map<number, Channel>();
  readonly #pending = new Map<number, PendingOpen>();
  #nextId = 0;

  constructor(transport: SshTransport, onOpen: OpenHandler | null) {
    this.#transport = transport;
    this.#onOpen = onOpen;
  }

  get size(): number {
    return this.#channels.size;
  }

  forget(id: number): void {
    this.#channels.delete(id);
  }

  #allocId(): number {
    while (this.#channels.has(this.#nextId) || this.#pending.has(this.#nextId)) {
      this.#nextId = (this.#nextId + 1) >>> 0;
    }
    return this.#nextId++;
  }

  /** Opens a channel of `type` (client side). */
  open(type: string, handlers: ChannelHandlers): Promise<Channel> {
    if (this.#transport.isClosed) {
      return Promise.reject(new SshError("Cannot open channel: connection closed"));
    }
    const id = this.#allocId();
    const p = new Promise<Channel>((resolve, reject) =>
      this.#pending.set(id, { handlers, resolve, reject })
    );
    this.#transport.post(
      new SshWriter(64).byte(MSG.CHANNEL_OPEN).string(type).uint32(id).uint32(LOCAL_WINDOW)
        .uint32(LOCAL_MAX_PACKET).bytes().slice(),
    );
    return p;
  }

  /** Handles a connection-protocol message; false when it is not one. */
  async handle(payload: Uint8Array): Promise<boolean> {
    const type = payload[0];
    const r = new SshReader(payload, 1);
    switch (type) {
      case MSG.GLOBAL_REQUEST: {
        r.text();
        // keepalive@openssh.com and everything else: we offer no global requests.
        if (r.boolean()) this.#transport.post(new Uint8Array([MSG.REQUEST_FAILURE]));
        return true;
      }
      case MSG.REQUEST_SUCCESS:
      case MSG.REQUEST_FAILURE:
        return true;
      case MSG.CHANNEL_OPEN:
        this.#onOpenRequest(r);
        return true;
      case MSG.CHANNEL_OPEN_CONFIRMATION:
      case MSG.CHANNEL_OPEN_FAILURE:
        this.#onOpenReply(type, r);
        return true;
      case MSG.CHANNEL_WINDOW_ADJUST:
      case MSG.CHANNEL_DATA:
      case MSG.CHANNEL_EXTENDED_DATA:
      case MSG.CHANNEL_EOF:
      case MSG.CHANNEL_CLOSE:
      case MSG.CHANNEL_REQUEST:
      case MSG.CHANNEL_SUCCESS:
      case MSG.CHANNEL_FAILURE: {
        const id = r.uint32();
        const ch = this.#channels.get(id);
        if (ch === undefined) throw protocolError(`unexpected channel id "${id}"`);
        await ch.receive(type, r);
        return true;
      }
    }
    return false;
  }

  /** The peer opens a channel: ours to accept (with its handlers) or refuse. */
  #onOpenRequest(r: SshReader): void {
    const chType = r.text();
    const remoteId = r.uint32();
    const window = r.uint32();
    const maxPacket = r.uint32();
    const refuse = (reason: number, message: string) =>
      this.#transport.post(
        new SshWriter(64).byte(MSG.CHANNEL_OPEN_FAILURE).uint32(remoteId).uint32(reason)
          .string(message).string("").bytes().slice(),
      );
    if (this.#onOpen === null) return refuse(1, "channels not accepted");
    if (this.#channels.size >= MAX_CHANNELS) return refuse(4, "too many channels");
    const id = this.#allocId();
    const ch = new Channel(this, this.#transport, id, remoteId, window, maxPacket);
    const decision = this.#onOpen(chType, ch, r);
    if ("reason" in decision) return refuse(decision.reason, decision.message);
    ch.setHandlers(decision.handlers);
    this.#channels.set(id, ch);
    this.#transport.post(
      new SshWriter(17).byte(MSG.CHANNEL_OPEN_CONFIRMATION).uint32(remoteId).uint32(id)
        .uint32(LOCAL_WINDOW).uint32(LOCAL_MAX_PACKET).bytes(),
    );
  }

  /** The peer answers a channel we opened. */
  #onOpenReply(type: number, r: SshReader): void {
    const id = r.uint32();
    const pending = this.#pending.get(id);
    if (pending === undefined) throw protocolError(`unexpected channel id "${id}"`);
    this.#pending.delete(id);
    if (type === MSG.CHANNEL_OPEN_FAILURE) {
      const reason = r.uint32();
      const text = r.text();
      pending.reject(new SshError(`Cannot open channel: ${text || "refused"} (${reason})`));
      return;
    }
    const remoteId = r.uint32();
    const window = r.uint32();
    const maxPacket = r.uint32();
    const ch = new Channel(this, this.#transport, id, remoteId, window, maxPacket);
    ch.setHandlers(pending.handlers);
    this.#channels.set(id, ch);
    pending.resolve(ch);
  }

  /** The connection ended: fail pending opens, end every channel. */
  abortAll(err: Error): void {
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
    for (const ch of [...this.#channels.values()]) ch.abort();
  }
}
