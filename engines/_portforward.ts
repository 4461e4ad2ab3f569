// A pod's port on 127.0.0.1, through the API server's port-forward: each
// local connection is one WebSocket (subprotocol v4.channel.k8s.io, which
// API servers answer since 1.4). Messages carry a channel byte: 0 data, 1
// errors; the first message on each channel is the port (2 bytes, little
// endian). The protocol has no half-close: the WebSocket closes when the
// local side stops sending or the pod's side ends.

import type { KubeClient } from "./_kube.ts";
import type { RawWebSocket } from "./_websocket.ts";
import { closeQuietly, isPeerGone, writeAll } from "../_internal/io.ts";
import { acceptLoop } from "../_internal/accept.ts";

const PROTOCOL = "v4.channel.k8s.io";

/** A local listener forwarding to `pod:port`; close it to stop. */
export class PortForward implements AsyncDisposable {
  readonly #listener: Deno.TcpListener;
  readonly #client: KubeClient;
  readonly #path: string;
  readonly #conns = new Set<Deno.TcpConn>();
  readonly #tasks = new Set<Promise<void>>();
  readonly #onError: (err: unknown) => void;
  readonly #accepting: Promise<void>;
  #closed = false;

  /**
   * Listens on 127.0.0.1 (a port of the system's choosing).
   * @param onError told of a connection that could not be forwarded (the pod's refusal)
   */
  constructor(
    client: KubeClient,
    namespace: string,
    pod: string,
    port: number,
    onError: (err: unknown) => void = () => {},
  ) {
    this.#client = client;
    this.#path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${
      encodeURIComponent(pod)
    }/portforward?ports=${port}`;
    this.#onError = onError;
    this.#listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    this.#accepting = this.#accept();
  }

  /** The local port. */
  get port(): number {
    return this.#listener.addr.port;
  }

  #accept(): Promise<void> {
    return acceptLoop(this.#listener, (conn) => {
      if (this.#closed) return closeQuietly(conn);
      this.#conns.add(conn);
      const task = this.#forward(conn).catch(this.#onError).finally(() => {
        this.#conns.delete(conn);
        closeQuietly(conn);
        this.#tasks.delete(task);
      });
      this.#tasks.add(task);
    }, { closing: () => this.#closed, onError: this.#onError });
  }

  async #forward(conn: Deno.TcpConn): Promise<void> {
    const ws = await this.#client.webSocket(this.#path, PROTOCOL);
    const errors: string[] = [];
    const down = podToLocal(ws, conn, errors);
    const up = localToPod(conn, ws);
    try {
      await Promise.race([up, down]);
    } finally {
      ws.close();
      closeQuietly(conn);
      await Promise.allSettled([up, down]);
    }
    const failure = errors.join("").trim();
    if (failure !== "") throw new Error(`port-forward to ${this.#path}: ${failure}`);
  }

  /** Stops listening, ends the connections, waits for them; idempotent. */
  async close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      closeQuietly(this.#listener);
      for (const c of this.#conns) closeQuietly(c);
    }
    await this.#accepting;
    await Promise.allSettled([...this.#tasks]);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/**
 * The pod's bytes to the local connection: channel 0's data; channel 1's
 * error text goes to `errors`. The first message of each channel names the
 * port.
 */
async function podToLocal(ws: RawWebSocket, conn: Deno.TcpConn, errors: string[]): Promise<void> {
  const seen = [false, false];
  while (true) {
    const msg = await ws.read();
    if (msg === null) return;
    const channel = msg[0];
    if (msg.length === 0 || channel > 1) continue;
    let body = msg.subarray(1);
    if (!seen[channel]) {
      seen[channel] = true;
      body = body.subarray(2);
    }
    if (body.length === 0) continue;
    if (channel === 1) {
      errors.push(new TextDecoder().decode(body));
      continue;
    }
    try {
      await writeAll(conn, body);
    } catch (err) {
      if (!isPeerGone(err)) throw err;
      return;
    }
  }
}

/** The local connection's bytes to the pod, on channel 0, until it stops sending. */
async function localToPod(conn: Deno.TcpConn, ws: RawWebSocket): Promise<void> {
  const buf = new Uint8Array(64 * 1024);
  while (true) {
    let n: number | null;
    try {
      n = await conn.read(buf);
    } catch (err) {
      if (!isPeerGone(err)) throw err;
      n = null;
    }
    if (n === null) return;
    const frame = new Uint8Array(n + 1);
    frame.set(buf.subarray(0, n), 1);
    await ws.send(frame);
  }
}
