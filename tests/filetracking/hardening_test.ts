// The file tracker facing an agent that tries to blind it, freeze it, or
// make it leak: each case here failed before the tracker was hardened.

import { test } from "../_test.ts";
import { GIT, PYTHON3 } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { type FileTrackingEvent, observeFiles, startFileTracker } from "../../filetracking/mod.ts";
import { Tracker, type TrackerLimits } from "../../filetracking/_core.ts";
import {
  compileGlob,
  isCredentialPath,
  isIgnored,
  matchGlob,
  parseGitignore,
} from "../../filetracking/_rules.ts";
import { readSameFileSync } from "../../filetracking/_scan.ts";
import { redactSecrets } from "../../_internal/redact.ts";
import { Capability } from "../../capability.ts";
import { encodeFrame, LineReader, parseLine } from "../../_internal/framing.ts";
import { writeAll } from "../../_internal/io.ts";
import { tcpServer } from "../_helpers.ts";

const MIB = 1024 * 1024;
const LIMITS: TrackerLimits = {
  maxFileSize: MIB,
  scanBudget: 50 * MIB,
  maxPayload: 50 * MIB,
  maxCaptureFiles: 20,
  maxCaptureFileSize: 5 * MIB,
  maxCaptureTotal: 15 * MIB,
};

async function sh(script: string, cwd: string): Promise<void> {
  const out = await new Deno.Command("bash", {
    args: ["-c", script],
    cwd,
    stdout: "null",
    stderr: "piped",
    signal: AbortSignal.timeout(30_000),
  }).output();
  if (!out.success) {
    throw new Error(`bash ${script} failed (${out.code}): ${new TextDecoder().decode(out.stderr)}`);
  }
}

/** 1,100 levels of a 10-character name under `root`: 12,100 characters, three times PATH_MAX. */
async function deepChain(root: string): Promise<void> {
  // One process, relative steps: no call sees a path longer than PATH_MAX.
  const out = await new Deno.Command("python3", {
    args: ["-c", "import os\nfor _ in range(1100):\n  os.mkdir('d' * 10)\n  os.chdir('d' * 10)\n"],
    cwd: root,
    stderr: "piped",
    signal: AbortSignal.timeout(30_000),
  }).output();
  if (!out.success) throw new Error(`deep chain: ${new TextDecoder().decode(out.stderr)}`);
}

async function withRoot(fn: (root: string) => Promise<void>): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "ft_hard_" });
  try {
    await fn(root);
  } finally {
    // GNU rm walks trees deeper than PATH_MAX.
    await sh(`rm -rf -- "${root}"`, "/");
  }
}

test("Tracker reports a directory chain past PATH_MAX and still sees other edits", {
  needs: [PYTHON3],
}, async () => {
  await withRoot(async (root) => {
    await Deno.writeTextFile(`${root}/main.sh`, "echo one\n");
    // 1,100 levels of a 10-character name: 12,100 characters, three times PATH_MAX.
    await deepChain(root);
    const tracker = await Tracker.create(root, LIMITS);
    await Deno.writeTextFile(`${root}/main.sh`, "echo two\n");
    const diff = await tracker.diff();
    assert.deepEqual(diff.patches.map((p) => p.path), ["main.sh"]);
    assert.match(diff.patches[0].patch, /\+echo two/);
    assert.ok(diff.skipped_paths !== undefined && diff.skipped_paths.length >= 1);
    assert.match(diff.skipped_paths[0].reason, /path longer than/);
  });
});

test("Tracker reports an unreadable file and goes on", async () => {
  await withRoot(async (root) => {
    await Deno.writeTextFile(`${root}/ok.txt`, "a\n");
    await Deno.mkdir(`${root}/loop`);
    // A symlink loop inside a directory the walk enters fails with ELOOP on read.
    await Deno.symlink("self", `${root}/loop/self`);
    const tracker = await Tracker.create(root, LIMITS);
    await Deno.writeTextFile(`${root}/ok.txt`, "b\n");
    const diff = await tracker.diff();
    assert.deepEqual(diff.patches.map((p) => p.path), ["ok.txt"]);
  });
});

test("matchGlob() takes linear time on a pattern that backtracks exponentially", async () => {
  // The former regex took seconds on 16 stars and 30 characters; 24 stars on
  // 48 characters would take hours. Run it in a child so a regression is a
  // bounded failure, not a hung suite.
  const code = `
    import { compileGlob, matchGlob } from ${
    JSON.stringify(new URL("../../filetracking/_rules.ts", import.meta.url).href)
  };
    const glob = compileGlob("a*".repeat(24) + "b");
    console.log(matchGlob(glob, "a".repeat(48)), matchGlob(glob, "a".repeat(47) + "b"));
  `;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", code],
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(20_000),
  }).output();
  assert.equal(new TextDecoder().decode(out.stdout).trim(), "false true", "glob match child");
});

test("matchGlob() agrees with git check-ignore", { needs: [GIT] }, async (t) => {
  const patterns = [
    "*.log",
    "/build",
    "docs/*.md",
    "a/**/b",
    "**/cache",
    "out/**",
    "f?o",
    "[abc]x",
    "[!a-c]y",
    "\\#lit",
    "x*y*z",
    "**/deep/**/file.txt",
    "*",
    "sub/",
    "!keep.log",
  ];
  const paths = [
    "app.log",
    "keep.log",
    "src/app.log",
    "build",
    "src/build",
    "docs/a.md",
    "docs/sub/a.md",
    "a/b",
    "a/x/b",
    "a/x/y/b",
    "ab",
    "cache",
    "src/cache",
    "out/x",
    "out/x/y",
    "foo",
    "fooo",
    "ax",
    "dx",
    "ay",
    "dy",
    "#lit",
    "xyz",
    "x1y2z",
    "xzy",
    "p/deep/q/file.txt",
    "deep/file.txt",
    "sub",
  ];
  const git = await new Deno.Command("git", { args: ["--version"], stdout: "null" }).output()
    .catch(() => null);
  if (git === null || !git.success) {
    t.step({ name: "git is not installed", ignore: true, fn: () => {} });
    return;
  }
  await withRoot(async (root) => {
    for (const pattern of patterns) {
      await t.step(pattern, async () => {
        await Deno.writeTextFile(`${root}/.gitignore`, pattern + "\n");
        await sh("git init -q", root);
        const out = await new Deno.Command("git", {
          args: ["check-ignore", "--no-index", "--stdin", "-v", "-n"],
          cwd: root,
          stdin: "piped",
          stdout: "piped",
          env: { GIT_CONFIG_NOSYSTEM: "1", HOME: root },
          signal: AbortSignal.timeout(20_000),
        }).spawn();
        const writer = out.stdin.getWriter();
        await writer.write(new TextEncoder().encode(paths.join("\n") + "\n"));
        await writer.close();
        const result = await out.output();
        const lines = new TextDecoder().decode(result.stdout).trim().split("\n");
        const rules = parseGitignore(pattern + "\n", "");
        for (const line of lines) {
          // "<source>:<line>:<pattern>\t<path>", or "::\t<path>" when not matched.
          const [source, path] = line.split("\t");
          const matched = source !== "::";
          const byGit = matched && !source.split(":").slice(2).join(":").startsWith("!");
          // As the scan walks: an ignored directory hides everything below it.
          const parts = path.split("/");
          let ours = false;
          for (let i = 1; i <= parts.length && !ours; i++) {
            ours = isIgnored(rules, parts.slice(0, i).join("/"), parts[i - 1], i < parts.length);
          }
          assert.equal(ours, byGit, `${pattern} on ${path}`);
        }
      });
    }
  });
});

test("compileGlob() drops nothing a literal bracket would need", () => {
  assert.equal(matchGlob(compileGlob("[unclosed"), "[unclosed"), true);
  assert.equal(matchGlob(compileGlob("a\\*"), "a*"), true);
  assert.equal(matchGlob(compileGlob("a\\*"), "ab"), false);
});

test("readSameFileSync() refuses a file swapped for a symlink after lstat", async () => {
  await withRoot(async (root) => {
    await Deno.writeTextFile(`${root}/outside.txt`, "TOP SECRET\n");
    await Deno.writeTextFile(`${root}/f.txt`, "harmless\n");
    const seen = await Deno.lstat(`${root}/f.txt`);
    await Deno.remove(`${root}/f.txt`);
    await Deno.symlink(`${root}/outside.txt`, `${root}/f.txt`);
    assert.throws(() => readSameFileSync(`${root}/f.txt`, seen), /replaced while being read/);
  });
});

test("readSameFileSync() reads no more than the size seen", async () => {
  await withRoot(async (root) => {
    await Deno.writeTextFile(`${root}/f.txt`, "short\n");
    const seen = await Deno.lstat(`${root}/f.txt`);
    await Deno.writeTextFile(`${root}/f.txt`, "x".repeat(1000), { append: true });
    assert.equal(readSameFileSync(`${root}/f.txt`, seen).length, 6);
  });
});

test("isCredentialPath() covers common credential files, in any case", () => {
  const credentials = [
    "kubeconfig",
    "home/.kube/config",
    "home/.KUBE/Config",
    ".config/gcloud/application_default_credentials.json",
    "application_default_credentials.json",
    ".config/gh/hosts.yml",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".yarnrc.yml",
    ".s3cfg",
    ".boto",
    "infra/terraform.tfstate.backup",
    "AuthKey_ABC123.p8",
    ".my.cnf",
    ".m2/settings.xml",
    "auth.json",
    ".kaggle/kaggle.json",
    "rclone.conf",
    ".config/rclone/rclone.conf",
  ];
  for (const path of credentials) assert.ok(isCredentialPath(path), path);
  for (const path of ["src/main.ts", "history.md", "settings.xml", "hosts.yml", "config"]) {
    assert.ok(!isCredentialPath(path), path);
  }
});

test("redactSecrets() hides keys and tokens in any text file", () => {
  const key = [
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
    "-----END OPENSSH PRIVATE KEY-----",
  ].join("\n");
  const text = [
    `key = """${key}"""`,
    "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz0123456789",
    'const gh = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";',
    "password: hunter2hunter2",
    "token_ref = ${API_TOKEN}",
    "nothing secret here",
  ].join("\n");
  const out = redactSecrets(text);
  for (
    const secret of [
      "b3BlbnNzaC1rZXktdjEAAAAABG5",
      "AKIAIOSFODNN7EXAMPLE",
      "wJalrXUtnFEMI",
      "sk-proj-abcdefghij",
      "ghp_0123456789",
      "hunter2hunter2",
    ]
  ) {
    assert.ok(!out.includes(secret), `${secret} leaked: ${out}`);
  }
  assert.match(out, /\[REDACTED OPENSSH PRIVATE KEY\]/);
  assert.match(out, /aws_secret_access_key = \[REDACTED/);
  assert.match(out, /token_ref = \$\{API_TOKEN\}/);
  assert.match(out, /nothing secret here/);
});

test("Tracker diffs never carry a private key written into an ordinary file", async () => {
  await withRoot(async (root) => {
    const tracker = await Tracker.create(root, LIMITS);
    const body = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7sekrit\n" +
      "-----END RSA PRIVATE KEY-----\n";
    await Deno.writeTextFile(`${root}/notes.txt`, body);
    const diff = await tracker.diff();
    assert.equal(diff.patches.length, 1);
    assert.ok(!diff.patches[0].patch.includes("7sekrit"));
    assert.match(diff.patches[0].patch, /REDACTED RSA PRIVATE KEY/);
  });
});

/** A stand-in tracker: `answer(method, n)` gives each call's reply (or closes the connection). */
function scriptedTracker(
  answer: (method: string, n: number) => Record<string, unknown> | "close",
): { capability: Capability; calls: string[]; close(): Promise<void> } {
  const calls: string[] = [];
  const server = tcpServer(async (conn) => {
    const reader = new LineReader(conn, MIB);
    while (true) {
      const r = await reader.read();
      if (r === null || r.kind !== "line") return;
      const req = parseLine(r.line) as { id: number; method: string };
      calls.push(req.method);
      const reply = answer(req.method, calls.length);
      if (reply === "close") return;
      await writeAll(conn, encodeFrame({ jsonrpc: "2.0", id: req.id, ...reply }));
    }
  });
  return {
    capability: Capability.filetracking({ url: `tcp://127.0.0.1:${server.port}`, root: "/x" }),
    calls,
    close: () => server.close(),
  };
}

const EMPTY_DIFF = {
  snapshot_timestamp: 1767225600.0,
  scan_duration_ms: 1,
  files_scanned: 1,
  files_changed: 0,
  patches: [],
};
const ONE_PATCH = {
  ...EMPTY_DIFF,
  files_changed: 1,
  patches: [{
    path: "a.txt",
    status: "added",
    patch: "+a\n",
    size_before: 0,
    size_after: 2,
    content_hash_before: null,
    content_hash_after: null,
  }],
};

/** An empty flush as HUD's tracker answers it: `{diff, capture}`. */
const HUD_FLUSH = {
  diff: EMPTY_DIFF,
  capture: {
    snapshot_timestamp: 1767225600.0,
    scan_duration_ms: 1,
    files_scanned: 1,
    files_changed: 0,
    files_eligible: 0,
    files_captured: 0,
    files_skipped: 0,
    files: [],
  },
};

test("observeFiles() keeps polling after an error reply", async () => {
  let diffs = 0;
  const tracker = scriptedTracker((method) => {
    if (method === "advance") return { result: { advanced: true } };
    if (method === "setup") return { result: { ...EMPTY_DIFF } };
    if (method === "snapshot") return { result: { files: [], files_scanned: 0 } };
    if (method === "diff") {
      diffs++;
      return diffs === 1
        ? { error: { code: -32000, message: "scan failed" } }
        : { result: diffs === 2 ? ONE_PATCH : EMPTY_DIFF };
    }
    return { result: HUD_FLUSH };
  });
  try {
    const events: FileTrackingEvent[] = [];
    const errors: unknown[] = [];
    await observeFiles(tracker.capability, async () => {
      const end = Date.now() + 10_000;
      while (!events.some((e) => e.kind === "diff") && Date.now() < end) {
        await new Promise((r) => setTimeout(r, 10));
      }
    }, { pollInterval: 10, onResult: (e) => events.push(e), onError: (e) => errors.push(e) });
    assert.equal(errors.length, 1);
    assert.ok(events.some((e) => e.kind === "diff"), "a diff after the error reply");
  } finally {
    await tracker.close();
  }
});

test("observeFiles() reconnects after losing the connection", async () => {
  let diffs = 0;
  const tracker = scriptedTracker((method) => {
    if (method === "advance") return { result: { advanced: true } };
    if (method === "setup") return { result: { ...EMPTY_DIFF } };
    if (method === "snapshot") return { result: { files: [], files_scanned: 0 } };
    if (method === "diff") {
      diffs++;
      if (diffs === 1) return "close";
      return { result: diffs === 2 ? ONE_PATCH : EMPTY_DIFF };
    }
    return { result: HUD_FLUSH };
  });
  try {
    const events: FileTrackingEvent[] = [];
    const errors: unknown[] = [];
    await observeFiles(tracker.capability, async () => {
      const end = Date.now() + 10_000;
      while (!events.some((e) => e.kind === "diff") && Date.now() < end) {
        await new Promise((r) => setTimeout(r, 10));
      }
    }, { pollInterval: 10, onResult: (e) => events.push(e), onError: (e) => errors.push(e) });
    assert.equal(errors.length, 1);
    assert.ok(events.some((e) => e.kind === "diff"), "a diff on the new connection");
    // The new connection was moved to the present before diffing.
    assert.deepEqual(tracker.calls.slice(0, 5), ["setup", "snapshot", "diff", "advance", "diff"]);
  } finally {
    await tracker.close();
  }
});

test(
  "startFileTracker() serves a tree with a 1,100-level chain",
  { needs: [PYTHON3] },
  async () => {
    await withRoot(async (root) => {
      await deepChain(root);
      await using tracker = await startFileTracker(root);
      const events: FileTrackingEvent[] = [];
      const errors: unknown[] = [];
      await observeFiles(tracker.capability(), async () => {
        await Deno.writeTextFile(`${root}/fix.sh`, "echo fixed\n");
      }, { onResult: (e) => events.push(e), onError: (e) => errors.push(e) });
      assert.deepEqual(errors, []);
      const flush = events.find((e) => e.kind === "flush");
      assert.ok(flush && flush.kind === "flush");
      assert.deepEqual(flush.result.diff.patches.map((p) => p.path), ["fix.sh"]);
    });
  },
);
