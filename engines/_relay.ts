// A byte relay: every connection accepted on one address is joined to a new
// connection to another. The container runtime reaches a container that has
// no network through one on each side of a unix socket the engine
// bind-mounts: 127.0.0.1 on this host to the socket, and the socket to the
// environment's control port on the container's own loopback.

import { acceptLoop } from "../_internal/accept.ts";
import { closeQuietly, isPeerGone, splice } from "../_internal/io.ts";

/** Where a relay listens or connects: a TCP address or a unix socket path. */
export type RelayAddress =
  | { transport: "tcp"; hostname: string; port: number }
  | { transport: "unix"; path: string };

/** A running relay; close it to stop accepting and end every joined pair. */
export class Relay implements AsyncDisposable {
  readonly #listener: Deno.Listener;
  readonly #to: RelayAddress;
  readonly #conns = new Set<Deno.Conn>();
  readonly #tasks = new Set<Promise<void>>();
  readonly #onError: (err: unknown) => void;
  readonly #loop: Promise<void>;
  #closed: Promise<void> | null = null;

  /**
   * Listens on `from` and joins each connection to a new one to `to`.
   * A connection whose peer cannot be reached is closed at once.
   * @param onError what is not a peer going away (out of descriptors...)
   */
  constructor(from: RelayAddress, to: RelayAddress, onError: (err: unknown) => void) {
    this.#listener = from.transport === "tcp"
      ? Deno.listen({ hostname: from.hostname, port: from.port })
      : Deno.listen({ transport: "unix", path: from.path });
    this.#to = to;
    this.#onError = onError;
    this.#loop = acceptLoop(this.#listener, (conn) => {
      const task = this.#join(conn).catch((err) => {
        if (!isPeerGone(err)) this.#onError(err);
      }).finally(() => this.#tasks.delete(task));
      this.#tasks.add(task);
    }, { closing: () => this.#closed !== null, onError });
  }

  /** The address listened on (the port chosen for port 0). */
  get addr(): Deno.Addr {
    return this.#listener.addr;
  }

  async #join(conn: Deno.Conn): Promise<void> {
    this.#conns.add(conn);
    let peer: Deno.Conn | null = null;
    try {
      try {
        peer = this.#to.transport === "tcp"
          ? await Deno.connect({ hostname: this.#to.hostname, port: this.#to.port })
          : await Deno.connect({ transport: "unix", path: this.#to.path });
      } catch {
        // Not listening yet (the environment still loads) or gone: the
        // client sees the connection close and tries again.
        return;
      }
      this.#conns.add(peer);
      if (this.#closed !== null) return;
      await splice(conn, peer);
    } finally {
      closeQuietly(conn);
      this.#conns.delete(conn);
      if (peer !== null) {
        closeQuietly(peer);
        this.#conns.delete(peer);
      }
    }
  }

  /** Stops listening, closes every connection and waits for the pairs to end. Idempotent. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      closeQuietly(this.#listener);
      for (const c of this.#conns) closeQuietly(c);
      await this.#loop;
      await Promise.allSettled([...this.#tasks]);
    })();
    return this.#closed;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
