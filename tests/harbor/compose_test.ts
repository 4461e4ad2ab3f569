// Harbor tasks with `environment/docker-compose.yaml` (issue 37): their
// services started through the engine's API, the agent in `main`. The tasks of
// tests/fixtures/harbor-compose/ (written here, its README.md says what they
// are): a key-value service the solution must configure and the verifier
// queries, and a health-checked dependency that `main` starts only after
// (main's ENTRYPOINT records whether it was ready); the oracle scores 1.0 and
// an agent that does nothing 0.0, through runHarborTasks and through `hud eval
// harbor:PATH`. A dependency that never becomes healthy fails the rollout
// ungraded, naming the service; an aborted start and every run leave no
// container, network or volume (listed by label); the agent cannot reach the
// engine nor forge the reward through a volume it shares with another
// service. The compose features this runner does not carry out are refused
// in one line naming the feature and the file (no engine needed). The last
// test removes the images the others built.

import { test } from "../_test.ts";
import { ENGINE, PODMAN } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildHarborImage,
  type HarborResult,
  type HarborTask,
  loadHarborTasks,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { composeImages } from "../../harbor/_compose_run.ts";
import { EngineClient, EngineError } from "../../engines/_engine.ts";
import { abortOnceRunning, hasImage } from "./_engine.ts";
import { type Agent, functionAgent } from "../../eval/mod.ts";
import { testSignal, withDeadline } from "../_deadline.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { inUsr, linkedLibraries } from "../../engines/_base_image.ts";
import { oracleSummary, writeTask } from "./_dataset.ts";

const DATASET = new URL("../fixtures/harbor-compose", import.meta.url).pathname;
/** The tag the fixtures' Dockerfiles name: the shell base with Deno (the key-value server's). */
const BASE = "hud-test-harbor-compose-base:latest";
const idle = functionAgent(() => {});

/** Each refused feature: the compose file's text, and what the one-line reason must say. */
const REFUSED: Record<string, [string, RegExp, string?]> = {
  separate: [
    "services:\n  main: {}\n",
    /not supported with \[verifier\] environment_mode "separate" by this runner/,
    '[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\ndocker_image = "x"\n',
  ],
  steps: [
    "services:\n  main: {}\n",
    /not supported with \[\[steps\]\] by this runner/,
    '[[steps]]\nname = "a"\n',
  ],
  privileged: [
    "services:\n  main: {}\n  side:\n    image: x\n    privileged: true\n",
    /service "side": "privileged" is not supported/,
  ],
  network_mode: [
    "services:\n  main:\n    network_mode: host\n",
    /service "main": "network_mode" is not supported/,
  ],
  bind_mount: [
    "services:\n  main: {}\n  side:\n    image: x\n    volumes:\n      - ./data:/data\n",
    /volumes "\.\/data:\/data": "\.\/data" is not a volume the file declares \(bind mounts/,
  ],
  engine_socket: [
    "services:\n  main: {}\n  side:\n    image: x\n    volumes:\n      - /var/run/docker.sock:/var/run/docker.sock\n",
    /bind mounts of host paths are not supported/,
  ],
  context_outside: [
    "services:\n  main: {}\n  side:\n    build: ../../..\n",
    /build context "\.\.\/\.\.\/\.\." with dockerfile "Dockerfile" leads outside the task folder/,
  ],
  context_symlink: [
    "services:\n  main: {}\n  side:\n    build: ./linked\n",
    /build: ".*\/linked" is reached through a symlink/,
  ],
  main_image: [
    "services:\n  main:\n    image: ubuntu\n",
    /service "main": "image" is not supported for main/,
  ],
  logs_volume: [
    "services:\n  main:\n    volumes:\n      - v:/logs/verifier\n  side:\n    image: x\n    volumes:\n      - v:/out\nvolumes:\n  v:\n",
    /volumes "v:\/logs\/verifier": the runner's own paths/,
  ],
  cycle: [
    "services:\n  main: {}\n  a:\n    image: x\n    depends_on: [b]\n  b:\n    image: x\n    depends_on: [a]\n",
    /depends_on has a cycle: a -> b -> a/,
  ],
  secrets: ["services:\n  main: {}\nsecrets:\n  s:\n    file: ./s\n", /top-level "secrets"/],
  condition: [
    "services:\n  main:\n    depends_on:\n      side:\n        condition: service_ready\n  side:\n    image: x\n",
    /depends_on "side": condition "service_ready" is not supported/,
  ],
  no_main: ["services:\n  app:\n    image: x\n", /it has no service "main"/],
  variable: [
    "services:\n  main: {}\n  side:\n    image: ${SIDE_IMAGE}\n",
    /variable "\$\{SIDE_IMAGE\}" is not set/,
  ],
  network_driver: [
    "services:\n  main: {}\nnetworks:\n  n:\n    driver: host\n",
    /networks "n": options \(driver\) are not supported/,
  ],
  block_scalar: [
    "services:\n  main: {}\n  side:\n    image: x\n    command: |\n      echo hi\n",
    /cannot read it: YAML line 5: anchors, tags and block scalars are not supported/,
  ],
};

test("loadHarborTasks() refuses each compose feature this runner does not carry out, in one line", async () => {
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-compose-refused-" });
  try {
    for (const [name, [yaml, , toml]] of Object.entries(REFUSED)) {
      await writeTask(root, name, {
        "task.toml": toml ?? "",
        "steps/a/instruction.md": "Do it.\n",
        "instruction.md": "Do it.\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "environment/Dockerfile": "FROM scratch\n",
        "environment/docker-compose.yaml": yaml,
      });
    }
    await Deno.mkdir(`${root}/context_symlink/environment/real`);
    await Deno.symlink("real", `${root}/context_symlink/environment/linked`);
    const { tasks, skipped } = await loadHarborTasks(root);
    assert.deepEqual(tasks, []);
    for (const [name, [, reason]] of Object.entries(REFUSED)) {
      const s = skipped.find((s) => s.name === name);
      assert.equal(s?.code, "compose", name);
      assert.match(s!.reason, reason, name);
      assert.ok(s!.reason.startsWith(`${s!.path}/environment/docker-compose.yaml: `), s!.reason);
      assert.ok(!s!.reason.includes("\n"), `${name}: not one line`);
    }
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("loadHarborTasks() reads the compose fixtures: services, conditions, healthchecks, volumes", async () => {
  const { tasks, skipped } = await loadHarborTasks(DATASET);
  assert.deepEqual(skipped, []);
  const [healthy, kv] = tasks;
  assert.deepEqual(kv.compose?.main.dependsOn, [{ service: "kv", condition: "service_started" }]);
  assert.deepEqual(kv.compose?.main.environment, { KV_URL: "http://kv:8080" });
  assert.deepEqual(kv.compose?.services[0].environment, { KV_PORT: "8080" });
  const token = healthy.compose!.services[0];
  assert.deepEqual(token.healthcheck, {
    test: ["CMD-SHELL", "test -s /shared/token"],
    intervalMs: 500,
    timeoutMs: 2000,
    retries: 20,
    startPeriodMs: 0,
  });
  assert.equal(token.build?.dockerfile, "Dockerfile.token");
  assert.equal(token.workingDir, "/srv");
  assert.deepEqual(healthy.compose?.volumes, ["shared"]);
});

test("loadHarborTasks() reads compose variables, command strings and durations as compose does", async () => {
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-compose-values-" });
  try {
    await writeTask(root, "values", {
      "task.toml": '[environment]\nenv = { SIDE_TAG = "v2" }\n',
      "instruction.md": "Do it.\n",
      "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
      "environment/Dockerfile": "FROM scratch\n",
      "environment/side/Dockerfile": "FROM scratch\n",
      "environment/docker-compose.yaml": [
        "services:",
        "  main:",
        "    environment:",
        "      - TAG=${SIDE_TAG}",
        '      - "ALT=${MISSING:-fallback}"',
        "  side:",
        "    build: ${CONTEXT_DIR}/side",
        `    command: sh -c 'echo "$$HOME" done' "two words"`,
        "    healthcheck:",
        "      test: curl -f http://localhost",
        "      interval: 1m30s",
        "      timeout: 250ms",
        "  other:",
        "    image: side-${SIDE_TAG}",
        "    depends_on:",
        "      side:",
        "        condition: service_healthy",
        "",
      ].join("\n"),
    });
    const { tasks, skipped } = await loadHarborTasks(root);
    assert.deepEqual(skipped, []);
    const compose = tasks[0].compose!;
    assert.deepEqual(compose.main.environment, { TAG: "v2", ALT: "fallback" });
    const [side, other] = compose.services;
    assert.equal(side.build?.context, `${tasks[0].path}/environment/side`);
    assert.deepEqual(side.command, ["sh", "-c", 'echo "$HOME" done', "two words"]);
    assert.deepEqual(side.healthcheck, {
      test: ["CMD-SHELL", "curl -f http://localhost"],
      intervalMs: 90_000,
      timeoutMs: 250,
      retries: 3,
      startPeriodMs: 0,
    });
    // Started after what it depends on.
    assert.deepEqual([side.name, other.name, other.image], ["side", "other", "side-v2"]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

/** Everything of the engine's labelled with a task under `under`: containers, networks, volumes. */
async function leftovers(under: string, socket?: string): Promise<string[]> {
  using engine = await EngineClient.open(socket);
  const filters = encodeURIComponent(JSON.stringify({ label: ["dev.hud.harbor.path"] }));
  const mine = (labels: Record<string, string> | null | undefined) =>
    (labels?.["dev.hud.harbor.path"] ?? "").startsWith(under);
  const containers = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
    Labels?: Record<string, string>;
  }[];
  const networks = await engine.call("GET", `/networks?filters=${filters}`) as {
    Name: string;
    Labels?: Record<string, string>;
  }[];
  const volumes = await engine.call("GET", `/volumes?filters=${filters}`) as {
    Volumes?: { Name: string; Labels?: Record<string, string> }[] | null;
  };
  return [
    ...containers.filter((c) => mine(c.Labels)).map((c) => `container ${c.Id.slice(0, 12)}`),
    ...networks.filter((n) => mine(n.Labels)).map((n) => `network ${n.Name}`),
    ...(volumes.Volumes ?? []).filter((v) => mine(v.Labels)).map((v) => `volume ${v.Name}`),
  ];
}

/** Waits (a release after an abort runs in the background) until nothing of `under` is left. */
async function nothingLeft(under: string, socket?: string): Promise<void> {
  let left = await leftovers(under, socket);
  for (let i = 0; i < 100 && left.length > 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
    left = await leftovers(under, socket);
  }
  assert.deepEqual(left, [], "left behind");
}

/** The images to remove at the end, children first, by engine socket ("" for the default one). */
const built = new Map<string, string[]>();
const builtBase = new Set<string>();
let prepared: Promise<Map<string, HarborTask>> | null = null;

/** The shell base with Deno and the libraries it links. */
async function buildBase(socket?: string): Promise<void> {
  const deno = await Deno.realPath(Deno.execPath());
  const extra: Record<string, Uint8Array> = { "/usr/local/bin/deno": await Deno.readFile(deno) };
  for (const lib of await linkedLibraries(deno)) {
    extra[inUsr(lib)] = await Deno.readFile(await Deno.realPath(lib));
  }
  await buildShellBase(BASE, socket, extra);
}

/** Builds the base (when missing) and every image the tasks under `root` use. */
async function buildAll(root: string, socket?: string): Promise<Map<string, HarborTask>> {
  if (!await hasImage(BASE, socket)) {
    builtBase.add(socket ?? "");
    await buildBase(socket);
  }
  const { tasks, skipped } = await loadHarborTasks(root);
  assert.deepEqual(skipped, []);
  for (const t of tasks) {
    const image = await buildHarborImage(t, { socket });
    const services = await composeImages(t, t.compose!, { socket });
    const list = built.get(socket ?? "") ?? [];
    built.set(socket ?? "", [image.image, image.taskImage, ...services.images.values(), ...list]);
  }
  return new Map(tasks.map((t) => [t.name, t]));
}

function fixtures(): Promise<Map<string, HarborTask>> {
  prepared ??= buildAll(DATASET);
  return prepared;
}

test(
  { name: "compose_test builds the base and the fixtures' images", needs: [ENGINE] },
  withDeadline(59_000, async () => {
    const tasks = await fixtures();
    assert.deepEqual([...tasks.keys()], ["healthy-dependency", "kv-store"]);
  }),
);

async function one(task: HarborTask, agent: Agent | "oracle", signal = testSignal()) {
  const [result] = await runHarborTasks([task], agent, { signal });
  await nothingLeft(task.path);
  return result;
}

function scored(result: HarborResult): [number | null, string | null] {
  return [result.reward, result.error];
}

test(
  {
    name:
      "runHarborTasks() runs a service the solution configures and the verifier queries: oracle 1, idle 0",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const task = (await fixtures()).get("kv-store")!;
    const oracle = await one(task, "oracle");
    assert.deepEqual(scored(oracle), [1, null], oracle.verifier?.output);
    assert.match(oracle.verifier?.output ?? "", /kv answer: 42/);
    const none = await one(task, idle);
    assert.deepEqual(scored(none), [0, null]);
    assert.match(none.verifier?.output ?? "", /kv answer: none/);
  }),
);

test(
  {
    name:
      "runHarborTasks() starts main only once a service_healthy dependency is healthy: oracle 1, idle 0",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const task = (await fixtures()).get("healthy-dependency")!;
    const oracle = await one(task, "oracle");
    assert.deepEqual(scored(oracle), [1, null], oracle.verifier?.output);
    // main's ENTRYPOINT found the token there: it started after the service was healthy.
    assert.deepEqual(oracle.subscores, { reward: 1, ordered: 1 });
    const none = await one(task, idle);
    assert.deepEqual(scored(none), [0, null]);
    assert.deepEqual(none.subscores, { reward: 0, ordered: 1 });
  }),
);

test(
  {
    name: "hud eval harbor:tests/fixtures/harbor-compose --agent oracle scores each task 1",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    await fixtures();
    const summary = await oracleSummary(DATASET);
    assert.deepEqual(summary.tasks.map((t) => [t.task, t.reward]), [
      ["healthy-dependency", 1],
      ["kv-store", 1],
    ]);
    assert.deepEqual(summary.skipped, []);
    await nothingLeft(DATASET);
  }),
);

/**
 * Tasks written here: one whose dependency never becomes healthy, one whose
 * start is slow, one whose agent phase has no network.
 */
let failing: Promise<Map<string, HarborTask>> | null = null;
function failingTasks(): Promise<Map<string, HarborTask>> {
  failing ??= (async () => {
    const root = await Deno.makeTempDir({ prefix: "hud-harbor-compose-" });
    globalThis.addEventListener("unload", () => Deno.removeSync(root, { recursive: true }));
    const common = {
      "task.toml": "[agent]\ntimeout_sec = 30.0\n",
      "instruction.md": "Do nothing.\n",
      "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
      "environment/Dockerfile": `FROM ${BASE}\nWORKDIR /app\n`,
      "environment/side/Dockerfile": `FROM ${BASE}\nCMD ["sleep", "infinity"]\n`,
    };
    await writeTask(root, "never-healthy", {
      ...common,
      "environment/docker-compose.yaml": [
        "services:",
        "  main:",
        "    depends_on:",
        "      sick: { condition: service_healthy }",
        "  sick:",
        "    build: ./side",
        "    networks: [inner]",
        "    volumes: [data:/data]",
        "    healthcheck:",
        '      test: ["CMD", "false"]',
        "      interval: 300ms",
        "      retries: 2",
        "networks:",
        "  inner:",
        "volumes:",
        "  data:",
        "",
      ].join("\n"),
    });
    await writeTask(root, "slow-start", {
      ...common,
      "environment/docker-compose.yaml": [
        "services:",
        "  main:",
        "    depends_on:",
        "      slow: { condition: service_completed_successfully }",
        "    volumes: [data:/data]",
        "  slow:",
        "    build: ./side",
        '    command: ["sleep", "60"]',
        "    volumes: [data:/data]",
        "volumes:",
        "  data:",
        "",
      ].join("\n"),
    });
    // A one-shot service that prepares a volume, and one that exits at once (started is all
    // a plain depends_on asks).
    await writeTask(root, "one-shot", {
      ...common,
      "tests/test.sh": '#!/bin/bash\n[ "$(cat /data/ready)" = prepared ] && r=1 || r=0\n' +
        "echo $r > /logs/verifier/reward.txt\n",
      "environment/docker-compose.yaml": [
        "services:",
        "  main:",
        "    depends_on:",
        "      quick:",
        "      setup: { condition: service_completed_successfully }",
        "    volumes: [data:/data]",
        "  setup:",
        "    build: ./side",
        '    command: ["bash", "-c", "sleep 1; echo prepared > /data/ready"]',
        "    volumes: [data:/data]",
        "    depends_on:",
        "      quick: { condition: service_started }",
        "  quick:",
        "    build: ./side",
        '    entrypoint: ["true"]',
        "volumes:",
        "  data:",
        "",
      ].join("\n"),
    });
    // The agent's phase has no network: main leaves the task's networks then, as Harbor's no-network
    // main service has none; the verifier's phase has them back.
    const kv = `${DATASET}/kv-store/environment/kv`;
    await writeTask(root, "agent-offline", {
      ...common,
      "task.toml": '[agent]\ntimeout_sec = 30.0\nnetwork_mode = "no-network"\n',
      "tests/test.sh": await Deno.readTextFile(`${DATASET}/kv-store/tests/test.sh`),
      "environment/kv/Dockerfile": await Deno.readTextFile(`${kv}/Dockerfile`),
      "environment/kv/server.ts": await Deno.readTextFile(`${kv}/server.ts`),
      "environment/docker-compose.yaml": await Deno.readTextFile(
        `${DATASET}/kv-store/environment/docker-compose.yaml`,
      ),
    });
    return await buildAll(root);
  })();
  return failing;
}

test(
  {
    name:
      "runHarborTasks(): a no-network agent phase leaves main only its loopback, away from the services; the verifier's phase reaches them",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const task = (await failingTasks()).get("agent-offline")!;
    const seen: Record<string, string> = {};
    const agent = functionAgent(async (_prompt, run, { signal }) => {
      await using shell = await run.client.open("shell", { signal });
      seen.links = (await shell.exec("ls /sys/class/net", { signal })).stdoutText.trim();
      const put = "exec 3<>/dev/tcp/kv/8080 && printf 'PUT /answer HTTP/1.1\\r\\nHost: kv\\r\\n" +
        "Content-Length: 2\\r\\nConnection: close\\r\\n\\r\\n42' >&3 && cat <&3";
      seen.put = String((await shell.exec(`timeout 5 bash -c "${put}"`, { signal })).code);
    });
    const result = await one(task, agent);
    assert.equal(seen.links, "lo");
    assert.notEqual(seen.put, "0", "the agent reached the service with no network");
    // The verifier reached the service (it answered "none": nothing stored).
    assert.deepEqual(scored(result), [0, null]);
    assert.match(result.verifier?.output ?? "", /kv answer: none/);
  }),
);

test(
  {
    name:
      "runHarborTasks() starts main after a one-shot service completed, and after one that exited once started",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const task = (await failingTasks()).get("one-shot")!;
    assert.deepEqual(task.compose?.main.dependsOn.map((d) => d.condition), [
      "service_started",
      "service_completed_successfully",
    ]);
    // While the agent runs, the engine says when each service started and ended.
    const times: Record<string, { StartedAt: string; FinishedAt: string }> = {};
    const watcher = functionAgent(async () => {
      using engine = await EngineClient.open();
      const filters = encodeURIComponent(
        JSON.stringify({ label: [`dev.hud.harbor.path=${task.path}`] }),
      );
      const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
        Id: string;
        Labels: Record<string, string>;
      }[];
      for (const c of list) {
        const info = await engine.call("GET", `/containers/${c.Id}/json`) as {
          State: { StartedAt: string; FinishedAt: string };
        };
        times[c.Labels["dev.hud.harbor.service"]] = info.State;
      }
    });
    const result = await one(task, watcher);
    assert.deepEqual(scored(result), [1, null], result.verifier?.output);
    assert.deepEqual(Object.keys(times).sort(), ["main", "quick", "setup"]);
    const at = (t: string) => Date.parse(t);
    // setup waited for quick to start; main for setup to complete (quick had exited by then).
    assert.ok(at(times.setup.StartedAt) >= at(times.quick.StartedAt), JSON.stringify(times));
    assert.ok(at(times.main.StartedAt) >= at(times.setup.FinishedAt), JSON.stringify(times));
  }),
);

test(
  {
    name:
      "runHarborTasks() fails a rollout whose dependency never becomes healthy as provisioning, naming the service, and leaves nothing",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const task = (await failingTasks()).get("never-healthy")!;
    const result = await one(task, idle);
    assert.equal(result.reward, null, "graded");
    assert.match(
      result.error ?? "",
      /service "sick" is unhealthy \(its healthcheck failed\) \(main depends_on it, service_healthy; .*docker-compose\.yaml\)/,
    );
    assert.equal(result.runs[0].error_class, "provisioning");
  }),
);

test(
  {
    name: "runHarborTasks() aborted while a dependency runs leaves no container, network or volume",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const task = (await failingTasks()).get("slow-start")!;
    const aborted = await abortOnceRunning(
      [`dev.hud.harbor.path=${task.path}`, "dev.hud.harbor.service=slow"],
      (signal) => runHarborTasks([task], idle, { signal: AbortSignal.any([signal, testSignal()]) }),
    );
    assert.ok(aborted, "the dependency never ran");
    await nothingLeft(task.path);
  }),
);

test(
  {
    name:
      "runHarborTasks(): the agent in main reaches no engine, and what it writes in a volume shared with a service, or in /logs/verifier, is no reward",
    needs: [ENGINE],
  },
  withDeadline(59_000, async () => {
    const task = (await fixtures()).get("healthy-dependency")!;
    const probes: Record<string, number | null> = {};
    const forger = functionAgent(async (_prompt, run, { signal }) => {
      await using shell = await run.client.open("shell", { signal });
      const checks = {
        socket: "ls /var/run/docker.sock /run/docker.sock /run/podman/podman.sock",
        // The engine on the task network's gateway (an engine listening on TCP): the
        // gateway found first (its route in /proc/net/route, little-endian hex).
        gateway: 'while read -r _ d g _; do [ "$d" = 00000000 ] && h=$g && break; done ' +
          "< /proc/net/route; [ -n \"$h\" ] && printf '%d.%d.%d.%d' 0x${h:6:2} 0x${h:4:2} " +
          "0x${h:2:2} 0x${h:0:2} > /tmp/gw",
        tcp: 'for p in 2375 2376 2377; do timeout 3 bash -c "exec 3<>/dev/tcp/$(cat /tmp/gw)/$p" ' +
          "&& exit 0; done; exit 1",
        forge: "echo 1 > /shared/reward.txt && echo 1 > /logs/verifier/reward.txt && " +
          'echo \'{"reward": 1, "ordered": 1}\' > /logs/verifier/reward.json && ' +
          "nohup bash -c 'while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.01; done' " +
          ">/dev/null 2>&1 &",
      };
      for (const [k, cmd] of Object.entries(checks)) {
        probes[k] = (await shell.exec(cmd, { signal })).code;
      }
    });
    const forged = await one(task, forger);
    assert.notEqual(probes.socket, 0, "an engine socket is in main");
    assert.equal(probes.gateway, 0, "main has no gateway: the TCP probe would prove nothing");
    assert.notEqual(probes.tcp, 0, "the engine answered on TCP");
    assert.equal(probes.forge, 0);
    assert.notEqual(forged.reward, 1, "a forged reward was graded");
    if (forged.reward === 0) assert.deepEqual(forged.subscores, { reward: 0, ordered: 1 });
  }),
);

let onPodman: Promise<Map<string, HarborTask>> | null = null;
function podmanFixtures(): Promise<Map<string, HarborTask>> {
  onPodman ??= buildAll(DATASET, Deno.env.get("HUD_TEST_PODMAN_SOCKET")!);
  return onPodman;
}

test(
  {
    name: "compose_test builds the base and the fixtures' images on Podman",
    needs: [ENGINE, PODMAN],
  },
  withDeadline(59_000, async () => {
    assert.equal((await podmanFixtures()).size, 2);
  }),
);

test(
  {
    name:
      "runHarborTasks() runs the compose fixtures on Podman's API: oracle 1 on each, nothing left",
    needs: [ENGINE, PODMAN],
  },
  withDeadline(59_000, async () => {
    const socket = Deno.env.get("HUD_TEST_PODMAN_SOCKET")!;
    const tasks = await podmanFixtures();
    const results = await runHarborTasks([...tasks.values()], "oracle", {
      socket,
      signal: testSignal(),
    });
    assert.deepEqual(
      results.map((r) => [r.task, r.reward, r.error, r.subscores]),
      [
        ["healthy-dependency", 1, null, { reward: 1, ordered: 1 }],
        ["kv-store", 1, null, {}],
      ],
      results.map((r) => r.verifier?.output).join("\n"),
    );
    await nothingLeft(DATASET, socket);
  }),
);

test({ name: "compose_test removes the images it built", needs: [ENGINE] }, async () => {
  const failed: string[] = [];
  for (const [socket, images] of built) {
    using engine = await EngineClient.open(socket || undefined);
    for (const ref of new Set([...images, ...(builtBase.has(socket) ? [BASE] : [])])) {
      // 409 while a container of it is still being removed (Podman removes
      // them after answering): tried again, for up to 5 s.
      for (let attempt = 0; attempt < 20; attempt++) {
        try {
          await engine.call("DELETE", `/images/${encodeURIComponent(ref)}`);
          break;
        } catch (err) {
          if (err instanceof EngineError && err.status === 404) break;
          if (err instanceof EngineError && err.status === 409 && attempt < 19) {
            await new Promise((r) => setTimeout(r, 250));
            continue;
          }
          if (!(err instanceof EngineError && err.status === 409)) failed.push(`${ref}: ${err}`);
          break;
        }
      }
    }
  }
  assert.deepEqual(failed, []);
  // The services' images carry their task's folder: none of this file's is left.
  for (const socket of built.keys()) {
    using engine = await EngineClient.open(socket || undefined);
    const filters = encodeURIComponent(JSON.stringify({ label: ["dev.hud.harbor.service"] }));
    const images = await engine.call("GET", `/images/json?filters=${filters}`) as {
      RepoTags?: string[] | null;
      Labels?: Record<string, string> | null;
    }[];
    const mine = images.filter((i) =>
      (i.Labels?.["dev.hud.harbor.path"] ?? "").startsWith(DATASET) ||
      (i.Labels?.["dev.hud.harbor.path"] ?? "").includes("/hud-harbor-compose-")
    );
    assert.deepEqual(
      mine.map((i) => i.RepoTags),
      [],
      `images left on ${socket || "the default engine"}`,
    );
  }
});
