// A WebSocket client over a connection of our own (RFC 6455), for the API
// server's port-forward: Deno's WebSocket offers HTTP/2 in its TLS handshake
// whatever its HttpClient allows, API servers pick it, and a WebSocket over
// HTTP/2 is then refused. Here the TLS handshake offers no ALPN, so the
// upgrade is HTTP/1.1. Binary messages only; pings are answered.

import { concat, writeAll } from "../_internal/io.ts";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/** Where to connect and how to authenticate. */
export interface WebSocketTarget {
  url: URL;
  protocol: string;
  headers: Record<string, string>;
  caCerts: string[];
  cert?: string;
  key?: string;
}

/** A connection to the target's host: TLS for https and wss, with its CA and client certificate. */
async function connectTo(target: WebSocketTarget): Promise<Deno.Conn> {
  const { url } = target;
  const secure = url.protocol === "https:" || url.protocol === "wss:";
  const port = Number(url.port) || (secure ? 443 : 80);
  const hostname = url.hostname.replace(/^\[|\]$/g, "");
  if (!secure) return await Deno.connect({ hostname, port });
  return await Deno.connectTls({
    hostname,
    port,
    caCerts: target.caCerts,
    ...(target.cert && target.key ? { cert: target.cert, key: target.key } : {}),
  });
}

/** The HTTP/1.1 upgrade request, with the target's subprotocol and headers. */
function upgradeRequest(target: WebSocketTarget, key: string): string {
  const { url } = target;
  return [
    `GET ${url.pathname}${url.search} HTTP/1.1`,
    `Host: ${url.host}`,
    "Upgrade: websocket",
    "Connection: Upgrade",
    `Sec-WebSocket-Key: ${key}`,
    "Sec-WebSocket-Version: 13",
    `Sec-WebSocket-Protocol: ${target.protocol}`,
    ...Object.entries(target.headers).map(([k, v]) => `${k}: ${v}`),
    "",
    "",
  ].join("\r\n");
}

/** The reply's head (status line and headers) and the bytes after it. */
async function readHead(conn: Deno.Conn): Promise<{ head: string; rest: Uint8Array }> {
  let buf: Uint8Array = new Uint8Array(0);
  let end = -1;
  const chunk = new Uint8Array(16 * 1024);
  while ((end = indexOfBlankLine(buf)) < 0) {
    if (buf.length > 64 * 1024) throw new Error("WebSocket upgrade: reply headers too long");
    const n = await conn.read(chunk);
    if (n === null) throw new Error("WebSocket upgrade: the server closed the connection");
    buf = concat([buf, chunk.subarray(0, n)]);
  }
  return { head: new TextDecoder().decode(buf.subarray(0, end)), rest: buf.slice(end + 4) };
}

/**
 * Checks the reply switches protocols and accepts our key; a refusal's body
 * (a Status object) says why.
 */
async function checkUpgrade(head: string, rest: Uint8Array, key: string): Promise<void> {
  const [status, ...fields] = head.split("\r\n");
  if (!/^HTTP\/1\.1 101\b/.test(status)) {
    const body = new TextDecoder().decode(rest).trim().slice(0, 300);
    throw new Error(
      `WebSocket upgrade refused: ${status.replace(/^HTTP\/1\.1 /, "")}${body ? `: ${body}` : ""}`,
    );
  }
  const accept = fields.find((f) => f.toLowerCase().startsWith("sec-websocket-accept:"))
    ?.slice("sec-websocket-accept:".length).trim();
  const digest = new Uint8Array(
    await crypto.subtle.digest("SHA-1", new TextEncoder().encode(key + GUID)),
  );
  if (accept !== btoa(String.fromCharCode(...digest))) {
    throw new Error("WebSocket upgrade: wrong Sec-WebSocket-Accept");
  }
}

/** An open WebSocket: whole binary messages in and out. */
export class RawWebSocket {
  readonly #conn: Deno.Conn;
  #buf: Uint8Array;
  #closed = false;
  #writing: Promise<void> = Promise.resolve();

  private constructor(conn: Deno.Conn, rest: Uint8Array) {
    this.#conn = conn;
    this.#buf = rest;
  }

  /** Connects and upgrades; throws with the server's status and words when it refuses. */
  static async open(target: WebSocketTarget): Promise<RawWebSocket> {
    const conn = await connectTo(target);
    try {
      const key = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))));
      await writeAll(conn, new TextEncoder().encode(upgradeRequest(target, key)));
      const { head, rest } = await readHead(conn);
      await checkUpgrade(head, rest, key);
      return new RawWebSocket(conn, rest);
    } catch (err) {
      conn.close();
      throw err;
    }
  }

  /** Sends one binary message. */
  send(data: Uint8Array): Promise<void> {
    const frame = encodeFrame(0x2, data);
    this.#writing = this.#writing.then(() => writeAll(this.#conn, frame));
    return this.#writing;
  }

  /** The next binary message, or null once the socket is closed. */
  async read(): Promise<Uint8Array | null> {
    const parts: Uint8Array[] = [];
    while (true) {
      const frame = await this.#frame();
      if (frame === null) return null;
      const { fin, opcode, payload } = frame;
      if (opcode === 0x8) {
        // Close: answer once, then end.
        if (!this.#closed) await this.#control(0x8, payload.subarray(0, 2)).catch(() => {});
        return null;
      }
      if (opcode === 0x9) {
        await this.#control(0xa, payload).catch(() => {});
        continue;
      }
      if (opcode === 0xa) continue;
      parts.push(payload);
      if (fin) return parts.length === 1 ? parts[0] : concat(parts);
    }
  }

  /** Sends a close frame (best effort) and closes the connection; idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const conn = this.#conn;
    void this.#writing.then(() => writeAll(conn, encodeFrame(0x8, new Uint8Array([3, 232]))))
      .catch(() => {}).finally(() => {
        try {
          conn.close();
        } catch {
          // already closed
        }
      });
  }

  #control(opcode: number, payload: Uint8Array): Promise<void> {
    const frame = encodeFrame(opcode, payload);
    this.#writing = this.#writing.then(() => writeAll(this.#conn, frame));
    return this.#writing;
  }

  async #fill(n: number): Promise<boolean> {
    const chunk = new Uint8Array(64 * 1024);
    while (this.#buf.length < n) {
      let got: number | null;
      try {
        got = await this.#conn.read(chunk);
      } catch {
        return false;
      }
      if (got === null) return false;
      this.#buf = concat([this.#buf, chunk.subarray(0, got)]);
    }
    return true;
  }

  async #frame(): Promise<{ fin: boolean; opcode: number; payload: Uint8Array } | null> {
    if (!(await this.#fill(2))) return null;
    const b0 = this.#buf[0];
    const b1 = this.#buf[1];
    let len = b1 & 0x7f;
    let at = 2;
    if (len === 126) {
      if (!(await this.#fill(4))) return null;
      len = (this.#buf[2] << 8) | this.#buf[3];
      at = 4;
    } else if (len === 127) {
      if (!(await this.#fill(10))) return null;
      len = Number(new DataView(this.#buf.buffer, this.#buf.byteOffset + 2, 8).getBigUint64(0));
      at = 10;
    }
    const masked = (b1 & 0x80) !== 0;
    const maskAt = at;
    if (masked) at += 4;
    if (!(await this.#fill(at + len))) return null;
    const payload = this.#buf.slice(at, at + len);
    if (masked) {
      for (let i = 0; i < payload.length; i++) payload[i] ^= this.#buf[maskAt + (i % 4)];
    }
    this.#buf = this.#buf.subarray(at + len);
    return { fin: (b0 & 0x80) !== 0, opcode: b0 & 0x0f, payload };
  }
}

function indexOfBlankLine(buf: Uint8Array): number {
  for (let i = 0; i + 3 < buf.length; i++) {
    if (buf[i] === 13 && buf[i + 1] === 10 && buf[i + 2] === 13 && buf[i + 3] === 10) return i;
  }
  return -1;
}

/** A client frame: FIN, the opcode, masked as clients must. */
function encodeFrame(opcode: number, payload: Uint8Array): Uint8Array {
  const len = payload.length;
  const head = len < 126 ? 2 : len < 65536 ? 4 : 10;
  const frame = new Uint8Array(head + 4 + len);
  frame[0] = 0x80 | opcode;
  if (len < 126) {
    frame[1] = 0x80 | len;
  } else if (len < 65536) {
    frame[1] = 0x80 | 126;
    frame[2] = len >> 8;
    frame[3] = len & 0xff;
  } else {
    frame[1] = 0x80 | 127;
    new DataView(frame.buffer).setBigUint64(2, BigInt(len));
  }
  const mask = crypto.getRandomValues(new Uint8Array(4));
  frame.set(mask, head);
  for (let i = 0; i < len; i++) frame[head + 4 + i] = payload[i] ^ mask[i % 4];
  return frame;
}
