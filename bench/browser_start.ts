// The browser from start to first page: `env.start()` with addBrowser, then
// through the control port as an agent does (bind, connect, open), a new
// page, a navigation to a page the environment serves on 127.0.0.1, and its
// title read back; then `env.stop()`. Interleaved rounds of this checkout and,
// with --before=DIR, of another checkout's addBrowser (the same flow, with
// whatever sandbox that code gives the browser).
//
//   git worktree add --detach /tmp/hud-before 1d43f44
//   deno run -A bench/browser_start.ts --before=/tmp/hud-before [--runs=10] [--unshare]
//   git worktree remove /tmp/hud-before
//
// Prints one JSON line per variant: medians and quartiles in milliseconds of
// `start` (env.start) and `first_page` (from env.start to the title), and
// `stop` (env.stop).
//
//   deno run -A bench/browser_start.ts --parts [--runs=6]
//
// instead times the parts in this checkout, in interleaved rounds: the
// sandbox probe, Chromium from spawn to its first answer on the pipe
// (unconfined, in bubblewrap with and without Chromium's own sandbox, with
// the hostPorts relay), and a new page in a window of its own against one
// in a tab of the shared window.

const arg = (name: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3);
const RUNS = Number(arg("runs") ?? 10);
const before = arg("before");

interface SdkFace {
  Environment: new (name: string) => {
    start(): Promise<void>;
    stop(): Promise<void>;
  };
  addBrowser(env: unknown, options?: Record<string, unknown>): void;
  bind(env: unknown): AsyncDisposable & { shutdown(): Promise<void> };
  connect(server: unknown): Promise<
    AsyncDisposable & {
      /** This checkout's (async, any protocol). */
      open?(ref: string): Promise<CdpFace>;
      /** What 1d43f44 had for a browser. */
      openCdp?(ref: string): Promise<CdpFace>;
    }
  >;
}

type CdpFace = AsyncDisposable & {
  newPage(): Promise<
    AsyncDisposable & {
      navigate(url: string): Promise<unknown>;
      evaluate<T>(expression: string): Promise<T>;
    }
  >;
};

interface Variant {
  name: string;
  sdk: SdkFace;
  options: Record<string, unknown>;
  start: number[];
  firstPage: number[];
  stop: number[];
}

if (Deno.args.includes("--parts")) {
  await parts();
  Deno.exit(0);
}

const here = {
  ...(await import("../env.ts")),
  ...(await import("../server.ts")),
  ...(await import("../client.ts")),
  ...(await import("../workspace/mod.ts")),
} as unknown as SdkFace;
const variants: Variant[] = [];
const add = (name: string, sdk: SdkFace, options: Record<string, unknown> = {}) =>
  variants.push({ name, sdk, options, start: [], firstPage: [], stop: [] });
if (before !== undefined) {
  add("before", (await import(`file://${before.replace(/\/$/, "")}/mod.ts`)) as SdkFace);
}

const site = Deno.serve(
  { hostname: "127.0.0.1", port: 0, onListen: () => {} },
  () =>
    new Response("<!doctype html><title>first page</title><p>hello</p>", {
      headers: { "content-type": "text/html; charset=utf-8" },
    }),
);
const url = `http://127.0.0.1:${site.addr.port}/`;
add("after", here, { hostPorts: [site.addr.port] });
if (Deno.args.includes("--unshare")) {
  add("after (unshare)", here, { hostPorts: [site.addr.port], isolation: "unshare" });
}

async function once(v: Variant, record: boolean): Promise<void> {
  const env = new v.sdk.Environment("bench-browser");
  v.sdk.addBrowser(env, v.options);
  const t0 = performance.now();
  await env.start();
  const started = performance.now();
  try {
    await using server = v.sdk.bind(env);
    await using client = await v.sdk.connect(server);
    await using cdp = await (client.openCdp ?? client.open)!.call(client, "browser");
    await using page = await cdp.newPage();
    await page.navigate(url);
    const title = await page.evaluate<string>("document.title");
    if (title !== "first page") throw new Error(`${v.name}: unexpected title "${title}"`);
    if (record) {
      v.start.push(started - t0);
      v.firstPage.push(performance.now() - t0);
    }
  } finally {
    const s = performance.now();
    await env.stop();
    if (record) v.stop.push(performance.now() - s);
  }
}

try {
  for (let round = 0; round < RUNS + 1; round++) {
    for (const v of variants) await once(v, round > 0); // round 0 warms up
  }
} finally {
  await site.shutdown();
}

const load = Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
for (const v of variants) {
  console.log(JSON.stringify({
    figure: "browser_start_to_first_page_ms",
    variant: v.name,
    runs: v.firstPage.length,
    start_ms: q(v.start, 0.5),
    first_page_ms: q(v.firstPage, 0.5),
    first_page_q1_q3: [q(v.firstPage, 0.25), q(v.firstPage, 0.75)],
    stop_ms: q(v.stop, 0.5),
    load_average: load,
  }));
}

async function parts(): Promise<void> {
  const { launchChromium } = await import("../cdp/_chromium.ts");
  const { chooseSandbox, spawnInSandbox } = await import("../workspace/_sandbox.ts");
  type Launch = Parameters<typeof launchChromium>[0];
  const times: Record<string, number[]> = {};
  const record = (key: string, ms: number) => (times[key] ??= []).push(ms);
  const user = Deno.uid() === 0 ? { uid: 65534, gid: 65534 } : null;
  const kinds = ["unconfined", "bwrap", "bwrap --no-sandbox", "bwrap + hostPorts"];
  for (let round = 0; round < RUNS + 1; round++) {
    for (const kind of kinds) {
      const dir = await Deno.makeTempDir({ prefix: "hud-browser-bench-" });
      if (user !== null) await Deno.chown(dir, user.uid, user.gid);
      try {
        let t = performance.now();
        const chosen = await chooseSandbox(
          "bwrap",
          { writable: [dir], network: false, user },
          dir,
          {
            what: "browser",
            runs: "Chromium",
          },
        );
        const probe = performance.now() - t;
        const options: Launch = kind === "unconfined" ? { dir } : {
          dir,
          spawn: (argv, env) => spawnInSandbox(argv, { cwd: dir, env, sandbox: chosen }),
          chromiumSandbox: kind !== "bwrap --no-sandbox",
          hostPorts: kind === "bwrap + hostPorts" ? [40_000 + round] : [],
        };
        t = performance.now();
        await using browser = await launchChromium(options);
        const launch = performance.now() - t;
        await using cdp = browser.connect();
        const page = async (newWindow: boolean) => {
          const t0 = performance.now();
          const { targetId } = await cdp.send<{ targetId: string }>("Target.createTarget", {
            url: "about:blank",
            newWindow,
          });
          await using session = await cdp.attachToTarget(targetId);
          await Promise.all([session.send("Page.enable"), session.send("Runtime.enable")]);
          return performance.now() - t0;
        };
        const tab = await page(false);
        const window = await page(true);
        if (round === 0) continue; // warm-up
        if (kind === "bwrap") record("sandbox probe", probe);
        record(`launch: ${kind}`, launch);
        if (kind === "unconfined") {
          record("new page: tab", tab);
          record("new page: window", window);
        }
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
    }
  }
  const load = Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
  for (const [part, xs] of Object.entries(times)) {
    console.log(JSON.stringify({
      figure: "browser_start_parts_ms",
      part,
      runs: xs.length,
      median_ms: q(xs, 0.5),
      q1_q3: [q(xs, 0.25), q(xs, 0.75)],
      load_average: load,
    }));
  }
}

/** The `p` quantile of `xs`, rounded. */
function q(xs: number[], p: number): number {
  return Math.round([...xs].sort((a, b) => a - b)[Math.floor(p * (xs.length - 1))]);
}
