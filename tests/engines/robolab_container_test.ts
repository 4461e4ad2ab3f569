// examples/robolab.ts inside containers: its SSH workspace and file tracking
// run in the container, reached through the runtime's control socket, and
// the agent's commands run in the workspace's own sandbox there (bubblewrap
// in user namespaces: no `isolation: "none"`). The image's base is a
// minimal rootfs of this machine's own tools (tests/engines/_shell_base.ts).
// Needs an engine socket; skipped without one, saying why (in CI it runs).

import { test } from "../_test.ts";
import { type Counterpart, ENGINE, PODMAN } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { buildEnvironmentImage, ContainerRuntime, OWNER_LABEL } from "../../engines/mod.ts";
import { EngineClient } from "../../engines/_engine.ts";
import { functionAgent, Taskset } from "../../eval/mod.ts";
import type { FileDiff, FlushResult } from "../../filetracking/mod.ts";
import { scriptedAgent, tasks } from "../../examples/robolab.ts";
import { withDeadline } from "../_deadline.ts";
import { buildShellBase } from "./_shell_base.ts";

const BASE = "hud-test-shell-bwrap:latest";
const TAG = "hud-test-robolab-bwrap:latest";
const ROBOLAB = new URL("../../examples/robolab.ts", import.meta.url).pathname;

/** Where Podman's API answers in CI (HUD_TEST_PODMAN_SOCKET; the PODMAN counterpart). */
const PODMAN_SOCKET = Deno.env.get("HUD_TEST_PODMAN_SOCKET") || "/run/podman/podman.sock";

const built = new Map<string | undefined, Promise<void>>();
/** The base and robolab images on the engine at `socket` (default: the default one), once. */
function buildImages(socket?: string): Promise<void> {
  let done = built.get(socket);
  if (done === undefined) {
    done = (async () => {
      await buildShellBase(BASE, socket);
      await buildEnvironmentImage(ROBOLAB, TAG, {
        from: BASE,
        envName: "robolab",
        envVersion: "1.0.0",
        socket,
        signal: AbortSignal.timeout(240_000),
      });
    })();
    built.set(socket, done);
  }
  return done;
}

/**
 * The containers of this file's image that this process made (other test
 * files, beside this one under `deno test --parallel`, have their own).
 */
async function running(socket?: string): Promise<string[]> {
  using engine = await EngineClient.open(socket);
  const filters = encodeURIComponent(
    JSON.stringify({ label: [`${OWNER_LABEL}=${Deno.pid}`], ancestor: [TAG] }),
  );
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
  }[];
  return list.map((c) => c.Id);
}

// As docs/runtimes.md has it: no option says how to sandbox.
const runtime = (socket?: string) => new ContainerRuntime(TAG, { socket });

/**
 * An IPv4 address of this host on Docker's bridge (docker0), where a
 * container on the bridge reaches the host through its gateway.
 */
function bridgeAddress(): string | null {
  return Deno.networkInterfaces().find((i) => i.family === "IPv4" && i.name === "docker0")
    ?.address ?? null;
}

test({
  name: "ContainerRuntime runs 20 robolab rollouts, SSH and file tracking inside containers",
  needs: [ENGINE],
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

test({
  name: "ContainerRuntime: a container killed mid-rollout errors that rollout with the reason",
  needs: [ENGINE],
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

/** The tests of the agent's view, against the engine at `socket`, named `label`. */
function agentSuite(
  label: string,
  socket: string | undefined,
  needs: readonly Counterpart[],
): void {
  test({
    name:
      `ContainerRuntime: robolab's agent is sandboxed in its container: its own processes, no network, no host service (${label})`,
    needs,
    fn: withDeadline(59_000, async () => {
      await buildImages(socket);
      const address = bridgeAddress();
      if (address === null) console.log("robolab_container_test: no docker0: host service skipped");
      const listener = address === null ? null : Deno.listen({ hostname: address, port: 0 });
      let accepted = 0;
      const serving = (async () => {
        if (listener === null) return;
        for await (const conn of listener) {
          accepted++;
          conn.close();
        }
      })();
      const target = listener === null ? "169.254.169.254/80" : `${address}/${listener.addr.port}`;
      const seen: Record<string, string> = {};
      const agent = functionAgent(async (_prompt, run, { signal }) => {
        seen.isolation = String(run.client.binding("shell").params.isolation);
        await using shell = await run.client.open("shell", { signal });
        const sh = async (command: string) =>
          (await shell.exec(command, { signal })).stdoutText.trim();
        seen.uid = await sh("id -u");
        seen.pid1 = await sh("cat /proc/1/comm");
        seen.processes = await sh("ls /proc | grep -c '^[0-9]*$'");
        seen.route = await sh("cat /proc/net/route | wc -l");
        seen.reach = await sh(
          `(exec 3<>/dev/tcp/${target}) 2>/dev/null && echo reached || echo unreachable`,
        );
        // The server's port on the container's loopback, and its control socket.
        seen.control = await sh(
          "(exec 3<>/dev/tcp/127.0.0.1/8765) 2>/dev/null && echo reached || echo unreachable",
        );
        seen.socket = await sh("ls -A /tmp/.hud-control 2>/dev/null || echo hidden");
        return "";
      });
      try {
        const job = await new Taskset(tasks.slice(0, 1)).run(agent, {
          runtime: runtime(socket),
          rolloutTimeout: 60_000,
          signal: AbortSignal.timeout(120_000),
        });
        assert.equal(job.errored.length, 0, JSON.stringify(job.errored[0]?.trace));
      } finally {
        listener?.close();
        await serving.catch(() => {});
      }
      assert.equal(seen.isolation, "bwrap");
      // The workspace's sandbox, not the container's processes: no server here.
      assert.notEqual(seen.pid1, "deno");
      assert.ok(Number(seen.processes) < 10, `${seen.processes} processes visible`);
      assert.equal(seen.uid, "65534");
      // Only the header of an empty route table.
      assert.equal(seen.route, "1");
      assert.equal(seen.reach, "unreachable");
      assert.equal(seen.control, "unreachable");
      assert.equal(seen.socket, "hidden");
      assert.equal(accepted, 0, "the host service on the bridge was reached");
      assert.deepEqual(await running(socket), [], "containers left behind");
    }),
  });

  test({
    name:
      `ContainerRuntime: OpenSSH's scp and sftp reach the workspace inside a container (${label})`,
    needs,
    fn: withDeadline(59_000, async () => {
      await buildImages(socket);
      const scratch = await Deno.makeTempDir({ prefix: "hud-scp-" });
      const seen: string[] = [];
      const agent = functionAgent(async (_prompt, run, { signal }) => {
        const shell = run.client.binding("shell");
        const dir = (run.bindings.shell as { cwd: string }).cwd;
        const port = new URL(shell.url).port;
        const key = `${scratch}/key`;
        await Deno.writeTextFile(key, String(shell.params.client_key), { mode: 0o600 });
        const options = [
          "-F",
          "/dev/null",
          "-o",
          "BatchMode=yes",
          "-o",
          "StrictHostKeyChecking=no",
          "-o",
          "UserKnownHostsFile=/dev/null",
          "-o",
          "LogLevel=ERROR",
          "-i",
          key,
          "-P",
          port,
        ];
        const at = `${shell.params.user}@127.0.0.1`;
        const run1 = async (cmd: string, args: string[], stdin?: string) => {
          const child = new Deno.Command(cmd, {
            args,
            stdin: stdin === undefined ? "null" : "piped",
            stdout: "piped",
            stderr: "piped",
            signal,
          }).spawn();
          if (stdin !== undefined) {
            const w = child.stdin.getWriter();
            await w.write(new TextEncoder().encode(stdin));
            await w.close();
          }
          const out = await child.output();
          const text = new TextDecoder();
          seen.push(`${cmd}: ${out.code} ${text.decode(out.stdout)}${text.decode(out.stderr)}`);
          return out.code;
        };
        await Deno.writeTextFile(`${scratch}/up.txt`, "sent by scp\n");
        await run1("scp", [...options, `${scratch}/up.txt`, `${at}:${dir}/up.txt`]);
        await run1("scp", [...options, `${at}:${dir}/up.txt`, `${scratch}/down.txt`]);
        await run1("sftp", ["-b", "-", ...options, at], `cd ${dir}\nls -1\n`);
        return "";
      });
      try {
        const job = await new Taskset(tasks.slice(0, 1)).run(agent, {
          runtime: runtime(socket),
          rolloutTimeout: 60_000,
          signal: AbortSignal.timeout(120_000),
        });
        assert.equal(job.errored.length, 0, JSON.stringify(job.errored[0]?.trace));
        assert.equal(
          await Deno.readTextFile(`${scratch}/down.txt`),
          "sent by scp\n",
          seen.join("\n"),
        );
        assert.match(seen[2], /^sftp: 0 .*up\.txt/s, seen.join("\n"));
      } finally {
        await Deno.remove(scratch, { recursive: true });
      }
      assert.deepEqual(await running(socket), [], "containers left behind");
    }),
  });
}

agentSuite("default engine", undefined, [ENGINE]);
agentSuite("Podman", PODMAN_SOCKET, [PODMAN]);

test({
  name:
    "hud image and hud eval --runtime container: run docs/runtimes.md's robolab commands as written",
  needs: [ENGINE],
  fn: withDeadline(59_000, async () => {
    await buildImages();
    const { main } = await import("../../cli.ts");
    let out = "";
    let err = "";
    const io = { stdout: (t: string) => out += t, stderr: (t: string) => err += t };
    const tag = "hud-test-robolab-readme:latest";
    // deno run -A cli.ts image examples/robolab.ts --tag robolab:latest --from my-rootfs:latest
    assert.equal(await main(["image", ROBOLAB, "--tag", tag, "--from", BASE], io), 0, err);
    // deno run -A cli.ts eval examples/robolab.ts --agent examples/ssh_agent.sh --runtime container:robolab:latest
    const agent = new URL("../../examples/ssh_agent.sh", import.meta.url).pathname;
    out = "";
    const code = await main(
      ["eval", ROBOLAB, "--agent", agent, "--runtime", `container:${tag}`, "--json"],
      io,
    );
    assert.equal(code, 0, err);
    const summary = JSON.parse(out) as {
      errored: number;
      tasks: { args: { difficulty: number }; mean_reward: number }[];
    };
    assert.equal(summary.errored, 0);
    // The agent knows the first lab's repair only.
    for (const task of summary.tasks.filter((t) => t.args.difficulty === 1)) {
      assert.equal(task.mean_reward, 1, JSON.stringify(task));
    }
    assert.deepEqual(await running(), [], "containers left behind");
  }),
});
