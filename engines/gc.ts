/**
 * {@linkcode removeStaleContainers}: cleaning up the containers of a run
 * that was killed.
 *
 * @module
 */

import { EngineClient, removeContainer } from "./_engine.ts";
import { CONTROL_DIR_LABEL, OWNER_LABEL } from "./_constants.ts";
import { processAlive } from "../_internal/process.ts";

/** Options for {@linkcode removeStaleContainers}. */
export interface RemoveStaleOptions {
  /**
   * Engine socket.
   * @default as {@linkcode ContainerRuntimeOptions.socket}
   */
  socket?: string;
  /**
   * Also remove containers of live processes older than this, in ms.
   * @default Infinity (only those whose creating process is gone)
   */
  olderThan?: number;
}

/**
 * Removes the control socket directory a container's label names: only one
 * that looks like the runtime's own (`hud-container-*`, a directory of this
 * user), since anyone who may start containers may write labels.
 */
async function removeControlDir(dir: string | undefined): Promise<void> {
  if (dir === undefined || !/\/hud-container-[A-Za-z0-9_]+$/.test(dir)) return;
  try {
    const info = await Deno.lstat(dir);
    if (!info.isDirectory || info.uid !== Deno.uid()) return;
    await Deno.remove(dir, { recursive: true });
  } catch {
    // gone already
  }
}

/**
 * Removes the containers a killed run left behind: those labelled by this
 * runtime whose creating process is gone (on this machine), or older than
 * `olderThan`, with the directories on this host that held their
 * control sockets.
 *
 * @returns the ids removed
 */
export async function removeStaleContainers(options: RemoveStaleOptions = {}): Promise<string[]> {
  using engine = await EngineClient.open(options.socket);
  const filters = encodeURIComponent(JSON.stringify({ label: [OWNER_LABEL] }));
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
    Created: number;
    Labels?: Record<string, string>;
  }[];
  const removed: string[] = [];
  const now = Date.now();
  for (const c of list) {
    const owner = Number(c.Labels?.[OWNER_LABEL]);
    const orphan = !Number.isInteger(owner) || owner === Deno.pid ? false : !processAlive(owner);
    const old = now - c.Created * 1000 > (options.olderThan ?? Infinity);
    if (orphan || old) {
      await removeContainer(engine, c.Id, 0);
      removed.push(c.Id);
      await removeControlDir(c.Labels?.[CONTROL_DIR_LABEL]);
    }
  }
  return removed;
}
