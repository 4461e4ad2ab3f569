// SSH benchmark: our server against OpenSSH's sshd, with OpenSSH's ssh as
// the client (and our SshClient on one connection as an extra row).
//
//   deno run -A bench/ssh.ts [--quick] [--files]
//   deno run -A bench/ssh.ts --stdout [--rounds=5] [--mib=256] [--quick] [--json]
//   deno run -A bench/ssh.ts --seal [--rounds=5]
//
// --stdout measures only the stdout throughput, with ssh's default cipher
// (what `ssh host cmd` negotiates with each server) and each cipher forced,
// in --rounds interleaved rounds (which server goes first alternates), and
// prints the median and best of each; --json prints one JSON line instead
// (the default cipher's figures, for bench/run.ts). The table adds our
// server's CPU seconds per GiB (it runs in this process), median of the rounds.
//
// --seal measures our sending path alone, in this process: PacketSealer
// sealing 128 MiB of 32 KiB channel-data packets, 32 per batch as the
// transport's write loop hands them over, per cipher (MB/s, median and best).
//
// --files measures only what starts no shell (SFTP transfers per cipher and
// the ciphers in-process): a login shell whose rc files are slow (pyenv's
// rehash lock, say) swamps the rest.
//
// Figures: exec("true") round trips per second (one ssh process, hence one
// connection and key exchange, per command), the throughput of a large
// stdout (MB/s) per cipher, SFTP get and put with OpenSSH's sftp (ours
// against sshd running OpenSSH's sftp-server), SshClient.readFile and
// writeFile, and the ciphers' own speed on 32 KiB packets in this process.
// Ours runs `bash --noprofile --norc -c` (no sandbox: the bare server), sshd
// runs the login user's shell with -c.

import { generateSshKeyPair, SshClient } from "../ssh/mod.ts";
import { startSshServer } from "../ssh/server.ts";
import { bigData, opensshOptions, startSshd } from "../tests/ssh/_util.ts";
import { ChaChaPolyOpenSsh } from "../ssh/_chacha.ts";
import { PacketSealer } from "../ssh/_cipher.ts";

const quick = Deno.args.includes("--quick");
const filesOnly = Deno.args.includes("--files");
const stdoutOnly = Deno.args.includes("--stdout");
const sealOnly = Deno.args.includes("--seal");
const json = Deno.args.includes("--json");
const ROUNDS = quick ? 10 : 20;
/** The size of each transfer: --mib, else 64 MiB with --quick, else 256. */
const BYTES =
  Number(Deno.args.find((a) => a.startsWith("--mib="))?.slice(6) ?? (quick ? 64 : 256)) *
  1024 * 1024;
const REPEATS = quick ? 1 : 3;
const STDOUT_ROUNDS = Number(
  Deno.args.find((a) => a.startsWith("--rounds="))?.slice(9) ?? (quick ? 3 : 5),
);
const CIPHERS = ["aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes128-ctr"];

interface Target {
  name: string;
  port: number;
  user: string;
  keyPath: string;
  knownHosts: string;
  hostPublicKey: string;
  privateKey: string;
}

async function ssh(t: Target, extra: string[], command: string): Promise<number> {
  const out = await new Deno.Command("ssh", {
    args: [
      ...opensshOptions(t.knownHosts, t.keyPath),
      "-p",
      String(t.port),
      ...extra,
      `${t.user}@127.0.0.1`,
      command,
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  if (out.code !== 0) throw new Error(new TextDecoder().decode(out.stderr));
  return out.code;
}

async function roundTrips(t: Target): Promise<number> {
  await ssh(t, [], "true");
  const start = performance.now();
  for (let i = 0; i < ROUNDS; i++) await ssh(t, [], "true");
  return ROUNDS / ((performance.now() - start) / 1000);
}

/**
 * MB/s of a large stdout, timed by the reader from its first byte to its
 * last: ssh's stdout goes to a shell that stamps the time after `head -c1`
 * and again after `cat` has read the rest. Connection set-up and the login
 * shell, which both servers pay and which swing by seconds under load, stay
 * out of it.
 */
async function throughput(t: Target, cipher: string): Promise<number> {
  // CTR forces our MAC too: sshd would otherwise get umac-64-etm.
  const forced = cipher === "default"
    ? []
    : cipher.endsWith("-ctr")
    ? ["-c", cipher, "-m", "hmac-sha2-256-etm@openssh.com"]
    : ["-c", cipher];
  const ssh = [
    "ssh",
    ...opensshOptions(t.knownHosts, t.keyPath),
    "-p",
    String(t.port),
    ...forced,
    `${t.user}@127.0.0.1`,
    `head -c ${BYTES} /dev/zero`,
  ];
  const out = await new Deno.Command("bash", {
    args: [
      "-c",
      'set -o pipefail; "$@" | { head -c1 >/dev/null; date +%s%N; wc -c; date +%s%N; }',
      "bash",
      ...ssh,
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const [first, rest, last] = new TextDecoder().decode(out.stdout).trim().split("\n").map(Number);
  if (!out.success || rest !== BYTES - 1) {
    throw new Error(`ssh to ${t.name} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return rest / 1e6 / ((last - first) / 1e9);
}

function sftpArgs(t: Target): string[] {
  return [
    ...opensshOptions(t.knownHosts, t.keyPath),
    "-P",
    String(t.port),
  ];
}

/** MB/s of `sftp -b` getting (or putting) the BYTES-long file. */
async function sftpTransfer(t: Target, way: "get" | "put", cipher?: string): Promise<number> {
  const batch = way === "get"
    ? `get ${dir}/sftp.bin ${dir}/sftp-got.bin\n`
    : `put ${dir}/sftp.bin ${dir}/sftp-put.bin\n`;
  await Deno.writeTextFile(`${dir}/batch`, batch);
  const start = performance.now();
  const out = await new Deno.Command("sftp", {
    args: [
      ...sftpArgs(t),
      ...(cipher === undefined ? [] : ["-c", cipher]),
      "-b",
      `${dir}/batch`,
      `${t.user}@127.0.0.1`,
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  if (out.code !== 0) throw new Error(new TextDecoder().decode(out.stderr));
  return BYTES / 1e6 / ((performance.now() - start) / 1000);
}

async function clientFiles(t: Target, way: "read" | "write"): Promise<number> {
  await using c = await SshClient.connect({
    port: t.port,
    user: t.user,
    hostPublicKey: t.hostPublicKey,
    privateKey: t.privateKey,
  });
  await c.stat(`${dir}/sftp.bin`); // SFTP session open before timing
  const start = performance.now();
  if (way === "read") await c.readFile(`${dir}/sftp.bin`);
  else await c.writeFile(`${dir}/client-put.bin`, payload);
  return BYTES / 1e6 / ((performance.now() - start) / 1000);
}

async function clientRoundTrips(t: Target): Promise<number> {
  await using c = await SshClient.connect({
    port: t.port,
    user: t.user,
    hostPublicKey: t.hostPublicKey,
    privateKey: t.privateKey,
  });
  await c.exec("true");
  const start = performance.now();
  for (let i = 0; i < ROUNDS; i++) await c.exec("true");
  return ROUNDS / ((performance.now() - start) / 1000);
}

/** PacketSealer's throughput per cipher, in this process (no sockets). */
async function sealRounds(): Promise<void> {
  const cases = [
    ["aes128-gcm@openssh.com", ""],
    ["aes128-ctr", "hmac-sha2-256-etm@openssh.com"],
    ["aes128-ctr", "hmac-sha2-256"],
    ["chacha20-poly1305@openssh.com", ""],
  ];
  const head = new Uint8Array(9);
  const body = crypto.getRandomValues(new Uint8Array(32768));
  const packets = 4096;
  const rates: number[][] = cases.map(() => []);
  for (let round = 0; round < STDOUT_ROUNDS; round++) {
    for (const [i, [cipher, mac]] of cases.entries()) {
      const keys = {
        cipher,
        mac,
        key: crypto.getRandomValues(new Uint8Array(64)),
        iv: crypto.getRandomValues(new Uint8Array(16)),
        macKey: crypto.getRandomValues(new Uint8Array(32)),
      };
      const sealer = await PacketSealer.create(keys, 0);
      const start = performance.now();
      for (let n = 0; n < packets; n += 32) {
        await sealer.seal(Array.from({ length: 32 }, () => [head, body] as const));
      }
      rates[i].push((packets * body.length) / 1e6 / ((performance.now() - start) / 1000));
      await sealer.drain();
    }
  }
  console.log(`seal 128 MiB of 32 KiB packets in-process, ${STDOUT_ROUNDS} rounds (MB/s)`);
  for (const [i, [cipher, mac]] of cases.entries()) {
    const sorted = [...rates[i]].sort((a, b) => a - b);
    console.log(
      `${(mac === "" ? cipher : `${cipher} + ${mac}`).padEnd(52)}${
        sorted[Math.floor(sorted.length / 2)].toFixed(0).padStart(8)
      }${sorted[sorted.length - 1].toFixed(0).padStart(8)}`,
    );
  }
  console.log(`load average ${Deno.loadavg().map((x) => x.toFixed(2)).join(" ")}`);
}
if (sealOnly) {
  await sealRounds();
  Deno.exit(0);
}

const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "ssh-bench-" }));
// sshd runs OpenSSH's sftp-server program; internal-sftp (the same code in
// sshd) avoids the login shell that starts it, which --files needs.
await using sshd = await startSshd(
  `Subsystem sftp ${filesOnly ? "internal-sftp" : "/usr/lib/openssh/sftp-server"}`,
);
const payload = bigData(BYTES);
await Deno.writeFile(`${dir}/sftp.bin`, payload);
const host = await generateSshKeyPair();
await Deno.writeTextFile(`${dir}/key`, sshd.client.privateKey, { mode: 0o600 });
await using ours = startSshServer({
  hostKey: host.privateKey,
  authorizedKeys: [sshd.client.publicKey],
  cwd: dir,
});
// The same server offering every cipher, for the rows that force one
// (chacha20-poly1305 is not offered by default).
await using oursAll = startSshServer({
  hostKey: host.privateKey,
  authorizedKeys: [sshd.client.publicKey],
  cwd: dir,
  ciphers: [
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
  ],
});
await Deno.writeTextFile(
  `${dir}/known_hosts`,
  `[127.0.0.1]:${ours.addr.port} ${host.publicKey}\n[127.0.0.1]:${oursAll.addr.port} ${host.publicKey}\n` +
    `[127.0.0.1]:${sshd.port} ${sshd.host.publicKey}\n`,
);
const common = {
  keyPath: `${dir}/key`,
  knownHosts: `${dir}/known_hosts`,
  privateKey: sshd.client.privateKey,
};
const sshdTarget: Target = {
  name: "sshd",
  port: sshd.port,
  user: sshd.user,
  hostPublicKey: sshd.host.publicKey,
  ...common,
};
/** Ours as configured by default, and sshd. */
const targets: Target[] = [
  { name: "ours", port: ours.addr.port, user: "agent", hostPublicKey: host.publicKey, ...common },
  sshdTarget,
];
/** Ours offering every cipher, and sshd: for the rows that force a cipher. */
const targetsAll: Target[] = [
  {
    name: "ours",
    port: oursAll.addr.port,
    user: "agent",
    hostPublicKey: host.publicKey,
    ...common,
  },
  sshdTarget,
];

/** The cipher and MAC `ssh` negotiates with `t` when it forces neither. */
async function negotiated(t: Target): Promise<string> {
  const out = await new Deno.Command("ssh", {
    args: [
      "-v",
      ...opensshOptions(t.knownHosts, t.keyPath),
      "-p",
      String(t.port),
      `${t.user}@127.0.0.1`,
      "true",
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).output();
  const m = /server->client cipher: (\S+) MAC: (\S+)/.exec(new TextDecoder().decode(out.stderr));
  if (m === null) return "unknown";
  return m[2] === "<implicit>" ? m[1] : `${m[1]} + ${m[2]}`;
}

/** Stdout throughput only: interleaved rounds, median and best. */
/** This process's user + system CPU time in seconds (Linux `/proc/self/stat`; NaN elsewhere). */
function processCpuSeconds(): number {
  try {
    const fields = Deno.readTextFileSync("/proc/self/stat").split(") ")[1].split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100; // clock ticks, USER_HZ = 100
  } catch {
    return NaN;
  }
}

async function stdoutRounds(): Promise<void> {
  const ciphers = quick || json ? ["default"] : ["default", ...CIPHERS];
  const names = [await negotiated(targets[0]), await negotiated(targets[1])];
  const results: Record<
    string,
    { ours: number[]; sshd: number[]; ratios: number[]; cpu: number[] }
  > = {};
  for (const cipher of ciphers) {
    const pair = cipher === "default" ? targets : targetsAll;
    await throughput(pair[0], cipher); // warm-up (JIT, page cache)
    const r = results[cipher] = {
      ours: [] as number[],
      sshd: [] as number[],
      ratios: [] as number[],
      cpu: [] as number[],
    };
    // Our server runs in this process: its CPU per GiB, session set-up included.
    const ours = async () => {
      const before = processCpuSeconds();
      const mbs = await throughput(pair[0], cipher);
      r.cpu.push((processCpuSeconds() - before) / (BYTES / 2 ** 30));
      return mbs;
    };
    for (let i = 0; i < STDOUT_ROUNDS; i++) {
      let a: number, b: number;
      if (i % 2 === 0) {
        a = await ours();
        b = await throughput(pair[1], cipher);
      } else {
        b = await throughput(pair[1], cipher);
        a = await ours();
      }
      r.ours.push(a);
      r.sshd.push(b);
      r.ratios.push(a / b);
    }
  }
  const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
  if (json) {
    const r = results.default;
    console.log(JSON.stringify({
      bytes: BYTES,
      rounds: STDOUT_ROUNDS,
      ours_cipher: names[0],
      sshd_cipher: names[1],
      ours_mbs: r.ours.map((x) => Math.round(x)),
      sshd_mbs: r.sshd.map((x) => Math.round(x)),
      ratios: r.ratios.map((x) => Math.round(x * 1000) / 1000),
      median_ours: Math.round(med(r.ours)),
      median_sshd: Math.round(med(r.sshd)),
      median_ratio: Math.round(med(r.ratios) * 1000) / 1000,
      loadavg: Deno.loadavg(),
    }));
    return;
  }
  console.log(`default cipher: ours ${names[0]}, sshd ${names[1]}; ${STDOUT_ROUNDS} rounds`);
  console.log(
    `${"stdout MB/s".padEnd(34)}${"ours med".padStart(10)}${"best".padStart(8)}` +
      `${"sshd med".padStart(10)}${"best".padStart(8)}${"ratio med".padStart(11)}` +
      `${"CPU s/GiB".padStart(11)}  ratios`,
  );
  for (const cipher of ciphers) {
    const r = results[cipher];
    console.log(
      `${cipher.padEnd(34)}${med(r.ours).toFixed(0).padStart(10)}` +
        `${Math.max(...r.ours).toFixed(0).padStart(8)}${med(r.sshd).toFixed(0).padStart(10)}` +
        `${Math.max(...r.sshd).toFixed(0).padStart(8)}${med(r.ratios).toFixed(2).padStart(11)}` +
        `${med(r.cpu).toFixed(2).padStart(11)}  ${r.ratios.map((x) => x.toFixed(2)).join(" ")}`,
    );
  }
  console.log(`load average ${Deno.loadavg().map((x) => x.toFixed(2)).join(" ")}`);
}
if (stdoutOnly) {
  await stdoutRounds();
} else {
  await everything();
}
await Deno.remove(dir, { recursive: true });

async function everything(): Promise<void> {
  const rows: [string, number, number][] = [];
  // Best of three, interleaved, so a busy machine hurts both sides alike.
  const measure = async (label: string, f: (t: Target) => Promise<number>) => {
    let [a, b] = [0, 0];
    for (let i = 0; i < REPEATS; i++) {
      a = Math.max(a, await f(targetsAll[0]));
      b = Math.max(b, await f(targetsAll[1]));
    }
    rows.push([label, a, b]);
  };
  if (!filesOnly) {
    await measure("ssh exec true (round trips/s)", roundTrips);
    for (const cipher of CIPHERS) {
      await measure(
        `ssh stdout ${BYTES >> 20} MiB, ${cipher} (MB/s)`,
        (t) => throughput(t, cipher),
      );
    }
    await measure("SshClient exec true, one connection (/s)", clientRoundTrips);
  }
  for (const cipher of CIPHERS) {
    for (const way of ["get", "put"] as const) {
      await measure(
        `sftp ${way} ${BYTES >> 20} MiB, ${cipher.replace("@openssh.com", "")} (MB/s)`,
        (t) => sftpTransfer(t, way, cipher),
      );
    }
  }
  for (const way of ["read", "write"] as const) {
    await measure(`SshClient ${way}File ${BYTES >> 20} MiB (MB/s)`, (t) => clientFiles(t, way));
  }

  // The ciphers alone, sealing 32 KiB packets in this process (no sockets).
  async function sealRate(cipher: "chacha" | "gcm"): Promise<number> {
    const packet = crypto.getRandomValues(new Uint8Array(32 * 1024));
    const n = quick ? 500 : 2000;
    const start = performance.now();
    if (cipher === "chacha") {
      const c = new ChaChaPolyOpenSsh(crypto.getRandomValues(new Uint8Array(64)));
      for (let i = 0; i < n; i++) c.seal(i, packet);
    } else {
      const key = await crypto.subtle.importKey(
        "raw",
        crypto.getRandomValues(new Uint8Array(16)),
        "AES-GCM",
        false,
        ["encrypt"],
      );
      const iv = new Uint8Array(12);
      for (let i = 0; i < n; i++) {
        new DataView(iv.buffer).setUint32(8, i);
        await crypto.subtle.encrypt({ name: "AES-GCM", iv }, key, packet);
      }
    }
    return (n * packet.length) / 1e6 / ((performance.now() - start) / 1000);
  }
  let [chachaRate, gcmRate] = [0, 0];
  for (let i = 0; i < REPEATS; i++) {
    chachaRate = Math.max(chachaRate, await sealRate("chacha"));
    gcmRate = Math.max(gcmRate, await sealRate("gcm"));
  }

  console.log(`${"".padEnd(52)}${"ours".padStart(10)}${"sshd".padStart(10)}${"ratio".padStart(8)}`);
  for (const [label, a, b] of rows) {
    console.log(
      `${label.padEnd(52)}${a.toFixed(1).padStart(10)}${b.toFixed(1).padStart(10)}${
        (a / b).toFixed(2).padStart(8)
      }`,
    );
  }
  console.log(
    `seal 32 KiB packets in-process: chacha20-poly1305 ${chachaRate.toFixed(0)} MB/s, ` +
      `AES-128-GCM (WebCrypto) ${gcmRate.toFixed(0)} MB/s`,
  );
}
