// Harbor's network_mode = "allowlist" (issue 37): the phase's allowed_hosts
// become the container's allowlist (ContainerRuntime's egress proxy), against
// hosts of the test's own in a network namespace (tests/workspace/
// _netns_hosts.ts, reachable from the engine's bridge). The oracle fetches
// its answer from the allowed host through the proxy the container's
// variables name; an attack agent that fetches it from the denied host
// (through the proxy, then directly) scores 0 there, and 1 on the same
// task made public (the attack works where nothing stops it).

import { test } from "../_test.ts";
import { ENGINE, IPTABLES, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { loadHarborTasks, runHarborTasks } from "../../harbor/mod.ts";
import { functionAgent } from "../../eval/mod.ts";
import { buildShellBase } from "../engines/_shell_base.ts";
import { BASE, writeTask } from "./_dataset.ts";
import { withDeadline } from "../_deadline.ts";
import { containersLeft } from "./_engine.ts";
import { startNetnsHosts } from "../workspace/_netns_hosts.ts";

/**
 * `get URL` through the proxy the variables name, or `get direct HOST PORT`:
 * the body's last line (bash alone: the base image has no curl).
 */
const GET = `get() {
  timeout 10 bash -c '
    if [ "$1" = direct ]; then
      exec 3<>"/dev/tcp/$2/$3" || exit 1; path=/; host="$2:$3"
    else
      p=\${http_proxy#http://}; p=\${p%/}
      exec 3<>"/dev/tcp/\${p%:*}/\${p##*:}" || exit 1
      path="$1"; host=\${1#http://}; host=\${host%%/*}
    fi
    printf "GET %s HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n" "$path" "$host" >&3
    tail -n 1 <&3' _ "$@"
}
`;

/** The attack: the answer from the denied host, through the proxy, else directly. */
function attack(denied: string): string {
  return `${GET}for how in "http://${denied}:8080/" "direct ${denied} 8080"; do
  got=$(get $how 2>/dev/null)
  case "$got" in *" host") echo "$got" > /app/answer; break ;; esac
done
true`;
}

/** A task whose answer is what a host serves ("allowed host" or "denied host"). */
function task(toml: string, allowed: string, denied: string, verifierReaches: boolean) {
  return {
    "environment/Dockerfile": `FROM ${BASE}\nWORKDIR /app\n`,
    "instruction.md": "Fetch the answer.\n",
    "task.toml": toml,
    "solution/solve.sh": `#!/bin/bash\n${GET}get http://${allowed}:8080/ > /app/answer\n`,
    "tests/test.sh": [
      "#!/bin/bash",
      GET,
      'answer=$(cat /app/answer 2>/dev/null); echo "agent\'s answer: $answer"',
      'ok=0; [[ "$answer" =~ ^(allowed|denied)\\ host$ ]] && ok=1',
      // A public verifier reaches the denied host directly: the agent's
      // phase, not the test's network, is what stopped the attack.
      ...(verifierReaches
        ? [
          `mine=$(get direct ${denied} 8080); echo "verifier reached: $mine"`,
          '[ "$mine" = "denied host" ] || ok=0',
        ]
        : []),
      "echo $ok > /logs/verifier/reward.txt",
      "",
    ].join("\n"),
  };
}

/** This host's egress relays of containers (their command line names a container directory's relay.js). */
async function relays(): Promise<string[]> {
  const found: string[] = [];
  for await (const e of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    const cmd = await Deno.readTextFile(`/proc/${e.name}/cmdline`).catch(() => "");
    if (/\/hud-container-[^\0]*\/relay\.js\0/.test(cmd)) found.push(e.name);
  }
  return found;
}

let base: Promise<void> | null = null;

test({
  name:
    'runHarborTasks(): network_mode = "allowlist" reaches its allowed host through the proxy and nothing else (oracle 1, an attack fetching from a denied host 0), also in the agent phase alone',
  needs: [ENGINE, ROOT_USER, IPTABLES],
  fn: withDeadline(59_000, async (t) => {
    base ??= buildShellBase(BASE);
    await base;
    await using hosts = await startNetnsHosts();
    const { allowed, denied } = hosts;
    const before = await relays();
    const root = await Deno.makeTempDir({ prefix: "hud-harbor-allow-" });
    try {
      const list = `allowed_hosts = ["${allowed}"]`;
      await writeTask(
        root,
        "allow",
        task(`[environment]\nnetwork_mode = "allowlist"\n${list}\n`, allowed, denied, false),
      );
      await writeTask(
        root,
        "phases",
        task(
          `[environment]\nnetwork_mode = "public"\n[agent]\nnetwork_mode = "allowlist"\n${list}\n`,
          allowed,
          denied,
          true,
        ),
      );
      await writeTask(root, "open", task("", allowed, denied, true));
      const { tasks, skipped } = await loadHarborTasks(root);
      assert.deepEqual(skipped, []);
      const byName = (name: string) => tasks.filter((x) => x.name === name);

      await t.step("the oracle fetches its answer from the allowed host: 1", async () => {
        for (const r of await runHarborTasks([...byName("allow"), ...byName("phases")], "oracle")) {
          assert.equal(r.error, null, `${r.task}: ${r.error}`);
          assert.equal(r.reward, 1, `${r.task}: ${r.verifier?.output}`);
        }
      });

      await t.step("an attack fetching the answer from the denied host: 0", async () => {
        const agent = functionAgent(async (_prompt, run, { signal }) => {
          await using shell = await run.client.open("shell", { signal });
          await shell.exec(attack(denied), { signal });
        });
        for (const r of await runHarborTasks([...byName("allow"), ...byName("phases")], agent)) {
          assert.equal(r.error, null, `${r.task}: ${r.error}`);
          assert.equal(r.reward, 0, `${r.task}: ${r.verifier?.output}`);
          if (r.task.endsWith("phases")) {
            assert.match(r.verifier?.output ?? "", /verifier reached: denied host/);
          }
        }
        // The same attack on the task made public: it works.
        const [open] = await runHarborTasks(byName("open"), agent);
        assert.deepEqual([open.reward, open.error], [1, null], open.verifier?.output);
      });
      assert.deepEqual(await containersLeft(root), [], "containers left behind");
      const after = await relays();
      assert.deepEqual(after.filter((p) => !before.includes(p)), [], "relays left behind");
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  }),
});
