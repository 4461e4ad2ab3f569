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

const LOADING = Symbol.for("@hud/sdk.loading");

/** The modules being imported as environments now (their URLs), each with a count. */
function loadingModules(): Map<string, number> {
  const g = globalThis as { [LOADING]?: Map<string, number> };
  return g[LOADING] ??= new Map();
}

/** Imports the module at `href` as an environment's (`loadEnvironment`). */
export async function importEnvironmentModule(href: string): Promise<Record<string, unknown>> {
  const loading = loadingModules();
  loading.set(href, (loading.get(href) ?? 0) + 1);
  try {
    return await import(href);
  } finally {
    const left = loading.get(href)! - 1;
    if (left === 0) loading.delete(href);
    else loading.set(href, left);
  }
}

/**
 * The module being imported as an environment's that this call comes from,
 * if any: a module that serves its environment when imported (no
 * `import.meta.main` guard). Read from the (async) stack, which holds the
 * module's top level while it runs, so that a serve() elsewhere in the
 * process at the same time is not mistaken for it.
 */
export function servingWhileLoaded(): string | undefined {
  const loading = loadingModules();
  if (loading.size === 0) return undefined;
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = Infinity;
  const stack = new Error().stack ?? "";
  Error.stackTraceLimit = limit;
  return [...loading.keys()].find((href) => stack.includes(`${href}:`));
}
