// Start-up of `cli.ts serve bench/_bench_env.ts --no-auth` (exec to the line
// naming the port) in each checkout given, interleaved, 10 runs after a
// warm-up; prints the median, min and max per checkout and the load average.
// A checkout may carry deno flags after an `@` (comma-separated), put before
// the script: `.@--v8-flags` keeps V8's defaults, so `serve` does not
// re-execute itself with its own flags (_server/v8_flags.ts).
//
//   deno run -A bench/serve_start.ts /tmp/hud-before .
//   deno run -A bench/serve_start.ts . .@--v8-flags .@--v8-flags=--max-semi-space-size=1
const trees = Deno.args;
const times: Record<string, number[]> = {};
async function once(tree: string): Promise<number> {
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
  const readOut = async (s: ReadableStream<Uint8Array>) => {
    for await (const c of s) {
      buf += dec.decode(c);
      if (/HUD_SERVE_PORT=|Serving /.test(buf) && isNaN(t)) {
        t = performance.now() - t0;
        p.kill("SIGTERM");
      }
    }
  };
  await Promise.all([readOut(p.stdout), readOut(p.stderr)]);
  await p.status;
  if (isNaN(t)) throw new Error(`${tree}: no port line: ${buf.slice(0, 300)}`);
  return t;
}
for (const d of trees) await once(d);
for (let i = 0; i < 10; i++) for (const d of trees) (times[d] ??= []).push(await once(d));
for (const d of trees) {
  const s = times[d].sort((a, b) => a - b);
  console.log(d, "median", s[5].toFixed(1), "min", s[0].toFixed(1), "max", s[9].toFixed(1));
}
console.log("load", Deno.readTextFileSync("/proc/loadavg").trim());
