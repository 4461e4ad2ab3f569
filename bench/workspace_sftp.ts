// SFTP in a workspace: what serving it from inside the sandbox costs.
// One bwrap workspace; OpenSSH's `sftp -b` gets and puts one file through
// the workspace's own SFTP (the sandboxed deno server since issue 22; the
// in-process one before), and through OpenSSH's sftp-server run in the
// same sandbox as a command (`sftp -s`), in interleaved rounds; plus the
// time to open a session (`sftp` with an empty batch) and SshClient's
// readFile/writeFile.
//
//   deno run -A bench/workspace_sftp.ts [--mib=64] [--rounds=3]
//
// Prints the median of the rounds per figure, and the load average.

import { Environment } from "../env.ts";
import { SshClient } from "../ssh/mod.ts";
import { addWorkspace } from "../workspace/mod.ts";
import { bigData, opensshOptions } from "../tests/ssh/_util.ts";

const arg = (name: string, fallback: number) =>
  Number(Deno.args.find((a) => a.startsWith(`--${name}=`))?.split("=")[1] ?? fallback);
const MIB = arg("mib", 64);
const ROUNDS = arg("rounds", 3);
const OPENSSH_SFTP_SERVER = "/usr/lib/openssh/sftp-server";

const root = await Deno.makeTempDir({ prefix: "bench-sftp-" });
const local = await Deno.makeTempDir({ prefix: "bench-sftp-local-" });
const env = new Environment("bench-sftp");
addWorkspace(env, root, { trackFiles: false, onError: () => {} });
await env.start();
try {
  const cap = env.capability("shell")!;
  const port = new URL(cap.url).port;
  await Deno.writeTextFile(
    `${local}/known_hosts`,
    `[127.0.0.1]:${port} ${cap.params.host_pubkey}\n`,
  );
  const ssh = opensshOptions(`${local}/known_hosts`, cap.params.client_key_path as string);
  const bytes = MIB * 1024 * 1024;
  await Deno.writeFile(`${local}/up.bin`, bigData(bytes));
  await Deno.writeFile(`${root}/down.bin`, bigData(bytes));
  await Deno.chown(`${root}/down.bin`, (await Deno.stat(root)).uid!, null);

  const sftp = async (batch: string, server?: string): Promise<number> => {
    await Deno.writeTextFile(`${local}/batch`, batch);
    const start = performance.now();
    const out = await new Deno.Command("sftp", {
      args: [
        ...ssh,
        "-P",
        port,
        ...(server ? ["-s", server] : []),
        "-b",
        `${local}/batch`,
        "agent@127.0.0.1",
      ],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!out.success) throw new Error(new TextDecoder().decode(out.stderr));
    return performance.now() - start;
  };

  const figures = new Map<string, number[]>();
  const add = (name: string, value: number) => {
    const list = figures.get(name) ?? [];
    list.push(value);
    figures.set(name, list);
  };
  const mbps = (ms: number) => bytes / 1e6 / (ms / 1000);
  const servers: [string, string | undefined][] = [["workspace's", undefined]];
  if ((await Deno.stat(OPENSSH_SFTP_SERVER).catch(() => null))?.isFile) {
    servers.push(["OpenSSH sftp-server in the sandbox", OPENSSH_SFTP_SERVER]);
  }
  for (let round = 0; round < ROUNDS; round++) {
    for (const [name, server] of servers) {
      add(`${name}: session start (empty batch), ms`, await sftp("\n", server));
      const session = await sftp("\n", server);
      const get = await sftp(`get down.bin ${local}/down.bin\n`, server);
      add(`${name}: get ${MIB} MiB, MB/s`, mbps(get - session));
      const put = await sftp(`put ${local}/up.bin up.bin\n`, server);
      add(`${name}: put ${MIB} MiB, MB/s`, mbps(put - session));
    }
    await using client = SshClient.fromBinding(cap);
    await client.stat("down.bin"); // SFTP session open before timing
    let start = performance.now();
    await client.readFile("down.bin");
    add(`SshClient.readFile ${MIB} MiB, MB/s`, mbps(performance.now() - start));
    const data = await Deno.readFile(`${local}/up.bin`);
    start = performance.now();
    await client.writeFile("up2.bin", data);
    add(`SshClient.writeFile ${MIB} MiB, MB/s`, mbps(performance.now() - start));
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
  console.log(`isolation ${cap.params.isolation}, uid ${Deno.uid()}, ${ROUNDS} rounds, median:`);
  for (const [name, xs] of figures) console.log(`  ${name.padEnd(60)} ${median(xs).toFixed(1)}`);
  console.log(`load ${Deno.loadavg().map((l) => l.toFixed(1)).join(" ")}`);
} finally {
  await env.stop();
  await Deno.remove(root, { recursive: true });
  await Deno.remove(local, { recursive: true });
}
