// What the Harbor tests share about the engine: the containers this process
// left for a test's tasks, and an abort once a given container runs.
// (Whether they can run is the ENGINE counterpart, tests/_counterparts.ts.)

import { EngineClient, inspectImage } from "../../engines/_engine.ts";
import { OWNER_LABEL } from "../../engines/mod.ts";

/**
 * The containers, running or not, that this process's runtimes made (by
 * owner label) for tasks in the folder `under` (by the runner's
 * `dev.hud.harbor.path` label): other test files, run beside this one under
 * `deno test --parallel` in the same process, have containers of their own.
 */
export async function containersLeft(under: string): Promise<string[]> {
  using engine = await EngineClient.open();
  const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${Deno.pid}`] }));
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
    Labels?: Record<string, string>;
  }[];
  const folder = under.endsWith("/") ? under : `${under}/`;
  return list.filter((c) => `${c.Labels?.["dev.hud.harbor.path"] ?? ""}/`.startsWith(folder))
    .map((c) => c.Id);
}

/** Whether the engine at `socket` (default: the default one) has image `tag`. */
export async function hasImage(tag: string, socket?: string): Promise<boolean> {
  using engine = await EngineClient.open(socket);
  return await inspectImage(engine, tag) !== null;
}

/**
 * Runs `run` with a signal that aborts once a container with all of
 * `labels` runs (the engine asked every 100 ms until `run` settles);
 * whether it aborted. `run`'s own failure is the abort's doing, not
 * reported.
 */
export async function abortOnceRunning(
  labels: readonly string[],
  run: (signal: AbortSignal) => Promise<unknown>,
): Promise<boolean> {
  const abort = new AbortController();
  using engine = await EngineClient.open();
  const filters = encodeURIComponent(JSON.stringify({ label: labels }));
  let finished = false;
  const watch = (async () => {
    while (!abort.signal.aborted && !finished) {
      const list = await engine.call("GET", `/containers/json?filters=${filters}`) as unknown[];
      if (list.length > 0) abort.abort(new Error("aborted by the test"));
      else await new Promise((r) => setTimeout(r, 100));
    }
  })();
  await run(abort.signal).catch(() => {}).finally(() => finished = true);
  await watch;
  return abort.signal.aborted;
}
