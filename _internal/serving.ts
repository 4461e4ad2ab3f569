// Which environments `serve()` is serving in this process, so that the
// command line can tell a module that serves itself when imported (no
// `import.meta.main` guard) from one it should serve. Kept on globalThis:
// the module may import another copy of the SDK (a symlinked checkout, jsr)
// than the command line's.

const KEY = Symbol.for("@hud/sdk.serving");

/** A running server, as far as the command line needs it. */
export interface ServingHandle {
  readonly addr: Deno.NetAddr | Deno.UnixAddr;
  shutdown(): Promise<void>;
}

function registry(): WeakMap<object, ServingHandle> {
  const g = globalThis as { [KEY]?: WeakMap<object, ServingHandle> };
  return g[KEY] ??= new WeakMap();
}

/** Records that `env` is served by `server` until `finished` settles. */
export function markServing(env: object, server: ServingHandle, finished: Promise<unknown>): void {
  registry().set(env, server);
  finished.finally(() => {
    if (registry().get(env) === server) registry().delete(env);
  }).catch(() => {});
}

/** The server already serving `env` in this process, if any. */
export function servingOf(env: object): ServingHandle | undefined {
  return registry().get(env);
}
