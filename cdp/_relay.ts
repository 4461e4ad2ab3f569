// One Chromium, many CDP clients. `--remote-debugging-pipe` is a single
// client connection, so the relay gives each client its own browser-level
// session (`Target.attachToBrowserTarget`): Chromium keeps that session's
// targets, discovery and auto-attach state apart from every other client's,
// as it does for separate WebSocket clients. A client's commands without a
// session go to its browser session and are renumbered, so that ids of
// different clients never collide; what Chromium sends back goes to the
// client that owns the session it names. Clients reach the relay through
// the authenticated tunnel (HTTP and WebSocket, `attach`) or in this process
// (`connect`).

import { isPeerGone } from "../_internal/io.ts";
import { isRecord } from "../_internal/util.ts";
import { type CdpClient, channelClient } from "./client.ts";
import { acceptWebSocket, type HttpRequest, readRequestHead, respond } from "./_websocket.ts";

/** What `Browser.getVersion` reports, for `/json/version`. */
export interface BrowserVersion {
  protocolVersion: string;
  product: string;
  revision: string;
  userAgent: string;
  jsVersion: string;
}

/** The longest message a client may send (Chromium's own limit is 256 MiB too). */
export const MAX_MESSAGE = 256 * 1024 * 1024;
/** Bytes queued for one client that does not read before it is dropped. */
const MAX_QUEUED = 512 * 1024 * 1024;

/** One client: where its messages go, and the sessions it owns. */
interface Peer {
  /** Its browser-level session; null until Chromium made it. */
  browserSession: string | null;
  /** Every session it owns, the browser session included. */
  readonly sessions: Set<string>;
  /** Messages sent before the browser session existed. */
  waiting: Record<string, unknown>[];
  closed: boolean;
  deliver(message: string): void;
  /** The browser is gone: close the client's side. */
  end(): void;
}

/** A command in flight: a client's (renumbered), or the relay's own. */
type Call =
  | { peer: Peer; clientId: number; method: string }
  | { peer: null; resolve(result: Record<string, unknown>): void; reject(error: Error): void };

/** Commands whose result names a session the caller now owns. */
const ATTACHING = new Set(["Target.attachToTarget", "Target.attachToBrowserTarget"]);

/**
 * Whether a `Host` header names an IP address or localhost, as Chromium's
 * own DevTools server requires: a page that rebinds its DNS name to the
 * forwarder's address sends its own name and is refused.
 */
function isLoopbackHost(host: string): boolean {
  return /^(localhost|\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\])(:\d{1,5})?$/i.test(host);
}

/** Serves CDP clients over one pipe to Chromium. */
export class CdpRelay {
  readonly #send: (message: string) => void;
  readonly #path = `/devtools/browser/${crypto.randomUUID()}`;
  readonly #calls = new Map<number, Call>();
  readonly #owners = new Map<string, Peer>();
  readonly #peers = new Set<Peer>();
  #version: BrowserVersion | null = null;
  #lastId = 0;
  #ended = false;

  /** `send` writes one message to Chromium's pipe. */
  constructor(send: (message: string) => void) {
    this.#send = send;
  }

  /** The path of the browser's WebSocket endpoint, `/devtools/browser/<id>`. */
  get path(): string {
    return this.#path;
  }

  /** Whether the browser is gone. */
  get ended(): boolean {
    return this.#ended;
  }

  /** Sets what `/json/version` reports (once the browser answered). */
  set version(version: BrowserVersion) {
    this.#version = version;
  }

  /** Sends a command of the relay's own (no client) and resolves with its result. */
  call(
    method: string,
    params: Record<string, unknown> = {},
    sessionId?: string,
  ): Promise<Record<string, unknown>> {
    if (this.#ended) return Promise.reject(new Error(`Cannot call ${method}: the browser is gone`));
    return new Promise((resolve, reject) => {
      const id = this.#nextId();
      this.#calls.set(id, { peer: null, resolve, reject });
      this.#send(JSON.stringify(
        sessionId === undefined ? { id, method, params } : {
          id,
          method,
          params,
          sessionId,
        },
      ));
    });
  }

  /** Handles one message from Chromium. */
  receive(text: string): void {
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      return;
    }
    if (!isRecord(msg)) return;
    if (typeof msg.id === "number") return this.#reply(msg);
    if (typeof msg.method !== "string") return;
    const params = isRecord(msg.params) ? msg.params : {};
    const sessionId = msg.sessionId;
    if (typeof sessionId !== "string") {
      // The pipe's own level: only the relay's browser sessions live here.
      if (msg.method === "Target.detachedFromTarget" && typeof params.sessionId === "string") {
        const peer = this.#owners.get(params.sessionId);
        if (peer !== undefined && peer.browserSession === params.sessionId) peer.end();
      }
      return;
    }
    const peer = this.#owners.get(sessionId);
    if (peer === undefined || peer.closed) return;
    if (msg.method === "Target.attachedToTarget" && typeof params.sessionId === "string") {
      this.#own(peer, params.sessionId);
    }
    if (sessionId === peer.browserSession) delete msg.sessionId;
    peer.deliver(JSON.stringify(msg));
    if (msg.method === "Target.detachedFromTarget" && typeof params.sessionId === "string") {
      peer.sessions.delete(params.sessionId);
      this.#owners.delete(params.sessionId);
    }
  }

  /** The pipe closed: every client is told, every call fails. */
  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    const calls = [...this.#calls.values()];
    this.#calls.clear();
    for (const call of calls) {
      if (call.peer === null) call.reject(new Error("The browser is gone"));
    }
    for (const peer of [...this.#peers]) peer.end();
  }

  /**
   * Serves one stream from the tunnel: `GET /json/version`, or the upgrade
   * to the browser's WebSocket, whose messages it relays until either side
   * closes. Resolves when done with the stream.
   */
  async attach(conn: Deno.Conn, head: Uint8Array): Promise<void> {
    try {
      await this.#serve(conn, head);
    } catch (err) {
      if (!isPeerGone(err)) throw err;
    }
  }

  async #serve(conn: Deno.Conn, head: Uint8Array): Promise<void> {
    const parsed = await readRequestHead(conn, head);
    if (parsed === null) return await respond(conn, 400, "Expected an HTTP request");
    const { request, rest } = parsed;
    const host = request.headers.get("host");
    if (host !== undefined && !isLoopbackHost(host)) {
      return await respond(conn, 403, "Host header is not an IP address or localhost");
    }
    const path = request.target.replace(/\?.*$/s, "");
    if (request.headers.has("upgrade")) {
      if (path !== this.#path) return await respond(conn, 404, `No target at "${path}"`);
      // CDP clients send no Origin; a web page always does.
      if (request.headers.has("origin")) {
        return await respond(conn, 403, "WebSocket connections from web pages are refused");
      }
      const ws = await acceptWebSocket(conn, request, rest, {
        maxMessage: MAX_MESSAGE,
        maxQueued: MAX_QUEUED,
      });
      if (ws === null) return;
      const peer = this.#join((message) => {
        if (!ws.send(message)) peer.end();
      }, () => ws.close(1001, "The browser is gone"));
      try {
        while (true) {
          const text = await ws.read();
          if (text === null) break;
          this.#fromClient(peer, text);
        }
      } finally {
        this.#leave(peer);
        await ws.flushed();
      }
      return;
    }
    if (request.method === "GET" && (path === "/json/version" || path === "/json/version/")) {
      return await respond(
        conn,
        200,
        JSON.stringify(this.#versionJson(request)),
        "application/json; charset=UTF-8",
      );
    }
    await respond(
      conn,
      404,
      `Unknown path "${path}": this browser serves /json/version and ${this.#path}`,
    );
  }

  /** A client in this process, with its own browser session like any other. */
  connect(): CdpClient {
    let peer: Peer | null = null;
    const { client, receive, end } = channelClient({
      send: (text) => {
        if (peer !== null && !peer.closed) this.#fromClient(peer, text);
      },
      close: () => {
        if (peer === null) return;
        const wasOpen = !peer.closed;
        this.#leave(peer);
        if (wasOpen) end(1000, "");
      },
      get open() {
        return peer !== null && !peer.closed;
      },
    });
    peer = this.#join(receive, () => end(1001, "The browser is gone"));
    return client;
  }

  /** Drops every client (the browser is being stopped). */
  close(): void {
    for (const peer of [...this.#peers]) {
      peer.end();
      this.#leave(peer);
    }
  }

  #versionJson(request: HttpRequest): Record<string, string> {
    const v = this.#version;
    const host = request.headers.get("host") ?? "127.0.0.1";
    return {
      "Browser": v?.product ?? "",
      "Protocol-Version": v?.protocolVersion ?? "1.3",
      "User-Agent": v?.userAgent ?? "",
      "V8-Version": v?.jsVersion ?? "",
      "WebKit-Version": v?.revision ?? "",
      "webSocketDebuggerUrl": `ws://${host}${this.#path}`,
    };
  }

  #nextId(): number {
    // Chromium takes ids as 32-bit integers.
    do this.#lastId = this.#lastId >= 0x7fffffff ? 1 : this.#lastId + 1; while (
      this.#calls.has(this.#lastId)
    );
    return this.#lastId;
  }

  #join(deliver: (message: string) => void, end: () => void): Peer {
    let ended = false;
    const peer: Peer = {
      browserSession: null,
      sessions: new Set(),
      waiting: [],
      closed: false,
      deliver,
      end: () => {
        if (ended) return;
        ended = true;
        peer.closed = true;
        end();
      },
    };
    if (this.#ended) {
      peer.end();
      return peer;
    }
    this.#peers.add(peer);
    this.call("Target.attachToBrowserTarget").then((result) => {
      const sessionId = result.sessionId;
      if (typeof sessionId !== "string") throw new Error("No sessionId from attachToBrowserTarget");
      if (peer.closed) {
        this.call("Target.detachFromTarget", { sessionId }).catch(() => {});
        return;
      }
      peer.browserSession = sessionId;
      this.#own(peer, sessionId);
      const waiting = peer.waiting;
      peer.waiting = [];
      for (const msg of waiting) this.#forward(peer, msg);
    }).catch(() => peer.end());
    return peer;
  }

  #leave(peer: Peer): void {
    peer.closed = true;
    if (!this.#peers.delete(peer)) return;
    for (const sessionId of peer.sessions) this.#owners.delete(sessionId);
    peer.sessions.clear();
    for (const [id, call] of this.#calls) if (call.peer === peer) this.#calls.delete(id);
    // Its child sessions go with it; the pages it opened stay, as they do
    // when a WebSocket client of Chromium disconnects.
    if (peer.browserSession !== null && !this.#ended) {
      this.call("Target.detachFromTarget", { sessionId: peer.browserSession }).catch(() => {});
    }
  }

  #own(peer: Peer, sessionId: string): void {
    peer.sessions.add(sessionId);
    this.#owners.set(sessionId, peer);
  }

  #fromClient(peer: Peer, text: string): void {
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      return peer.deliver(
        JSON.stringify({ error: { code: -32700, message: "Message must be valid JSON" } }),
      );
    }
    if (!isRecord(msg) || !Number.isSafeInteger(msg.id)) {
      return peer.deliver(
        JSON.stringify({
          error: { code: -32600, message: "Message must have integer 'id' property" },
        }),
      );
    }
    if (typeof msg.method !== "string") {
      return peer.deliver(JSON.stringify({
        id: msg.id,
        error: { code: -32600, message: "Message must have string 'method' property" },
      }));
    }
    if (peer.browserSession === null) {
      peer.waiting.push(msg);
      return;
    }
    this.#forward(peer, msg);
  }

  #forward(peer: Peer, msg: Record<string, unknown>): void {
    const clientId = msg.id as number;
    let sessionId: string;
    if (msg.sessionId === undefined) {
      sessionId = peer.browserSession!;
    } else if (typeof msg.sessionId === "string" && this.#owners.get(msg.sessionId) === peer) {
      sessionId = msg.sessionId;
    } else {
      // Another client's session is not this client's to drive.
      return peer.deliver(JSON.stringify({
        id: clientId,
        error: { code: -32001, message: "Session with given id not found." },
      }));
    }
    if (this.#ended) return;
    const id = this.#nextId();
    this.#calls.set(id, { peer, clientId, method: msg.method as string });
    msg.id = id;
    msg.sessionId = sessionId;
    this.#send(JSON.stringify(msg));
  }

  #reply(msg: Record<string, unknown>): void {
    const call = this.#calls.get(msg.id as number);
    if (call === undefined) return;
    this.#calls.delete(msg.id as number);
    if (call.peer === null) {
      if (isRecord(msg.error)) {
        call.reject(new Error(`CDP error: ${String(msg.error.message)}`));
      } else {
        call.resolve(isRecord(msg.result) ? msg.result : {});
      }
      return;
    }
    const peer = call.peer;
    if (peer.closed) return;
    if (ATTACHING.has(call.method) && isRecord(msg.result)) {
      const sessionId = msg.result.sessionId;
      if (typeof sessionId === "string") this.#own(peer, sessionId);
    }
    if (msg.sessionId === peer.browserSession) delete msg.sessionId;
    msg.id = call.clientId;
    peer.deliver(JSON.stringify(msg));
  }
}
