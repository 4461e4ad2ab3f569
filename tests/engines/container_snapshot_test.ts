// Container snapshots against real engines (Docker, and Podman's compatible
// API when HUD_TEST_PODMAN_SOCKET names one): ContainerRuntime.snapshot()
// commits a container's file system into an image, placeFrom() starts
// forks of it that begin with its files and diverge apart, a Taskset runs
// a best-of-4 from one prepared container state, and the job's images go
// with the job, also when a snapshot fails its bound. Each test removes
// what it made, even when it fails.

import { test } from "../_test.ts";
import { type Counterpart, ENGINE, PODMAN } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { connect, type HudClient } from "../../client.ts";
import { taskSlug } from "../../env.ts";
import type { ContainerSnapshot } from "../../engines/mod.ts";
import { EngineClient } from "../../engines/_engine.ts";
import { OWNER_LABEL, SNAPSHOT_LABEL } from "../../engines/_constants.ts";
import { SERVE_TOKEN_VAR } from "../../_internal/auth.ts";
import { functionAgent, Taskset } from "../../eval/mod.ts";
import type { Placement } from "../../runtime/placement.ts";
import { withDeadline } from "../_deadline.ts";
import {
  buildForkImage,
  containersOf,
  FORK_TAG,
  forkRuntime,
  PODMAN_SOCKET,
  snapshotImagesOf,
  sweep,
} from "./_snapshot_images.ts";

interface State {
  work: string[];
  tmp: string;
}

async function task(client: HudClient, id: string, args: Record<string, unknown> = {}) {
  const { prompt } = await client.startTask(id, args);
  assert.equal((await client.grade({ answer: "" })).score, 1);
  return String(prompt);
}

async function stateOf(placement: Placement): Promise<State> {
  await using client = await connect(placement);
  return JSON.parse(await task(client, "state")) as State;
}

async function write(placement: Placement, name: string, text: string): Promise<void> {
  await using client = await connect(placement);
  await task(client, "write", { name, text });
}

/** The committed image's labels and variables. */
async function imageConfig(image: string, socket?: string) {
  using engine = await EngineClient.open(socket);
  const info = await engine.call("GET", `/images/${encodeURIComponent(image)}/json`) as {
    Config: { Labels: Record<string, string>; Env: string[] };
  };
  return info.Config;
}

async function imageExists(image: string, socket?: string): Promise<boolean> {
  return await imageConfig(image, socket).then(() => true, () => false);
}

/** A placement of a container prepared with `lines` lines of log.txt, snapshotted. */
async function preparedSnapshot(
  runtime: ReturnType<typeof forkRuntime>,
  lines: number,
  signal?: AbortSignal,
): Promise<{ snapshot: ContainerSnapshot; state: State }> {
  await using placement = await runtime.place({ signal });
  {
    await using client = await connect(placement);
    await task(client, "prepare", { lines });
  }
  const state = await stateOf(placement);
  return { snapshot: await runtime.snapshot(placement, { signal }), state };
}

function suite(label: string, socket: string | undefined, needs: readonly Counterpart[]) {
  test({
    name:
      `ContainerRuntime.snapshot() commits a container; its forks start with its files and diverge (${label})`,
    needs,
    fn: withDeadline(59_000, async () => {
      await buildForkImage(socket);
      const runtime = forkRuntime(socket);
      const made: ContainerSnapshot[] = [];
      try {
        const { snapshot: s, state: want } = await preparedSnapshot(runtime, 2);
        made.push(s);
        assert.equal(s.kind, "container");
        assert.equal(s.workspace, FORK_TAG);
        assert.deepEqual([s.parent, s.lineage], [null, []]);
        assert.ok(s.bytes > 0 && s.bytes < 1024 * 1024, `${s.bytes} bytes`);
        // What the prepared container held: contents, modes, links, empty directories.
        for (
          const entry of [
            '/log.txt file 644 "setup\\nsetup\\n"',
            '/run.sh file 750 "#!/bin/sh\\necho ran\\n"',
            '/deep/er/note file 600 "deep\\n"',
            "/empty dir 755",
            "/link link log.txt",
            "/dangling link /nowhere",
          ]
        ) assert.ok(want.work.includes(entry), `${entry} in ${want.work.join(", ")}`);
        assert.equal(want.tmp, "tmpfs\n");
        // The image is labelled for gc, and keeps no token of the container.
        const config = await imageConfig(s.image, socket);
        assert.equal(config.Labels[SNAPSHOT_LABEL], s.id);
        assert.equal(config.Labels[OWNER_LABEL], String(Deno.pid));
        assert.ok(config.Env.includes(`${SERVE_TOKEN_VAR}=`), config.Env.join(" "));

        const [a, b] = await Promise.all([runtime.placeFrom(s), runtime.placeFrom(s)]);
        let child: ContainerSnapshot;
        try {
          assert.equal(a.params.from, s.id);
          for (const fork of [a, b]) {
            // The snapshot's files; /tmp (a tmpfs) is not in a commit.
            assert.deepEqual(await stateOf(fork), { work: want.work, tmp: "NotFound" });
          }
          await write(a, "a.txt", "from a");
          await write(b, "b.txt", "from b");
          const [sa, sb] = [await stateOf(a), await stateOf(b)];
          assert.ok(sa.work.includes('/a.txt file 644 "from a"'), sa.work.join(", "));
          assert.ok(!sa.work.some((e) => e.startsWith("/b.txt")), sa.work.join(", "));
          assert.ok(sb.work.includes('/b.txt file 644 "from b"'), sb.work.join(", "));
          assert.ok(!sb.work.some((e) => e.startsWith("/a.txt")), sb.work.join(", "));
          child = await runtime.snapshot(a);
          made.push(child);
          assert.deepEqual([child.parent, child.lineage], [s.id, [s.id]]);
          // Removed while its forks run: refused for new forks, its image kept.
          await s.remove();
          await assert.rejects(runtime.placeFrom(s), new RegExp(`snapshot "${s.id}" was removed`));
          assert.ok(await imageExists(s.image, socket), "the forks' image stays while they run");
        } finally {
          await a[Symbol.asyncDispose]();
          await b[Symbol.asyncDispose]();
        }
        // A child of it still stands on its image; removing the child lets both go.
        assert.ok(await imageExists(s.image, socket), "a child's image stands on it");
        const c = await runtime.placeFrom(child);
        try {
          const sc = await stateOf(c);
          assert.ok(sc.work.includes('/a.txt file 644 "from a"'), sc.work.join(", "));
        } finally {
          await c[Symbol.asyncDispose]();
        }
        await child.remove();
        assert.deepEqual(await snapshotImagesOf(Deno.pid, socket), []);
        // An image deleted outside this process: placing from it says so, removing it is a no-op.
        const { snapshot: gone } = await preparedSnapshot(runtime, 1);
        made.push(gone);
        {
          using engine = await EngineClient.open(socket);
          await engine.call("DELETE", `/images/${encodeURIComponent(gone.image)}?force=true`);
        }
        await assert.rejects(runtime.placeFrom(gone), {
          name: "EngineError",
          message: new RegExp(`snapshot "${gone.id}": its image \\S+ is gone from`),
        });
        await gone.remove();
        assert.deepEqual(await containersOf(Deno.pid, socket), []);
      } finally {
        for (const s of made) await s.remove().catch(() => {});
        await runtime.close();
        await sweep(Deno.pid, socket);
      }
    }),
  });

  test({
    name:
      `Taskset.run() from a container snapshot: a best-of-4 graded on each fork, no fork sees another's files, the job's image removed (${label})`,
    needs,
    fn: withDeadline(59_000, async () => {
      await buildForkImage(socket);
      const runtime = forkRuntime(socket);
      const taken: ContainerSnapshot[] = [];
      let started = 0;
      let arrived = 0;
      let allArrived: () => void = () => {};
      const barrier = new Promise<void>((resolve) => allArrived = resolve);
      const agent = functionAgent(async (_prompt, run) => {
        await using shell = await run.client.open("shell");
        const k = ++started;
        const me = `mark-${k}`;
        const wrote = await shell.exec(
          `cd /work && touch ${me} && for i in $(seq ${k}); do echo agent >> log.txt; done`,
        );
        if (wrote.code !== 0) throw new Error(`append failed: ${wrote.stderrText}`);
        // Every fork has written its mark before any looks for the others'.
        if (++arrived === 4) allArrived();
        let timer: ReturnType<typeof setTimeout> | undefined;
        await Promise.race([
          barrier,
          new Promise((_, reject) => {
            timer = setTimeout(() => reject(new Error("the four forks never ran at once")), 30_000);
          }),
        ]).finally(() => clearTimeout(timer));
        const seen = await shell.exec(
          "ls /work; for s in /var/run/docker.sock /run/docker.sock /run/podman/podman.sock; do test -e $s && echo socket $s; done; true",
        );
        const marks = seen.stdoutText.split("\n").filter((l) => l.startsWith("mark-"));
        if (marks.join() !== me) throw new Error(`fork ${me} sees ${marks.join()}`);
        if (seen.stdoutText.includes("socket ")) throw new Error(seen.stdoutText);
        return "done";
      });
      try {
        const job = await new Taskset([{
          env: "cfork",
          id: "count",
          args: { n: 1 },
          slug: taskSlug("count", { n: 1 }),
        }]).run(agent, {
          runtime,
          group: 4,
          maxConcurrent: 4,
          from: async (_task, signal) => {
            const { snapshot } = await preparedSnapshot(runtime, 2, signal);
            taken.push(snapshot);
            return snapshot;
          },
          snapshots: { maxCount: 1 },
          rolloutTimeout: 50_000,
        });
        assert.deepEqual(
          job.runs.map((r) => r.reward).sort(),
          [3, 4, 5, 6],
          JSON.stringify(job.errored[0]?.trace.errors),
        );
        assert.equal(taken.length, 1);
        for (const r of job.runs) {
          assert.deepEqual(r.trace.from_snapshot, {
            id: taken[0].id,
            workspace: FORK_TAG,
            parents: [],
          });
        }
        assert.ok(taken[0].removed, "the job removed its snapshot");
        assert.deepEqual(await snapshotImagesOf(Deno.pid, socket), []);
      } finally {
        for (const s of taken) await s.remove().catch(() => {});
        await runtime.close();
        assert.deepEqual(await containersOf(Deno.pid, socket), []);
        await sweep(Deno.pid, socket);
      }
    }),
  });

  test({
    name:
      `Taskset.run() from container snapshots: one past snapshots.maxBytes fails its rollout and is removed (${label})`,
    needs,
    fn: withDeadline(59_000, async () => {
      await buildForkImage(socket);
      const runtime = forkRuntime(socket);
      const taken: ContainerSnapshot[] = [];
      try {
        const job = await new Taskset([{
          env: "cfork",
          id: "count",
          args: { n: 1 },
          slug: taskSlug("count", { n: 1 }),
        }]).run(functionAgent(() => "never"), {
          runtime,
          from: async (_task, signal) => {
            const { snapshot } = await preparedSnapshot(runtime, 2, signal);
            taken.push(snapshot);
            return snapshot;
          },
          snapshots: { maxBytes: 1 },
        });
        assert.equal(job.runs.length, 1);
        const [error] = job.runs[0].trace.errors;
        assert.equal(error?.phase, "provisioning");
        assert.match(error.message, /took \d+ bytes.*snapshots\.maxBytes \(1\)/);
        assert.ok(taken.length >= 1 && taken.every((s) => s.removed));
        assert.deepEqual(await snapshotImagesOf(Deno.pid, socket), []);
      } finally {
        for (const s of taken) await s.remove().catch(() => {});
        await runtime.close();
        await sweep(Deno.pid, socket);
      }
    }),
  });
}

suite("default engine", undefined, [ENGINE]);
suite("Podman", PODMAN_SOCKET, [PODMAN]);
