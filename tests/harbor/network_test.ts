// Harbor's network policy per phase (issue 37): `network_mode` and
// `allowed_hosts` of [environment], [agent] and [verifier], with
// `allow_internet`, read as Harbor reads them (no engine needed); then, in
// containers, a phase with "no-network" has nothing but its loopback while
// the others keep the engine's network (the engine connects and
// disconnects the container from outside, between the phases). An
// "allowlist" task is refused in one line: this runner cannot hold an agent
// to a list of hosts yet. The container tests need an engine (ENGINE):
// skipped without one, naming it (in CI they fail instead).

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  type HarborTask,
  loadHarborTasks,
  parseHarborConfig,
  runHarborTasks,
} from "../../harbor/mod.ts";
import { ContainerRuntime } from "../../engines/mod.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { BASE, writeTask } from "./_dataset.ts";
import { functionAgent } from "../../eval/mod.ts";
import { withDeadline } from "../_deadline.ts";
import { containersLeft } from "./_engine.ts";

function phases(toml: string) {
  const { network } = parseHarborConfig(toml, "t/task.toml");
  return [network.environment, network.agent, network.verifier].map((p) =>
    p.mode + (p.allowedHosts.length > 0 ? ` ${p.allowedHosts.join(",")}` : "")
  );
}

test("parseHarborConfig(): each phase's network as Harbor resolves it", () => {
  // Harbor's default: public everywhere.
  assert.deepEqual(phases(""), ["public", "public", "public"]);
  // The older allow_internet = false is the no-network baseline.
  assert.deepEqual(phases("[environment]\nallow_internet = false\n"), [
    "no-network",
    "no-network",
    "no-network",
  ]);
  // network_mode wins over allow_internet; a phase without its own has the baseline's.
  assert.deepEqual(
    phases('[environment]\nallow_internet = false\nnetwork_mode = "public"\n'),
    ["public", "public", "public"],
  );
  assert.deepEqual(phases('[environment]\nnetwork_mode = "no-network"\n'), [
    "no-network",
    "no-network",
    "no-network",
  ]);
  assert.deepEqual(phases('[agent]\nnetwork_mode = "no-network"\n'), [
    "public",
    "no-network",
    "public",
  ]);
  assert.deepEqual(
    phases('[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n'),
    ["no-network", "no-network", "public"],
  );
  // allowed_hosts alone means allowlist; hosts lowercased, a final dot and duplicates dropped.
  assert.deepEqual(
    phases('[agent]\nallowed_hosts = ["PyPI.org.", "pypi.org", " ", "10.0.0.7"]\n'),
    ["public", "allowlist pypi.org,10.0.0.7", "public"],
  );
  // A task of the field that names both phases' modes.
  const fixture = Deno.readTextFileSync(
    new URL("../fixtures/toml/harbor/comments-env-tables.toml", import.meta.url),
  );
  const { network } = parseHarborConfig(fixture, "f.toml");
  assert.deepEqual(
    [network.environment.mode, network.agent.mode, network.verifier.mode],
    ["public", "no-network", "no-network"],
  );
});

test("parseHarborConfig(): a network key of the wrong shape is refused in one line naming it", () => {
  const refusals: [string, RegExp][] = [
    [
      '[environment]\nnetwork_mode = "offline"\n',
      /"environment\.network_mode" must be "public", "no-network" or "allowlist"/,
    ],
    [
      '[agent]\nnetwork_mode = "public"\nallowed_hosts = ["a.example"]\n',
      /"agent\.allowed_hosts" is only valid with agent\.network_mode = "allowlist"/,
    ],
    [
      '[verifier]\nallowed_hosts = "a.example"\n',
      /"verifier\.allowed_hosts" must be an array of host names/,
    ],
    [
      '[agent]\nallowed_hosts = ["https://pypi.org"]\n',
      /"https:\/\/pypi\.org" is not a host name or IPv4 address/,
    ],
    [
      '[agent]\nallowed_hosts = ["pypi.org:443"]\n',
      /not a host name or IPv4 address \(no url, path, port or CIDR\)/,
    ],
    ['[agent]\nallowed_hosts = ["10.0.0.0/8"]\n', /"10\.0\.0\.0\/8" is not a host name/],
    ["[environment]\nallow_internet = 1\n", /"environment\.allow_internet" must be a boolean/],
  ];
  for (const [toml, message] of refusals) {
    assert.throws(() => parseHarborConfig(toml, "t/task.toml"), (err: Error) => {
      assert.ok(err instanceof TypeError);
      assert.match(err.message, /^Cannot load Harbor task: t\/task\.toml: /);
      assert.match(err.message, message);
      assert.ok(!err.message.includes("\n"), err.message);
      return true;
    });
  }
});

test("loadHarborTasks(): an allowlist task loads; a separate verifier's allowlist, or one beside compose services, is skipped with its code", async () => {
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-net-" });
  try {
    const files = {
      "environment/Dockerfile": `FROM ${BASE}\n`,
      "instruction.md": "x\n",
      "task.toml": '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n',
      "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    };
    await writeTask(root, "allow", files);
    await writeTask(root, "separate", {
      ...files,
      "tests/Dockerfile": `FROM ${BASE}\n`,
      "task.toml":
        '[verifier]\nenvironment_mode = "separate"\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n',
    });
    // With services: the allowlist phase would take main off their network.
    await writeTask(root, "services", {
      ...files,
      "environment/docker-compose.yaml":
        `services:\n  main:\n    depends_on: [db]\n  db:\n    image: ${BASE}\n`,
    });
    const { tasks, skipped } = await loadHarborTasks(root);
    assert.deepEqual(tasks.map((t) => t.name), ["allow"]);
    assert.deepEqual(tasks[0].config.network.agent, {
      mode: "allowlist",
      allowedHosts: ["pypi.org"],
    });
    assert.deepEqual(skipped.map((s) => [s.name, s.code]), [
      ["separate", "network_allowlist"],
      ["services", "network_allowlist"],
    ]);
    assert.match(
      skipped[0].reason,
      /"allowlist" for a separate verifier's container is not enforced/,
    );
    assert.match(skipped[1].reason, /"allowlist" \(agent\) with environment\/docker-compose\.yaml/);
    assert.ok(!skipped[1].reason.includes("\n"));
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("ContainerRuntime: a network by phase of the wrong shape is refused in one line", () => {
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => new ContainerRuntime("img", { network: { agent: false } as any }),
    /network by phase needs "setup": \{ setup, agent\?, verifier\? \}/,
  );
  assert.throws(
    // deno-lint-ignore no-explicit-any
    () => new ContainerRuntime("img", { network: { setup: true, verifier: "no" as any } }),
    /network\.verifier: Invalid network policy "no": use "none", "public" or \{ allow: \[\.\.\.\] \}/,
  );
  assert.throws(
    () =>
      new ContainerRuntime("img", { network: { setup: true, agent: { allow: ["http://x/"] } } }),
    /^TypeError: Cannot create ContainerRuntime: network\.agent: /,
  );
});

// The interfaces other than loopback this process's container has.
const COUNT = 'tail -n +3 /proc/net/dev | grep -vc "^ *lo:"';

/** A task whose agent records how many interfaces it had, and whose verifier checks `expect`. */
function phaseTask(toml: string, expect: string) {
  return {
    "environment/Dockerfile": `FROM ${BASE}\nWORKDIR /app\n`,
    "instruction.md": "Record your network.\n",
    "task.toml": toml,
    // The agent writes what it sees, and tries to reach the engine's
    // gateway (only an interface gives it a route there).
    "solution/solve.sh": `#!/bin/bash\n${COUNT} > /app/agent_net || true\n`,
    "tests/test.sh": [
      "#!/bin/bash",
      `agent=$(cat /app/agent_net 2>/dev/null || echo none); mine=$(${COUNT})`,
      'echo "agent saw $agent, verifier sees $mine"',
      `if ${expect}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt`,
      "",
    ].join("\n"),
  };
}

let base: Promise<void> | null = null;

/** Runs `fn` on the three phase tasks, loaded from a directory removed after. */
async function withPhaseTasks(fn: (tasks: HarborTask[]) => Promise<void>): Promise<void> {
  base ??= buildShellBase(BASE);
  await base;
  const root = await Deno.makeTempDir({ prefix: "hud-harbor-net-" });
  try {
    // Harbor 0.18's network_mode = "no-network", allow_internet left at its
    // default (true): before, the container kept eth0.
    await writeTask(
      root,
      "nonet",
      phaseTask(
        '[environment]\nnetwork_mode = "no-network"\n',
        '[ "$agent" = 0 ] && [ "$mine" = 0 ]',
      ),
    );
    // Setup public, the agent without a network, the verifier with the baseline's.
    await writeTask(
      root,
      "agentoff",
      phaseTask('[agent]\nnetwork_mode = "no-network"\n', '[ "$agent" = 0 ] && [ "$mine" -ge 1 ]'),
    );
    // The agent with a network, the verifier without.
    await writeTask(
      root,
      "verifieroff",
      phaseTask(
        '[verifier]\nnetwork_mode = "no-network"\n',
        '[ "$agent" -ge 1 ] && [ "$mine" = 0 ]',
      ),
    );
    const { tasks, skipped } = await loadHarborTasks(root);
    assert.deepEqual(skipped, []);
    await fn(tasks);
    assert.deepEqual(await containersLeft(root), [], "containers left behind");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

test({
  name:
    "runHarborTasks(): no-network phases have only loopback, the others the engine's network, switched between phases",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withPhaseTasks(async (tasks) => {
      for (const r of await runHarborTasks(tasks, "oracle")) {
        assert.equal(r.error, null, `${r.task}: ${r.error}`);
        assert.equal(r.reward, 1, `${r.task}: ${JSON.stringify(r.runs[0]?.trace)}`);
      }
    })),
});

test({
  name: "runHarborTasks(): the phase tasks score a do-nothing agent 0 (their checks can fail)",
  needs: [ENGINE],
  fn: withDeadline(59_000, () =>
    withPhaseTasks(async (tasks) => {
      const idle = functionAgent(() => "");
      for (const r of await runHarborTasks(tasks, idle)) {
        assert.equal(r.error, null, `${r.task}: ${r.error}`);
        assert.equal(r.reward, 0, r.task);
      }
    })),
});
