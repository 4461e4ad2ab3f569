// Snapshots of a workspace's files: restore and fork, byte for byte; what
// another rollout's agent can see of them; their bounds; what is left after
// the process ends; and an agent that plants links, FIFOs, device nodes,
// hard links, setuid files and sparse giants before a snapshot.

import { test } from "../_test.ts";
import { BWRAP, ROOT_USER } from "../_counterparts.ts";
import { firstLine } from "../_helpers.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace, type Workspace, type WorkspaceOptions } from "../../workspace/workspace.ts";
import type { WorkspaceSnapshot } from "../../workspace/mod.ts";
import { snapshotMethod } from "../../workspace/_snapshot.ts";
import { diskUse, mountsNaming, storeOf, treeManifest } from "./_snapshot_util.ts";

const IS_ROOT = Deno.uid() === 0;
const OVERLAY = (await snapshotMethod()).method === "overlay";
const CHILD = new URL("./_snapshot_child.ts", import.meta.url).pathname;

interface Running {
  env: Environment;
  workspace: Workspace;
  root: string;
  shell: SshClient;
  /** Runs a command as the agent; fails the test when it fails. */
  sh(command: string): Promise<string>;
  /** Runs a command as the agent; its exit code and output. */
  try(command: string): Promise<{ code: number | null; out: string }>;
  stop(): Promise<void>;
}

/** Starts a workspace on `root` (made when not given) and logs an agent in. */
async function start(options: WorkspaceOptions, root?: string): Promise<Running> {
  root ??= await Deno.makeTempDir({ prefix: "ws-snap-" });
  const env = new Environment("snapshot-test");
  const workspace = addWorkspace(env, root, { trackFiles: false, ...options });
  await env.start();
  const shell = SshClient.fromBinding(env.capability("shell")!);
  const run = async (command: string) => {
    const r = await shell.exec(command, { timeout: 20_000 });
    return { code: r.code, out: r.stdoutText + r.stderrText };
  };
  let stopped = false;
  return {
    env,
    workspace,
    root,
    shell,
    async sh(command) {
      const r = await run(command);
      assert.equal(r.code, 0, `"${command}": ${r.out}`);
      return r.out;
    },
    try: run,
    async stop() {
      if (stopped) return;
      stopped = true;
      await shell.close();
      await env.stop();
    },
  };
}

async function cleanup(...dirs: string[]): Promise<void> {
  for (const d of dirs) await Deno.remove(d, { recursive: true }).catch(() => {});
}

/** The files a test starts from, made on the host before the workspace starts. */
async function seed(root: string): Promise<void> {
  await Deno.mkdir(`${root}/src/deep/er`, { recursive: true });
  await Deno.writeTextFile(`${root}/src/main.sh`, "#!/bin/sh\necho main\n", { mode: 0o755 });
  await Deno.chmod(`${root}/src/main.sh`, 0o755);
  await Deno.writeTextFile(`${root}/src/deep/er/data.bin`, "x".repeat(100_000));
  await Deno.mkdir(`${root}/empty`);
  await Deno.symlink("src/main.sh", `${root}/main`);
  await Deno.writeFile(`${root}/bytes`, crypto.getRandomValues(new Uint8Array(4096)));
}

for (const method of ["auto", "copy"] as const) {
  const overlay = method === "auto" && OVERLAY;
  test({
    name: `Workspace.restore() brings back a snapshot's files byte for byte (method "${method}")`,
    needs: [BWRAP],
  }, async (t) => {
    const root = await Deno.makeTempDir({ prefix: "ws-snap-" });
    await seed(root);
    const ws = await start({ snapshots: { method } }, root);
    try {
      await ws.sh(
        [
          "echo edited >> src/main.sh",
          "chmod 700 src/main.sh",
          "mkdir -p new/empty-too && chmod 750 new",
          "ln -s ../bytes new/to-bytes",
          "rm src/deep/er/data.bin",
          "mkfifo pipe",
          "cp /bin/true tool && chmod 4755 tool",
          "printf '\\0\\1\\2\\377' > binary",
        ].join(" && "),
      );
      const snapped = await treeManifest(root);
      const inSandbox = await ws.sh("find . -printf '%p %y %m %U:%G %l\\n' | sort");
      const snapshot = await ws.workspace.snapshot();
      await t.step("it holds only what changed (overlay)", () => {
        if (!overlay) return;
        // The changes' blocks and inodes (a copy of /bin/true, five directories copied up...).
        assert.ok(snapshot.bytes < 96 * 1024, `${snapshot.bytes} bytes`);
      });

      await ws.sh(
        [
          "echo again > src/main.sh",
          "chmod 644 src/main.sh",
          "rm -r new empty pipe",
          "rm main && echo not-a-link > main",
          "mkdir -p src/deep/er && echo back > src/deep/er/data.bin",
          "chmod 755 tool",
          "echo more > more",
        ].join(" && "),
      );
      assert.notDeepEqual(await treeManifest(root), snapped);

      await t.step(
        "restored: contents, modes, owners, links, FIFOs, empty directories",
        async () => {
          await ws.workspace.restore(snapshot);
          assert.deepEqual(await treeManifest(root), snapped);
          assert.equal(await ws.sh("find . -printf '%p %y %m %U:%G %l\\n' | sort"), inSandbox);
        },
      );

      await t.step("the agent's later changes stay apart from the snapshot", async () => {
        await ws.sh("echo after > after && rm bytes");
        await ws.workspace.restore(snapshot);
        assert.deepEqual(await treeManifest(root), snapped);
      });

      await t.step("at stop the root keeps the restored files", async () => {
        await ws.stop();
        assert.deepEqual(await treeManifest(root), snapped);
      });

      await t.step("a later episode restores an earlier one's snapshot", async () => {
        // The later episode's agent may have another uid (another workspace of
        // this process held the first one meanwhile): owners are the agent's,
        // whichever uid it has, as the root's owner says.
        const agentOwned = (manifest: string[]) => {
          const owner = manifest.find((l) => l.startsWith(". "))!.split(" ")[3];
          return manifest.map((l) => l.replaceAll(` ${owner} `, " AGENT "));
        };
        const again = await start({ snapshots: { method } }, root);
        try {
          await again.sh("rm -r src && echo x > x");
          await again.workspace.restore(snapshot);
          assert.deepEqual(agentOwned(await treeManifest(root)), agentOwned(snapped));
          await again.sh("echo last > last");
        } finally {
          await again.stop();
        }
        // At stop the root is made again from that snapshot's layers, with the change on top.
        const last = await treeManifest(root);
        assert.deepEqual(
          agentOwned(last).filter((l) => !l.startsWith("last ")),
          agentOwned(snapped),
        );
        assert.equal(await Deno.readTextFile(`${root}/last`), "last\n");
      });

      await t.step("a later episode of another uid restores it, set-ID bits kept", async () => {
        if (!IS_ROOT) return;
        // A uid no other workspace leases: the snapshot's files change owner on the way.
        const other = await start({ snapshots: { method }, uid: 61999, gid: 61999 }, root);
        try {
          await other.workspace.restore(snapshot);
          const agentOwned = (manifest: string[]) => {
            const owner = manifest.find((l) => l.startsWith(". "))!.split(" ")[3];
            return manifest.map((l) => l.replaceAll(` ${owner} `, " AGENT "));
          };
          const manifest = await treeManifest(root);
          assert.equal(manifest.find((l) => l.startsWith(". "))!.split(" ")[3], "61999:61999");
          assert.deepEqual(agentOwned(manifest), agentOwned(snapped));
        } finally {
          await other.stop();
        }
      });
      await snapshot.remove();
    } finally {
      await ws.stop();
      await cleanup(root);
    }
  });

  test({
    name:
      `addWorkspace() from: two forks of one snapshot diverge without seeing each other (method "${method}")`,
    needs: [BWRAP],
  }, async (t) => {
    const root = await Deno.makeTempDir({ prefix: "ws-snap-" });
    await seed(root);
    await Deno.writeFile(`${root}/big`, new Uint8Array(8 * 1024 * 1024).fill(7));
    const source = await start({ snapshots: { method } }, root);
    const forks: Running[] = [];
    try {
      await source.sh("echo prepared > state");
      const prepared = await treeManifest(root);
      const snapshot = await source.workspace.snapshot();
      const storeBefore = overlay ? await diskUse(storeOf(root)!) : 0;
      // One fork of each method: either takes the other's snapshots.
      forks.push(await start({ from: snapshot }));
      forks.push(await start({ from: snapshot, snapshots: { method: "copy" } }));

      await t.step("each starts as the snapshot, its files its own agent's", async () => {
        for (const fork of forks) {
          assert.equal(await fork.sh("cat state"), "prepared\n");
          const uid = fork.workspace.uid ?? Deno.uid();
          const owners = await fork.sh("find . -path ./big -prune -o -printf '%U\\n' | sort -u");
          assert.equal(owners, `${uid}\n`);
        }
        if (IS_ROOT) assert.notEqual(forks[0].workspace.uid, forks[1].workspace.uid);
      });

      await t.step("forks share the snapshot's data (overlay)", async () => {
        if (!overlay || !OVERLAY) return;
        const grown = await diskUse(storeOf(root)!) - storeBefore;
        assert.ok(
          grown < 1024 * 1024,
          `the store grew ${grown} bytes for an overlay fork of 8 MiB`,
        );
      });

      await t.step("their writes stay their own", async () => {
        await forks[0].sh("echo a > state && echo a > only-a && rm bytes && chmod 600 src/main.sh");
        await forks[1].sh("echo b > state && echo b > only-b && mkdir dir-b");
        assert.equal(
          await forks[0].sh("cat state; ls"),
          "a\nbig\nempty\nmain\nonly-a\nsrc\nstate\n",
        );
        assert.equal(
          await forks[1].sh("cat state; ls"),
          "b\nbig\nbytes\ndir-b\nempty\nmain\nonly-b\nsrc\nstate\n",
        );
        assert.equal(await forks[1].sh("stat -c %a src/main.sh"), "755\n");
        assert.deepEqual(await treeManifest(root), prepared, "the source is unchanged");
      });

      await t.step(
        "a fork's root is empty after it stops; its snapshot keeps its state",
        async () => {
          const kept = await forks[0].workspace.snapshot();
          const before = await treeManifest(forks[0].root);
          await forks[0].stop();
          assert.deepEqual([...Deno.readDirSync(forks[0].root)], []);
          const again = await start({ from: kept });
          forks.push(again);
          const restarted = await treeManifest(again.root);
          const strip = (lines: string[]) => lines.map((l) => l.replace(/ \d+:\d+ /, " "));
          assert.deepEqual(strip(restarted), strip(before));
          assert.equal(kept.parent, snapshot.id);
          await kept.remove();
        },
      );
      await snapshot.remove();
    } finally {
      for (const fork of forks) await fork.stop();
      await source.stop();
      await cleanup(root, ...forks.map((f) => f.root));
    }
  });
}

for (const method of ["auto", "copy"] as const) {
  test({
    name:
      `addWorkspace() snapshots: a later workspace of a root whose agent has another uid reaches its files (method "${method}")`,
    needs: [BWRAP, ROOT_USER],
  }, async () => {
    // Two workspaces of one process in turn on one root, their agents of
    // different uids (as when another workspace holds the first one's uid
    // meanwhile): the first one's private root is the second agent's.
    const first = await start({ snapshots: { method }, uid: 59997, gid: 59997 });
    const root = first.root;
    try {
      await first.sh("chmod 700 . && echo one > one");
      const snapshot = await first.workspace.snapshot();
      await first.sh("echo two > two");
      await first.workspace.restore(snapshot);
      await first.stop();
      const second = await start({ snapshots: { method }, uid: 59998, gid: 59998 }, root);
      try {
        assert.equal(await second.sh("id -u && cat one && ls"), `${59998}\none\none\n`);
        await second.sh("echo three > three");
        await second.workspace.restore(snapshot);
        assert.equal(await second.sh("ls"), "one\n");
      } finally {
        await second.stop();
      }
      await snapshot.remove();
    } finally {
      await first.stop();
      await cleanup(root);
    }
  });
}

test({
  name:
    "addWorkspace() snapshots: a new root on a removed root's inode is not taken for it (its files and its forks' are their agents')",
  needs: [BWRAP, ROOT_USER],
}, async () => {
  if (!OVERLAY) return; // only an overlay root's owner is remembered
  // As under `deno test --parallel` (once in CI): a root is removed, ext4
  // gives its inode number to the next directory made there, and a later
  // workspace's root on it was taken for the old one: its files kept the old
  // agent's uid as their owner on disk, so the new agent saw them as
  // another's, and a fork of it too ('chmod: Operation not permitted').
  const parent = await Deno.makeTempDir({ prefix: "ws-snap-reuse-" });
  const forks: Running[] = [];
  let first: Running | null = null;
  let source: Running | null = null;
  try {
    // Made again until the next directory made there takes the old root's
    // inode (ext4 and xfs give it at once, unless another process takes it first).
    let root: string | null = null;
    for (let attempt = 0; attempt < 8 && root === null; attempt++) {
      const old = `${parent}/old-${attempt}`;
      await Deno.mkdir(old);
      first = await start({ snapshots: true, uid: 59993, gid: 59993 }, old);
      await first.sh("echo one > one");
      await first.stop();
      const ino = (await Deno.stat(old)).ino;
      await Deno.remove(old, { recursive: true });
      for (let i = 0; i < 16 && root === null; i++) {
        const dir = `${parent}/new-${attempt}-${i}`;
        await Deno.mkdir(dir);
        if ((await Deno.stat(dir)).ino === ino) root = dir;
      }
    }
    assert.ok(
      root !== null,
      "no new directory took a removed one's inode: this file system reuses none",
    );
    await seed(root);
    source = await start({ snapshots: true, uid: 59994, gid: 59994 }, root);
    await source.sh("echo prepared > state");
    const owners = "find . -printf '%U\\n' | sort -u";
    assert.equal(await source.sh(owners), "59994\n", "the source's files are its agent's");
    const snapshot = await source.workspace.snapshot();
    forks.push(await start({ from: snapshot }));
    const uid = forks[0].workspace.uid;
    assert.equal(await forks[0].sh(owners), `${uid}\n`, "the fork's files are its agent's");
    await forks[0].sh("chmod 600 src/main.sh && echo fork >> src/main.sh");
    await snapshot.remove();
  } finally {
    for (const fork of forks) await fork.stop();
    await source?.stop();
    await first?.stop();
    await cleanup(...forks.map((f) => f.root), parent);
  }
});

test({
  name:
    "addWorkspace() snapshots: what root adds to a root between workspaces of other uids is the later agent's, and its forks'",
  needs: [BWRAP, ROOT_USER],
}, async () => {
  if (!OVERLAY) return; // only an overlay root's files keep an earlier agent's uid on disk
  // The environment, as root, adds a file and a directory to the root after
  // the first workspace; the second one's agent has another uid. Its
  // sandbox's first command (a probe, before the overlay is mounted) gave
  // them to the second uid on disk, where the first one's are shown as the
  // second's: they were shown as the first's, and so in a fork.
  const first = await start({ snapshots: true, uid: 59991, gid: 59991 });
  const root = first.root;
  let second: Running | null = null;
  let fork: Running | null = null;
  try {
    await first.sh("echo one > one");
    await first.stop();
    await Deno.writeTextFile(`${root}/added`, "added\n");
    await Deno.mkdir(`${root}/added-dir`);
    second = await start({ snapshots: true, uid: 59992, gid: 59992 }, root);
    const owners = "find . -printf '%U\\n' | sort -u";
    assert.equal(await second.sh(owners), "59992\n");
    await second.sh("echo more >> added && touch added-dir/file && echo two >> one");
    const snapshot = await second.workspace.snapshot();
    fork = await start({ from: snapshot });
    assert.equal(await fork.sh(owners), `${fork.workspace.uid}\n`);
    await fork.sh("echo fork >> added && rm added-dir/file && echo fork >> one");
    await snapshot.remove();
  } finally {
    await fork?.stop();
    await second?.stop();
    await first.stop();
    await cleanup(root, ...(fork ? [fork.root] : []));
  }
});

test({
  name: "addWorkspace() from: nothing an agent plants before a snapshot forges a fork's grade",
  needs: [BWRAP],
}, async () => {
  // The grader's hidden check: the answer, and nothing else, decides.
  const files = { "check.sh": "grep -qx right answer.txt && echo 1.0 || echo 0.0\n" };
  const grade = async (ws: Running) => {
    const r = await ws.workspace.exec(["bash", "-c", '. "$HUD_GRADER_FILES/check.sh"'], { files });
    assert.equal(r.code, 0, r.stderr);
    return r.stdout;
  };
  const source = await start({ snapshots: true });
  let fork: Running | null = null;
  try {
    await source.sh(
      [
        "echo wrong > answer.txt",
        // Shadows of the check at the paths a grader might take it from.
        "mkdir -p grader && printf 'echo 1.0; exit 0\\n' > grader/check.sh",
        "printf 'echo 1.0; exit 0\\n' | tee .bashrc .profile .bash_profile > /dev/null",
        "ln -s /grader/check.sh check.sh",
      ].join(" && "),
    );
    const snapshot = await source.workspace.snapshot();
    fork = await start({ from: snapshot });
    // The source's agent answers right after the snapshot.
    await source.sh("echo right > answer.txt");
    assert.equal(await grade(source), "1.0\n");
    // The fork has the planted files, but its grade is the check's, on its answer.
    assert.equal(await fork.sh("cat grader/check.sh answer.txt"), "echo 1.0; exit 0\nwrong\n");
    assert.equal(await grade(fork), "0.0\n");
    await fork.sh("echo right > answer.txt");
    assert.equal(await grade(fork), "1.0\n");
    await source.sh("echo wrong > answer.txt");
    assert.equal(await grade(source), "0.0\n", "the fork's answer is not the source's");
    await snapshot.remove();
  } finally {
    await fork?.stop();
    await source.stop();
    await cleanup(source.root, ...(fork ? [fork.root] : []));
  }
});

test({
  name:
    "Workspace.restore(): the agent's next command and the next grading see the restored files, not the sandboxes started ahead",
  needs: [BWRAP],
}, async () => {
  const ws = await start({ snapshots: true });
  try {
    await ws.sh("echo before > f");
    const snapshot = await ws.workspace.snapshot();
    await ws.sh("echo after > f");
    // The next command's sandbox and the first grading's are made and waiting.
    await new Promise((r) => setTimeout(r, 300));
    await ws.workspace.restore(snapshot);
    assert.equal(await ws.sh("cat f"), "before\n");
    assert.equal((await ws.workspace.exec(["cat", "f"])).stdout, "before\n");
    await ws.sh("echo again > f");
    assert.equal((await ws.workspace.exec(["cat", "f"])).stdout, "again\n");
    await snapshot.remove();
  } finally {
    await ws.stop();
    await cleanup(ws.root);
  }
});

test({
  name: "WorkspaceSnapshot cannot be read from another workspace's sandbox",
  needs: [BWRAP, ROOT_USER],
}, async () => {
  const secret = `secret-${crypto.randomUUID()}`;
  const source = await start({ snapshots: true });
  const other = await start({});
  let fork: Running | null = null;
  try {
    const clean = await source.workspace.snapshot();
    await source.sh(`echo ${secret} > secret.txt`);
    const snapshot = await source.workspace.snapshot();
    const store = storeOf(source.root);
    assert.ok(store !== null, "the overlay names its store");
    // Other rollouts' agents (one of a plain workspace, one of a fork of an
    // earlier snapshot) know the path (a mount table may tell it) and look
    // for the secret everywhere they can.
    for (const agent of [other, fork = await start({ from: clean })]) {
      const out = await agent.try(
        `ls -la ${store} 2>&1; cat ${store}/*/secret.txt ${store}/*/*/secret.txt 2>&1; grep -rs ${secret} /tmp /run /var $HOME ${store} 2>/dev/null; echo done`,
      );
      assert.match(out.out, /No such file or directory/);
      assert.match(out.out, /done\n$/);
      assert.doesNotMatch(out.out, new RegExp(secret), out.out);
    }
    // On the host, as the other workspace's uid (isolation "none" would run it so).
    const host = await new Deno.Command("setpriv", {
      args: [
        `--reuid=${other.workspace.uid}`,
        `--regid=${other.workspace.uid}`,
        "--clear-groups",
        "--",
        "bash",
        "-c",
        `ls ${store} 2>&1; cat ${store}/l*/secret.txt 2>&1`,
      ],
      stdout: "piped",
    }).output();
    const said = new TextDecoder().decode(host.stdout);
    assert.match(said, /Permission denied/);
    assert.doesNotMatch(said, new RegExp(secret));
    assert.equal((await Deno.stat(store!)).mode! & 0o777, 0o700);
    await snapshot.remove();
    await clean.remove();
  } finally {
    await fork?.stop();
    await other.stop();
    await source.stop();
    await cleanup(source.root, other.root, ...(fork ? [fork.root] : []));
  }
});

test({
  name: "WorkspaceSnapshot bounds: snapshots.maxCount and snapshots.maxBytes",
  needs: [BWRAP],
}, async () => {
  const ws = await start({ snapshots: { maxCount: 2, maxBytes: 1024 * 1024 } });
  try {
    const a = await ws.workspace.snapshot();
    const b = await ws.workspace.snapshot();
    await assert.rejects(ws.workspace.snapshot(), /2 snapshots of it exist \(snapshots.maxCount\)/);
    await a.remove();
    const c = await ws.workspace.snapshot();
    await ws.sh("head -c 2000000 /dev/urandom > big");
    await c.remove();
    const store = OVERLAY ? storeOf(ws.root)! : null;
    const entries = () =>
      store === null ? [] : [...Deno.readDirSync(store)].map((e) => e.name).sort();
    const before = entries();
    await assert.rejects(ws.workspace.snapshot(), /snapshots.maxBytes \(1048576\)/);
    assert.deepEqual(entries(), before, "a refused snapshot leaves nothing in the store");
    await b.remove();
  } finally {
    await ws.stop();
    await cleanup(ws.root);
  }
});

for (const method of ["auto", "copy"] as const) {
  test({
    name:
      `WorkspaceSnapshot: an agent's empty directories and files count against snapshots.maxBytes (method "${method}")`,
    needs: [BWRAP],
  }, async () => {
    // Holding no data, each takes a block of disk (a directory) or an inode
    // in every copy: 600 of them are past 1 MiB.
    const ws = await start({ snapshots: { method, maxBytes: 1024 * 1024 } });
    try {
      const store = OVERLAY && method === "auto" ? storeOf(ws.root)! : null;
      const entries = () =>
        store === null ? [] : [...Deno.readDirSync(store)].map((e) => e.name).sort();
      await ws.sh("mkdir dirs && cd dirs && seq -f d%g 600 | xargs mkdir");
      const before = entries();
      await assert.rejects(ws.workspace.snapshot(), /snapshots.maxBytes \(1048576\)/);
      assert.deepEqual(entries(), before, "a refused snapshot leaves nothing in the store");
      await ws.sh("rm -r dirs && mkdir files && cd files && seq -f f%g 5000 | xargs touch");
      await assert.rejects(ws.workspace.snapshot(), /snapshots.maxBytes \(1048576\)/);
      await ws.sh("rm -r files");
      await (await ws.workspace.snapshot()).remove();
    } finally {
      await ws.stop();
      await cleanup(ws.root);
    }
  });
}

test({
  name: "Workspace.snapshot() refuses without the snapshots option, and when stopped",
  needs: [BWRAP],
}, async () => {
  const ws = await start({});
  const other = await start({ snapshots: true });
  try {
    await assert.rejects(ws.workspace.snapshot(), /added without snapshots \(set snapshots: true/);
    const s = await other.workspace.snapshot();
    await assert.rejects(ws.workspace.restore(s), /added without snapshots/);
    await other.stop();
    await assert.rejects(other.workspace.snapshot(), /it is not started/);
    await s.remove();
    await assert.rejects(
      start({ from: s }).then((r) => r.stop()),
      /snapshot "snap-[0-9a-f]+" was removed/,
    );
    assert.throws(
      () => addWorkspace(new Environment("x"), "/tmp", { from: {} as WorkspaceSnapshot }),
      /not a snapshot/,
    );
  } finally {
    await ws.stop();
    await other.stop();
    await cleanup(ws.root, other.root);
  }
});

test({
  name: "addWorkspace() from: a fork's root must be empty",
  needs: [BWRAP],
}, async () => {
  const source = await start({ snapshots: true });
  const root = await Deno.makeTempDir({ prefix: "ws-snap-" });
  await Deno.writeTextFile(`${root}/mine`, "mine\n");
  try {
    const s = await source.workspace.snapshot();
    await assert.rejects(start({ from: s }, root), /the root ".*" of a fork must be empty/);
    assert.equal(await Deno.readTextFile(`${root}/mine`), "mine\n");
    await s.remove();
  } finally {
    await source.stop();
    await cleanup(root, source.root);
  }
});

/** Spawns the child in `mode`, returns its first line and the process. */
async function child(mode: string, permissions: string[] = ["-A"], tmp?: string) {
  const proc = new Deno.Command(Deno.execPath(), {
    args: ["run", ...permissions, CHILD, mode],
    ...(tmp === undefined ? {} : { env: { TMPDIR: tmp } }),
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  return { proc, line: await firstLine(proc.stdout) };
}

for (const signal of ["SIGINT", "SIGKILL"] as const) {
  test({
    name:
      `WorkspaceSnapshot: the store, its mounts and the workspaces' temporary directories are gone after ${signal}`,
    needs: [BWRAP],
    // The overlay store's own mounts: a machine that snapshots by copying has none to leave.
    ignore: !OVERLAY,
  }, async () => {
    // Its own TMPDIR: what the child's workspaces make there is seen, and no other's.
    const tmp = await Deno.makeTempDir({ prefix: "snap-tmp-" });
    const { proc, line } = await child("hold", ["-A"], tmp);
    let info: { store: string; roots: string[] };
    try {
      info = JSON.parse(line);
      assert.ok(info.store !== null, line);
      assert.ok((await Deno.stat(info.store)).isDirectory);
      assert.ok(mountsNaming(info.store).length >= 2, "the overlays use the store");
    } finally {
      proc.kill(signal);
      await proc.status;
      await proc.stdout.cancel().catch(() => {});
      await proc.stderr.cancel();
    }
    // The watcher polls twice a second.
    for (let i = 0; i < 100 && (await Deno.stat(info.store).then(() => true, () => false)); i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    await assert.rejects(Deno.stat(info.store), Deno.errors.NotFound);
    assert.deepEqual(mountsNaming(info.store), []);
    for (const root of info.roots) assert.deepEqual(mountsNaming(` ${root} `), []);
    assert.equal(await Deno.readTextFile(`${info.roots[0]}/kept.txt`), "kept\n");
    await cleanup(...info.roots);
    // The workspaces' HOMEs, /etc files, SSH keys and SFTP sources too (a
    // watcher of the same kind): they stayed before, a private key among them.
    const left = async () => {
      const names: string[] = [];
      for await (const e of Deno.readDir(tmp)) names.push(e.name);
      return names.sort();
    };
    for (let i = 0; i < 50 && (await left()).length > 0; i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(await left(), []);
    await Deno.remove(tmp);
  });
}

for (const method of ["auto", "copy"] as const) {
  test({
    name:
      `WorkspaceSnapshot: an agent's planted files lead snapshot, restore and fork nowhere (method "${method}")`,
    needs: [BWRAP, ROOT_USER],
  }, async (t) => {
    const outside = await Deno.makeTempDir({ prefix: "ws-snap-outside-" });
    await Deno.chmod(outside, 0o777);
    await Deno.writeTextFile(`${outside}/victim`, "victim\n");
    await Deno.writeTextFile(`${outside}/linked`, "outside original\n", { mode: 0o666 });
    await Deno.chmod(`${outside}/linked`, 0o666);
    const outsideBefore = await treeManifest(outside);
    const root = await Deno.makeTempDir({ prefix: "ws-snap-" });
    await Deno.mkdir(`${root}/d`);
    await Deno.writeTextFile(`${root}/d/inner`, "inner\n");
    // A hard link to a file outside the root (an author's, or an agent's
    // under isolation "none": the sandbox refuses to make one, below).
    await Deno.link(`${outside}/linked`, `${root}/linked`);
    const ws = await start({ snapshots: { method }, limits: { fileSize: Infinity } }, root);
    const forks: Running[] = [];
    try {
      await t.step("the sandbox makes no device node and no hard link out", async () => {
        assert.notEqual((await ws.try("mknod dev c 1 5")).code, 0);
        assert.notEqual((await ws.try("ln /etc/passwd passwd")).code, 0);
        assert.notEqual((await ws.try("echo x > ~/h && ln ~/h home-link")).code, 0);
      });
      await ws.sh(
        [
          `ln -s ${outside} out`,
          "ln -s /etc/passwd pw",
          `rm -r d && ln -s ${outside} d`,
          "mkfifo fifo",
          "cp /usr/bin/id tool && chmod 4755 tool",
          "truncate -s 20G sparse",
          // A socket the agent listens on (sockets are left out of snapshots).
          `perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => "sock", Listen => 1) or die "$!"'`,
          // Through the overlay, a write in place copies the file up first;
          // in a plain root it would write the outside file, as any write
          // through a hard link does (the agent may: it is 0666).
          method === "auto" ? "echo agent >> linked" : "true",
        ].join(" && "),
      );
      const linked = method === "auto" ? "outside original\nagent\n" : "outside original\n";
      // Device nodes only an unconfined root could plant.
      await new Deno.Command("mknod", { args: [`${root}/zero`, "c", "1", "5"] }).output();
      await new Deno.Command("mknod", { args: [`${root}/disk`, "b", "7", "0"] }).output();
      const planted = await treeManifest(root).catch(() => [] as string[]);

      const snapshot = await ws.workspace.snapshot();
      await t.step("the snapshot skips device nodes, keeps holes, reads no FIFO", () => {
        assert.deepEqual([...snapshot.skipped].sort(), ["disk", "sock", "zero"]);
        assert.ok(snapshot.bytes < 1024 * 1024, `${snapshot.bytes} bytes for a 20 GiB sparse file`);
      });
      await ws.sh("rm -f out pw d fifo tool sparse sock linked && echo again > linked");
      await Deno.remove(`${root}/zero`);
      await Deno.remove(`${root}/disk`);
      await ws.workspace.restore(snapshot);

      await t.step("restored: the links are links, nothing followed", async () => {
        const now = await treeManifest(root);
        const expected = planted.filter((l) => !/^(zero|disk|sock) /.test(l));
        assert.deepEqual(now, expected);
        assert.equal(await Deno.readLink(`${root}/d`), outside);
        assert.equal(await ws.sh("cat linked"), linked);
      });

      await t.step("a fork starts with the links and FIFO; its writes stay in it", async () => {
        const fork = await start({ from: snapshot, limits: { fileSize: Infinity } });
        forks.push(fork);
        assert.equal(
          await fork.sh("readlink d; test -p fifo && echo fifo; test -e sock || echo no socket"),
          `${outside}\nfifo\nno socket\n`,
        );
        // What the links name is not in the fork's sandbox.
        assert.notEqual((await fork.try("echo x > d/victim")).code, 0);
        await fork.sh("echo fork >> linked && echo y >> sparse");
        assert.equal(await fork.sh("stat -c %s sparse"), `${20 * 1024 ** 3 + 2}\n`);
      });

      await t.step("setuid files stay the agent's: the roots are mounted nosuid", async () => {
        for (const dir of [root, ...forks.map((f) => f.root)]) {
          if (method === "copy" && dir === root) continue; // a plain directory, as without snapshots
          const line = mountsNaming(` ${dir} `)[0] ?? "";
          assert.match(line, /[ ,]nosuid[ ,]/, `${dir}: ${line}`);
          const ran = await new Deno.Command("setpriv", {
            args: ["--reuid=65534", "--regid=65534", "--clear-groups", `${dir}/tool`, "-u"],
            stdout: "piped",
          }).output();
          assert.equal(new TextDecoder().decode(ran.stdout), "65534\n");
        }
      });

      await t.step("nothing outside the root was read into a snapshot or written", async () => {
        for (const fork of forks.splice(0)) {
          await fork.stop();
          await cleanup(fork.root);
        }
        await ws.stop();
        assert.deepEqual(await treeManifest(outside), outsideBefore);
        assert.equal(await Deno.readTextFile(`${outside}/linked`), "outside original\n");
        assert.ok((await Deno.lstat(`${root}/d`)).isSymlink);
        assert.equal(await Deno.readTextFile(`${root}/linked`), linked);
      });
      await snapshot.remove();
    } finally {
      for (const fork of forks) await fork.stop();
      await ws.stop();
      await cleanup(root, outside, ...forks.map((f) => f.root));
    }
  });
}
