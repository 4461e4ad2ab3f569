// A container's network allowlist (ContainerRuntime, issue 37): what the
// egress proxy and its relay cost. Places a container of the test image
// (tests/fixtures/basic_env.ts, built if missing) with network false, with
// an allowlist and with true, and times place() (until the environment
// answers, the relay started) and the release; then fetches 64 MiB from an
// HTTP host in a network namespace of its own, with the image's deno in
// the container, through the proxy (allowlist) and directly (true). Root
// only (it makes the namespace: tests/workspace/_netns_hosts.ts).
//
//   deno run -A bench/container_egress.ts [--rounds=5] [--socket=/run/podman/podman.sock]
//
// Prints the median of the rounds per figure, and the load average.

import { buildEnvironmentImage, ContainerRuntime } from "../engines/mod.ts";
import { EngineClient } from "../engines/_engine.ts";
import type { NetworkPolicy } from "../workspace/mod.ts";
import { startNetnsHosts } from "../tests/workspace/_netns_hosts.ts";

const arg = (name: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.split("=").slice(1).join("=");
const ROUNDS = Number(arg("rounds") ?? 5);
const SOCKET = arg("socket");
const TAG = "hud-test-egress:latest";
/** The namespace's host serves 64 MiB at /bulk. */
const MIB = 64;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** Milliseconds the container's deno takes to fetch `url` whole (the proxy variables honoured). */
async function download(engine: EngineClient, id: string, url: string): Promise<number> {
  const script = `const t = performance.now(); const r = await fetch(${JSON.stringify(url)});
let n = 0; for await (const c of r.body) n += c.length;
if (n !== ${MIB * 1024 * 1024}) throw new Error("got " + n);
console.log(performance.now() - t);`;
  const created = await engine.call("POST", `/containers/${id}/exec`, {
    Cmd: ["/usr/local/bin/deno", "eval", "--quiet", script],
    AttachStdout: true,
    AttachStderr: true,
  }) as { Id: string };
  const res = await engine.raw("POST", `/exec/${created.Id}/start`, {
    body: JSON.stringify({ Detach: false, Tty: false }),
    headers: { "content-type": "application/json" },
  });
  const raw = new Uint8Array(await res.arrayBuffer());
  // 8 bytes of framing (stream, 0, 0, 0, length) before each chunk.
  let text = "";
  for (let o = 0; o + 8 <= raw.length;) {
    const n = new DataView(raw.buffer, raw.byteOffset + o + 4, 4).getUint32(0);
    text += new TextDecoder().decode(raw.subarray(o + 8, o + 8 + n));
    o += 8 + n;
  }
  const ms = Number(text.trim().split("\n").at(-1));
  if (!Number.isFinite(ms)) throw new Error(`download failed: ${text}`);
  return ms;
}

async function measure(network: boolean | NetworkPolicy, url: string | null) {
  const place: number[] = [];
  const release: number[] = [];
  const fetches: number[] = [];
  using engine = await EngineClient.open(SOCKET);
  for (let i = 0; i < ROUNDS; i++) {
    const runtime = new ContainerRuntime(TAG, { socket: SOCKET, network });
    let t = performance.now();
    const placement = await runtime.place();
    place.push(performance.now() - t);
    try {
      if (url !== null) {
        fetches.push(await download(engine, String(placement.params.containerId), url));
      }
    } finally {
      t = performance.now();
      await placement[Symbol.asyncDispose]();
      release.push(performance.now() - t);
      await runtime.close();
    }
  }
  return { place: median(place), release: median(release), fetch: median(fetches) };
}

await buildEnvironmentImage(
  new URL("../tests/fixtures/basic_env.ts", import.meta.url).pathname,
  TAG,
  {
    envName: "fixture",
    envVersion: "0.3.0",
    socket: SOCKET,
  },
);
await using hosts = await startNetnsHosts();
const url = `http://${hosts.allowed}:8080/bulk`;
const none = await measure(false, null);
const allow = await measure({ allow: [hosts.allowed] }, url);
const open = await measure(true, url);
const ms = (x: number) => `${x.toFixed(0)} ms`;
const rate = (x: number) => `${(MIB / (x / 1000)).toFixed(0)} MiB/s`;
console.log(`engine: ${SOCKET ?? "default"}, ${ROUNDS} rounds`);
console.log(
  `place(): none ${ms(none.place)}, allowlist ${ms(allow.place)}, public ${ms(open.place)}`,
);
console.log(
  `release: none ${ms(none.release)}, allowlist ${ms(allow.release)}, public ${ms(open.release)}`,
);
console.log(
  `${MIB} MiB download: through the proxy ${ms(allow.fetch)} (${rate(allow.fetch)}), direct ${
    ms(open.fetch)
  } (${rate(open.fetch)})`,
);
console.log(`load average: ${Deno.loadavg().map((l) => l.toFixed(2)).join(" ")}`);
