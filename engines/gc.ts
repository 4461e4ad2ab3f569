/**
 * {@linkcode removeStaleContainers}, {@linkcode removeStaleSnapshots},
 * {@linkcode removeStaleNetworks} and {@linkcode removeStaleVolumes}:
 * cleaning up the containers, snapshot images, networks and volumes of a
 * run that was killed.
 *
 * @module
 */

import { EngineClient, EngineError, removeContainer } from "./_engine.ts";
import { CONTROL_DIR_LABEL, OWNER_LABEL, SNAPSHOT_LABEL } from "./_constants.ts";
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
    if (stale(c, now, options.olderThan)) {
      await removeContainer(engine, c.Id, 0);
      removed.push(c.Id);
      await removeControlDir(c.Labels?.[CONTROL_DIR_LABEL]);
    }
  }
  return removed;
}

/** Whether what a process labelled is stale: its process gone, or older than `olderThan` ms. */
function stale(
  item: { Created: number; Labels?: Record<string, string> | null },
  now: number,
  olderThan = Infinity,
): boolean {
  const owner = Number(item.Labels?.[OWNER_LABEL]);
  const orphan = !Number.isInteger(owner) || owner === Deno.pid ? false : !processAlive(owner);
  return orphan || now - item.Created * 1000 > olderThan;
}

/**
 * Removes the snapshot images (`ContainerRuntime.snapshot()`'s, labelled
 * `dev.hud.snapshot`) a killed run left behind: those whose committing
 * process is gone, or older than `olderThan`. Run it after
 * {@linkcode removeStaleContainers}: an image a container still runs stays.
 *
 * @returns the image ids removed
 */
export async function removeStaleSnapshots(options: RemoveStaleOptions = {}): Promise<string[]> {
  using engine = await EngineClient.open(options.socket);
  const filters = encodeURIComponent(JSON.stringify({ label: [SNAPSHOT_LABEL] }));
  const list = await engine.call("GET", `/images/json?filters=${filters}`) as {
    Id: string;
    Created: number;
    Labels?: Record<string, string> | null;
  }[];
  const now = Date.now();
  // Children first: an image another one is a layer of cannot go before it.
  const todo = list.filter((i) => stale(i, now, options.olderThan))
    .sort((a, b) => b.Created - a.Created);
  const removed: string[] = [];
  for (const image of todo) {
    try {
      await engine.call("DELETE", `/images/${encodeURIComponent(image.Id)}`);
      removed.push(image.Id);
    } catch (err) {
      // 404: another cleaner removed it; 409: a container still uses it.
      if (!(err instanceof EngineError) || (err.status !== 404 && err.status !== 409)) throw err;
    }
  }
  return removed;
}

/**
 * Removes the engine networks a killed run left behind (a Harbor compose
 * task's, labelled with its process): those whose process is gone, or older
 * than `olderThan`. Run it after {@linkcode removeStaleContainers}: a
 * network a container is still on stays.
 *
 * @returns the names removed
 */
export async function removeStaleNetworks(options: RemoveStaleOptions = {}): Promise<string[]> {
  using engine = await EngineClient.open(options.socket);
  const list = await engine.call("GET", `/networks?filters=${byOwnerLabel()}`) as {
    Name: string;
    Created?: string;
    Labels?: Record<string, string> | null;
  }[];
  return await removeEach(
    engine,
    list.map((n) => ({ name: n.Name, created: n.Created, labels: n.Labels })),
    options.olderThan,
    (name) => `/networks/${encodeURIComponent(name)}`,
  );
}

/**
 * Removes the named volumes a killed run left behind (a Harbor compose
 * task's, labelled with its process): those whose process is gone, or older
 * than `olderThan`. Run it after {@linkcode removeStaleContainers}: a volume
 * a container still mounts stays.
 *
 * @returns the names removed
 */
export async function removeStaleVolumes(options: RemoveStaleOptions = {}): Promise<string[]> {
  using engine = await EngineClient.open(options.socket);
  const reply = await engine.call("GET", `/volumes?filters=${byOwnerLabel()}`) as {
    Volumes?: { Name: string; CreatedAt?: string; Labels?: Record<string, string> | null }[] | null;
  };
  return await removeEach(
    engine,
    (reply.Volumes ?? []).map((v) => ({ name: v.Name, created: v.CreatedAt, labels: v.Labels })),
    options.olderThan,
    (name) => `/volumes/${encodeURIComponent(name)}`,
  );
}

function byOwnerLabel(): string {
  return encodeURIComponent(JSON.stringify({ label: [OWNER_LABEL] }));
}

/** Deletes each stale item at `path(name)`; one in use (409) or gone (404) is left. */
async function removeEach(
  engine: EngineClient,
  items: { name: string; created: string | undefined; labels?: Record<string, string> | null }[],
  olderThan: number | undefined,
  path: (name: string) => string,
): Promise<string[]> {
  const now = Date.now();
  const removed: string[] = [];
  for (const item of items) {
    // An unreadable creation time counts as new: only a gone owner removes it then.
    const created = Date.parse(item.created ?? "") / 1000;
    const entry = { Created: Number.isFinite(created) ? created : now / 1000, Labels: item.labels };
    if (!stale(entry, now, olderThan)) continue;
    try {
      await engine.call("DELETE", path(item.name));
      removed.push(item.name);
    } catch (err) {
      if (!(err instanceof EngineError) || (err.status !== 404 && err.status !== 409)) throw err;
    }
  }
  return removed;
}
