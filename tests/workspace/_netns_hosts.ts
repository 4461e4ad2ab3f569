// A network namespace of a test's own holding the hosts of
// `_netpolicy_hosts.ts` (an allowed and a denied address in a /24 of the
// test's, joined to this host by a veth pair), behind the machine's firewall
// guard (.ci/engine/guard.sh, acquired for the namespace's life): this host
// and containers on the engines' bridges (masqueraded to this host's end)
// reach them, nothing they run reaches past them.

import { ENGINE_DIR } from "../engines/_clusters.ts";

/** The namespace's hosts, removed with `await using`. */
export interface NetnsHosts extends AsyncDisposable {
  /** The allowed host's address (HTTP on 8080, an echo on 443, DNS on 53). */
  readonly allowed: string;
  /** The denied host's address (HTTP on 8080). */
  readonly denied: string;
}

async function run(...argv: string[]): Promise<void> {
  const out = await new Deno.Command(argv[0], {
    args: argv.slice(1),
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`${argv.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

/** A third octet of 10.231.0.0/16 no route of this host uses (another test process may hold one). */
async function freeSubnet(): Promise<number> {
  const out = await new Deno.Command("ip", { args: ["-4", "route", "show"], stdout: "piped" })
    .output();
  const routes = new TextDecoder().decode(out.stdout);
  for (let i = 0; i < 250; i++) {
    const id = (Deno.pid + i) % 250;
    if (!routes.includes(`10.231.${id}.0/24`)) return id;
  }
  throw new Error("No free /24 in 10.231.0.0/16");
}

/** Makes the namespace, its addresses and its hosts; undoes what it made if a step fails. */
export async function startNetnsHosts(): Promise<NetnsHosts> {
  const id = await freeSubnet();
  const ns = `hud-np-${Deno.pid}`;
  // The guard lets containers' packets out through "hudns*" (a namespace
  // with no route on): a container on an engine's bridge reaches these
  // hosts unless its own network stops it.
  const [outer, inner] = [`hudns${Deno.pid}`, `hnp${Deno.pid}n`].map((n) => n.slice(0, 15));
  const net = `10.231.${id}`;
  const witness = await Deno.makeTempDir({ prefix: "hud-np-guard-" });
  const guardUser = `netpolicy-${Deno.pid}`;
  let hosts: Deno.ChildProcess | null = null;
  const undo = async () => {
    if (hosts !== null) {
      try {
        hosts.kill("SIGKILL");
      } catch {
        // gone
      }
      await hosts.status;
    }
    await run("ip", "link", "del", outer).catch(() => {});
    await run("ip", "netns", "del", ns).catch(() => {});
    await run("bash", `${ENGINE_DIR}guard.sh`, "release", guardUser).catch(() => {});
    await Deno.remove(witness, { recursive: true }).catch(() => {});
  };
  try {
    await run("bash", `${ENGINE_DIR}guard.sh`, "acquire", guardUser, `path ${witness}`);
    await run("ip", "netns", "add", ns);
    await run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner);
    await run("ip", "link", "set", inner, "netns", ns);
    await run("ip", "addr", "add", `${net}.1/24`, "dev", outer);
    await run("ip", "link", "set", outer, "up");
    for (const a of [`${net}.2/24`, `${net}.3/24`]) {
      await run("ip", "-n", ns, "addr", "add", a, "dev", inner);
    }
    await run("ip", "-n", ns, "link", "set", inner, "up");
    await run("ip", "-n", ns, "link", "set", "lo", "up");
    hosts = new Deno.Command("ip", {
      args: [
        "netns",
        "exec",
        ns,
        Deno.execPath(),
        "run",
        "--unstable-net",
        "-A",
        new URL("./_netpolicy_hosts.ts", import.meta.url).pathname,
        `${net}.2`,
        `${net}.3`,
      ],
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const reader = hosts.stdout.getReader();
    const { value } = await reader.read();
    await reader.cancel();
    if (!new TextDecoder().decode(value).startsWith("ready")) {
      throw new Error("the namespace's hosts did not start");
    }
  } catch (err) {
    await undo();
    throw err;
  }
  return { allowed: `${net}.2`, denied: `${net}.3`, [Symbol.asyncDispose]: undo };
}
