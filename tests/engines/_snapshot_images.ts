// What the container snapshot tests share: the image of
// tests/fixtures/container_fork_env.ts (on a base of this machine's shell
// tools with a /work anyone may write), a runtime of it with a writable
// image, and what a process left on an engine: its containers and its
// snapshot images, found by label, and removed.

import { buildEnvironmentImage, ContainerRuntime, OWNER_LABEL } from "../../engines/mod.ts";
import { EngineClient } from "../../engines/_engine.ts";
import { buildContext } from "../../engines/_base_image.ts";
import { SNAPSHOT_LABEL } from "../../engines/_constants.ts";
import { TarWriter } from "../../engines/_tar.ts";
import { buildShellBase } from "./_shell_base.ts";

/** Where Podman's API answers in CI (HUD_TEST_PODMAN_SOCKET; the PODMAN counterpart). */
export const PODMAN_SOCKET = Deno.env.get("HUD_TEST_PODMAN_SOCKET") || "/run/podman/podman.sock";

const SHELL = "hud-test-shell-bwrap:latest";
const WORK_BASE = "hud-test-cfork-base:latest";
/** The environment's image. */
export const FORK_TAG = "hud-test-cfork:latest";
const FIXTURE = new URL("../fixtures/container_fork_env.ts", import.meta.url).pathname;

const built = new Map<string | undefined, Promise<void>>();

/** The images on the engine at `socket` (default: the default one), once per process. */
export function buildForkImage(socket?: string): Promise<void> {
  let done = built.get(socket);
  if (done === undefined) {
    done = (async () => {
      const signal = AbortSignal.timeout(240_000);
      await buildShellBase(SHELL, socket);
      const tar = new TarWriter();
      tar.dir("root/work", 0o1777);
      tar.file("Dockerfile", new TextEncoder().encode(`FROM ${SHELL}\nCOPY root/ /\n`));
      await buildContext(tar, WORK_BASE, { socket, signal });
      await buildEnvironmentImage(FIXTURE, FORK_TAG, {
        from: WORK_BASE,
        envName: "cfork",
        envVersion: "1.0.0",
        socket,
        signal,
      });
    })();
    built.set(socket, done);
    done.catch(() => built.delete(socket));
  }
  return done;
}

/**
 * The label on every container these tests' runtimes make: other test
 * files, run beside them under `deno test --parallel` in the same process,
 * have containers of the same owner, which these tests must neither count
 * nor remove.
 */
const FILE_LABEL = "dev.hud.test.file";
const FILE = "container_snapshot";

/** A runtime of the environment whose image is writable (what a snapshot keeps). */
export function forkRuntime(socket?: string): ContainerRuntime {
  return new ContainerRuntime(FORK_TAG, {
    socket,
    readOnly: false,
    pids: 512,
    labels: { [FILE_LABEL]: FILE },
  });
}

function byOwner(pid: number): string {
  return encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${pid}`] }));
}

/**
 * The snapshot images process `pid` committed, newest first. Filtered by
 * one label only: Podman 4.3 matches nothing for two label filters, one of
 * them a bare key.
 */
async function ownImages(engine: EngineClient, pid: number) {
  const list = await engine.call("GET", `/images/json?filters=${byOwner(pid)}`) as {
    Id: string;
    Created: number;
    Labels?: Record<string, string> | null;
  }[];
  return list.filter((i) => i.Labels?.[SNAPSHOT_LABEL] !== undefined)
    .sort((a, b) => b.Created - a.Created);
}

/** The ids of the containers process `pid` made on the engine at `socket`. */
export async function containersOf(pid: number, socket?: string): Promise<string[]> {
  using engine = await EngineClient.open(socket);
  const list = await engine.call("GET", `/containers/json?all=true&filters=${byOwner(pid)}`) as {
    Id: string;
    Labels?: Record<string, string> | null;
  }[];
  // By one label on the engine (Podman 4.3), the other here.
  return list.filter((c) => c.Labels?.[FILE_LABEL] === FILE).map((c) => c.Id);
}

/** The ids of the snapshot images process `pid` committed on the engine at `socket`. */
export async function snapshotImagesOf(pid: number, socket?: string): Promise<string[]> {
  using engine = await EngineClient.open(socket);
  return (await ownImages(engine, pid)).map((i) => i.Id);
}

/**
 * Removes what process `pid` left on the engine at `socket`: its
 * containers, then its snapshot images, newest first (a child image before
 * the one it stands on). For a test's `finally`: a failed test leaves
 * nothing either.
 */
export async function sweep(pid: number, socket?: string): Promise<void> {
  using engine = await EngineClient.open(socket);
  for (const id of await containersOf(pid, socket)) {
    await engine.call("DELETE", `/containers/${id}?force=true`).catch(() => {});
  }
  // Twice: a child image made in the same second as its parent may sort after it.
  for (let pass = 0; pass < 2; pass++) {
    for (const image of await ownImages(engine, pid)) {
      await engine.call("DELETE", `/images/${encodeURIComponent(image.Id)}?force=true`)
        .catch(() => {});
    }
  }
}
