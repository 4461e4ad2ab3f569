// Start-up of `cli.ts serve bench/_bench_env.ts --no-auth` (exec to the line
// naming the port) in each checkout given, interleaved, 10 runs after a
// warm-up; prints the median, min and max per checkout, the mean CPU time the
// process had used by then (user + system, from /proc: less sensitive to the
// machine's load than the wall time; a re-executed process keeps counting),
// and the load average.
// A checkout may carry deno flags after an `@` (comma-separated), put before
// the script: `.@--v8-flags` keeps V8's defaults, so `serve` does not
// re-execute itself with its own flags (_server/v8_flags.ts).
//
//   deno run -A bench/serve_start.ts /tmp/hud-before .
//   deno run -A bench/serve_start.ts . .@--v8-flags .@--v8-flags=--max-semi-space-size=1
const trees = Deno.args;
const times: Record<string, number[]> = {};
const cpu: Record<string, number[]> = {};
const TICK_MS = 10; // USER_HZ is 100 on Linux

/** User + system CPU time of process `pid` so far, in ms. */
function cpuMs(pid: number): number {
  const fields = Deno.readTextFileSync(`/proc/${pid}/stat`).replace(/^.*\) /, "").split(" ");
  return (Number(fields[11]) + Number(fields[12])) * TICK_MS;
}

async function once(tree: string): Promise<[number, number]> {
  const [dir, flags = ""] = tree.split(/@(.*)/s);
  const t0 = performance.now();
  const p = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      ...flags.split(",").filter(Boolean),
      "cli.ts",
      "serve",
      "bench/_bench_env.ts",
      "--port",
      "0",
      "--no-auth",
    ],
    cwd: dir,
    stdout: "piped",
    stderr: "piped",
    env: { HUD_SERVE_TOKEN: "" },
  }).spawn();
  const dec = new TextDecoder();
  let buf = "";
  let t = NaN;
  let used = NaN;
  const readOut = async (s: ReadableStream<Uint8Array>) => {
    for await (const c of s) {
      buf += dec.decode(c);
      if (/HUD_SERVE_PORT=|Serving /.test(buf) && isNaN(t)) {
        t = performance.now() - t0;
        used = cpuMs(p.pid);
        p.kill("SIGTERM");
      }
    }
  };
  await Promise.all([readOut(p.stdout), readOut(p.stderr)]);
  await p.status;
  if (isNaN(t)) throw new Error(`${tree}: no port line: ${buf.slice(0, 300)}`);
  return [t, used];
}
for (const d of trees) await once(d);
for (let i = 0; i < 10; i++) {
  for (const d of trees) {
    const [t, used] = await once(d);
    (times[d] ??= []).push(t);
    (cpu[d] ??= []).push(used);
  }
}
for (const d of trees) {
  const s = times[d].sort((a, b) => a - b);
  const meanCpu = cpu[d].reduce((a, b) => a + b, 0) / cpu[d].length;
  console.log(
    d,
    "median",
    s[5].toFixed(1),
    "min",
    s[0].toFixed(1),
    "max",
    s[9].toFixed(1),
    "cpu",
    meanCpu.toFixed(0),
  );
}
console.log("load", Deno.readTextFileSync("/proc/loadavg").trim());
