// examples/robolab.ts inside containers: its SSH workspace and file tracking
// run in the container, reached through the published control port. The
// image's base is a minimal rootfs assembled here from this machine's own
// bash, coreutils, grep, sed, bc and setpriv with the libraries ldd lists
// (a debootstrap rootfs works too, but took 356 s here: too slow for CI).
// Needs an engine socket; skipped without one, saying why (in CI it runs).

import assert from "node:assert/strict";
import { buildEnvironmentImage, ContainerRuntime, OWNER_LABEL } from "../../engines/mod.ts";
import { EngineClient, findEngineSocket } from "../../engines/_engine.ts";
import { TarWriter } from "../../engines/_tar.ts";
import { functionAgent, Taskset } from "../../eval/mod.ts";
import type { FileDiff, FlushResult } from "../../filetracking/mod.ts";
import { scriptedAgent, tasks } from "../../examples/robolab.ts";
import { withDeadline } from "../_deadline.ts";

function engineSocket(): string | null {
  try {
    return findEngineSocket();
  } catch {
    return null;
  }
}
const SOCKET = engineSocket();
const CI = Deno.env.get("CI") === "true";
if (SOCKET === null && !CI) console.log("robolab_container_test: skipped: no engine socket");
const ignore = SOCKET === null && !CI;

const BASE = "hud-test-shell:latest";
const TAG = "hud-test-robolab:latest";
const ROBOLAB = new URL("../../examples/robolab.ts", import.meta.url).pathname;
const TOOLS = ["bash", "grep", "sed", "bc", "setpriv", "env"];

async function output(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return new TextDecoder().decode(out.stdout);
}

/** A path on a merged-/usr system, as it sits in the rootfs. */
function inUsr(path: string): string {
  return path.replace(/^\/(bin|sbin|lib|lib64)\//, "/usr/$1/");
}

/**
 * A FROM-scratch base image of this machine's shell tools: bash, coreutils,
 * grep, sed, bc, setpriv, and every library they and Deno link.
 */
async function buildShellBase(engine: EngineClient): Promise<void> {
  const coreutils = (await output("dpkg", ["-L", "coreutils"])).split("\n")
    .filter((p) => /^\/(usr\/)?bin\/[^/]+$/.test(p));
  const bins = new Set<string>();
  for (const p of [...coreutils, ...TOOLS.map((t) => `/usr/bin/${t}`)]) {
    try {
      bins.add(await Deno.realPath(p));
    } catch {
      // not on this machine (bc is optional: only the third lab's check uses it)
    }
  }
  const libs = new Set<string>();
  for (const bin of [...bins, await Deno.realPath(Deno.execPath())]) {
    const ldd = await output("ldd", [bin]).catch(() => "");
    for (const lib of ldd.match(/\/[^ :()]+\.so[^ :()]*/g) ?? []) libs.add(lib);
  }
  const tar = new TarWriter();
  for (const d of ["usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc"]) tar.dir(`root/${d}`);
  for (const l of ["bin", "sbin", "lib", "lib64"]) tar.symlink(`root/${l}`, `usr/${l}`);
  tar.dir("root/tmp", 0o1777);
  tar.file(
    "root/etc/passwd",
    new TextEncoder().encode("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/bin/sh\n"),
  );
  tar.file("root/etc/group", new TextEncoder().encode("root:x:0:\nnogroup:x:65534:\n"));
  for (const bin of bins) tar.file(`root${inUsr(bin)}`, await Deno.readFile(bin), 0o755);
  tar.symlink("root/usr/bin/sh", "bash");
  for (const lib of libs) {
    const path = `root${inUsr(lib)}`;
    const dir = path.slice(0, path.lastIndexOf("/"));
    if (!["root/usr/lib", "root/usr/lib64"].includes(dir)) tar.dir(dir);
    tar.file(path, await Deno.readFile(await Deno.realPath(lib)), 0o755);
  }
  tar.file(
    "Dockerfile",
    new TextEncoder().encode("FROM scratch\nCOPY root/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n"),
  );
  const res = await engine.raw("POST", `/build?t=${encodeURIComponent(BASE)}&rm=1&forcerm=1`, {
    body: tar.bytes(),
    headers: { "content-type": "application/x-tar" },
    signal: AbortSignal.timeout(240_000),
  });
  for (const line of (await res.text()).split("\n")) {
    if (line.trim() === "") continue;
    const msg = JSON.parse(line) as { error?: string };
    if (msg.error) throw new Error(`Cannot build ${BASE}: ${msg.error}`);
  }
}

let built: Promise<void> | null = null;
function buildImages(): Promise<void> {
  built ??= (async () => {
    using engine = await EngineClient.open();
    await buildShellBase(engine);
    await buildEnvironmentImage(ROBOLAB, TAG, {
      from: BASE,
      envName: "robolab",
      envVersion: "1.0.0",
      signal: AbortSignal.timeout(240_000),
    });
  })();
  return built;
}

async function running(): Promise<string[]> {
  using engine = await EngineClient.open();
  const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${Deno.pid}`] }));
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
  }[];
  return list.map((c) => c.Id);
}

const runtime = () => new ContainerRuntime(TAG, { env: { ROBOLAB_ISOLATION: "none" } });

Deno.test({
  name: "ContainerRuntime runs 20 robolab rollouts, SSH and file tracking inside containers",
  ignore,
  fn: withDeadline(59_000, async () => {
    await buildImages();
    // Five tasks, four times each.
    const job = await new Taskset(tasks.slice(0, 5)).run(scriptedAgent, {
      group: 4,
      runtime: runtime(),
      maxConcurrent: 4,
      rolloutTimeout: 120_000,
      signal: AbortSignal.timeout(280_000),
    });
    assert.equal(job.runs.length, 20);
    const rewards = job.runs.map((r) => [r.task.args.difficulty, r.reward]);
    const want = { 1: 1, 2: 0.5, 3: 0 } as Record<number, number>;
    for (const [difficulty, reward] of rewards) {
      assert.equal(reward, want[difficulty as number], JSON.stringify(job.errored[0]?.trace));
    }
    // File tracking ran inside the container: the fix shows as a diff.
    const first = job.liveRuns.find((r) => r?.task.args.difficulty === 1)!;
    const dir = (first.bindings.filetracking as { path: string }).path;
    const patches = first.trace.steps
      .flatMap((s) =>
        s.type === "filetracking.diff"
          ? (s.content as FileDiff).patches
          : s.type === "filetracking.flush"
          ? (s.content as FlushResult).diff.patches
          : []
      );
    const count = patches.find((p) => p.path === `${dir}/count.sh`);
    assert.ok(count, `no diff of ${dir}/count.sh in ${JSON.stringify(patches.map((p) => p.path))}`);
    assert.match(count.patch, /^\+while \[ "\$i" -le "\$n" \]; do$/m);
    assert.deepEqual(await running(), [], "containers left behind");
  }),
});

Deno.test({
  name: "ContainerRuntime: a container killed mid-rollout errors that rollout with the reason",
  ignore,
  fn: withDeadline(59_000, async () => {
    await buildImages();
    // The agent reaches the workspace, then its container is killed under it.
    const agent = functionAgent(async (_prompt, run, { signal }) => {
      await using shell = await run.client.open("shell", { signal });
      await shell.exec("true", { signal });
      const [id] = await running();
      using engine = await EngineClient.open();
      await engine.call("POST", `/containers/${id}/kill?signal=SIGKILL`);
      return (await shell.exec("echo still here", { signal })).stdoutText;
    });
    const job = await new Taskset(tasks.slice(0, 1)).run(agent, {
      runtime: runtime(),
      rolloutTimeout: 60_000,
      signal: AbortSignal.timeout(120_000),
    });
    const [record] = job.runs;
    assert.equal(record.status, "error");
    assert.equal(record.reward, null);
    assert.ok(
      ["agent", "grading"].includes(record.failed_phase ?? ""),
      `failed in ${record.failed_phase}`,
    );
    const trace = JSON.stringify(record.trace);
    assert.match(trace, /died while placed: exit code 137/);
    assert.deepEqual(await running(), [], "containers left behind");
  }),
});
