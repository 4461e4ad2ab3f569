import assert from "node:assert/strict";
import { addBrowser, CdpClient, CdpError, discoverBrowserWsUrl } from "../../cdp/mod.ts";
import {
  bind,
  connect,
  Environment,
  functionAgent,
  LocalRuntime,
  rollout,
  type Run,
} from "../../mod.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { liveGroupMembers } from "../../_internal/process.ts";

const PAGE = `<!doctype html><html><head><title>cdp test</title></head>
<body><h1 id="greeting">Hello from Deno</h1>
<div style="width:200px;height:100px;background:rgb(255,0,0)"></div></body></html>`;

function serve() {
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    () => new Response(PAGE, { headers: { "content-type": "text/html; charset=utf-8" } }),
  );
  return server;
}

async function assertDirGone(path: string) {
  await assert.rejects(Deno.stat(path), Deno.errors.NotFound);
}

/** Streams may already have closed the resource (EOF / pipeTo closing the writable). */
function closeQuietly(conn: Deno.Conn) {
  try {
    conn.close();
  } catch (error) {
    if (!(error instanceof Deno.errors.BadResource)) throw error;
  }
}

/** Minimal TCP forwarder to check that discovery rewrites host:port. */
function forward(targetPort: number) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns = new Set<Deno.Conn>();
  const pipes: Promise<void>[] = [];
  const pipe = (from: Deno.Conn, to: Deno.Conn) =>
    from.readable.pipeTo(to.writable).catch(() => {}).finally(() => {
      for (const c of [from, to]) if (conns.delete(c)) closeQuietly(c);
    });
  const accepting = (async () => {
    for await (const inbound of listener) {
      const outbound = await Deno.connect({ hostname: "127.0.0.1", port: targetPort });
      conns.add(inbound);
      conns.add(outbound);
      pipes.push(pipe(inbound, outbound), pipe(outbound, inbound));
    }
  })().catch(() => {});
  return {
    port: (listener.addr as Deno.NetAddr).port,
    async close() {
      listener.close();
      await accepting;
      for (const c of conns) closeQuietly(c);
      conns.clear();
      await Promise.all(pipes);
    },
  };
}

Deno.test("CdpClient drives headless Chromium end to end", async (t) => {
  const signal = AbortSignal.timeout(60_000);
  const browser = await launchChromium({ signal });
  const server = serve();
  let client: CdpClient | undefined;
  try {
    assert.match(browser.wsUrl, /^ws:\/\/127\.0\.0\.1:\d+\/devtools\/browser\/[\w-]+$/);
    assert.deepEqual(liveGroupMembers(browser.pid).includes(browser.pid), true);

    await t.step("discovery via /json/version matches DevToolsActivePort", async () => {
      const url = await discoverBrowserWsUrl(`127.0.0.1:${browser.port}`, { signal });
      assert.equal(url, browser.wsUrl);
    });

    await t.step("discovery through a forwarder rewrites host:port", async () => {
      const fwd = forward(browser.port);
      try {
        const url = await discoverBrowserWsUrl(`127.0.0.1:${fwd.port}`, { signal });
        assert.equal(new URL(url).port, String(fwd.port));
        await using viaFwd = await CdpClient.connect(url, { signal });
        const v = await viaFwd.send<{ product: string }>("Browser.getVersion", {}, { signal });
        assert.match(v.product, /Chrome\//);
      } finally {
        await fwd.close();
      }
    });

    client = await CdpClient.connect(browser.wsUrl, { signal });
    const c = client;

    await t.step("protocol errors become CdpError with code", async () => {
      const err = await c.send("No.suchMethod", {}, { signal }).catch((e: unknown) => e);
      assert.ok(err instanceof CdpError);
      assert.equal(err.name, "CdpError");
      assert.equal(err.kind, "protocol");
      assert.equal(err.code, -32601);
      assert.match(err.message, /No\.suchMethod/);
    });

    await t.step("send honours an aborted signal", async () => {
      await assert.rejects(
        c.send("Browser.getVersion", {}, { signal: AbortSignal.abort() }),
        { name: "AbortError" },
      );
      await assert.rejects(
        c.waitFor("Never.happens", undefined, { signal: AbortSignal.timeout(50) }),
        { name: "TimeoutError" },
      );
    });

    await t.step("page: navigate, evaluate, screenshot, exceptions", async () => {
      const targetCreated = c.waitFor(
        "Target.targetCreated",
        (p) => (p.targetInfo as { type?: string } | undefined)?.type === "page",
        { signal },
      );
      await c.send("Target.setDiscoverTargets", { discover: true }, { signal });
      await using page = await c.newPage("about:blank", { signal });
      await targetCreated;
      assert.ok(page.targetId);
      assert.ok(page.sessionId);

      const seen: string[] = [];
      const off = page.on("Page.frameNavigated", (p) => {
        const frame = p.frame as { url?: string };
        if (frame.url) seen.push(frame.url);
      });
      const url = `http://127.0.0.1:${server.addr.port}/`;
      const nav = await page.navigate(url, { signal });
      off();
      assert.ok(nav.loaderId);
      assert.deepEqual(seen, [url]);

      assert.equal(await page.evaluate("document.title", { signal }), "cdp test");
      assert.equal(
        await page.evaluate<string>("document.querySelector('#greeting').textContent", { signal }),
        "Hello from Deno",
      );
      assert.deepEqual(await page.evaluate("Promise.resolve({a: [1, 2]})", { signal }), {
        a: [1, 2],
      });

      const png = await page.screenshot({ signal });
      assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
      assert.ok(png.length > 1000);

      const err = await page.evaluate("throw new RangeError('boom')", { signal }).catch((
        e: unknown,
      ) => e);
      assert.ok(err instanceof CdpError);
      assert.equal(err.kind, "exception");
      assert.match(err.message, /RangeError: boom/);
      assert.ok(err.exceptionDetails);

      await assert.rejects(page.evaluate("Promise.reject(new Error('async boom'))", { signal }), {
        name: "CdpError",
        message: /async boom/,
      });

      const closedPort = (() => {
        const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
        l.close();
        return (l.addr as Deno.NetAddr).port;
      })();
      const failed = await page.navigate(`http://127.0.0.1:${closedPort}/`, { signal })
        .catch((e: unknown) => e);
      assert.ok(failed instanceof CdpError);
      assert.match(failed.message, /ERR_CONNECTION_REFUSED/);
    });

    await t.step("events() iterator yields session events", async () => {
      await using page = await c.newPage("about:blank", { signal });
      const ac = new AbortController();
      const got: string[] = [];
      const reading = (async () => {
        for await (
          const ev of c.events({
            methods: ["Runtime.consoleAPICalled"],
            sessionId: page.sessionId,
            signal: AbortSignal.any([ac.signal, signal]),
          })
        ) {
          const args = ev.params.args as { value?: unknown }[];
          got.push(String(args[0]?.value));
          if (got.length === 2) ac.abort();
        }
      })();
      await page.evaluate("console.log('one'); console.log('two')", { signal });
      await reading;
      assert.deepEqual(got, ["one", "two"]);
    });

    await t.step("close is idempotent and rejects later calls", async () => {
      await c.close();
      await c.close();
      assert.equal(c.isClosed, true);
      await assert.rejects(c.send("Browser.getVersion"), (e: unknown) => {
        assert.ok(e instanceof CdpError);
        assert.equal(e.kind, "closed");
        return true;
      });
    });
  } finally {
    await client?.close();
    await server.shutdown();
    await browser.close();
  }
  assert.deepEqual(liveGroupMembers(browser.pid), []);
  await assertDirGone(browser.userDataDir);
});

Deno.test("CdpClient rejects pending calls when the browser dies", async () => {
  const signal = AbortSignal.timeout(30_000);
  const browser = await launchChromium({ signal });
  try {
    await using client = await CdpClient.connect(browser.wsUrl, { signal });
    await using page = await client.newPage("about:blank", { signal });
    const never = page.evaluate("new Promise(() => {})", { signal });
    const waiting = client.waitFor("Never.happens", undefined, { signal });
    const all = Promise.allSettled([never, waiting]);
    await browser.close();
    for (const r of await all) {
      if (r.status !== "rejected") assert.fail("expected rejection");
      const e: unknown = r.reason;
      assert.ok(e instanceof CdpError, String(e));
      assert.equal(e.kind, "closed");
      assert.match(e.message, /closed/);
    }
    await client.closed;
    assert.equal(client.isClosed, true);
  } finally {
    await browser.close();
  }
  assert.deepEqual(liveGroupMembers(browser.pid), []);
  await assertDirGone(browser.userDataDir);
});

Deno.test("CdpClient.connect() fails cleanly with TypeError or abort", async () => {
  await assert.rejects(CdpClient.connect("http://127.0.0.1:1/"), TypeError);
  await assert.rejects(CdpClient.connect("ws://127.0.0.1:1/devtools/browser/x"), TypeError);
  await assert.rejects(
    CdpClient.connect("ws://127.0.0.1:1/x", { signal: AbortSignal.abort() }),
    { name: "AbortError" },
  );
});

Deno.test("launchChromium() reports an early exit with stderr", async () => {
  await assert.rejects(
    launchChromium({ executable: "false", signal: AbortSignal.timeout(10_000) }),
    { name: "TypeError", message: /exited early/ },
  );
});

Deno.test("launchChromium() watchdog kills the browser group when Deno dies", async () => {
  const script = `import { launchChromium } from ${
    JSON.stringify(import.meta.resolve("../../cdp/_chromium.ts"))
  };
const b = await launchChromium({ signal: AbortSignal.timeout(20_000) });
console.log(JSON.stringify({ pid: b.pid, dir: b.userDataDir }));
Deno.exit(0); // no close()`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", script],
    stdout: "piped",
    stderr: "null",
    signal: AbortSignal.timeout(30_000),
  }).output();
  assert.equal(out.code, 0);
  const { pid, dir } = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    pid: number;
    dir: string;
  };
  for (let i = 0; i < 200 && liveGroupMembers(pid).length > 0; i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.deepEqual(liveGroupMembers(pid), []);
  await Deno.remove(dir, { recursive: true }); // profile is left behind in this case
});

// ------------------------------------------------------------ the browser capability

/** Live processes whose command line contains `marker`. */
function processesWith(marker: string): number[] {
  const out: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const cmdline = Deno.readTextFileSync(`/proc/${entry.name}/cmdline`);
      const stat = Deno.readTextFileSync(`/proc/${entry.name}/stat`);
      const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
      if (cmdline.includes(marker) && state !== "Z") out.push(Number(entry.name));
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

/**
 * An environment that serves a page with a code and publishes a browser:
 * the agent must read the code through the browser.
 */
function vaultEnv(marker: string): Environment {
  const env = new Environment("vault", { version: "1.0.0" });
  let site: Deno.HttpServer<Deno.NetAddr> | null = null;
  let code = "";
  env.initialize(() => {
    code = String(100_000 + Math.floor(Math.random() * 900_000));
    site = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      () =>
        new Response(
          `<!doctype html><title>vault</title><p>The code is <b id="code">${code}</b></p>`,
          { headers: { "content-type": "text/html; charset=utf-8" } },
        ),
    );
  });
  env.shutdown(async () => {
    await site?.shutdown();
    site = null;
  });
  addBrowser(env, { args: [`--hud-test-marker=${marker}`] });
  env.template({ id: "read_code" }, async function* () {
    const answer = yield `Open http://127.0.0.1:${site!.addr.port}/ in the browser ` +
      "and answer with the code on the page.";
    yield String(answer).trim() === code ? 1 : 0;
  });
  return env;
}

Deno.test("addBrowser() publishes a browser an agent drives through the forwarder", async (t) => {
  const marker = crypto.randomUUID();
  const env = vaultEnv(marker);

  await t.step(
    'HudClient.open("cdp") and open("browser") reach the browser at the forwarder\'s port',
    async () => {
      const signal = AbortSignal.timeout(45_000);
      await env.start();
      try {
        assert.ok(processesWith(marker).length > 0, "no browser process with the marker");
        await using server = bind(env);
        await using client = await connect(server, { readyTimeout: 10_000 });
        const published = env.capability("browser")!;
        const local = client.binding("browser");
        assert.equal(local.protocol, "cdp/1.3");
        assert.notEqual(new URL(local.url).port, new URL(published.url).port);
        assert.equal(new URL(local.url).pathname, new URL(published.url).pathname);
        await using cdp = await client.open("cdp", { signal });
        const { product } = await cdp.send<{ product: string }>("Browser.getVersion", {}, {
          signal,
        });
        assert.match(product, /Chrome\//);
        await using named = await client.open("browser", { signal });
        assert.equal(named.isClosed, false);
      } finally {
        await env.stop();
      }
      assert.deepEqual(processesWith(marker), [], "the browser outlived env.stop()");
      assert.equal(env.capability("browser"), undefined);
    },
  );

  await t.step("an agent reads the page through the browser and scores 1", async () => {
    const agent = functionAgent(async (prompt, run: Run, { signal }) => {
      await using cdp = await run.client.open("cdp", { signal });
      await using page = await cdp.newPage("about:blank", { signal });
      const url = /http:\/\/\S+\//.exec(String(prompt))![0];
      await page.navigate(url, { signal });
      return await page.evaluate<string>("document.getElementById('code').textContent", {
        signal,
      });
    });
    const run = await rollout(
      { env: "vault", id: "read_code", args: {}, slug: "read_code" },
      agent,
      { runtime: new LocalRuntime(env), rolloutTimeout: 45_000, fileTracking: false },
    );
    assert.deepEqual(run.trace.errors, []);
    assert.equal(run.reward, 1);
    assert.deepEqual(processesWith(marker), [], "the browser outlived the rollout");
  });
});

Deno.test("addBrowser() reports a missing executable in one line", async () => {
  const env = new Environment("nobrowser");
  addBrowser(env, { executable: "/nonexistent/chromium" });
  await assert.rejects(env.start(), { message: /"\/nonexistent\/chromium" is not installed/ });
  await env.stop();
});
