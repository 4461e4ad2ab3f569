// A runtime whose control connections can be cut: each placement of an
// inner runtime is reached through a TCP relay of its own that cuts a
// connection (both ends, at once) when told to. The SDK sees what a network
// partition or a dying load balancer does: a connection that ends
// mid-rollout.
//
// A placement serves one rollout, and every connection of that rollout (its
// control session and its capabilities' tunnels) goes through the
// placement's relay, so a cut is put down to the rollout: the relay reads
// which one from the `tasks.start` frame that passes through it (the task's
// arguments). A cut before that frame belongs to a rollout that never
// started its task; those are counted apart.

import type { Placement, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { placementOf } from "../runtime/placement.ts";
import { closeQuietly, type Duplex, splice } from "../_internal/io.ts";

/** How far into a client's bytes the relay looks for the `tasks.start` frame. */
const SNIFF_LIMIT = 64 * 1024;

/** The relay of one placement, with the pairs of connections it holds. */
class Relay {
  readonly #listener: Deno.Listener;
  readonly #target: number;
  readonly #keyOf: (args: unknown) => string | null;
  readonly pairs = new Set<[Deno.Conn, Deno.Conn]>();
  readonly #running = new Set<Promise<void>>();
  /** The rollout's key, once its `tasks.start` went through. */
  key: string | null = null;
  /** Cuts made before the key was known. */
  cutsUnkeyed = 0;

  constructor(target: number, keyOf: (args: unknown) => string | null) {
    this.#target = target;
    this.#keyOf = keyOf;
    this.#listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    void this.#accept();
  }

  get port(): number {
    return (this.#listener.addr as Deno.NetAddr).port;
  }

  async #accept(): Promise<void> {
    try {
      for await (const a of this.#listener) {
        const done = this.#relay(a).catch(() => {}).finally(() => this.#running.delete(done));
        this.#running.add(done);
      }
    } catch {
      // closed
    }
  }

  async #relay(a: Deno.Conn): Promise<void> {
    let b: Deno.Conn;
    try {
      b = await Deno.connect({ hostname: "127.0.0.1", port: this.#target });
    } catch {
      closeQuietly(a);
      return;
    }
    const pair: [Deno.Conn, Deno.Conn] = [a, b];
    this.pairs.add(pair);
    try {
      await splice(this.#sniffing(a), b);
    } finally {
      this.pairs.delete(pair);
      closeQuietly(a);
      closeQuietly(b);
    }
  }

  /** `conn`, whose first bytes from the client are read for the `tasks.start` frame. */
  #sniffing(conn: Deno.Conn): Duplex {
    const decoder = new TextDecoder();
    let seen = "";
    return {
      read: async (p) => {
        const n = await conn.read(p);
        if (n !== null && this.key === null && seen.length < SNIFF_LIMIT) {
          seen += decoder.decode(p.subarray(0, n), { stream: true });
          this.#findKey(seen);
        }
        return n;
      },
      write: (p) => conn.write(p),
      closeWrite: () => conn.closeWrite(),
      close: () => conn.close(),
    };
  }

  #findKey(text: string): void {
    for (const line of text.split("\n").slice(0, -1)) {
      if (!line.includes('"tasks.start"')) continue;
      try {
        const frame = JSON.parse(line) as { params?: { args?: unknown } };
        this.key = this.#keyOf(frame.params?.args);
        return;
      } catch {
        // not a whole frame
      }
    }
  }

  async close(): Promise<void> {
    closeQuietly(this.#listener);
    for (const [a, b] of this.pairs) {
      closeQuietly(a);
      closeQuietly(b);
    }
    await Promise.allSettled([...this.#running]);
  }
}

/**
 * `inner`'s placements, each through a relay of its own whose connections
 * {@linkcode CuttingRuntime.cut} ends; `keyOf` names a rollout from its
 * task's arguments.
 */
export class CuttingRuntime implements RuntimeProvider {
  readonly #inner: RuntimeProvider;
  readonly #keyOf: (args: unknown) => string | null;
  readonly #relays = new Set<Relay>();
  /** Every cut, by rollout key. */
  readonly cutsByKey = new Map<string, number>();
  /** Cuts on placements whose task had not started (no key). */
  cutsUnkeyed = 0;
  cuts = 0;

  constructor(inner: RuntimeProvider, keyOf: (args: unknown) => string | null) {
    this.#inner = inner;
    this.#keyOf = keyOf;
  }

  async place(options?: PlaceOptions): Promise<Placement> {
    const inner = await this.#inner.place(options);
    const relay = new Relay(inner.address.port, this.#keyOf);
    this.#relays.add(relay);
    const address = { hostname: "127.0.0.1", port: relay.port, token: inner.address.token };
    return placementOf(address, inner.params, async () => {
      this.#relays.delete(relay);
      this.cutsUnkeyed += relay.cutsUnkeyed;
      await relay.close();
      await inner[Symbol.asyncDispose]();
    });
  }

  /** Cuts one connection at random (a control session or a capability's tunnel); false when none is open. */
  cut(): boolean {
    const all = [...this.#relays].flatMap((r) => [...r.pairs].map((pair) => ({ r, pair })));
    if (all.length === 0) return false;
    const { r, pair: [a, b] } = all[Math.floor(Math.random() * all.length)];
    closeQuietly(a);
    closeQuietly(b);
    this.cuts++;
    if (r.key === null) r.cutsUnkeyed++;
    else this.cutsByKey.set(r.key, (this.cutsByKey.get(r.key) ?? 0) + 1);
    return true;
  }

  async close(): Promise<void> {
    for (const r of this.#relays) this.cutsUnkeyed += r.cutsUnkeyed;
    await Promise.all([...this.#relays].map((r) => r.close()));
    this.#relays.clear();
  }
}
