// Ways to relay a tunnel's bytes, each in a relay process of its own
// between bench/_transfer.ts (full duplex) and the echo daemon
// (bench/_echo.ts bytes), in interleaved rounds with the direct transfer:
// throughput against direct, and the relay's CPU per GiB carried each way
// (utime + stime from /proc/<pid>/stat).
//
//   deno run -A bench/relay.ts [--mib=128] [--rounds=3]

const MIB = Number(Deno.args.find((a) => a.startsWith("--mib="))?.slice(6) ?? 128);
const ROUNDS = Number(Deno.args.find((a) => a.startsWith("--rounds="))?.slice(9) ?? 3);
const BENCH_DIR = new URL(".", import.meta.url).pathname;
const decoder = new TextDecoder();

interface Child {
  process: Deno.ChildProcess;
  port: number;
}

async function spawn(args: string[]): Promise<Child> {
  const process = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", ...args],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = process.stdout.getReader();
  let text = "";
  while (!/PORT=\d+\n/.test(text)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`${args.join(" ")} exited before printing its port`);
    text += decoder.decode(value);
  }
  reader.releaseLock();
  void process.stdout.pipeTo(new WritableStream()).catch(() => {});
  return { process, port: Number(/PORT=(\d+)\n/.exec(text)![1]) };
}

function cpuMs(pid: number): number {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

/** Seconds for the full-duplex transfer, or NaN when bytes were lost. */
async function transfer(port: number, bytes: number): Promise<number> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", BENCH_DIR + "_transfer.ts", String(port), String(bytes)],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  const r = JSON.parse(decoder.decode(out.stdout));
  return r.ok ? r.secs : NaN;
}

const VARIANTS: [string, string[]][] = [
  ["splice (SDK)", ["splice"]],
  ["pipeTo", ["pipeto"]],
  ["single 64 KiB", ["single", "65536"]],
  ["single 256 KiB", ["single", "262144"]],
  ["double 64 KiB", ["double", "65536"]],
  ["double 256 KiB", ["double", "262144"]],
  ["double 1 MiB", ["double", "1048576"]],
];

const daemon = await spawn([BENCH_DIR + "_echo.ts", "bytes"]);
const relays = await Promise.all(
  VARIANTS.map(([, a]) => spawn([BENCH_DIR + "_relay.ts", String(daemon.port), ...a])),
);
const bytes = MIB * 1024 * 1024;
const ratios: number[][] = VARIANTS.map(() => []);
const rates: number[][] = VARIANTS.map(() => []);
const cpu = VARIANTS.map(() => 0);
console.log(JSON.stringify({ date: new Date().toISOString(), loadavg: Deno.loadavg(), mib: MIB }));
try {
  await transfer(daemon.port, 16 * 1024 * 1024);
  for (const r of relays) await transfer(r.port, 16 * 1024 * 1024);
  for (let round = 0; round < ROUNDS; round++) {
    for (let i = 0; i < VARIANTS.length; i++) {
      const direct = await transfer(daemon.port, bytes);
      const c0 = cpuMs(relays[i].process.pid);
      const through = await transfer(relays[i].port, bytes);
      cpu[i] += cpuMs(relays[i].process.pid) - c0;
      ratios[i].push(direct / through);
      rates[i].push(MIB / through);
    }
  }
} finally {
  for (const c of [daemon, ...relays]) {
    c.process.kill("SIGTERM");
    await c.process.status;
  }
}
const median = (xs: number[]) =>
  xs.some(Number.isNaN) ? NaN : [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const gib = (ROUNDS * bytes) / 1024 ** 3;
console.log("\n| relay | MiB/s each way | ratio to direct (median) | relay CPU ms per GiB |");
console.log("| --- | --- | --- | --- |");
VARIANTS.forEach(([name], i) => {
  console.log(
    `| ${name} | ${
      Number.isNaN(median(rates[i])) ? "lost bytes" : Math.round(median(rates[i]))
    } | ${median(ratios[i]).toFixed(2)} | ${Math.round(cpu[i] / gib)} |`,
  );
});
console.log(`load average at the end: ${Deno.loadavg().join(" ")}`);
