// Ports of their own for in-process capabilities, on servers without
// authentication only. An attached capability (the workspace's file tracker)
// is published with a placeholder url and reached through `tunnel.open`; an
// agent that reads the raw manifest bindings, as HUD's agents inside an
// environment do, dials the url instead. Without a token anyone who reaches
// the control port reaches the capability through a tunnel anyway, so a
// loopback port for it exposes nothing more; with a token the placeholder
// stays, and the tunnel (which checks the token) is the only way in.

import type { Capability } from "../capability.ts";
import type { CapabilityHandler } from "../env.ts";
import { closeQuietly, isPeerGone } from "../_internal/io.ts";
import { acceptLoop } from "../_internal/accept.ts";

/** What the listeners need from the server that owns them. */
export interface AttachedHost {
  /** The in-process handler of the capability published under `name`, now. */
  handler(name: string): CapabilityHandler | undefined;
  /** Counts a connection against the server's limits until the returned function runs; `null` refuses it. */
  track(conn: Deno.Conn): (() => void) | null;
  /** Unexpected errors. */
  onError(error: unknown): void;
}

/** One loopback listener per in-process capability, opened on first use. */
export class AttachedListeners {
  readonly #host: AttachedHost;
  readonly #listeners = new Map<string, { listener: Deno.Listener; loop: Promise<void> }>();
  readonly #handling = new Set<Promise<void>>();
  #closed = false;

  constructor(host: AttachedHost) {
    this.#host = host;
  }

  /**
   * The url to publish for the in-process `capability`: its own url with
   * the host and port of a loopback listener (opened now if need be).
   */
  urlFor(capability: Capability): string {
    let entry = this.#listeners.get(capability.name);
    if (entry === undefined) {
      if (this.#closed) return capability.url;
      const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      entry = { listener, loop: this.#accept(listener, capability.name) };
      this.#listeners.set(capability.name, entry);
    }
    const port = (entry.listener.addr as Deno.NetAddr).port;
    // scheme://host[:port] of the placeholder, the rest kept.
    return capability.url.replace(
      /^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)(?:[^@/?#]*@)?(\[[^\]]*\]|[^:/?#]*)(:\d*)?/,
      `$1127.0.0.1:${port}`,
    );
  }

  /** Closes the listeners and the connections they accepted; waits for them. */
  async close(): Promise<void> {
    this.#closed = true;
    const loops = [...this.#listeners.values()].map((e) => {
      closeQuietly(e.listener);
      return e.loop;
    });
    this.#listeners.clear();
    await Promise.allSettled([...loops, ...this.#handling]);
  }

  #accept(listener: Deno.Listener, name: string): Promise<void> {
    return acceptLoop(listener, (conn) => {
      const untrack = this.#host.track(conn);
      // Looked up per connection: the capability may have been replaced.
      const handler = this.#host.handler(name);
      if (untrack === null || handler === undefined) {
        untrack?.();
        closeQuietly(conn);
        return;
      }
      const done = handler.attach(conn, new Uint8Array()).catch((err) => {
        if (!isPeerGone(err)) this.#host.onError(err);
      }).finally(() => {
        untrack();
        closeQuietly(conn);
        this.#handling.delete(done);
      });
      this.#handling.add(done);
    }, { closing: () => this.#closed, onError: (err) => this.#host.onError(err) });
  }
}
