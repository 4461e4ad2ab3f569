// What a held connection costs a server process, split by where the bytes
// live: V8's heap (objects), ArrayBuffer backing stores ("external"), and the
// rest of the resident set (Rust resources, tokio, the allocator). Each
// server runs in a child started with `--v8-flags=--expose-gc`; before and
// after N connections are opened, the child runs two full GCs and reports
// Deno.memoryUsage() and /proc/self/smaps_rollup (bench/_mem.ts).
//
// The `cli` rows are the command line as a user types it, `deno run -A
// cli.ts serve bench/_bench_env.ts`, with no extra flag (so no forced GC and
// no breakdown): its resident set is read from /proc/<pid>/status once it
// stops moving, beside the same command with the flag written out
// (`cli-semi1`) and with V8's defaults kept by a bare `--v8-flags`
// (`cli-defaults`, what the plain command gave before it applied the flag
// itself).
//
//   deno run -A bench/memory.ts [--n=10000] [--only=cli,cli-semi1,serve,echo,...] [--idle=S]
//
// `--idle=S` waits S seconds with every connection held before measuring.
//
// Servers: `serve` (bench/_serve_env.ts: hello + tasks.start on each
// connection), `echo` (bench/_echo.ts lines: one round trip), and the bare
// holders of bench/_hold.ts: `none` (accepted, no read), `read4096`,
// `read256`, `read64` (one read pending into a buffer of that size),
// `shared4096` (all pending reads into one buffer).

import { generateToken } from "../_internal/auth.ts";

const N = Number(Deno.args.find((a) => a.startsWith("--n="))?.slice(4) ?? 10_000);
const ONLY = Deno.args.find((a) => a.startsWith("--only="))?.slice(7).split(",");
const IDLE_S = Number(Deno.args.find((a) => a.startsWith("--idle="))?.slice(7) ?? 0);
const BENCH_DIR = new URL(".", import.meta.url).pathname;
const CLI = new URL("../cli.ts", import.meta.url).pathname;
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const TOKEN = generateToken();

interface Kind {
  name: string;
  /** A script of bench/, run with --expose-gc and probed (forced GCs, the breakdown). */
  script?: string;
  /** Instead: `cli.ts serve bench/_bench_env.ts`, these flags of deno's before it, measured from outside. */
  cli?: string[];
  args: string[];
  lines: Uint8Array[];
  /** V8 flags besides --expose-gc. */
  v8?: string;
}

const line = (v: unknown) => encoder.encode(JSON.stringify(v) + "\n");
const SESSION = [
  line({ jsonrpc: "2.0", id: 0, method: "hello", params: { token: TOKEN } }),
  line({ jsonrpc: "2.0", id: 1, method: "tasks.start", params: { id: "t" } }),
];
const KINDS: Kind[] = [
  { name: "cli", cli: [], args: [], lines: SESSION },
  { name: "cli-semi1", cli: ["--v8-flags=--max-semi-space-size=1"], args: [], lines: SESSION },
  { name: "cli-defaults", cli: ["--v8-flags"], args: [], lines: SESSION },
  {
    name: "serve",
    script: "_serve_env.ts",
    args: [],
    lines: [
      line({ jsonrpc: "2.0", id: 0, method: "hello", params: { token: TOKEN } }),
      line({ jsonrpc: "2.0", id: 1, method: "tasks.start", params: { id: "t" } }),
    ],
  },
  {
    name: "serve-semi1",
    script: "_serve_env.ts",
    args: [],
    v8: "--max-semi-space-size=1",
    lines: [
      line({ jsonrpc: "2.0", id: 0, method: "hello", params: { token: TOKEN } }),
      line({ jsonrpc: "2.0", id: 1, method: "tasks.start", params: { id: "t" } }),
    ],
  },
  {
    name: "serve-hello",
    script: "_serve_env.ts",
    args: [],
    lines: [line({ jsonrpc: "2.0", id: 0, method: "hello", params: { token: TOKEN } })],
  },
  {
    name: "echo",
    script: "_echo.ts",
    args: ["lines"],
    lines: [line({ jsonrpc: "2.0", id: 1, method: "ping", params: {} })],
  },
  { name: "none", script: "_hold.ts", args: ["none"], lines: [] },
  { name: "read4096", script: "_hold.ts", args: ["read", "4096"], lines: [] },
  { name: "read256", script: "_hold.ts", args: ["read", "256"], lines: [] },
  { name: "read64", script: "_hold.ts", args: ["read", "64"], lines: [] },
  { name: "then64", script: "_hold.ts", args: ["then", "64"], lines: [] },
  { name: "shared4096", script: "_hold.ts", args: ["shared", "4096"], lines: [] },
];

interface Mem {
  rss: number;
  heapTotal: number;
  heapUsed: number;
  external: number;
  anonymous: number;
  spaces: Record<string, { size: number; used: number }>;
}

/** The resident set of process `pid` once it stops moving (GC and allocator settle). */
async function settledRss(pid: number): Promise<number> {
  const rss = () =>
    Number(/VmRSS:\s+(\d+) kB/.exec(Deno.readTextFileSync(`/proc/${pid}/status`))![1]) * 1024;
  let last = rss();
  for (let i = 0; i < 20; i++) {
    await new Promise((r) => setTimeout(r, 100));
    const now = rss();
    if (Math.abs(now - last) < 256 * 1024) return now;
    last = now;
  }
  return last;
}

class Child {
  readonly #process: Deno.ChildProcess;
  readonly #reader: ReadableStreamDefaultReader<Uint8Array>;
  readonly #probed: boolean;
  #text = "";

  constructor(kind: Kind) {
    this.#probed = kind.cli === undefined;
    const command = kind.cli === undefined
      ? [
        `--v8-flags=--expose-gc${kind.v8 ? "," + kind.v8 : ""}`,
        BENCH_DIR + kind.script,
        ...kind.args,
      ]
      : [...kind.cli, CLI, "serve", BENCH_DIR + "_bench_env.ts", "--port", "0"];
    this.#process = new Deno.Command("bash", {
      args: [
        "-c",
        'ulimit -n "$(ulimit -Hn)" && exec "$0" "$@"',
        Deno.execPath(),
        "run",
        "-A",
        ...command,
      ],
      env: { HUD_SERVE_TOKEN: TOKEN, MEM_PROBE: "1" },
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#reader = this.#process.stdout.getReader();
  }

  async #line(pattern: RegExp): Promise<RegExpExecArray> {
    const signal = AbortSignal.timeout(30_000);
    while (true) {
      const m = pattern.exec(this.#text);
      if (m) {
        this.#text = this.#text.slice(m.index + m[0].length);
        return m;
      }
      if (signal.aborted) throw new Error(`no ${pattern} from the child within 30 s`);
      const { value, done } = await this.#reader.read();
      if (done) throw new Error(`child exited before printing ${pattern}`);
      this.#text += decoder.decode(value, { stream: true });
    }
  }

  async port(): Promise<number> {
    return Number((await this.#line(/PORT=(\d+)\n/))[1]);
  }

  /** The probe's report; from outside, the settled resident set only. */
  async memory(): Promise<Mem | { rss: number }> {
    await new Promise((r) => setTimeout(r, 300));
    if (!this.#probed) return { rss: await settledRss(this.#process.pid) };
    this.#process.kill("SIGUSR2");
    return JSON.parse((await this.#line(/MEM (.*)\n/))[1]);
  }

  async stop(): Promise<void> {
    this.#process.kill("SIGTERM");
    await this.#reader.cancel();
    await this.#process.status;
  }
}

async function openConns(port: number, lines: Uint8Array[]): Promise<Deno.TcpConn[]> {
  const conns: Deno.TcpConn[] = [];
  let next = 0;
  const worker = async () => {
    const buf = new Uint8Array(4096);
    while (next < N) {
      next++;
      const conn = await Deno.connect({ hostname: "127.0.0.1", port });
      conns.push(conn);
      for (const l of lines) {
        let off = 0;
        while (off < l.length) off += await conn.write(l.subarray(off));
        let end = 0;
        while (buf.subarray(0, end).indexOf(10) < 0) {
          const n = await conn.read(buf.subarray(end));
          if (n === null) throw new Error("server closed a connection");
          end += n;
        }
      }
    }
  };
  await Promise.all(Array.from({ length: 200 }, worker));
  return conns;
}

const perConn = (a: number, b: number) => Math.round(((b - a) / N / 1024) * 100) / 100;

/** A probed server's growth, per connection, by where the bytes are. */
function breakdown(server: string, before: Mem, after: Mem): Record<string, string | number> {
  return {
    server,
    rss_kib: perConn(before.rss, after.rss),
    heap_used_kib: perConn(before.heapUsed, after.heapUsed),
    heap_total_kib: perConn(before.heapTotal, after.heapTotal),
    old_used_kib: perConn(before.spaces.old_space.used, after.spaces.old_space.used),
    old_size_kib: perConn(before.spaces.old_space.size, after.spaces.old_space.size),
    new_size_kib: perConn(before.spaces.new_space.size, after.spaces.new_space.size),
    external_kib: perConn(before.external, after.external),
    other_kib: perConn(
      before.rss - before.heapTotal - before.external,
      after.rss - after.heapTotal - after.external,
    ),
  };
}
console.log(JSON.stringify({ n: N, date: new Date().toISOString(), loadavg: Deno.loadavg() }));
const rows: string[][] = [];
const cliRows: [string, string[], string | number][] = [];
for (const kind of KINDS) {
  if (ONLY && !ONLY.includes(kind.name)) continue;
  const child = new Child(kind);
  try {
    const port = await child.port();
    const before = await child.memory();
    const conns = await openConns(port, kind.lines);
    await new Promise((r) => setTimeout(r, IDLE_S * 1000));
    const after = await child.memory();
    for (const c of conns) c.close();
    const row = "spaces" in before && "spaces" in after
      ? breakdown(kind.name, before, after)
      : { server: kind.name, rss_kib: perConn(before.rss, after.rss) };
    console.log(JSON.stringify({ ...row, rss_mib: [before.rss / 2 ** 20, after.rss / 2 ** 20] }));
    if (kind.cli !== undefined) cliRows.push([kind.name, kind.cli, row.rss_kib]);
    // Measured from outside: the resident set only.
    rows.push(Array.from({ length: 9 }, (_, i) => String(Object.values(row)[i] ?? "–")));
  } finally {
    await child.stop();
  }
}
const head = [
  "server",
  "RSS",
  "V8 heap used",
  "V8 heap total",
  "old space used",
  "old space size",
  "new space size",
  "external",
  "rest",
];
console.log("\nKiB per held connection, N = " + N);
console.log("| " + head.join(" | ") + " |");
console.log("|" + head.map(() => " --- ").join("|") + "|");
for (const r of rows) console.log("| " + r.join(" | ") + " |");
if (cliRows.length > 0) {
  console.log(`\nKiB per held session, \`deno run -A [flags] cli.ts serve\`, N = ${N}`);
  console.log("| flags | KiB per session |\n| --- | --- |");
  for (const [, flags, kib] of cliRows) {
    console.log(`| ${flags.length ? flags.join(" ") : "none"} | ${kib} |`);
  }
}
