// A job of rollouts from a container snapshot it took, interrupted as
// `hud eval` is (SIGINT to a child process running it): the job's snapshot
// image is removed before the process exits, and none of its containers is
// left; killed by SIGKILL, its image is what removeStaleSnapshots() (hud
// gc) removes. On Docker, and on Podman's compatible API when
// HUD_TEST_PODMAN_SOCKET names one.

import { test } from "../_test.ts";
import { type Counterpart, ENGINE, PODMAN } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { waitingFor, withDeadline } from "../_deadline.ts";
import { removeStaleContainers, removeStaleSnapshots } from "../../engines/mod.ts";
import {
  buildForkImage,
  containersOf,
  PODMAN_SOCKET,
  snapshotImagesOf,
  sweep,
} from "./_snapshot_images.ts";

const FIXTURE = new URL("../fixtures/container_fork_job.ts", import.meta.url).pathname;

/** Reads `stream` until a line is `want`; the text read, and the reader to go on with. */
async function readUntil(stream: ReadableStream<string>, want: string) {
  const reader = stream.getReader();
  let text = "";
  while (!text.split("\n").includes(want)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
  }
  return { text, reader };
}

/** The fixture's job on the engine at `socket`, once its two agents are at work. */
async function jobAtWork(socket: string | undefined) {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", FIXTURE, socket ?? ""],
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(55_000),
  }).spawn();
  const stderr = new Response(child.stderr).text();
  const stdout = child.stdout.pipeThrough(new TextDecoderStream());
  const first = await waitingFor("two agents at work", readUntil(stdout, "running 2"));
  // The child's stderr is read once it exits: a failure says what it said.
  if (!/running 2/.test(first.text)) {
    child.kill("SIGKILL");
    assert.fail(`the child never had two agents at work: ${first.text}${await stderr}`);
  }
  return { child, stderr, reader: first.reader };
}

/** Kills `child` if it still runs and waits for its end. */
async function ended(child: Deno.ChildProcess, stderr: Promise<string>): Promise<void> {
  try {
    child.kill("SIGKILL");
  } catch { /* gone */ }
  await waitingFor("the child's end", child.status);
  await waitingFor("the child's stderr", stderr);
}

function suite(label: string, socket: string | undefined, needs: readonly Counterpart[]) {
  test({
    name:
      `Taskset.run() from a container snapshot: after SIGINT, the job's image and containers are gone before exit (${label})`,
    needs,
    fn: withDeadline(59_000, async () => {
      await buildForkImage(socket);
      const { child, stderr, reader } = await jobAtWork(socket);
      try {
        assert.equal((await snapshotImagesOf(child.pid, socket)).length, 1, "the job's image");
        child.kill("SIGINT");
        let rest = "";
        while (true) {
          const { value, done } = await waitingFor("the child's last words", reader.read());
          if (done) break;
          rest += value;
        }
        const status = await waitingFor("the child's exit", child.status);
        assert.equal(status.code, 130, rest + (await stderr));
        const report = JSON.parse(rest.trim().split("\n").pop()!);
        assert.deepEqual(report, {
          taken: 1,
          removed: [true],
          cancelled: 2,
          containers: [],
          images: [],
        });
        assert.deepEqual(await snapshotImagesOf(child.pid, socket), []);
        assert.deepEqual(await containersOf(child.pid, socket), []);
      } finally {
        await ended(child, stderr);
        await sweep(child.pid, socket);
      }
    }),
  });

  test({
    name: `removeStaleSnapshots() removes the snapshot image of a job killed by SIGKILL (${label})`,
    needs,
    fn: withDeadline(59_000, async () => {
      await buildForkImage(socket);
      const { child, stderr } = await jobAtWork(socket);
      try {
        const [image] = await snapshotImagesOf(child.pid, socket);
        assert.ok(image, "the job's image");
        await ended(child, stderr);
        assert.deepEqual(await snapshotImagesOf(child.pid, socket), [image], "left by the kill");
        // Its containers first: an image a container runs stays.
        await removeStaleContainers({ socket });
        assert.ok((await removeStaleSnapshots({ socket })).includes(image));
        assert.deepEqual(await snapshotImagesOf(child.pid, socket), []);
        assert.deepEqual(await containersOf(child.pid, socket), []);
      } finally {
        await ended(child, stderr);
        await sweep(child.pid, socket);
      }
    }),
  });
}

suite("default engine", undefined, [ENGINE]);
suite("Podman", PODMAN_SOCKET, [PODMAN]);
