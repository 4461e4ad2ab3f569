// observeFiles() against a tracker with HUD's filetracking/1 shapes
// (tests/fixtures/py_hud_tracker.py): nested flush, {"advanced": true},
// float timestamps.
import { test } from "../_test.ts";
import { PYTHON3 } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Capability } from "../../capability.ts";
import { type FileTrackingEvent, observeFiles } from "../../filetracking/mod.ts";

/** Reads `reader` until a line `PORT=<n>`; returns n. */
async function portLine(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<number> {
  let text = "";
  while (!/^PORT=\d+$/m.test(text)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`The tracker ended before its port line: ${text}`);
    text += new TextDecoder().decode(value);
  }
  return Number(/^PORT=(\d+)$/m.exec(text)![1]);
}

/** Runs the HUD-shaped tracker on `root` for the duration of `fn`. */
async function withHudTracker(
  root: string,
  args: string[],
  fn: (port: number) => Promise<void>,
): Promise<void> {
  const child = new Deno.Command("python3", {
    args: [new URL("../fixtures/py_hud_tracker.py", import.meta.url).pathname, root, ...args],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stdout = child.stdout.getReader();
  try {
    await fn(await portLine(stdout));
  } finally {
    child.kill();
    await stdout.cancel();
    await child.stderr.cancel();
    await child.status;
  }
}

test("observeFiles() reads HUD's tracker: the flush's diff and capture, nothing lost", {
  needs: [PYTHON3],
}, async (t) => {
  const root = await Deno.makeTempDir();
  const run = async () => {
    await Deno.writeTextFile(`${root}/fix.py`, "print('fixed')\n");
    await Deno.writeTextFile(`${root}/report.html`, "<p>done</p>");
    return 7;
  };
  try {
    await t.step(
      "flush: {diff, capture}; advance: {advanced: true}; float timestamps",
      async () => {
        await Deno.writeTextFile(`${root}/a.txt`, "a\n");
        await withHudTracker(root, [], async (port) => {
          const capability = Capability.filetracking({
            url: `tcp://127.0.0.1:${port}`,
            root,
            setupDiff: false,
          });
          const events: FileTrackingEvent[] = [];
          const errors: unknown[] = [];
          const value = await observeFiles(capability, run, {
            pollInterval: 600_000, // no poll: the flush alone must carry the changes
            onResult: (e) => events.push(e),
            onError: (e) => errors.push(e),
          });
          assert.equal(value, 7);
          assert.deepEqual(errors.map(String), []);
          assert.deepEqual(events.map((e) => e.kind), ["snapshot", "flush"]);
          const flush = events[1].result as unknown as {
            diff: { snapshot_timestamp: number; patches: { path: string }[] };
            capture: { files_captured: number; files: { path: string }[] };
          };
          assert.deepEqual(flush.diff.patches.map((p) => p.path), ["fix.py", "report.html"]);
          assert.equal(typeof flush.diff.snapshot_timestamp, "number");
          assert.equal(flush.capture.files_captured, 1);
          assert.deepEqual(flush.capture.files.map((f) => f.path), ["report.html"]);
        });
      },
    );
    await t.step("a tracker without flush: the last changes come as a diff", async () => {
      await Deno.remove(`${root}/fix.py`);
      await Deno.remove(`${root}/report.html`);
      await withHudTracker(root, ["--no-flush"], async (port) => {
        const capability = Capability.filetracking({ url: `tcp://127.0.0.1:${port}`, root });
        const events: FileTrackingEvent[] = [];
        const errors: unknown[] = [];
        await observeFiles(capability, run, {
          pollInterval: 600_000,
          onResult: (e) => events.push(e),
          onError: (e) => errors.push(e),
        });
        assert.equal(errors.length, 1);
        assert.match(String(errors[0]), /unknown filetracking method: 'flush'/);
        assert.deepEqual(events.map((e) => e.kind), ["snapshot", "diff"]);
        const diff = events[1].result as unknown as { patches: { path: string }[] };
        assert.deepEqual(diff.patches.map((p) => p.path), ["fix.py", "report.html"]);
      });
    });
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
