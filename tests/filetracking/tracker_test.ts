import { test } from "../_test.ts";
import { DIFFUTILS } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  FileTrackerClient,
  type FileTrackingEvent,
  observeFiles,
  startFileTracker,
} from "../../filetracking/tracker.ts";
import { Capability } from "../../capability.ts";
import { ConnectionClosedError, HudProtocolError } from "../../errors.ts";
import { Tracker, type TrackerLimits } from "../../filetracking/_core.ts";
import { isIgnored, parseGitignore } from "../../filetracking/_rules.ts";
import { unifiedDiff } from "../../filetracking/_diff.ts";
import { encodeFrame, LineReader, parseLine } from "../../_internal/framing.ts";
import { writeAll } from "../../_internal/io.ts";

const MIB = 1024 * 1024;
const LIMITS: TrackerLimits = {
  maxFileSize: MIB,
  scanBudget: 50 * MIB,
  maxPayload: 50 * MIB,
  maxCaptureFiles: 20,
  maxCaptureFileSize: 5 * MIB,
  maxCaptureTotal: 15 * MIB,
};

/** Writes `files` (path to text or bytes) under `root`, creating directories. */
async function write(root: string, files: Record<string, string | Uint8Array>): Promise<void> {
  for (const [path, content] of Object.entries(files)) {
    const abs = `${root}/${path}`;
    await Deno.mkdir(abs.slice(0, abs.lastIndexOf("/")), { recursive: true });
    if (typeof content === "string") await Deno.writeTextFile(abs, content);
    else await Deno.writeFile(abs, content);
  }
}

/** Runs `fn` with a fresh temporary root holding `files`, then removes it. */
async function withRoot(
  files: Record<string, string | Uint8Array>,
  fn: (root: string) => Promise<void>,
): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "ft_" });
  try {
    await write(root, files);
    await fn(root);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

async function sha256(bytes: Uint8Array<ArrayBuffer>): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return [...d].map((b) => b.toString(16).padStart(2, "0")).join("");
}

test("Tracker.diff() reports adds, edits, deletes and renames", async () => {
  await withRoot({
    "a.txt": "one\ntwo\nthree\n",
    "b.txt": "bee\n",
    "src/c.txt": "sea\n",
  }, async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    await write(root, { "a.txt": "one\nTWO\nthree\n", "e.txt": "new\n" });
    await Deno.remove(`${root}/b.txt`);
    await Deno.rename(`${root}/src/c.txt`, `${root}/src/d.txt`);
    const diff = await tracker.diff();
    assert.deepEqual(
      diff.patches.map((p) => [p.path, p.status]),
      [
        ["a.txt", "modified"],
        ["b.txt", "deleted"],
        ["e.txt", "added"],
        ["src/c.txt", "deleted"],
        ["src/d.txt", "added"],
      ],
    );
    assert.equal(diff.files_changed, 5);
    assert.equal(diff.files_scanned, 3);
    const a = diff.patches[0];
    assert.equal(
      a.patch,
      unifiedDiff("one\ntwo\nthree\n", "one\nTWO\nthree\n", {
        oldPath: "a/a.txt",
        newPath: "b/a.txt",
      }),
    );
    assert.equal(a.size_before, 14);
    assert.equal(a.size_after, 14);
    assert.equal(a.content_hash_after, await sha256(new TextEncoder().encode("one\nTWO\nthree\n")));
    assert.equal(diff.patches[1].patch, "--- a/b.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bee\n");
    assert.equal(diff.patches[2].size_before, 0, "0 when added, as HUD's tracker");
    assert.equal(diff.patches[2].content_hash_before, null);
    // Seconds since the epoch, a float, as HUD's tracker (time.time()).
    assert.equal(typeof diff.snapshot_timestamp, "number");
    assert.ok(Math.abs(diff.snapshot_timestamp - Date.now() / 1000) < 600);
    assert.equal(typeof diff.scan_duration_ms, "number");
    // Changes are reported once.
    assert.equal((await tracker.diff()).files_changed, 0);
  });
});

test("Tracker.diff() patches match diff -u on real files", { needs: [DIFFUTILS] }, async () => {
  const before = Array.from({ length: 200 }, (_, i) => `line ${i % 37}\n`).join("");
  const lines = before.split("\n");
  lines.splice(10, 3, "inserted", "another");
  lines.splice(120, 0, "}", "", "}");
  const after = lines.join("\n");
  const scratch = await Deno.makeTempDir();
  try {
    await withRoot({ "code.py": before }, async (root) => {
      const tracker = await Tracker.create(root, LIMITS);
      await Deno.writeTextFile(`${scratch}/code.py`, before);
      await write(root, { "code.py": after });
      const out = await new Deno.Command("diff", {
        args: ["-u", `${scratch}/code.py`, `${root}/code.py`],
        stdout: "piped",
      }).output();
      const gnu = new TextDecoder().decode(out.stdout).split("\n").slice(2).join("\n");
      const [patch] = (await tracker.diff()).patches;
      assert.equal(patch.patch, "--- a/code.py\n+++ b/code.py\n" + gnu);
    });
  } finally {
    await Deno.remove(scratch, { recursive: true });
  }
});

test("Tracker honours .gitignore rules", async () => {
  await withRoot({
    ".gitignore": [
      "# comment",
      "*.log",
      "!keep.log",
      "/anchored.txt",
      "tmp/",
      "docs/**/*.gen.md",
      "cache-*",
      "",
    ].join("\n"),
    "app.log": "x",
    "keep.log": "x",
    "anchored.txt": "x",
    "deep/anchored.txt": "x",
    "tmp/a.txt": "x",
    "deep/tmp/b.txt": "x",
    "tmp.txt": "x",
    "docs/a/b/x.gen.md": "x",
    "docs/x.md": "x",
    "cache-1/y.txt": "x",
    "sub/.gitignore": "*.txt\n!important.txt\n/only-here.md\n",
    "sub/a.txt": "x",
    "sub/important.txt": "x",
    "sub/only-here.md": "x",
    "sub/inner/only-here.md": "x",
    "sub/inner/b.txt": "x",
    "other/a.txt": "x",
  }, async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    const paths = (await tracker.snapshot()).files.map((f) => f.path);
    assert.deepEqual(paths, [
      ".gitignore",
      "deep/anchored.txt",
      "docs/x.md",
      "keep.log",
      "other/a.txt",
      "sub/.gitignore",
      "sub/important.txt",
      "sub/inner/only-here.md",
      "tmp.txt",
    ]);
    // A file created later under an ignored rule stays out of diffs.
    await write(root, { "new.log": "x", "tmp/c.txt": "x", "visible.md": "x" });
    assert.deepEqual((await tracker.diff()).patches.map((p) => p.path), ["visible.md"]);
  });
});

test("parseGitignore() handles escapes, ** and dir-only rules", () => {
  const rules = parseGitignore("\\#hash\n\\!bang\n**/logs\nlogs2/**\na/**/b\nbuild/\n", "");
  const ignored = (path: string, isDir = false) =>
    isIgnored(rules, path, path.slice(path.lastIndexOf("/") + 1), isDir);
  assert.equal(ignored("#hash"), true);
  assert.equal(ignored("!bang"), true);
  assert.equal(ignored("x/y/logs"), true);
  assert.equal(ignored("logs2/q"), true);
  assert.equal(ignored("logs2", true), false);
  assert.equal(ignored("a/b"), true);
  assert.equal(ignored("a/x/y/b"), true);
  assert.equal(ignored("build", true), true);
  assert.equal(ignored("build"), false);
});

test("Tracker skips noise folders", async () => {
  await withRoot({
    "src/main.ts": "x",
    "node_modules/pkg/index.js": "x",
    "src/node_modules/pkg/index.js": "x",
    ".git/config": "x",
    "__pycache__/m.cpython-312.pyc": "x",
    ".venv/lib/site.py": "x",
    "dist/out.js": "x",
    "target/debug/app": "x",
    ".pytest_cache/v": "x",
    ".DS_Store": "x",
  }, async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    await write(root, { "node_modules/new/index.js": "x", "build/x.o": "x" });
    assert.deepEqual((await tracker.snapshot()).files.map((f) => f.path), ["src/main.ts"]);
    assert.equal((await tracker.diff()).files_changed, 0);
  });
});

test("Tracker never exposes credential-shaped file content", async () => {
  const SECRET = "hunter2-SUPER-SECRET-TOKEN";
  await withRoot({ "readme.md": "hello\n", ".env": `API_KEY=${SECRET}-old\n` }, async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    await write(root, {
      ".env": `API_KEY=${SECRET}\n`,
      ".env.local": `TOKEN=${SECRET}\n`,
      ".ssh/id_ed25519": `-----BEGIN OPENSSH PRIVATE KEY-----\n${SECRET}\n`,
      ".aws/config": `aws_secret_access_key=${SECRET}\n`,
      "certs/server.pem": SECRET,
      "keys/id_rsa.pub": SECRET,
      "config/credentials.json": `{"token":"${SECRET}"}`,
      ".netrc": `password ${SECRET}`,
      "report.md": "fine\n",
    });
    const setup = await tracker.setup();
    const snapshot = await tracker.snapshot();
    await write(root, { ".env": `API_KEY=${SECRET}-rotated\n`, "secrets.pdf.key": SECRET });
    const diff = await tracker.diff();
    const flush = await tracker.flush();
    for (const payload of [setup, snapshot, diff, flush]) {
      const json = JSON.stringify(payload);
      assert.ok(!json.includes("SUPER-SECRET"), json);
      assert.ok(!json.includes(btoa(SECRET).slice(0, 12)));
    }
    const byPath = new Map(setup.patches.map((p) => [p.path, p]));
    assert.equal(byPath.get(".env")?.status, "modified");
    assert.equal(byPath.get(".env")?.patch, "Credential-shaped file .env: content not recorded\n");
    assert.equal(byPath.get(".env")?.content_hash_after, null);
    for (
      const path of [
        ".env.local",
        ".ssh/id_ed25519",
        ".aws/config",
        "certs/server.pem",
        "keys/id_rsa.pub",
        "config/credentials.json",
        ".netrc",
      ]
    ) {
      assert.equal(byPath.get(path)?.status, "added", path);
      assert.match(byPath.get(path)!.patch, /^Credential-shaped file /);
    }
    assert.deepEqual(diff.patches.map((p) => [p.path, p.status]), [
      [".env", "modified"],
      ["secrets.pdf.key", "added"],
    ]);
    assert.ok(
      snapshot.files.filter((f) => f.path.startsWith(".env")).every((f) => f.content_hash === null),
    );
  });
});

test("Tracker tracks binary files by hash only", async () => {
  const bytes = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0, 1, 2, 3, 255, 0]);
  await withRoot({}, async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    await write(root, {
      "blob.bin": bytes,
      "latin1.txt": new Uint8Array([0x63, 0x61, 0x66, 0xe9]),
    });
    const diff = await tracker.diff();
    assert.deepEqual(diff.patches.map((p) => p.patch), [
      "Binary files /dev/null and b/blob.bin differ\n",
      "Binary files /dev/null and b/latin1.txt differ\n",
    ]);
    assert.equal(diff.patches[0].content_hash_after, await sha256(bytes));
    await write(root, { "blob.bin": bytes.map((b) => b ^ 1) });
    const edit = await tracker.diff();
    assert.equal(edit.patches[0].patch, "Binary files a/blob.bin and b/blob.bin differ\n");
    assert.equal(edit.patches[0].status, "modified");
  });
});

test("Tracker diffs a symlink by its target without following it", async () => {
  await withRoot({ "data/real.txt": "real\n" }, async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    await Deno.symlink("data/real.txt", `${root}/link`);
    await Deno.symlink("data", `${root}/dirlink`);
    const diff = await tracker.diff();
    assert.deepEqual(diff.patches.map((p) => [p.path, p.patch]), [
      [
        "dirlink",
        "--- /dev/null\n+++ b/dirlink\n@@ -0,0 +1 @@\n+data\n\\ No newline at end of file\n",
      ],
      [
        "link",
        "--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n+data/real.txt\n\\ No newline at end of file\n",
      ],
    ]);
  });
});

test("Tracker puts a placeholder instead of a diff for files over 1 MiB", async () => {
  const big = "x".repeat(100) + "\n";
  await withRoot({ "big.txt": big.repeat(11_000) }, async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    await write(root, { "big.txt": big.repeat(11_001) });
    const [patch] = (await tracker.diff()).patches;
    assert.equal(patch.status, "modified");
    assert.equal(patch.patch, "File big.txt is over 1048576 bytes: diff not recorded\n");
    assert.equal(patch.size_after, 101 * 11_001);
    assert.equal(typeof patch.content_hash_after, "string");
    assert.notEqual(patch.content_hash_before, patch.content_hash_after);
  });
});

test("Tracker caps the scan budget and the payload", async (t) => {
  await t.step("scan budget", async () => {
    await withRoot({}, async (root) => {
      const tracker = await Tracker.create(root, { ...LIMITS, scanBudget: 150 });
      await write(root, { "a.txt": "a".repeat(100), "b.txt": "b".repeat(100) });
      const diff = await tracker.diff();
      assert.equal(diff.truncated, true);
      assert.equal(diff.patches[0].content_hash_after?.length, 64);
      assert.equal(diff.patches[1].content_hash_after, null);
      assert.match(diff.patches[1].patch, /not read/);
    });
  });
  await t.step("payload", async () => {
    await withRoot({}, async (root) => {
      const tracker = await Tracker.create(root, { ...LIMITS, maxPayload: 300 });
      await write(root, { "a.txt": "a\n".repeat(50), "b.txt": "b\n".repeat(50) });
      const diff = await tracker.diff();
      assert.equal(diff.truncated, true);
      assert.match(diff.patches[0].patch, /^--- \/dev\/null/);
      assert.match(diff.patches[1].patch, /omitted: payload cap/);
      assert.equal(diff.files_changed, 2);
    });
  });
});

test("Tracker.setup() reports the setup, Tracker.advance() skips it", async (t) => {
  for (const method of ["setup", "advance"] as const) {
    await t.step(method, async () => {
      await withRoot({ "a.txt": "a\n" }, async (root) => {
        const tracker = await Tracker.create(root, LIMITS);
        await write(root, { "a.txt": "setup\n", "task.md": "do it\n" });
        const result = await tracker[method]();
        if (method === "setup") {
          assert.deepEqual(
            (result as unknown as { patches: { path: string }[] }).patches.map((p) => p.path),
            ["a.txt", "task.md"],
          );
        } else {
          assert.equal(result.files_scanned, 2);
          assert.equal((result as { advanced?: boolean }).advanced, true, "HUD's advance reply");
        }
        assert.equal((await tracker.diff()).files_changed, 0);
        const flush = await tracker.flush();
        assert.equal(flush.capture.files_eligible, 0); // task.md came from the setup
      });
    });
  }
});

test("Tracker.flush() captures artifacts within limits", async (t) => {
  await t.step("count, size and total caps", async () => {
    await withRoot({ "old.pdf": "unchanged" }, async (root) => {
      const tracker = await Tracker.create(root, {
        ...LIMITS,
        maxCaptureFiles: 3,
        maxCaptureFileSize: 100,
        maxCaptureTotal: 160,
      });
      await write(root, {
        "a.pdf": "a".repeat(50),
        "b.png": new Uint8Array(60).fill(7),
        "c.csv": "c".repeat(101),
        "d.html": "d".repeat(60),
        "e.md": "e".repeat(10),
        "f.xlsx": "f".repeat(10),
        "notes.txt": "not an artifact",
        ".env.pdf": "secret",
      });
      const { capture, diff } = await tracker.flush();
      assert.equal(diff.patches.length, 8);
      assert.equal(capture.files_changed, 8);
      assert.equal(capture.files_eligible, 6);
      assert.equal(capture.files_captured, 3);
      assert.equal(capture.files_skipped, 3);
      assert.equal(capture.truncated, true);
      assert.deepEqual(capture.files.map((f) => [f.path, f.content_type, f.status]), [
        ["a.pdf", "application/pdf", "added"],
        ["b.png", "image/png", "added"],
        ["e.md", "text/markdown", "added"],
      ]);
      assert.deepEqual(capture.skipped_files.map((s) => [s.path, s.reason]), [
        ["c.csv", "size"],
        ["d.html", "total"],
        ["f.xlsx", "count"],
      ]);
      assert.equal(capture.files[1].file.type, "file");
      assert.equal(capture.files[1].file.media_type, "image/png");
      const png = Uint8Array.from(atob(capture.files[1].file.data), (c) => c.charCodeAt(0));
      assert.deepEqual(png, new Uint8Array(60).fill(7));
      assert.equal(capture.files[1].content_hash, await sha256(png));
    });
  });
  await t.step("twenty files by default", async () => {
    await withRoot({}, async (root) => {
      const tracker = await Tracker.create(root, LIMITS);
      const files: Record<string, string> = {};
      for (let i = 0; i < 25; i++) {
        files[`charts/chart${String(i).padStart(2, "0")}.svg`] = `<svg>${i}</svg>`;
      }
      await write(root, files);
      const { capture } = await tracker.flush();
      assert.equal(capture.files_eligible, 25);
      assert.equal(capture.files_captured, 20);
      assert.equal(capture.files_skipped, 5);
      assert.ok(capture.skipped_files.every((s) => s.reason === "count"));
    });
  });
});

/** Sends raw lines and reads the replies, for transport tests. */
async function rawSession(url: string) {
  const port = Number(url.slice(url.lastIndexOf(":") + 1));
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const reader = new LineReader(conn, 64 * MIB);
  return {
    async send(text: string) {
      await writeAll(conn, new TextEncoder().encode(text + "\n"));
    },
    async reply(): Promise<Record<string, unknown>> {
      const r = await reader.read();
      assert.ok(r && r.kind === "line");
      return parseLine(r.line) as Record<string, unknown>;
    },
    close: () => conn.close(),
  };
}

test("startFileTracker() answers JSON-RPC errors without dropping the connection", async () => {
  await withRoot({ "a.txt": "a\n" }, async (root) => {
    await using tracker = await startFileTracker(root);
    const s = await rawSession(tracker.url);
    try {
      await s.send("{not json");
      let reply = await s.reply();
      assert.equal(reply.id, null);
      assert.equal((reply.error as { code: number }).code, -32700);
      await s.send("[1,2]");
      assert.equal(((await s.reply()).error as { code: number }).code, -32600);
      await s.send('{"jsonrpc":"2.0","id":"x","method":"nope"}');
      reply = await s.reply();
      assert.equal(reply.id, "x");
      assert.deepEqual(reply.error, { code: -32601, message: "method not found: nope" });
      // A notification runs without a reply: the next reply is for id 6.
      await s.send('{"jsonrpc":"2.0","method":"advance"}');
      await s.send('{"jsonrpc":"2.0","id":6,"method":"snapshot"}');
      assert.equal((await s.reply()).id, 6);
      await Deno.writeTextFile(`${root}/b.txt`, "b\n");
      await s.send('{"jsonrpc":"2.0","id":7,"method":"diff","params":null}');
      reply = await s.reply();
      assert.equal(reply.id, 7);
      assert.deepEqual(
        (reply.result as { patches: { path: string }[] }).patches.map((p) => p.path),
        ["b.txt"],
      );
    } finally {
      s.close();
    }
  });
});

test("startFileTracker() refuses an oversized frame, then closes the connection", async () => {
  await withRoot({}, async (root) => {
    await using tracker = await startFileTracker(root);
    const s = await rawSession(tracker.url);
    try {
      await s.send(`{"jsonrpc":"2.0","id":1,"method":"diff","pad":"${"x".repeat(2 * MIB)}"}`);
      const reply = await s.reply();
      assert.equal((reply.error as { code: number }).code, -32600);
      await assert.rejects(s.reply()); // end of stream
    } finally {
      s.close();
    }
  });
});

test("FileTrackerClient follows a file replaced by a directory", async () => {
  await withRoot({ "a.txt": "a\n" }, async (root) => {
    await using tracker = await startFileTracker(root);
    await using client = await FileTrackerClient.connect(tracker.url);
    await Deno.remove(`${root}/a.txt`);
    await Deno.mkdir(`${root}/a.txt`);
    await Deno.writeTextFile(`${root}/a.txt/x`, "x\n");
    const diff = await client.diff();
    assert.deepEqual(diff.patches.map((p) => [p.path, p.status]), [
      ["a.txt", "deleted"],
      ["a.txt/x", "added"],
    ]);
    assert.equal((await client.snapshot()).files_scanned, 1);
  });
});

test("startFileTracker() serves the five methods over TCP", async () => {
  await withRoot({ "a.txt": "a\n" }, async (root) => {
    const errors: unknown[] = [];
    await using tracker = await startFileTracker(root, { onError: (e) => errors.push(e) });
    assert.match(tracker.url, /^tcp:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(tracker.addr.hostname, "127.0.0.1");
    const cap = tracker.capability();
    assert.deepEqual(cap.toManifest(), {
      name: "filetracking",
      protocol: "filetracking/1",
      url: tracker.url,
      params: { root: await Deno.realPath(root), setup_diff: true },
    });
    assert.equal(tracker.capability("files").name, "files");
    await using client = await FileTrackerClient.connect(tracker.url);
    await Deno.writeTextFile(`${root}/a.txt`, "A\n");
    assert.deepEqual((await client.setup()).patches.map((p) => p.path), ["a.txt"]);
    assert.equal((await client.snapshot()).files[0].path, "a.txt");
    assert.equal((await client.advance()).advanced, true);
    // Concurrent calls queue on the one connection.
    const [d1, d2] = await Promise.all([client.diff(), client.diff()]);
    assert.equal(d1.files_changed + d2.files_changed, 0);
    await Deno.writeTextFile(`${root}/out.html`, "<p>hi</p>");
    const flush = await client.flush();
    assert.equal(flush.capture.files_captured, 1);
    assert.deepEqual(errors, []);
  });
});

test("startFileTracker() shuts down on abort and closes live connections", async () => {
  await withRoot({}, async (root) => {
    const controller = new AbortController();
    const tracker = await startFileTracker(root, { signal: controller.signal });
    const client = await FileTrackerClient.connect(tracker.url);
    controller.abort();
    await tracker.finished;
    await assert.rejects(client.diff(), ConnectionClosedError);
    assert.equal(client.closed, true);
    await tracker.shutdown(); // idempotent
  });
});

test("startFileTracker() rejects bad arguments", async () => {
  await assert.rejects(startFileTracker(""), TypeError);
  await assert.rejects(startFileTracker("/nonexistent/ft-root"), Deno.errors.NotFound);
  await withRoot({ "f": "x" }, async (root) => {
    await assert.rejects(startFileTracker(`${root}/f`), TypeError);
    await assert.rejects(startFileTracker(root, { maxFileSize: -1 }), RangeError);
  });
});

test("FileTrackerClient.connect() rejects urls it cannot use", async () => {
  await assert.rejects(FileTrackerClient.connect("ws://127.0.0.1:1"), TypeError);
  await assert.rejects(FileTrackerClient.connect("tcp://127.0.0.1"), TypeError);
});

test("FileTrackerClient surfaces error replies as HudProtocolError", async () => {
  // A stand-in tracker that answers every call with an error.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const serving = (async () => {
    const conn = await listener.accept();
    const reader = new LineReader(conn, MIB);
    const r = await reader.read();
    const req = parseLine((r as { line: Uint8Array }).line) as { id: number };
    await writeAll(
      conn,
      encodeFrame({ jsonrpc: "2.0", id: req.id, error: { code: -32000, message: "disk on fire" } }),
    );
    await reader.read(); // until the client closes
    conn.close();
  })();
  try {
    await using client = await FileTrackerClient.connect(`127.0.0.1:${listener.addr.port}`);
    const err = await client.diff().catch((e) => e);
    assert.ok(err instanceof HudProtocolError);
    assert.equal(err.code, -32000);
    assert.equal(err.message, "disk on fire");
  } finally {
    await serving;
    listener.close();
  }
});

test("observeFiles() reports setup, snapshot, diffs and the flush", async () => {
  await withRoot({ "main.py": "print(1)\n" }, async (root) => {
    await using tracker = await startFileTracker(root);
    await write(root, { "task.txt": "fix main.py\n" }); // the task's setup
    const events: FileTrackingEvent[] = [];
    const errors: unknown[] = [];
    const answer = await observeFiles(tracker.capability(), async () => {
      await write(root, { "main.py": "print(2)\n" });
      await new Promise((r) => setTimeout(r, 200));
      await write(root, { "report.md": "# done\n" });
      return "ok";
    }, { pollInterval: 50, onResult: (e) => events.push(e), onError: (e) => errors.push(e) });
    assert.equal(answer, "ok");
    assert.deepEqual(errors, []);
    const kinds = events.map((e) => e.kind);
    assert.deepEqual(kinds.slice(0, 2), ["setup", "snapshot"]);
    assert.equal(kinds.at(-1), "flush");
    const setup = events[0] as Extract<FileTrackingEvent, { kind: "setup" }>;
    assert.deepEqual(setup.result.patches.map((p) => p.path), ["task.txt"]);
    const patches = events.flatMap((e) =>
      e.kind === "diff" ? e.result.patches : e.kind === "flush" ? e.result.diff.patches : []
    );
    const main = patches.find((p) => p.path === "main.py");
    assert.ok(main?.patch.includes("-print(1)\n+print(2)\n"));
    assert.ok(patches.some((p) => p.path === "report.md"));
    const flush = events.at(-1) as Extract<FileTrackingEvent, { kind: "flush" }>;
    assert.deepEqual(flush.result.capture.files.map((f) => f.path), ["report.md"]);
  });
});

test("observeFiles() calls advance when setup_diff is false", async () => {
  await withRoot({}, async (root) => {
    await using tracker = await startFileTracker(root, { setupDiff: false });
    await write(root, { "setup.txt": "x\n" });
    const events: FileTrackingEvent[] = [];
    await observeFiles(tracker.capability(), async () => {
      await write(root, { "agent.txt": "y\n" });
    }, { onResult: (e) => events.push(e) });
    assert.deepEqual(events.map((e) => e.kind), ["snapshot", "flush"]);
    const flush = events[1] as Extract<FileTrackingEvent, { kind: "flush" }>;
    assert.deepEqual(flush.result.diff.patches.map((p) => p.path), ["agent.txt"]);
  });
});

test("observeFiles() runs on when the tracker is down at start", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = listener.addr.port;
  listener.close(); // nothing listens there now
  const cap = Capability.filetracking({ url: `tcp://127.0.0.1:${port}`, root: "/nowhere" });
  const events: FileTrackingEvent[] = [];
  const errors: unknown[] = [];
  const result = await observeFiles(cap, () => Promise.resolve(5), {
    pollInterval: 10,
    onResult: (e) => events.push(e),
    onError: (e) => errors.push(e),
  });
  assert.equal(result, 5);
  assert.deepEqual(events, []);
  assert.equal(errors.length, 1);
  assert.ok(errors[0] instanceof Deno.errors.ConnectionRefused);
});

test("observeFiles() runs on when the tracker goes away mid-run", async () => {
  await withRoot({}, async (root) => {
    const tracker = await startFileTracker(root);
    const errors: unknown[] = [];
    await assert.rejects(
      observeFiles(tracker.capability(), async () => {
        await tracker.shutdown();
        await new Promise((r) => setTimeout(r, 100));
        throw new Error("agent failed");
      }, { pollInterval: 20, onError: (e) => errors.push(e) }),
      { message: "agent failed" },
    );
    // The lost connection, then each failed reconnection, up to the limit (3).
    assert.ok(errors[0] instanceof ConnectionClosedError);
    assert.ok(errors.length >= 2 && errors.length <= 4, `${errors.length} errors`);
    for (const e of errors.slice(1)) assert.ok(e instanceof Deno.errors.ConnectionRefused);
  });
});

test("observeFiles() survives a throwing onResult", async () => {
  await withRoot({ "a.txt": "a" }, async (root) => {
    await using tracker = await startFileTracker(root);
    const errors: unknown[] = [];
    const value = await observeFiles(tracker.capability(), () => Promise.resolve(1), {
      onResult: () => {
        throw new Error("recorder broke");
      },
      onError: (e) => errors.push(e),
    });
    assert.equal(value, 1);
    assert.equal((errors[0] as Error).message, "recorder broke");
  });
});

test("startFileTracker() gives each connection its own position", async () => {
  const root = await Deno.makeTempDir();
  try {
    await using tracker = await startFileTracker(root);
    await using a = await FileTrackerClient.connect(tracker.url);
    await using b = await FileTrackerClient.connect(tracker.url);
    await a.advance();
    await b.advance();
    await Deno.writeTextFile(`${root}/one.txt`, "1\n");
    // a's diff does not consume the change that b has not reported yet.
    assert.deepEqual((await a.diff()).patches.map((p) => p.path), ["one.txt"]);
    assert.deepEqual((await a.diff()).patches, []);
    await Deno.writeTextFile(`${root}/two.txt`, "2\n");
    assert.deepEqual((await b.diff()).patches.map((p) => p.path), ["one.txt", "two.txt"]);
    assert.deepEqual((await a.flush()).diff.patches.map((p) => p.path), ["two.txt"]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
