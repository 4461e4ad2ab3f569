import { test } from "../_test.ts";
import { CHROMIUM } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { CdpClient, CdpError, discoverBrowserWsUrl } from "../../cdp/mod.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { liveGroupMembers } from "../../_internal/process.ts";
import { serveRelay } from "./_relay_server.ts";

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

test("CdpClient drives headless Chromium end to end", { needs: [CHROMIUM] }, async (t) => {
  const signal = AbortSignal.timeout(60_000);
  const browser = await launchChromium({ signal });
  // The test's own stand-in for the tunnel: each connection goes to the relay.
  const relay = serveRelay(browser);
  const wsUrl = `ws://127.0.0.1:${relay.port}${browser.path}`;
  const server = serve();
  let client: CdpClient | undefined;
  try {
    assert.match(browser.path, /^\/devtools\/browser\/[\w-]+$/);
    assert.deepEqual(liveGroupMembers(browser.pid).includes(browser.pid), true);

    await t.step("discovery via /json/version names the browser's endpoint", async () => {
      const url = await discoverBrowserWsUrl(`127.0.0.1:${relay.port}`, { signal });
      assert.equal(url, wsUrl);
    });

    await t.step("discovery through a forwarder rewrites host:port", async () => {
      const fwd = forward(relay.port);
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

    client = await CdpClient.connect(wsUrl, { signal });
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
    await relay.close();
    await browser.close();
  }
  assert.deepEqual(liveGroupMembers(browser.pid), []);
  await assertDirGone(browser.dir);
});

test("CdpClient rejects pending calls when the browser dies", { needs: [CHROMIUM] }, async () => {
  const signal = AbortSignal.timeout(30_000);
  const browser = await launchChromium({ signal });
  const relay = serveRelay(browser);
  try {
    await using client = await CdpClient.connect(
      `ws://127.0.0.1:${relay.port}${browser.path}`,
      { signal },
    );
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
    await relay.close();
    await browser.close();
  }
  assert.deepEqual(liveGroupMembers(browser.pid), []);
  await assertDirGone(browser.dir);
});

test("CdpClient.connect() fails cleanly with TypeError or abort", async () => {
  await assert.rejects(CdpClient.connect("http://127.0.0.1:1/"), TypeError);
  await assert.rejects(CdpClient.connect("ws://127.0.0.1:1/devtools/browser/x"), TypeError);
  await assert.rejects(
    CdpClient.connect("ws://127.0.0.1:1/x", { signal: AbortSignal.abort() }),
    { name: "AbortError" },
  );
});

test("launchChromium() reports an early exit with stderr", async () => {
  await assert.rejects(
    launchChromium({ executable: "false", signal: AbortSignal.timeout(10_000) }),
    { name: "TypeError", message: /exited early/ },
  );
});

test("launchChromium()'s browser exits when this process dies without close()", {
  needs: [CHROMIUM],
}, async () => {
  // No watchdog: Chromium reads the pipe, and the pipe closes with us.
  const script = `import { launchChromium } from ${
    JSON.stringify(import.meta.resolve("../../cdp/_chromium.ts"))
  };
const b = await launchChromium({ signal: AbortSignal.timeout(20_000) });
console.log(JSON.stringify({ pid: b.pid, dir: b.dir }));
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
  for (let i = 0; i < 500 && liveGroupMembers(pid).length > 0; i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.deepEqual(liveGroupMembers(pid), []);
  await Deno.remove(dir, { recursive: true }); // the profile is left behind in this case
});
