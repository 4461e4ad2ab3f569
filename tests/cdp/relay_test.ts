// The relay's HTTP and WebSocket side, byte by byte, and its sessions: what
// a CDP client (or a web page trying to be one) meets at the end of the
// tunnel. One real Chromium over the pipe, reached through a loopback
// stand-in for the tunnel.

import { test } from "../_test.ts";
import { CHROMIUM } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { CdpClient, CdpError } from "../../cdp/mod.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { serveRelay } from "./_relay_server.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Reads until the peer closes; returns everything as text. */
async function readAll(conn: Deno.Conn): Promise<string> {
  const parts: Uint8Array[] = [];
  const buf = new Uint8Array(65536);
  while (true) {
    const n = await conn.read(buf).catch(() => null);
    if (n === null) break;
    parts.push(buf.slice(0, n));
  }
  return decoder.decode(new Uint8Array(parts.flatMap((p) => [...p])));
}

/** One raw HTTP exchange; returns the whole response. */
async function http(port: number, request: string): Promise<string> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    await conn.write(encoder.encode(request));
    return await readAll(conn);
  } finally {
    conn.close();
  }
}

function upgrade(path: string, extra = ""): string {
  return `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n` +
    `Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n` +
    `Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n${extra}\r\n`;
}

/** A client frame, masked as RFC 6455 requires (unless `masked` is false). */
function clientFrame(opcode: number, payload: Uint8Array, fin = true, masked = true): Uint8Array {
  const n = payload.length;
  const head = n < 126 ? [n] : [126, n >> 8, n & 0xff];
  const mask = masked ? [1, 2, 3, 4] : [];
  const out = new Uint8Array(1 + head.length + mask.length + n);
  out[0] = (fin ? 0x80 : 0) | opcode;
  out.set(head, 1);
  out[1] |= masked ? 0x80 : 0;
  out.set(mask, 1 + head.length);
  for (let i = 0; i < n; i++) {
    out[1 + head.length + mask.length + i] = payload[i] ^ (mask[i & 3] ?? 0);
  }
  return out;
}

/** Reads server frames: [opcode, payload] pairs, until `count` or the end. */
class FrameReader {
  #conn: Deno.Conn;
  #buf: Uint8Array = new Uint8Array(0);
  constructor(conn: Deno.Conn, head: Uint8Array) {
    this.#conn = conn;
    this.#buf = head;
  }
  async #need(n: number): Promise<boolean> {
    while (this.#buf.length < n) {
      const chunk = new Uint8Array(65536);
      const got = await this.#conn.read(chunk).catch(() => null);
      if (got === null) return false;
      const next = new Uint8Array(this.#buf.length + got);
      next.set(this.#buf);
      next.set(chunk.subarray(0, got), this.#buf.length);
      this.#buf = next;
    }
    return true;
  }
  async next(): Promise<[number, Uint8Array] | null> {
    if (!await this.#need(2)) return null;
    let len = this.#buf[1] & 0x7f;
    let off = 2;
    if (len === 126) {
      if (!await this.#need(4)) return null;
      len = (this.#buf[2] << 8) | this.#buf[3];
      off = 4;
    } else if (len === 127) {
      if (!await this.#need(10)) return null;
      len = Number(new DataView(this.#buf.buffer, this.#buf.byteOffset).getBigUint64(2));
      off = 10;
    }
    if (!await this.#need(off + len)) return null;
    const frame: [number, Uint8Array] = [this.#buf[0] & 0x0f, this.#buf.slice(off, off + len)];
    this.#buf = this.#buf.slice(off + len);
    return frame;
  }
}

/** Opens a raw WebSocket to the relay; returns the connection and a frame reader. */
async function rawSocket(port: number, path: string): Promise<{
  conn: Deno.Conn;
  frames: FrameReader;
  send(text: string): Promise<void>;
}> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  await conn.write(encoder.encode(upgrade(path)));
  let got = new Uint8Array(0);
  let end = -1;
  while (end < 0) {
    const chunk = new Uint8Array(4096);
    const n = await conn.read(chunk);
    assert.notEqual(n, null, "the relay closed during the handshake");
    got = new Uint8Array([...got, ...chunk.subarray(0, n!)]);
    end = decoder.decode(got).indexOf("\r\n\r\n");
  }
  const head = decoder.decode(got.subarray(0, end));
  assert.match(head, /^HTTP\/1\.1 101 /);
  // The accept value for the RFC's sample key.
  assert.match(head, /Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK\+xOo=/i);
  return {
    conn,
    frames: new FrameReader(conn, got.slice(end + 4)),
    send: async (text) => {
      await conn.write(clientFrame(1, encoder.encode(text)));
    },
  };
}

test(
  "the browser relay speaks HTTP and WebSocket as CDP clients expect",
  { needs: [CHROMIUM] },
  async (t) => {
    const signal = AbortSignal.timeout(120_000);
    const browser = await launchChromium({ signal });
    const relay = serveRelay(browser);
    try {
      await t.step(
        "GET /json/version names the browser's endpoint at the request's host",
        async () => {
          const res = await http(
            relay.port,
            `GET /json/version HTTP/1.1\r\nHost: 127.0.0.1:${relay.port}\r\n\r\n`,
          );
          assert.match(res, /^HTTP\/1\.1 200 /);
          const body = JSON.parse(res.slice(res.indexOf("\r\n\r\n") + 4));
          assert.equal(body.webSocketDebuggerUrl, `ws://127.0.0.1:${relay.port}${browser.path}`);
          assert.equal(body["Protocol-Version"], "1.3");
          assert.match(body.Browser, /Chrome\//);
          // Playwright asks with a trailing slash.
          assert.match(
            await http(relay.port, "GET /json/version/ HTTP/1.1\r\nHost: localhost\r\n\r\n"),
            /^HTTP\/1\.1 200 /,
          );
        },
      );

      await t.step("other paths are 404, a bad request 400", async () => {
        assert.match(
          await http(relay.port, "GET /json/list HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
          /^HTTP\/1\.1 404 /,
        );
        assert.match(
          await http(relay.port, upgrade("/devtools/browser/guess")),
          /^HTTP\/1\.1 404 /,
        );
        assert.match(await http(relay.port, "hello\r\n\r\n"), /^HTTP\/1\.1 400 /);
      });

      await t.step("a Host that is not an IP or localhost is refused (DNS rebinding)", async () => {
        const res = await http(
          relay.port,
          "GET /json/version HTTP/1.1\r\nHost: rebind.attacker.example\r\n\r\n",
        );
        assert.match(res, /^HTTP\/1\.1 403 /);
        assert.doesNotMatch(res, /webSocketDebuggerUrl/);
      });

      await t.step("a WebSocket upgrade with an Origin (a web page) is refused", async () => {
        const res = await http(
          relay.port,
          upgrade(browser.path, "Origin: https://attacker.example\r\n"),
        );
        assert.match(res, /^HTTP\/1\.1 403 /);
      });

      await t.step(
        "frames: fragments, ping, bad messages, then an unmasked frame closes",
        async () => {
          const ws = await rawSocket(relay.port, browser.path);
          try {
            const json = encoder.encode(JSON.stringify({ id: 7, method: "Browser.getVersion" }));
            await ws.conn.write(clientFrame(1, json.subarray(0, 10), false));
            await ws.conn.write(clientFrame(9, encoder.encode("hi"))); // a ping between fragments
            await ws.conn.write(clientFrame(0, json.subarray(10)));
            const pong = await ws.frames.next();
            assert.deepEqual([pong![0], decoder.decode(pong![1])], [10, "hi"]);
            const reply = await ws.frames.next();
            assert.equal(reply![0], 1);
            const version = JSON.parse(decoder.decode(reply![1]));
            assert.equal(version.id, 7);
            assert.equal(
              version.sessionId,
              undefined,
              "the client's browser session shows through",
            );
            assert.match(version.result.product, /Chrome\//);

            await ws.send("not json");
            assert.equal(
              JSON.parse(decoder.decode((await ws.frames.next())![1])).error.code,
              -32700,
            );
            await ws.send(JSON.stringify({ method: "Browser.getVersion" }));
            assert.equal(
              JSON.parse(decoder.decode((await ws.frames.next())![1])).error.code,
              -32600,
            );

            await ws.conn.write(clientFrame(1, json, true, false));
            const close = await ws.frames.next();
            assert.equal(close![0], 8);
            assert.equal((close![1][0] << 8) | close![1][1], 1002);
            assert.equal(await ws.frames.next(), null);
          } finally {
            ws.conn.close();
          }
        },
      );

      await t.step("a 3 MiB message goes through both ways", async () => {
        await using cdp = await CdpClient.connect(`ws://127.0.0.1:${relay.port}${browser.path}`);
        await using page = await cdp.newPage("about:blank", { signal });
        const big = "x".repeat(3 * 1024 * 1024);
        const length = await page.evaluate<number>(`${JSON.stringify(big)}.length`, { signal });
        assert.equal(length, big.length);
        const echoed = await page.evaluate<string>(`"y".repeat(${big.length})`, { signal });
        assert.equal(echoed.length, big.length);
      });

      await t.step(
        "sessions are a client's own: no events to others, no commands from them, detached when it leaves",
        async () => {
          const a = await CdpClient.connect(`ws://127.0.0.1:${relay.port}${browser.path}`);
          await using b = await CdpClient.connect(`ws://127.0.0.1:${relay.port}${browser.path}`);
          const seenByB: (string | undefined)[] = [];
          const off = b.on("*", (_params, event) => seenByB.push(event.sessionId));
          const page = await a.newPage("about:blank", { signal });
          await page.navigate("data:text/html,<p>a's page</p>", { signal });
          off();
          assert.ok(!seenByB.includes(page.sessionId), "b received events of a's session");
          const attached = async () => {
            const { targetInfos } = await b.send<
              { targetInfos: { targetId: string; attached: boolean }[] }
            >(
              "Target.getTargets",
              {},
              { signal },
            );
            return targetInfos.find((i) => i.targetId === page.targetId)?.attached;
          };
          assert.equal(await attached(), true);
          await assert.rejects(
            b.send("Runtime.evaluate", { expression: "1" }, { sessionId: page.sessionId, signal }),
            (e: unknown) => e instanceof CdpError && e.code === -32001,
          );
          await a.close();
          let still = true;
          for (let i = 0; i < 100 && still; i++) {
            still = (await attached()) === true;
            if (still) await new Promise((r) => setTimeout(r, 20));
          }
          assert.equal(still, false, "the page stayed attached after its client left");
          await b.send("Target.closeTarget", { targetId: page.targetId }, { signal });
        },
      );
    } finally {
      await relay.close();
      await browser.close();
    }
  },
);
