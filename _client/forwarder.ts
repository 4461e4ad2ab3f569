// The client's loopback forwarders: one listener per capability, each local
// connection a `tunnel.open` stream through the control port, served only to
// the users `forwardUsers` names; and the url rewriting that points a
// binding at its forwarder. Private to client.ts.

import type { Capability } from "../capability.ts";
import type { ControlAddress } from "../_internal/auth.ts";
import { HudProtocolError } from "../errors.ts";
import { encodeFrame, LineReader, parseLine } from "../_internal/framing.ts";
import { closeQuietly, isPeerGone, pump, writeAll } from "../_internal/io.ts";
import { acceptLoop } from "../_internal/accept.ts";
import { type PeerUsers, peerUsers, refusePeer } from "../_internal/peer_uid.ts";
import { isRecord } from "../_internal/util.ts";

const TUNNEL_REPLY_MAX = 64 * 1024;

/**
 * A loopback forwarder for one capability: each local connection becomes a
 * `tunnel.open` stream through the control port.
 */
export class TcpForwarder {
  readonly capability: Capability;
  readonly #listener: Deno.TcpListener;
  readonly #control: ControlAddress;
  readonly #conns = new Set<Deno.Conn>();
  readonly #tasks = new Set<Promise<void>>();
  readonly #onError: (err: unknown) => void;
  readonly #users: PeerUsers;
  readonly #loop: Promise<void>;
  #closed = false;

  constructor(
    capability: Capability,
    control: ControlAddress,
    users: PeerUsers,
    onError: (err: unknown) => void,
  ) {
    this.capability = capability;
    this.#control = control;
    this.#users = users;
    this.#onError = onError;
    this.#listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    this.#loop = acceptLoop(this.#listener, (local) => {
      const task = this.#serve(local).catch((err) => {
        if (!isPeerGone(err)) this.#onError(err);
      }).finally(() => this.#tasks.delete(task));
      this.#tasks.add(task);
    }, { closing: () => this.#closed, onError: onError });
  }

  /** Tunnels a local connection if its user may use the forwarder. */
  async #serve(local: Deno.Conn): Promise<void> {
    if (this.#users !== "any") {
      this.#conns.add(local);
      let refused: Error | null;
      try {
        refused = await refusePeer(
          local,
          this.#users,
          `Forwarder for "${this.capability.name}"`,
          "forwardUsers",
        );
      } finally {
        this.#conns.delete(local);
      }
      if (refused !== null) {
        closeQuietly(local);
        this.#onError(refused);
        return;
      }
    }
    await this.#tunnel(local);
  }

  get port(): number {
    return this.#listener.addr.port;
  }

  async #tunnel(local: Deno.Conn): Promise<void> {
    this.#conns.add(local);
    let remote: Deno.TcpConn | null = null;
    try {
      remote = await Deno.connect({ hostname: this.#control.hostname, port: this.#control.port });
      // Small packets both ways (an SSH handshake): Nagle's algorithm would
      // hold each behind the peer's delayed ACK, 40 ms a time.
      remote.setNoDelay(true);
      (local as Deno.TcpConn).setNoDelay(true);
      this.#conns.add(remote);
      if (this.#closed) return;
      await writeAll(remote, encodeFrame(this.#openRequest()));
      // Bytes the agent sends before the reply are forwarded at once.
      const up = pump(local, remote);
      const reader = new LineReader(remote, TUNNEL_REPLY_MAX);
      if (!(await this.#opened(reader))) {
        closeQuietly(local);
        closeQuietly(remote);
        await up.catch(() => {});
        return;
      }
      const head = reader.takeBuffered();
      if (head.length > 0) await writeAll(local, head);
      await Promise.all([up, pump(remote, local)]);
    } finally {
      closeQuietly(local);
      this.#conns.delete(local);
      if (remote) {
        closeQuietly(remote);
        this.#conns.delete(remote);
      }
    }
  }

  /** The `tunnel.open` request for this capability, with the token when there is one. */
  #openRequest(): Record<string, unknown> {
    const { token } = this.#control;
    const capability = this.capability.name;
    return {
      jsonrpc: "2.0",
      id: 1,
      method: "tunnel.open",
      params: token === undefined ? { capability } : { capability, token },
    };
  }

  /** Whether the server's reply opened the tunnel; an error reply goes to `onError`. */
  async #opened(reader: LineReader): Promise<boolean> {
    const frame = await reader.read();
    if (frame?.kind !== "line") return false;
    let reply: unknown;
    try {
      reply = parseLine(frame.line);
    } catch {
      return false;
    }
    if (isRecord(reply) && isRecord(reply.result)) return true;
    if (isRecord(reply) && isRecord(reply.error)) {
      this.#onError(
        new HudProtocolError(
          Number(reply.error.code),
          `Cannot open tunnel to "${this.capability.name}": ${reply.error.message}`,
        ),
      );
    }
    return false;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    closeQuietly(this.#listener);
    for (const c of this.#conns) closeQuietly(c);
    await this.#loop;
    await Promise.allSettled([...this.#tasks]);
  }
}

/** The users the forwarders serve, from `forwardUsers` (see {@linkcode peerUsers}). */
export function forwardUsers(option: readonly number[] | "any" | undefined): PeerUsers {
  return peerUsers(option, {
    what: "Cannot forward",
    listener: "a forwarder",
    option: "forwardUsers",
    orElse: "forward: false",
  });
}

/**
 * Rewrites `scheme://[user[:password]@]host:port/rest` to point at a local
 * port, as `scheme://[user@]127.0.0.1:port/rest`: the user name stays (an
 * SSH login needs it), a password does not (as HUD's client does), so that
 * the url can be shown and handed to agents.
 */
export function localUrl(url: string, port: number): string {
  const m = /^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)?(?:([^@/?#]*)@)?([^/?#]*)(.*)$/s.exec(url)!;
  const scheme = m[1] ?? "tcp://";
  const name = m[2]?.split(":", 1)[0] ?? "";
  const user = name !== "" ? `${name}@` : "";
  return `${scheme}${user}127.0.0.1:${port}${m[4]}`;
}

/**
 * Whether a published url is the placeholder of a capability that has no
 * port of its own (attached to the environment's control port: port 0).
 */
export function isPlaceholderUrl(url: string): boolean {
  return /^(?:[a-zA-Z][a-zA-Z0-9+.-]*:\/\/)?(?:[^@/?#]*@)?(?:\[[^\]]*\]|[^:/?#]*):0(?:[/?#]|$)/
    .test(url);
}
