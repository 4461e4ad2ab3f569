/**
 * The runtime contract: a {@linkcode RuntimeProvider} places an environment
 * for a rollout, the client connects to the {@linkcode Placement}'s url,
 * and disposing the placement releases it. Every runtime implements it,
 * here and in `engines/`; `connect()` takes one (structurally: the client
 * is a lower layer and does not import this module).
 *
 * @module
 */

/** A placed environment: where to connect, until disposed. */
export interface Placement extends AsyncDisposable {
  /**
   * The control address, `tcp://host:port`, or `tcp://:TOKEN@host:port` when
   * the environment requires a token (do not print it).
   */
  readonly url: string;
  /** Data about the placement (container id, pid...). */
  readonly params: Readonly<Record<string, unknown>>;
}

/** Options for {@linkcode RuntimeProvider.place}. */
export interface PlaceOptions {
  /** Aborts placing. */
  signal?: AbortSignal;
}

/**
 * Something that can place an environment for a rollout: the runtimes in
 * `runtime/` and `engines/` implement it, and `connect()` accepts one.
 */
export interface RuntimeProvider {
  /** Places the environment; dispose the placement to release it. */
  place(options?: PlaceOptions): Promise<Placement>;
}
