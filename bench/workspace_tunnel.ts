// The workspace's shell through the control server's tunnel, against the
// same shell reached directly: stdout throughput of one `head -c` per run
// (SshClient, default cipher), in interleaved rounds, for
//   direct     SshClient to the SSH server's own port
//   attached   client forwarder -> control server -> SSH server in-process
//              (addWorkspace attaches the shell: what tunnel.open does now)
//   dialled    client forwarder -> control server -> loopback TCP to the
//              SSH port (what tunnel.open did before the attachment)
// Everything runs in this one process, so the ratio is what each hop costs
// in CPU on one thread.
//
//   deno run -A bench/workspace_tunnel.ts [--mib=64] [--rounds=5]

import { connect } from "../client.ts";
import { Environment } from "../env.ts";
import { bind } from "../server.ts";
import { SshClient } from "../ssh/mod.ts";
import { addWorkspace } from "../workspace/workspace.ts";

const MIB = Number(Deno.args.find((a) => a.startsWith("--mib="))?.slice(6) ?? 64);
const ROUNDS = Number(Deno.args.find((a) => a.startsWith("--rounds="))?.slice(9) ?? 5);

async function stdoutSecs(shell: SshClient): Promise<number> {
  const start = performance.now();
  const proc = await shell.spawn(`head -c ${MIB * 1024 * 1024} /dev/zero`);
  let n = 0;
  for await (const chunk of proc.stdout) n += chunk.length;
  await proc.status;
  if (n !== MIB * 1024 * 1024) throw new Error(`got ${n} bytes of stdout`);
  return (performance.now() - start) / 1000;
}

const root = await Deno.makeTempDir({ prefix: "ws-tunnel-bench-" });
const env = new Environment("attached");
addWorkspace(env, root, { writeKeyFile: false, trackFiles: false, isolation: "none" });
await env.start();
// The same shell published without the attachment: the server dials it.
const dialledEnv = new Environment("dialled");
dialledEnv.addCapability(env.capability("shell")!);
console.log(JSON.stringify({ date: new Date().toISOString(), loadavg: Deno.loadavg(), mib: MIB }));
try {
  await using attachedServer = bind(env);
  await using dialledServer = bind(dialledEnv);
  await using attachedClient = await connect(attachedServer, { readyTimeout: 10_000 });
  await using dialledClient = await connect(dialledServer, { readyTimeout: 10_000 });
  await using direct = SshClient.fromBinding(env.capability("shell")!);
  await using attached = SshClient.fromBinding(attachedClient.binding("shell"));
  await using dialled = SshClient.fromBinding(dialledClient.binding("shell"));
  const shells: [string, SshClient][] = [
    ["direct", direct],
    ["attached", attached],
    ["dialled", dialled],
  ];
  const secs: Record<string, number[]> = { direct: [], attached: [], dialled: [] };
  for (const [, s] of shells) await stdoutSecs(s); // warm-up
  for (let r = 0; r < ROUNDS; r++) {
    for (const [name, s] of shells) secs[name].push(await stdoutSecs(s));
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  console.log("\n| path | MiB/s (median) | ratio to direct (median of paired rounds) |");
  console.log("| --- | --- | --- |");
  for (const [name] of shells) {
    const ratio = median(secs[name].map((t, i) => secs.direct[i] / t));
    console.log(`| ${name} | ${Math.round(MIB / median(secs[name]))} | ${ratio.toFixed(2)} |`);
  }
} finally {
  await env.stop();
  await Deno.remove(root, { recursive: true });
}
console.log(`load average at the end: ${Deno.loadavg().join(" ")}`);
