// Container snapshots: a container's file system (its writable layer: what
// its processes changed in the image's files) committed by the engine into
// an image (`POST /commit`, on Docker and Podman's compatible API), which
// ContainerRuntime.placeFrom() starts new containers of. Processes and
// memory are not kept, nor what is mounted (the /tmp tmpfs, the control
// socket's directory).
//
// A snapshot's image stays while a container placed from it runs, or a
// snapshot of such a container is alive (its image is a layer on top):
// remove() marks it removed, and the image goes with the last of those.

import { SERVE_TOKEN_VAR } from "../_internal/auth.ts";
import { type EngineClient, EngineError } from "./_engine.ts";
import {
  CONTROL_SOCKET_VAR,
  CREATED_LABEL,
  OWNER_LABEL,
  SNAPSHOT_LABEL,
  SNAPSHOT_REPO,
} from "./_constants.ts";

/** Options for `ContainerRuntime.snapshot()`. */
export interface ContainerSnapshotOptions {
  /** Aborts taking it (a commit under way ends first; its image is then removed). */
  signal?: AbortSignal;
}

/** What a snapshot needs to be placed from and removed, kept apart from its public face. */
interface SnapshotState {
  /** Opens a client of the engine that holds its image. */
  readonly open: () => Promise<EngineClient>;
  /** The engine's socket: a runtime on another engine cannot place from it. */
  readonly socket: string;
  readonly parent: ContainerSnapshot | null;
  /** Containers placed from it and not yet removed, and its children alive. */
  users: number;
  removing: Promise<void> | null;
}

const STATES = new WeakMap<ContainerSnapshot, SnapshotState>();

/**
 * A container's file system at one moment, as an image of the engine
 * (`hud-snapshot:snap-...`, labelled `dev.hud.snapshot`): the image's files
 * with what the container's processes changed in them (contents, modes,
 * owners, links, empty directories; deletions). Processes, memory and
 * mounts (the /tmp tmpfs) are not part of it. `ContainerRuntime.placeFrom()`
 * starts a new container of it. It stays until removed; a killed process's
 * snapshots are what `removeStaleSnapshots()` removes.
 */
export class ContainerSnapshot implements AsyncDisposable {
  /** What it holds: a container's file system (a `ContainerRuntime` places from it). */
  readonly kind = "container";
  /** Its id, unique in this process (`snap-...`; its image's tag). */
  readonly id: string;
  /** The image of the runtime whose container it was taken of. */
  readonly workspace: string;
  /** The snapshot that container was placed from, or null. */
  readonly parent: string | null;
  /** Its ancestry, nearest first: its parent, that one's parent, and so on. */
  readonly lineage: readonly string[];
  /** Bytes of disk its image took on top of the one below (the engine's image sizes). */
  readonly bytes: number;
  /** The engine's id of its image. */
  readonly image: string;
  #removed = false;

  /** Made by `ContainerRuntime.snapshot()`. */
  constructor(
    info: { id: string; workspace: string; bytes: number; image: string },
    state: SnapshotState,
  ) {
    this.id = info.id;
    this.workspace = info.workspace;
    this.parent = state.parent?.id ?? null;
    this.lineage = Object.freeze(
      state.parent === null ? [] : [state.parent.id, ...state.parent.lineage],
    );
    this.bytes = info.bytes;
    this.image = info.image;
    STATES.set(this, state);
  }

  /** Whether it was removed. */
  get removed(): boolean {
    return this.#removed;
  }

  /**
   * Removes it: its image is deleted now, or once the last container placed
   * from it, and the last snapshot taken of such a container, are gone.
   * Idempotent.
   */
  remove(): Promise<void> {
    this.#removed = true;
    return settle(this);
  }

  /** Removes it, as {@linkcode ContainerSnapshot.remove}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.remove();
  }
}

/** Deletes `snapshot`'s image once it is removed and unused; then lets its parent go. */
function settle(snapshot: ContainerSnapshot): Promise<void> {
  const state = STATES.get(snapshot)!;
  if (!snapshot.removed || state.users > 0) return Promise.resolve();
  return state.removing ??= (async () => {
    await deleteImage(state, snapshot);
    if (state.parent !== null) await releaseSnapshot(state.parent);
  })();
}

async function deleteImage(state: SnapshotState, snapshot: ContainerSnapshot): Promise<void> {
  using engine = await state.open();
  try {
    await engine.call("DELETE", `/images/${encodeURIComponent(snapshot.image)}`);
  } catch (err) {
    if (err instanceof EngineError && err.status === 404) return;
    throw new EngineError(
      `Cannot remove snapshot "${snapshot.id}": ${err instanceof Error ? err.message : err}`,
      err instanceof EngineError ? err.status : 500,
      { cause: err },
    );
  }
}

/** Keeps `snapshot`'s image while a container of it, or a child of it, lives. */
export function retainSnapshot(snapshot: ContainerSnapshot): void {
  STATES.get(snapshot)!.users++;
}

/** Undoes one {@linkcode retainSnapshot}; deletes the image when it was the last and it was removed. */
export function releaseSnapshot(snapshot: ContainerSnapshot): Promise<void> {
  STATES.get(snapshot)!.users--;
  return settle(snapshot);
}

/**
 * Checks that `from` is a container snapshot made in this process, not
 * removed, on the engine at `socket()`.
 * @throws {TypeError} when it is not one, or its image is on another engine
 * @throws {Error} when it was removed
 */
export function usableSnapshot(
  verb: string,
  from: unknown,
  socket: () => string,
): ContainerSnapshot {
  const state = from instanceof ContainerSnapshot ? STATES.get(from) : undefined;
  if (state === undefined) {
    const id = (from as { id?: unknown } | null)?.id;
    throw new TypeError(
      `Cannot ${verb}: ${
        typeof id === "string" ? `snapshot "${id}"` : "it"
      } was not made by ContainerRuntime.snapshot() in this process`,
    );
  }
  const snapshot = from as ContainerSnapshot;
  if (snapshot.removed) throw new Error(`Cannot ${verb}: snapshot "${snapshot.id}" was removed`);
  const ours = socket();
  if (state.socket !== ours) {
    throw new TypeError(
      `Cannot ${verb}: snapshot "${snapshot.id}" is an image of the engine at ${state.socket}, not ${ours}; place it with a runtime on that engine`,
    );
  }
  return snapshot;
}

/** What a container is snapshotted from. */
export interface CommitSource {
  readonly engine: EngineClient;
  readonly open: () => Promise<EngineClient>;
  readonly container: string;
  /** The image the container runs (the runtime's, or its snapshot's), to size the new layer against. */
  readonly image: string;
  /** The runtime's image, for `workspace`. */
  readonly workspace: string;
  readonly parent: ContainerSnapshot | null;
  /** Variables the runtime set in the container: emptied in the image, or the image's own values. */
  readonly envKeys: readonly string[];
}

/** Commits `source.container` into a new snapshot image. */
export async function takeSnapshot(
  source: CommitSource,
  signal: AbortSignal | undefined,
): Promise<ContainerSnapshot> {
  signal?.throwIfAborted();
  const { engine } = source;
  const base = await imageInfo(engine, source.image);
  const id = snapshotId();
  const query = new URLSearchParams({
    container: source.container,
    repo: SNAPSHOT_REPO,
    tag: id,
    pause: "true",
  });
  for (const change of commitChanges(id, source.envKeys, base.env)) query.append("changes", change);
  // Not aborted halfway: the engine would make the image and we would not
  // know its id to remove it. An abort is seen just after.
  const made = await engine.call("POST", `/commit?${query}`, {}) as { Id: string };
  // Podman answers a bare hex id, which it reads as a name once the image is gone.
  const image = made.Id.includes(":") ? made.Id : `sha256:${made.Id}`;
  const parent = source.parent;
  const state: SnapshotState = {
    open: source.open,
    socket: engine.socket,
    parent,
    users: 0,
    removing: null,
  };
  let size = base.size;
  try {
    signal?.throwIfAborted();
    size = (await imageInfo(engine, image)).size;
  } catch (err) {
    await engine.call("DELETE", `/images/${encodeURIComponent(image)}`).catch(() => {});
    throw err;
  }
  if (parent !== null) retainSnapshot(parent);
  return new ContainerSnapshot(
    { id, workspace: source.workspace, bytes: Math.max(0, size - base.size), image },
    state,
  );
}

/**
 * The commit's Dockerfile changes: the snapshot's labels, and each
 * variable the runtime set (its token among them) back to the image's value,
 * or empty: the image keeps none of one container's secrets.
 */
function commitChanges(
  id: string,
  envKeys: readonly string[],
  imageEnv: ReadonlyMap<string, string>,
): string[] {
  const changes = [
    `LABEL ${SNAPSHOT_LABEL}=${id}`,
    `LABEL ${OWNER_LABEL}=${Deno.pid}`,
    `LABEL ${CREATED_LABEL}=${new Date().toISOString()}`,
  ];
  for (const key of new Set([SERVE_TOKEN_VAR, CONTROL_SOCKET_VAR, ...envKeys])) {
    const value = imageEnv.get(key) ?? "";
    // A value the change line would need quoting for is left empty too.
    changes.push(`ENV ${key}=${/^[\w/.:,+@%=-]*$/.test(value) ? value : ""}`);
  }
  return changes;
}

/** An image's size (the engine's, its layers below included) and variables. */
async function imageInfo(
  engine: EngineClient,
  image: string,
): Promise<{ size: number; env: Map<string, string> }> {
  const info = await engine.call("GET", `/images/${encodeURIComponent(image)}/json`) as {
    Size?: number;
    Config?: { Env?: string[] | null };
  };
  const env = new Map<string, string>();
  for (const entry of info.Config?.Env ?? []) {
    const at = entry.indexOf("=");
    if (at > 0) env.set(entry.slice(0, at), entry.slice(at + 1));
  }
  return { size: info.Size ?? 0, env };
}

function snapshotId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  return `snap-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}
