// ContainerRuntime with an allowlist phase, on Docker and on Podman, against
// hosts of the test's own in a network namespace (tests/workspace/
// _netns_hosts.ts, behind the firewall guard, reachable from the engines'
// bridges): what the container's commands reach through the egress proxy,
// what they are refused, and the attacks an agent in the container would
// try (a raw connection, a name the list does not hold, killing or
// replacing the relay). Commands run through the engine's exec, with the
// container's environment, as `docker exec` would run an agent's.

import { test } from "../_test.ts";
import { withDeadline } from "../_deadline.ts";
import { type Counterpart, ENGINE, IPTABLES, PODMAN, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  buildEnvironmentImage,
  ContainerRuntime,
  KubernetesRuntime,
  OWNER_LABEL,
  removeStaleContainers,
  SlurmRuntime,
  SwarmRuntime,
} from "../../engines/mod.ts";
import { EngineClient } from "../../engines/_engine.ts";
import type { NetworkPolicy } from "../../workspace/_netpolicy.ts";
import type { PlacementWithUrl } from "../../runtime/placement.ts";
import { startNetnsHosts } from "../workspace/_netns_hosts.ts";

const PODMAN_SOCKET = Deno.env.get("HUD_TEST_PODMAN_SOCKET") || "/run/podman/podman.sock";
const TAG = "hud-test-egress:latest";
const BROKEN_TAG = "hud-test-egress-broken:latest";
const fixture = (name: string) => new URL(`../fixtures/${name}`, import.meta.url).pathname;

/** The policy of these tests: names under allowed.test, never the denied address. */
function policyOf(allowed: string, denied: string): NetworkPolicy {
  return { allow: ["*.allowed.test"], deny: [`${denied}/32`], nameServer: `${allowed}:53` };
}

/**
 * What a command in the container sees (run with the image's deno, which
 * honours the proxy variables): `fetch` of each url, a raw connection to
 * each address, a DNS answer for each name, the processes it can see, and
 * whether it can take the proxy's port.
 */
const PROBE = `
const [urls, raw, names] = JSON.parse(Deno.args[0]);
const out = { fetch: {}, raw: {}, dns: {}, relaySeen: false, bind3128: "" };
const bounded = (p, ms) => Promise.race([p, new Promise((r) => setTimeout(() => r("timed out"), ms))]);
for (const url of urls) {
  out.fetch[url] = await bounded(fetch(url).then(async (r) => r.status + " " + (await r.text()).trim(),
    (e) => "error " + e.message), 8000);
}
for (const addr of raw) {
  const [hostname, port] = addr.split(":");
  out.raw[addr] = await bounded(Deno.connect({ hostname, port: Number(port) }).then((c) => {
    c.close();
    return "connected";
  }, (e) => e.name), 4000);
}
// A question of its own to the resolver /etc/resolv.conf names: its answer's rcode.
async function rcode(name) {
  const q = [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
  for (const l of name.split(".")) q.push(l.length, ...new TextEncoder().encode(l));
  q.push(0, 0, 1, 0, 1);
  const sock = Deno.listenDatagram({ hostname: "127.0.0.1", port: 0, transport: "udp" });
  try {
    await sock.send(new Uint8Array(q), { transport: "udp", hostname: "127.0.0.1", port: 53 });
    const [msg] = await sock.receive();
    return "rcode " + (msg[3] & 15);
  } finally {
    sock.close();
  }
}
for (const name of names) {
  const a = await bounded(Deno.resolveDns(name, "A").then((a) => a.join(","), (e) => "error " + e.message), 4000);
  out.dns[name] = a + "; " + await bounded(rcode(name).catch((e) => e.name), 4000);
}
for (const e of Deno.readDirSync("/proc")) {
  if (!/^[0-9]+$/.test(e.name)) continue;
  try {
    if (Deno.readTextFileSync("/proc/" + e.name + "/cmdline").includes("relay" + ".js")) out.relaySeen = true;
  } catch { /* gone */ }
}
try {
  Deno.listen({ hostname: "127.0.0.1", port: 3128 }).close();
  out.bind3128 = "bound";
} catch (e) {
  out.bind3128 = e.name;
}
console.log(JSON.stringify(out));
Deno.exit(0);
`;

interface Seen {
  fetch: Record<string, string>;
  raw: Record<string, string>;
  dns: Record<string, string>;
  relaySeen: boolean;
  bind3128: string;
}

/** Runs `cmd` in container `id` through the engine's exec; its exit code and output. */
async function execIn(
  engine: EngineClient,
  id: string,
  cmd: string[],
  user?: string,
): Promise<{ code: number; out: string }> {
  const created = await engine.call("POST", `/containers/${id}/exec`, {
    Cmd: cmd,
    ...(user ? { User: user } : {}),
    AttachStdout: true,
    AttachStderr: true,
  }) as { Id: string };
  const res = await engine.raw("POST", `/exec/${created.Id}/start`, {
    body: JSON.stringify({ Detach: false, Tty: false }),
    headers: { "content-type": "application/json" },
  });
  const raw = new Uint8Array(await res.arrayBuffer());
  // The stream is framed: 8 bytes (stream, 0, 0, 0, length) before each chunk.
  const parts: Uint8Array[] = [];
  for (let o = 0; o + 8 <= raw.length;) {
    const n = new DataView(raw.buffer, raw.byteOffset + o + 4, 4).getUint32(0);
    parts.push(raw.subarray(o + 8, o + 8 + n));
    o += 8 + n;
  }
  const info = await engine.call("GET", `/exec/${created.Id}/json`) as { ExitCode: number };
  const out = parts.map((p) => new TextDecoder().decode(p)).join("");
  return { code: info.ExitCode, out };
}

/** The probe's view from container `id`. */
async function probe(
  engine: EngineClient,
  id: string,
  what: { urls?: string[]; raw?: string[]; names?: string[] },
): Promise<Seen> {
  const args = JSON.stringify([what.urls ?? [], what.raw ?? [], what.names ?? []]);
  const r = await execIn(engine, id, [
    "/usr/local/bin/deno",
    "eval",
    "--quiet",
    "--unstable-net",
    PROBE,
    args,
  ]);
  assert.equal(r.code, 0, r.out);
  return JSON.parse(r.out.trim().split("\n").at(-1)!) as Seen;
}

/** This host's processes whose command line holds `needle`: pid and command line. */
async function hostProcesses(needle: string): Promise<string[]> {
  const found: string[] = [];
  for await (const e of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const cmd = (await Deno.readTextFile(`/proc/${e.name}/cmdline`)).replaceAll("\0", " ");
      if (cmd.includes(needle)) found.push(`${e.name} ${cmd}`);
    } catch {
      // gone
    }
  }
  return found;
}

async function exists(path: string): Promise<boolean> {
  return await Deno.stat(path).then(() => true, () => false);
}

/** This host's egress relays of containers (their command line: a container directory's relay.js). */
async function relays(): Promise<string[]> {
  return (await hostProcesses("/relay.js")).filter((p) => /hud-container-/.test(p));
}

/** The entries of `now` not in `before`. */
function newer(now: string[], before: string[]): string[] {
  return now.filter((p) => !before.includes(p));
}

function suite(label: string, socket: string | undefined, needs: readonly Counterpart[]) {
  let built: Promise<string> | null = null;
  let brokenBuilt: Promise<string> | null = null;
  const buildImage = () =>
    built ??= buildEnvironmentImage(fixture("basic_env.ts"), TAG, {
      envName: "fixture",
      envVersion: "0.3.0",
      socket,
      signal: AbortSignal.timeout(240_000),
    });

  /** The placement's container, its control directory, and the relay's host process and proxy directory. */
  async function parts(engine: EngineClient, placement: PlacementWithUrl) {
    const id = String(placement.params.containerId);
    const info = await engine.call("GET", `/containers/${id}/json`) as {
      Config: { Labels: Record<string, string> };
    };
    const dir = info.Config.Labels["dev.hud.control.dir"];
    const relays = await hostProcesses(`${dir}/relay.js`);
    const proxyDir = relays[0]?.trim().split(" ").at(-1) ?? "";
    return { id, dir, relays, proxyDir };
  }

  test(
    `ContainerRuntime network allowlist: only the proxy carries traffic, and the relay is out of the agent's reach (${label})`,
    { needs: [...needs, ROOT_USER, IPTABLES] },
    withDeadline(58_000, async (t) => {
      await buildImage();
      await using hosts = await startNetnsHosts();
      const { allowed, denied } = hosts;
      using engine = await EngineClient.open(socket);
      const runtime = new ContainerRuntime(TAG, { socket, network: policyOf(allowed, denied) });
      const placement = await runtime.place();
      let left: Awaited<ReturnType<typeof parts>>;
      try {
        left = await parts(engine, placement);
        assert.equal(left.relays.length, 1, left.relays.join("\n"));
        const seen = await probe(engine, left.id, {
          urls: ["http://api.allowed.test:8080/", "http://www.denied.test:8080/"],
          raw: [`${allowed}:8080`, `${denied}:8080`],
          names: ["api.allowed.test", "www.denied.test"],
        });
        await t.step("the allowed host is reached through the proxy", () => {
          assert.equal(seen.fetch["http://api.allowed.test:8080/"], "200 allowed host");
        });
        await t.step("a name not on the list is refused with 403 and a reason", () => {
          assert.match(
            seen.fetch["http://www.denied.test:8080/"],
            /^403 .*"www.denied.test:8080" is not on the allowlist/,
          );
        });
        await t.step("a raw connection reaches neither the allowed nor the denied address", () => {
          for (const a of [`${allowed}:8080`, `${denied}:8080`]) {
            assert.match(seen.raw[a], /NetworkUnreachable|ConnectionRefused|timed out/, a);
          }
        });
        await t.step("DNS answers the allowed name and refuses the denied one", () => {
          assert.equal(seen.dns["api.allowed.test"], `${allowed}; rcode 0`);
          // 5: REFUSED (the namespace's server would have answered it).
          assert.match(seen.dns["www.denied.test"], /^error .*; rcode 5$/);
        });
        await t.step(
          "the relay is not in the container's processes, its port cannot be taken, and killing every process the agent can does not stop it",
          async () => {
            assert.equal(seen.relaySeen, false);
            assert.equal(seen.bind3128, "AddrInUse");
            // As root in the container: its relay's pid on this host, then every process it can.
            const hostPid = Number(left.relays[0].split(" ")[0]);
            const kill = await execIn(engine, left.id, [
              "/usr/local/bin/deno",
              "eval",
              `for (const pid of [${hostPid}, -1]) {
                try { Deno.kill(pid, "SIGKILL"); console.log(pid, "killed"); }
                catch (e) { console.log(pid, e.name); }
              }`,
            ], "0");
            assert.match(kill.out, new RegExp(`^${hostPid} (NotFound|PermissionDenied)$`, "m"));
            const again = await probe(engine, left.id, { urls: ["http://api.allowed.test:8080/"] });
            assert.equal(again.fetch["http://api.allowed.test:8080/"], "200 allowed host");
            assert.equal((await hostProcesses(`${left.dir}/relay.js`)).length, 1);
          },
        );
      } finally {
        await placement[Symbol.asyncDispose]();
        await runtime.close();
      }
      await t.step("nothing is left: relay, proxy directory, container", async () => {
        assert.deepEqual(await hostProcesses(`${left.dir}/relay.js`), []);
        assert.equal(await exists(left.proxyDir), false, left.proxyDir);
        assert.equal(await exists(left.dir), false, left.dir);
        await assert.rejects(engine.call("GET", `/containers/${left.id}/json`), /404|no such/i);
      });
    }),
  );

  test(
    `ContainerRuntime network allowlist: nothing is left when placing fails, nor when the runtime's process is killed (${label})`,
    { needs: [...needs, ROOT_USER] },
    withDeadline(58_000, async (t) => {
      await buildImage();
      const policy: NetworkPolicy = { allow: ["pypi.org"] };
      const before = await relays();
      await t.step(
        "an image whose server dies at once: place() fails, no relay or proxy left",
        async () => {
          await (brokenBuilt ??= buildEnvironmentImage(fixture("broken_env.ts"), BROKEN_TAG, {
            envName: "broken",
            envVersion: "0",
            socket,
            signal: AbortSignal.timeout(240_000),
          }));
          const runtime = new ContainerRuntime(BROKEN_TAG, {
            socket,
            network: policy,
            readyTimeout: 20_000,
          });
          await assert.rejects(runtime.place());
          await runtime.close();
          assert.deepEqual(newer(await relays(), before), []);
        },
      );
      await t.step("the runtime's process killed: its relay ends with it", async () => {
        const mod = new URL("../../engines/mod.ts", import.meta.url).href;
        const child = new Deno.Command(Deno.execPath(), {
          args: [
            "eval",
            `import { ContainerRuntime } from "${mod}";
            const r = new ContainerRuntime(${JSON.stringify(TAG)}, { socket: ${
              JSON.stringify(socket)
            }, network: ${JSON.stringify(policy)} });
            await r.place();
            console.log("placed");
            await new Promise(() => {});`,
          ],
          stdout: "piped",
          stderr: "inherit",
        }).spawn();
        const reader = child.stdout.getReader();
        const { value } = await reader.read();
        reader.releaseLock();
        assert.match(new TextDecoder().decode(value), /placed/);
        const mine = newer(await relays(), before);
        assert.equal(mine.length, 1, "the child's relay");
        using engine = await EngineClient.open(socket);
        const filters = encodeURIComponent(
          JSON.stringify({ label: [`${OWNER_LABEL}=${child.pid}`] }),
        );
        const theirs =
          (await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
            Id: string;
          }[]).map((c) => c.Id);
        assert.equal(theirs.length, 1);
        child.kill("SIGKILL");
        await child.status;
        await child.stdout.cancel();
        let left = mine;
        for (let i = 0; i < 50 && left.length > 0; i++) {
          await new Promise((r) => setTimeout(r, 100));
          left = newer(await relays(), before);
        }
        assert.deepEqual(left, [], "the relay outlived the runtime's process");
        // Its container is a stale one now: what removeStaleContainers() (hud gc) removes.
        const removed = await removeStaleContainers({ socket });
        for (const id of theirs) assert.ok(removed.includes(id), `${id} not removed`);
        const proxyDir = mine[0].trim().split(" ").at(-1)!;
        assert.match(proxyDir, /\/hud-container-[^/]+\/hud-net-/);
        assert.equal(await exists(proxyDir), false, `${proxyDir} left behind`);
      });
    }),
  );

  test(
    `ContainerRuntime network by phase: setup public, agent allowlist, verifier none (${label})`,
    { needs: [...needs, ROOT_USER, IPTABLES] },
    withDeadline(58_000, async (t) => {
      await buildImage();
      await using hosts = await startNetnsHosts();
      const { allowed, denied } = hosts;
      using engine = await EngineClient.open(socket);
      const runtime = new ContainerRuntime(TAG, {
        socket,
        network: { setup: "public", agent: policyOf(allowed, denied), verifier: false },
      });
      const placement = await runtime.place();
      let dir = "";
      try {
        const setup = await parts(engine, placement);
        dir = setup.dir;
        await t.step("setup (public): the denied address is reached directly", async () => {
          const seen = await probe(engine, setup.id, { raw: [`${denied}:8080`] });
          assert.equal(seen.raw[`${denied}:8080`], "connected");
        });
        await placement.enterPhase!("agent");
        await t.step("agent (allowlist): only through the proxy", async () => {
          const agent = await parts(engine, placement);
          assert.equal(agent.relays.length, 1);
          assert.notEqual(agent.proxyDir, setup.proxyDir, "a proxy of the agent's policy");
          assert.equal(await exists(setup.proxyDir), false, "the setup's proxy is gone");
          const seen = await probe(engine, setup.id, {
            urls: ["http://api.allowed.test:8080/", "http://www.denied.test:8080/"],
            raw: [`${allowed}:8080`, `${denied}:8080`],
          });
          assert.equal(seen.fetch["http://api.allowed.test:8080/"], "200 allowed host");
          assert.match(seen.fetch["http://www.denied.test:8080/"], /^403 /);
          for (const a of [`${allowed}:8080`, `${denied}:8080`]) {
            assert.notEqual(seen.raw[a], "connected", a);
          }
        });
        await placement.enterPhase!("verifier");
        await t.step("verifier (none): no relay, nothing reached", async () => {
          assert.deepEqual(await hostProcesses(`${dir}/relay.js`), []);
          const seen = await probe(engine, setup.id, {
            urls: ["http://api.allowed.test:8080/"],
            raw: [`${allowed}:8080`],
          });
          assert.match(seen.fetch["http://api.allowed.test:8080/"], /^error /);
          assert.notEqual(seen.raw[`${allowed}:8080`], "connected");
        });
      } finally {
        await placement[Symbol.asyncDispose]();
        await runtime.close();
      }
      assert.deepEqual(await hostProcesses(`${dir}/relay.js`), []);
    }),
  );
}

test("KubernetesRuntime, SwarmRuntime and SlurmRuntime refuse a network they cannot enforce, in one line", () => {
  const make = {
    KubernetesRuntime: (network: unknown) =>
      // deno-lint-ignore no-explicit-any
      new KubernetesRuntime("img", { network } as any),
    // deno-lint-ignore no-explicit-any
    SwarmRuntime: (network: unknown) => new SwarmRuntime("img", { network } as any),
    // deno-lint-ignore no-explicit-any
    SlurmRuntime: (network: unknown) => new SlurmRuntime({ module: "m.ts", network } as any),
  };
  const cases: [unknown, string][] = [
    ["none", '"none"'],
    [false, "false"],
    [{ allow: ["pypi.org"] }, "an allowlist"],
    [{ setup: true, agent: false }, "a network by phase"],
  ];
  for (const [name, create] of Object.entries(make)) {
    for (const [network, shown] of cases) {
      assert.throws(() => create(network), (err: Error) => {
        assert.ok(err instanceof TypeError);
        assert.ok(
          err.message.startsWith(`Cannot create ${name}: network ${shown} is not enforced by it (`),
          err.message,
        );
        assert.match(err.message, /it supports "public" only: use ContainerRuntime/);
        assert.ok(!err.message.includes("\n"));
        return true;
      });
    }
  }
});

suite("default engine", undefined, [ENGINE]);
suite("Podman", PODMAN_SOCKET, [PODMAN]);
