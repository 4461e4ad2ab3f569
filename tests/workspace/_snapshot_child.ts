// A process that takes snapshots, for tests/workspace/snapshot_test.ts.
//
//   deno run -A _snapshot_child.ts hold
//     starts a workspace with snapshots, takes one, starts a fork of it, prints
//     {"store", "roots"} as one JSON line and waits to be killed.

import { Environment } from "../../env.ts";
import { SshClient } from "../../ssh/mod.ts";
import { addWorkspace } from "../../workspace/workspace.ts";

const mode = Deno.args[0];

async function started(root: string, options: Parameters<typeof addWorkspace>[2]) {
  const env = new Environment("snapshot-child");
  const workspace = addWorkspace(env, root, { trackFiles: false, ...options });
  await env.start();
  const shell = SshClient.fromBinding(env.capability("shell")!);
  const sh = async (command: string) => {
    const r = await shell.exec(command, { timeout: 20_000 });
    if (r.code !== 0) throw new Error(`"${command}" failed: ${r.stderrText}`);
    return r.stdoutText;
  };
  return { env, workspace, shell, sh };
}

if (mode === "hold") {
  const root = await Deno.makeTempDir({ prefix: "snap-hold-" });
  const forkRoot = await Deno.makeTempDir({ prefix: "snap-hold-fork-" });
  await Deno.writeTextFile(`${root}/kept.txt`, "kept\n");
  const source = await started(root, { snapshots: true });
  await source.sh("echo changed > kept.txt");
  const snapshot = await source.workspace.snapshot();
  await started(forkRoot, { from: snapshot });
  const store = Deno.readTextFileSync("/proc/self/mountinfo").split("\n")
    .map((l) => /upperdir=([^,]*)\/w[0-9a-z]+\/u/.exec(l)?.[1])
    .find((s) => s !== undefined) ?? null;
  console.log(JSON.stringify({ store, roots: [root, forkRoot] }));
  await new Promise(() => {}); // until killed
} else {
  throw new Error(`unknown mode "${mode}"`);
}
