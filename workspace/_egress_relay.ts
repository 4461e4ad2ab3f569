// The sandbox's side of an allowlist: a relay started inside each sandbox's
// own network namespace (loopback only) before the command, listening on
// 127.0.0.1:3128 (the proxy the command's HTTP_PROXY names) and 127.0.0.1:53
// (the resolver its /etc/resolv.conf names), carrying each connection and
// each DNS question to the egress proxy's Unix sockets, which the sandbox
// shows read-only at EGRESS_DIR. The relay is no trust boundary: it decides
// nothing, and an agent that kills or bypasses it reaches the same sockets
// and the same checks (`_egress.ts`). Plain JavaScript, so that the deno
// binary runs it without a cache or a type check.

import { readEnv } from "../_internal/util.ts";

/** Where the sandbox sees the proxy's sockets, the relay and resolv.conf. */
export const EGRESS_DIR = "/run/hud/net";
/** Where the sandbox sees the deno binary that runs the relay. */
export const EGRESS_DENO = "/run/hud/net-deno";
/** The proxy's port on the sandbox's loopback. */
export const PROXY_PORT = 3128;

/** The command's variables naming the proxy (every spelling tools read). */
export const PROXY_ENV: Readonly<Record<string, string>> = (() => {
  const url = `http://127.0.0.1:${PROXY_PORT}`;
  const none = "localhost,127.0.0.1,::1";
  const env: Record<string, string> = {};
  for (const name of ["http_proxy", "https_proxy", "all_proxy"]) {
    env[name] = env[name.toUpperCase()] = url;
  }
  env.no_proxy = env.NO_PROXY = none;
  return env;
})();

/**
 * This process's own proxy variables (those of {@linkcode PROXY_ENV} that
 * are set): the ones a container with an allowlist is made with, which
 * its commands sharing its network need as much as it does.
 */
export function inheritedProxyEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const name of Object.keys(PROXY_ENV)) {
    const value = readEnv(name);
    if (value !== undefined) env[name] = value;
  }
  return env;
}

/** The relay's source (`relay.js` in the staged directory). Argument: the sockets' directory. */
export const RELAY_JS = `const dir = Deno.args[0];
const tcp = Deno.listen({ hostname: "127.0.0.1", port: ${PROXY_PORT} });
const dnsTcp = Deno.listen({ hostname: "127.0.0.1", port: 53 });
const dnsUdp = Deno.listenDatagram({ hostname: "127.0.0.1", port: 53, transport: "udp" });
async function pump(from, to) {
  const buf = new Uint8Array(65536);
  try {
    for (;;) {
      const n = await from.read(buf);
      if (n === null) break;
      for (let o = 0; o < n;) o += await to.write(buf.subarray(o, n));
    }
  } catch { /* the peer is gone */ }
  try { await to.closeWrite(); } catch { /* closed */ }
}
async function relay(conn, path) {
  let up;
  try {
    up = await Deno.connect({ transport: "unix", path });
  } catch {
    conn.close();
    return;
  }
  await Promise.all([pump(conn, up), pump(up, conn)]);
  for (const c of [conn, up]) try { c.close(); } catch { /* closed */ }
}
async function accept(listener, path) {
  for await (const conn of listener) relay(conn, path);
}
async function readFull(conn, n) {
  const out = new Uint8Array(n);
  for (let o = 0; o < n;) {
    const got = await conn.read(out.subarray(o));
    if (got === null) return null;
    o += got;
  }
  return out;
}
async function question(msg, addr) {
  let up;
  try {
    up = await Deno.connect({ transport: "unix", path: dir + "/dns.sock" });
    const framed = new Uint8Array(msg.length + 2);
    framed.set([msg.length >> 8, msg.length & 255]);
    framed.set(msg, 2);
    for (let o = 0; o < framed.length;) o += await up.write(framed.subarray(o));
    const len = await readFull(up, 2);
    const answer = len && await readFull(up, len[0] << 8 | len[1]);
    if (answer) await dnsUdp.send(answer, addr);
  } catch { /* no answer: the resolver retries */ }
  try { up?.close(); } catch { /* closed */ }
}
async function datagrams() {
  for (;;) {
    const [msg, addr] = await dnsUdp.receive();
    question(msg, addr);
  }
}
accept(tcp, dir + "/proxy.sock");
accept(dnsTcp, dir + "/dns.sock");
datagrams();
await Deno.stdout.write(new TextEncoder().encode("ready\\n"));
Deno.stdout.close();
`;

// Runs inside the sandbox before the command: starts the relay (its argv
// first, after its length), waits for it to listen, then runs the rest.
const RELAY_START = `n=$1; shift; relay=("\${@:1:n}"); shift "$n"
exec 3< <(exec "\${relay[@]}" </dev/null 2>/dev/null)
IFS= read -r ready <&3 && [ "$ready" = ready ] ||
  { echo "Cannot run in the sandbox: its network relay did not start (port 53 needs CAP_NET_BIND_SERVICE in the sandbox)" >&2; exit 125; }
exec 3<&-
exec "$@"
`;

/** The relay's variables: no cache, no update check, no colour. */
export const RELAY_ENV: Readonly<Record<string, string>> = {
  DENO_DIR: "/nonexistent",
  DENO_NO_UPDATE_CHECK: "1",
  NO_COLOR: "1",
};

/**
 * `deno run` of the relay `script` with no more than it needs: the network,
 * and the proxy's sockets in `proxyDir` (and `script`, when it is not in
 * there).
 */
export function relayRun(deno: string, script: string, proxyDir: string): string[] {
  const readable = script.startsWith(`${proxyDir}/`) ? proxyDir : `${proxyDir},${script}`;
  return [
    deno,
    "run",
    "--no-config",
    "--no-lock",
    "--quiet",
    "--unstable-net",
    "--allow-net",
    `--allow-read=${readable}`,
    `--allow-write=${proxyDir}`,
    script,
    proxyDir,
  ];
}

/**
 * What runs inside the sandbox before the command's own stage: the relay,
 * keeping of root's capabilities only the one that binds port 53 (as root
 * or root of a user namespace, `privileged`).
 */
export function relayArgv(privileged: boolean): string[] {
  const drop = privileged
    ? [
      "setpriv",
      "--bounding-set=-all,+net_bind_service",
      "--inh-caps=-all",
      "--no-new-privs",
      "--",
    ]
    : [];
  const relay = [
    ...drop,
    "env",
    "-i",
    ...Object.entries(RELAY_ENV).map(([k, v]) => `${k}=${v}`),
    ...relayRun(EGRESS_DENO, `${EGRESS_DIR}/relay.js`, EGRESS_DIR),
  ];
  return [
    "bash",
    "--noprofile",
    "--norc",
    "-c",
    RELAY_START,
    "hud-relay",
    String(relay.length),
    ...relay,
  ];
}
