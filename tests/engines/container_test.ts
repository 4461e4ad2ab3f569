// ContainerRuntime against real engines: the default one (Docker's socket,
// else Podman's) and, when HUD_TEST_PODMAN_SOCKET names one, Podman's too.
// `.ci/run` starts both (.ci/engine/engine_up.sh, behind its firewall
// guard); without an engine socket these tests are skipped, saying why.

import { test } from "../_test.ts";
import { type Counterpart, counterpart, ENGINE, PODMAN } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { connect } from "../../client.ts";
import { NotReadyError } from "../../errors.ts";
import { loadEnvironment } from "../../loader.ts";
import {
  buildEnvironmentImage,
  ContainerRuntime,
  OWNER_LABEL,
  removeStaleContainers,
} from "../../engines/mod.ts";
import { EngineClient } from "../../engines/_engine.ts";
import { TarWriter } from "../../engines/_tar.ts";
import { buildShellBase } from "./_shell_base.ts";
import { functionAgent, Taskset } from "../../eval/mod.ts";
import { taskSlug } from "../../env.ts";

/** Where Podman's API answers in CI (HUD_TEST_PODMAN_SOCKET; the PODMAN counterpart). */
const PODMAN_SOCKET = Deno.env.get("HUD_TEST_PODMAN_SOCKET") || "/run/podman/podman.sock";
const fixture = (name: string) => new URL(`../fixtures/${name}`, import.meta.url).pathname;
const TAG = "hud-test-env:latest";
const BROKEN_TAG = "hud-test-env-broken:latest";
const PROBE_TAG = "hud-test-env-probe:latest";
const PROBE_BASE = "hud-test-env-probe-base:latest";
const FILE_LABEL = "dev.hud.test.file";
/** On every container this file's runtimes make in this process (containersOf). */
const FILE_LABELS = { [FILE_LABEL]: "container_test" };

/**
 * tests/fixtures/syscall_probe.c built static, or null without gcc (or off
 * x86_64, where its 32-bit call does not exist).
 */
async function syscallProbe(): Promise<Uint8Array | null> {
  if (Deno.build.arch !== "x86_64") return null;
  const dir = await Deno.makeTempDir({ prefix: "hud-syscall-probe-" });
  try {
    // Without gcc, spawning it throws (before a promise exists to reject).
    const out = await (async () =>
      await new Deno.Command("gcc", {
        args: ["-static", "-O1", "-o", `${dir}/probe`, fixture("syscall_probe.c")],
        stdout: "null",
        stderr: "piped",
      }).output())().catch(() => null);
    return out?.success ? await Deno.readFile(`${dir}/probe`) : null;
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
const SYSCALL_PROBE = await syscallProbe();
/** What builds the system call probe: gcc with a static libc (on x86_64). */
const SYSCALL_GCC = counterpart(
  "gcc",
  "apt-get install gcc libc6-dev",
  () => SYSCALL_PROBE === null ? "gcc cannot build a static x86_64 program here" : null,
);

/**
 * An IPv4 address of this host on an engine's bridge (Docker's docker0
 * first): a service there is what a container on a bridge reaches through
 * its gateway, as it would a cloud's metadata service.
 */
function bridgeAddress(): string | null {
  const ours = Deno.networkInterfaces().filter((i) =>
    i.family === "IPv4" && /^(docker0|podman\d*|cni-podman\d*|br-)/.test(i.name)
  );
  return (ours.find((i) => i.name === "docker0") ?? ours[0])?.address ?? null;
}

/** A TCP service on `hostname` that counts the connections it accepts. */
function countingService(hostname: string) {
  const listener = Deno.listen({ hostname, port: 0 });
  let accepted = 0;
  const loop = (async () => {
    for await (const conn of listener) {
      accepted++;
      conn.close();
    }
  })();
  return {
    target: `${hostname}:${listener.addr.port}`,
    get accepted() {
      return accepted;
    },
    async close() {
      listener.close();
      await loop.catch(() => {});
    },
  };
}

interface Facts {
  uid: number;
  capEff: string;
  capBnd: string;
  noNewPrivs: string;
  seccomp: string;
  routes: string[];
  masks: string[];
  imageWritable: string;
  reached: Record<string, string>;
  syscalls: Record<string, string>;
}

/**
 * Registers the suite against one engine: `socket` (undefined: the default
 * one), named `label` in the test names.
 */
function suite(label: string, socket: string | undefined, needs: readonly Counterpart[]) {
  let built: Promise<void> | null = null;
  /** Builds the two test images once per run. */
  function buildImages(): Promise<void> {
    built ??= (async () => {
      const env = await loadEnvironment(fixture("basic_env.ts"));
      await buildEnvironmentImage(fixture("basic_env.ts"), TAG, {
        envName: env.name,
        envVersion: env.version,
        socket,
        signal: AbortSignal.timeout(240_000),
      });
      await buildEnvironmentImage(fixture("broken_env.ts"), BROKEN_TAG, {
        envName: "broken",
        envVersion: "0",
        socket,
        signal: AbortSignal.timeout(240_000),
      });
      await buildShellBase(
        PROBE_BASE,
        socket,
        SYSCALL_PROBE ? { "/usr/local/bin/hud-syscall-probe": SYSCALL_PROBE } : {},
      );
      await buildEnvironmentImage(fixture("container_probe_env.ts"), PROBE_TAG, {
        from: PROBE_BASE,
        envName: "probe",
        envVersion: "1.0.0",
        socket,
        signal: AbortSignal.timeout(240_000),
      });
    })();
    return built;
  }

  /**
   * The containers process `pid` made; for this process, only this file's
   * (FILE_LABELS): other test files, run beside it under `deno test
   * --parallel` in the same process, make containers of the same owner.
   */
  async function containersOf(pid: number): Promise<string[]> {
    using engine = await EngineClient.open(socket);
    const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${pid}`] }));
    const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
      Id: string;
      Labels?: Record<string, string> | null;
    }[];
    return list.filter((c) =>
      pid !== Deno.pid || c.Labels?.[FILE_LABEL] === FILE_LABELS[FILE_LABEL]
    )
      .map((c) => c.Id);
  }

  /** The control socket directory the container of `pid` names in its label. */
  async function controlDirOf(pid: number): Promise<string> {
    using engine = await EngineClient.open(socket);
    const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${pid}`] }));
    const [c] = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
      Labels: Record<string, string>;
    }[];
    return c.Labels["dev.hud.control.dir"];
  }

  test({
    name: `buildEnvironmentImage() makes an image with the env's label from no registry (${label})`,
    needs,
    async fn() {
      await buildImages();
      using engine = await EngineClient.open(socket);
      const info = await engine.call("GET", `/images/${encodeURIComponent(TAG)}/json`) as {
        Config: { Labels: Record<string, string>; Cmd: string[] };
      };
      assert.equal(info.Config.Labels["dev.hud.env"], "fixture");
      assert.equal(info.Config.Labels["dev.hud.control"], "socket");
      // The server starts with a small young generation (SERVER_V8_FLAGS).
      assert.ok(
        info.Config.Cmd.includes("--v8-flags=--max-semi-space-size=1"),
        info.Config.Cmd.join(" "),
      );
      assert.equal(info.Config.Labels["dev.hud.env.version"], "0.3.0");
    },
  });

  test({
    name:
      `ContainerRuntime places, serves a task with a token, and removes the container (${label})`,
    needs,
    async fn() {
      await buildImages();
      const runtime = new ContainerRuntime(TAG, {
        socket,
        memory: 256 * 1024 * 1024,
        pids: 256,
        labels: FILE_LABELS,
      });
      let containerId = "";
      {
        await using client = await connect(runtime, { readyTimeout: 60_000 });
        assert.match(client.url, /^tcp:\/\/.*127\.0\.0\.1:\d+/);
        assert.equal(client.manifest.env.name, "fixture");
        const { prompt } = await client.startTask("add", { a: 2, b: 3 });
        assert.equal(prompt, "What is 2 + 3?");
        assert.equal((await client.grade({ answer: "5" })).score, 1);
        const mine = await containersOf(Deno.pid);
        assert.equal(mine.length, 1);
        containerId = mine[0];
      }
      assert.deepEqual(await containersOf(Deno.pid), [], `container ${containerId} left behind`);
    },
  });

  /** The probe's facts from a container of `runtime`. */
  async function factsOf(runtime: ContainerRuntime, targets: string[]): Promise<Facts> {
    await using client = await connect(runtime, { readyTimeout: 60_000 });
    const { prompt } = await client.startTask("facts", { targets });
    assert.equal((await client.grade({ answer: "ok" })).score, 1);
    return JSON.parse(String(prompt)) as Facts;
  }

  test({
    name:
      `ContainerRuntime runs the container unprivileged: not root, no capabilities, no_new_privs, seccomp, a read-only image (${label})`,
    needs,
    async fn() {
      await buildImages();
      const facts = await factsOf(
        new ContainerRuntime(PROBE_TAG, { socket, labels: FILE_LABELS }),
        [],
      );
      assert.equal(facts.uid, 65534);
      assert.equal(facts.capEff, "0000000000000000");
      assert.equal(facts.capBnd, "0000000000000000");
      assert.equal(facts.noNewPrivs, "1");
      assert.equal(facts.seccomp, "2");
      assert.notEqual(facts.imageWritable, "yes");
      // Nothing covers /proc (the sandbox mounts a fresh one); /sys keeps its masks.
      assert.deepEqual(facts.masks.filter((m) => m.startsWith("/proc/")), [], String(facts.masks));
      assert.ok(facts.masks.includes("/sys/firmware"), String(facts.masks));
      assert.deepEqual(await containersOf(Deno.pid), []);
    },
  });

  test({
    name:
      `ContainerRuntime's seccomp profile refuses keyrings, bpf, perf, userfaultfd, io_uring, other processes' memory and 32-bit calls, and allows user namespaces (${label})`,
    needs: [...needs, SYSCALL_GCC],
    async fn() {
      await buildImages();
      const { syscalls } = await factsOf(
        new ContainerRuntime(PROBE_TAG, { socket, labels: FILE_LABELS }),
        [],
      );
      // EPERM from Docker 20.10 (no defaultErrnoRet), ENOSYS from Podman.
      const refused = /^-1 (1|38)$/;
      for (
        const name of [
          "keyctl",
          "add_key",
          "bpf",
          "perf_event_open",
          "userfaultfd",
          "io_uring_setup",
          "process_vm_readv",
        ]
      ) {
        assert.match(syscalls[name] ?? "missing", refused, `${name}: ${JSON.stringify(syscalls)}`);
      }
      assert.equal(syscalls.unshare_user, "0 0", JSON.stringify(syscalls));
      assert.equal(syscalls.i386, "killed by SIGSYS", JSON.stringify(syscalls));
    },
  });

  test({
    name:
      `ContainerRuntime network: false: no route, so the bridge gateway, a host service and 169.254.169.254 are unreachable, while the control port answers (${label})`,
    needs,
    async fn(t) {
      await buildImages();
      const address = bridgeAddress();
      if (address === null) {
        console.log("container_test: no engine bridge on this host: the host service is skipped");
      }
      const service = address === null ? null : countingService(address);
      try {
        const targets = ["169.254.169.254:80", ...(service ? [service.target] : [])];
        // The control port answers: the task runs at all.
        const facts = await factsOf(
          new ContainerRuntime(PROBE_TAG, { socket, labels: FILE_LABELS }),
          targets,
        );
        assert.deepEqual(facts.routes, [], "the container has routes");
        for (const target of targets) {
          assert.match(facts.reached[target], /unreachable/i, target);
        }
        assert.equal(service?.accepted ?? 0, 0, "the host service was reached");
        await t.step("network: true puts it on the bridge, with a route out", async () => {
          const open = await factsOf(
            new ContainerRuntime(PROBE_TAG, { socket, network: true, labels: FILE_LABELS }),
            service ? [service.target] : [],
          );
          assert.ok(open.routes.some((r) => r.split("\t")[1] === "00000000"), "no default route");
          if (service) assert.equal(open.reached[service.target], "connected");
        });
      } finally {
        await service?.close();
      }
      assert.deepEqual(await containersOf(Deno.pid), []);
    },
  });

  // The command line finds the default engine only.
  if (socket === undefined) {
    test({
      name:
        `hud eval --runtime container: --container-network and --container-env reach the container (${label})`,
      needs,
      async fn() {
        await buildImages();
        const { main } = await import("../../cli.ts");
        const dir = await Deno.makeTempDir({ prefix: "hud-eval-flags-" });
        try {
          const rows = `${dir}/rows.jsonl`;
          await Deno.writeTextFile(
            rows,
            JSON.stringify({ env: "probe", id: "facts", args: { targets: [] } }) + "\n",
          );
          // Answers "ok" when the facts it is given match what it expects.
          const agent = (route: string, note: string) =>
            `p=$(cat); case "$p" in *'"routes":[]'*) r=none;; *) r=some;; esac; ` +
            `case "$p" in *'"note":"hello"'*) n=hello;; *) n=null;; esac; ` +
            `[ "$r $n" = "${route} ${note}" ] && echo ok || echo "$r $n"`;
          let out = "";
          let err = "";
          const io = { stdout: (t: string) => out += t, stderr: (t: string) => err += t };
          const probe = fixture("container_probe_env.ts");
          const common = ["--tasks", rows, "--runtime", `container:${PROBE_TAG}`, "--json"];
          assert.equal(
            await main(["eval", probe, "--agent", agent("none", "null"), ...common], io),
            0,
            err,
          );
          assert.equal(JSON.parse(out).mean_reward, 1, out);
          out = "";
          const flags = ["--container-network", "--container-env", "PROBE_NOTE=hello"];
          assert.equal(
            await main(["eval", probe, "--agent", agent("some", "hello"), ...common, ...flags], io),
            0,
            err,
          );
          assert.equal(JSON.parse(out).mean_reward, 1, out);
          err = "";
          assert.equal(
            await main(["eval", probe, "--agent", "true", "--container-network"], io),
            2,
          );
          assert.match(err, /--container-network needs --runtime container:IMAGE/);
          assert.equal(
            await main(["eval", probe, "--agent", "true", ...common, "--container-env", "X"], io),
            2,
          );
          assert.match(err, /--container-env takes NAME=VALUE, got "X"/);
        } finally {
          await Deno.remove(dir, { recursive: true });
        }
        assert.deepEqual(await containersOf(Deno.pid), []);
      },
    });
  }

  test({
    name: `ContainerRuntime refuses an image whose server has no control socket (${label})`,
    needs,
    async fn() {
      using engine = await EngineClient.open(socket);
      const tar = new TarWriter();
      tar.file("f", new TextEncoder().encode("x"));
      tar.file("Dockerfile", new TextEncoder().encode("FROM scratch\nCOPY f /f\n"));
      const res = await engine.raw("POST", `/build?t=hud-test-unlabelled:latest&rm=1`, {
        body: tar.bytes(),
        headers: { "content-type": "application/x-tar" },
      });
      await res.text();
      const err = await new ContainerRuntime("hud-test-unlabelled:latest", {
        socket,
        labels: FILE_LABELS,
      }).place()
        .catch((e) => e);
      assert.ok(err instanceof TypeError, String(err));
      assert.match(err.message, /has no "dev\.hud\.control=socket" label.*rebuild it/);
      const missing = await new ContainerRuntime("hud-test-no-such-image:latest", {
        socket,
        labels: FILE_LABELS,
      })
        .place().catch((e) => e);
      assert.match(String(missing), /no image "hud-test-no-such-image:latest"/);
      assert.deepEqual(await containersOf(Deno.pid), []);
    },
  });

  test({
    name: `ContainerRuntime reports a container that exits before it is ready (${label})`,
    needs,
    async fn() {
      await buildImages();
      const runtime = new ContainerRuntime(BROKEN_TAG, {
        socket,
        readyTimeout: 60_000,
        labels: FILE_LABELS,
      });
      const err = await runtime.place().catch((e) => e);
      assert.ok(err instanceof NotReadyError, String(err));
      assert.match(err.message, /exited with code [1-9]/);
      assert.match(err.message, /fixture refuses to load/);
      assert.deepEqual(await containersOf(Deno.pid), []);
    },
  });

  test({
    name: `ContainerRuntime runs 20 rollouts of a taskset, 4 at a time (${label})`,
    needs,
    async fn() {
      await buildImages();
      const rows = Array.from({ length: 20 }, (_, i) => ({
        env: "fixture",
        id: "add",
        args: { a: i, b: 1 },
        slug: taskSlug("add", { a: i, b: 1 }),
      }));
      const taskset = new Taskset(rows);
      const agent = functionAgent((prompt) => {
        const [a, b] = String(prompt).match(/\d+/g)!.map(Number);
        return String(a + b);
      });
      const job = await taskset.run(agent, {
        runtime: new ContainerRuntime(TAG, { socket, labels: FILE_LABELS }),
        maxConcurrent: 4,
        signal: AbortSignal.timeout(300_000),
      });
      assert.equal(
        job.runs.filter((r) => r.reward === 1).length,
        20,
        JSON.stringify(job.errored[0]),
      );
      assert.deepEqual(await containersOf(Deno.pid), []);
    },
  });

  test({
    name: `removeStaleContainers() removes what a killed runner left behind (${label})`,
    needs,
    async fn() {
      await buildImages();
      // A runner that places a container, then dies by SIGKILL before releasing it.
      const code = `
      import { ContainerRuntime } from ${
        JSON.stringify(new URL("../../engines/container.ts", import.meta.url).href)
      };
      await new ContainerRuntime(${JSON.stringify(TAG)}, { socket: ${
        JSON.stringify(socket ?? null)
      } ?? undefined }).place();
      console.log("placed");
      await new Promise(() => {});
    `;
      const child = new Deno.Command(Deno.execPath(), {
        args: ["eval", code],
        stdout: "piped",
        stderr: "inherit",
      }).spawn();
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let out = "";
      const deadline = AbortSignal.timeout(120_000);
      while (!out.includes("placed") && !deadline.aborted) {
        const { value, done } = await reader.read();
        if (done) break;
        out += value;
      }
      try {
        child.kill("SIGKILL");
      } catch {
        // It died on its own: the assertion below says how.
      }
      await child.status;
      await reader.cancel();
      assert.match(out, /placed/, "the runner placed its container");
      assert.equal((await containersOf(child.pid)).length, 1);
      const dir = await controlDirOf(child.pid);
      assert.ok((await Deno.stat(dir)).isDirectory, dir);
      const removed = await removeStaleContainers({ socket });
      assert.ok(removed.length >= 1);
      assert.deepEqual(await containersOf(child.pid), []);
      await assert.rejects(Deno.stat(dir), Deno.errors.NotFound, `${dir} left behind`);
    },
  });

  // The command line's gc finds the default engine only.
  if (socket === undefined) {
    test({
      name: `hud gc and hud image: usage errors, and gc against the engine (${label})`,
      needs,
      async fn() {
        const { main } = await import("../../cli.ts");
        let err = "";
        const quiet = { stdout: () => {}, stderr: (t: string) => err += t };
        assert.equal(await main(["gc", "--older-than", "soon"], quiet), 2);
        assert.match(err, /--older-than must be a number of seconds, got "soon"/);
        assert.equal(await main(["image", fixture("basic_env.ts")], quiet), 2);
        assert.match(err, /--tag is required/);
        assert.equal(
          await main(
            ["eval", fixture("basic_env.ts"), "--agent", "cat", "--runtime", "vm:x"],
            quiet,
          ),
          2,
        );
        assert.match(
          err,
          /--runtime must be "local", "container:IMAGE", "swarm:IMAGE", "k8s:IMAGE" or "slurm\[:PARTITION\]", got "vm:x"/,
        );
        err = "";
        assert.equal(await main(["gc"], quiet), 0);
        assert.match(err, /gc: removed \d+ containers?/);
      },
    });
  }

  test({
    name: `removeStaleContainers() run by several cleaners at once: each succeeds (${label})`,
    needs,
    async fn() {
      await buildImages();
      using engine = await EngineClient.open(socket);
      // Owned by a pid that cannot be alive (above this machine's pid_max).
      const created = await engine.call("POST", "/containers/create", {
        Image: TAG,
        Labels: { [OWNER_LABEL]: "4194305" },
      }) as { Id: string };
      await engine.call("POST", `/containers/${created.Id}/start`);
      const results = await Promise.allSettled(
        [1, 2, 3].map(() => removeStaleContainers({ socket })),
      );
      assert.deepEqual(results.map((r) => r.status), ["fulfilled", "fulfilled", "fulfilled"]);
      assert.deepEqual(await containersOf(4194305), []);
    },
  });
}

suite("default engine", undefined, [ENGINE]);
suite("Podman", PODMAN_SOCKET, [PODMAN]);
