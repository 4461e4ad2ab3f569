// A job of rollouts from snapshots it took, interrupted as `hud eval` is
// (SIGINT to a child process running it): the job's snapshots are removed
// before the process exits, and nothing of the store or of the forks' roots
// is left, nor a mount naming them.

import { test } from "../_test.ts";
import { BWRAP } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { mountsNaming } from "../workspace/_snapshot_util.ts";
import { waitingFor } from "../_deadline.ts";

const FIXTURE = new URL("../fixtures/fork_job.ts", import.meta.url).pathname;

/** Reads `stream` line by line until `done` says stop; the lines read. */
async function readUntil(
  stream: ReadableStream<string>,
  done: (line: string) => boolean,
): Promise<{ lines: string[]; rest: ReadableStreamDefaultReader<string> }> {
  const reader = stream.getReader();
  const lines: string[] = [];
  let buffer = "";
  while (true) {
    const { value, done: ended } = await reader.read();
    if (ended) break;
    buffer += value;
    const parts = buffer.split("\n");
    buffer = parts.pop()!;
    lines.push(...parts);
    if (parts.some(done)) break;
  }
  return { lines, rest: reader };
}

test({
  name: "Taskset.run() from snapshots: after SIGINT, the job's snapshots are removed before exit",
  needs: [BWRAP],
}, async () => {
  const tmp = await Deno.makeTempDir({ prefix: "fork-interrupt-" });
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", FIXTURE],
    env: { TMPDIR: tmp, NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(90_000),
  }).spawn();
  const stderr = new Response(child.stderr).text();
  try {
    const stdout = child.stdout.pipeThrough(new TextDecoderStream());
    const first = await waitingFor(
      "four agents at work",
      readUntil(stdout, (l) => l === "running 4"),
    );
    assert.ok(first.lines.includes("running 4"), first.lines.join("\n"));
    // Two tasks' snapshots in the store, four forks running from them.
    const stores = () =>
      [...Deno.readDirSync(tmp)].map((e) => e.name).filter((n) => n.startsWith("hud-snapshots-"));
    assert.equal(stores().length, 1, "the store is in the child's TMPDIR");
    child.kill("SIGINT");
    let rest = "";
    while (true) {
      const { value, done } = await waitingFor("the child's last words", first.rest.read());
      if (done) break;
      rest += value;
    }
    const status = await waitingFor("the child's exit", child.status);
    const report = JSON.parse(rest.trim().split("\n").pop()!);
    assert.equal(status.code, 130, rest + (await stderr));
    assert.deepEqual(report, { taken: 2, removed: [true, true], cancelled: 4, left: [] });
    assert.deepEqual([...Deno.readDirSync(tmp)].map((e) => e.name), []);
    assert.deepEqual(mountsNaming(tmp), []);
  } finally {
    try {
      child.kill("SIGKILL");
    } catch { /* gone */ }
    await waitingFor("the child's end", child.status);
    await waitingFor("the child's stderr", stderr);
    await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
});
