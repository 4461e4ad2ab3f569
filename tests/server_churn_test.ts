// A stranger's churn of connections against a token holder (issue 43, point
// 3): a local user without the token who keeps opening connections must not
// get the holder's hellos refused, nor take the server to its open-files
// limit.

import { test } from "./_test.ts";
import assert from "node:assert/strict";
import { bind } from "../server.ts";
import { demoEnv, RawPeer } from "./_helpers.ts";
import { waitingFor } from "./_deadline.ts";

const TOKEN = "t".repeat(64);
const encoder = new TextEncoder();

/** A server with its defaults in a child whose open-files limit is `limit`. */
async function withLimitedServer(
  limit: number,
  fn: (port: number, pid: number) => Promise<void>,
): Promise<void> {
  const server = new URL("../server.ts", import.meta.url).href;
  const helpers = new URL("./_helpers.ts", import.meta.url).href;
  const code = `
    import { bind } from "${server}";
    import { demoEnv } from "${helpers}";
    const s = bind(demoEnv(), { token: "${TOKEN}", onError: () => {} });
    console.log("PORT=" + s.addr.port);
    await new Response(Deno.stdin.readable).arrayBuffer();
    await s.shutdown();
  `;
  const child = new Deno.Command("bash", {
    args: ["-c", `ulimit -n ${limit} && exec "$0" eval "$1"`, Deno.execPath(), code],
    stdin: "piped",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const out = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  try {
    while (!/PORT=\d+\n/.test(text)) {
      const { value, done } = await waitingFor("the child's port line", out.read(), { ms: 30_000 });
      if (done) throw new Error(`the child exited before its port line: ${text}`);
      text += value;
    }
    await fn(Number(/PORT=(\d+)/.exec(text)![1]), child.pid);
  } finally {
    await child.stdin.close().catch(() => {});
    await out.cancel().catch(() => {});
    await waitingFor("the child to exit", child.status, { ms: 30_000 }).catch(() =>
      child.kill("SIGKILL")
    );
  }
}

/** Descriptors `pid` holds. */
function descriptors(pid: number): number {
  let n = 0;
  try {
    for (const _ of Deno.readDirSync(`/proc/${pid}/fd`)) n++;
  } catch {
    // The child is gone: nothing to count.
  }
  return n;
}

/**
 * One stranger: opens connections as fast as they are accepted, each doing
 * `act`, and keeps at most `hold` of them open (closing the oldest), until
 * `stop` aborts.
 */
async function stranger(
  port: number,
  hold: number,
  act: (conn: Deno.Conn) => Promise<void>,
  stop: AbortSignal,
): Promise<void> {
  const open: Deno.Conn[] = [];
  const stopped = new Promise<null>((resolve) => {
    if (stop.aborted) resolve(null);
    stop.addEventListener("abort", () => resolve(null), { once: true });
  });
  // A paused server leaves connections in the kernel's queue: a connect
  // may still be waiting there when the churn stops, and is closed once
  // it completes (a signal given to Deno.connect leaked one).
  let late: Promise<void> = Promise.resolve();
  try {
    while (!stop.aborted) {
      const attempt = Deno.connect({ hostname: "127.0.0.1", port });
      const conn = await Promise.race([attempt, stopped]).catch(() => undefined);
      if (conn === null) {
        late = attempt.then((c) => c.close(), () => {});
        break;
      }
      if (conn === undefined) {
        await new Promise((r) => setTimeout(r, 5));
        continue;
      }
      open.push(conn);
      await act(conn).catch(() => {});
      if (open.length > hold) {
        try {
          open.shift()!.close();
        } catch { /* closed already */ }
      }
    }
  } finally {
    for (const c of open) {
      try {
        c.close();
      } catch { /* closed already */ }
    }
    await late;
  }
}

const line = (frame: unknown) => encoder.encode(JSON.stringify(frame) + "\n");

test("bind() serves a token holder through a stranger's churn of connections (issue 43, point 3)", async () => {
  // The observation: at an open-files limit of 1,024 (a cap of 768), a
  // stranger's churn got 8 of 30 of the holder's hellos refused and took
  // the server to 1,024 descriptors of 1,024.
  const LIMIT = 1024;
  await withLimitedServer(LIMIT, async (port, pid) => {
    const stop = new AbortController();
    let most = 0;
    const sampler = setInterval(() => most = Math.max(most, descriptors(pid)), 5);
    const strangers = [
      // Connect and say nothing: more than the cap between them.
      stranger(port, 600, async () => {}, stop.signal),
      stranger(port, 600, async () => {}, stop.signal),
      // A hello with a wrong token, never reading the refusal.
      stranger(port, 600, async (c) => {
        await c.write(line({ jsonrpc: "2.0", id: 1, method: "hello", params: { token: "x" } }));
      }, stop.signal),
      // Junk as a first frame.
      stranger(port, 600, async (c) => void await c.write(encoder.encode("junk\n")), stop.signal),
      // A hello without a token.
      stranger(port, 600, async (c) => {
        await c.write(line({ jsonrpc: "2.0", id: 1, method: "hello" }));
      }, stop.signal),
    ];
    const refused: unknown[] = [];

    try {
      // Let the churn fill the server first.
      await new Promise((r) => setTimeout(r, 1500));
      for (let i = 0; i < 30; i++) {
        const peer = await waitingFor(`hello ${i}'s connection`, RawPeer.open(port), {
          ms: 10_000,
        });
        try {
          const reply = await waitingFor(
            `hello ${i}'s reply`,
            peer.call("hello", { token: TOKEN }),
            {
              ms: 10_000,
            },
          );
          if (!reply.result) refused.push(reply.error);
        } catch (err) {
          refused.push(String(err));
        } finally {
          peer.close();
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    } finally {
      stop.abort();
      await Promise.all(strangers);
      clearInterval(sampler);
    }
    assert.deepEqual(refused, [], "every hello of the token holder served");
    assert.ok(most < LIMIT, `the server held ${most} descriptors of ${LIMIT}`);
    // The churn did press the server: to its cap of connections at least.
    assert.ok(most >= 768, `the strangers took the server to ${most} descriptors only`);
  });
});

test("bind() gives a stranger's slot back as soon as it is turned away (issue 43, point 3)", async () => {
  // Before: a refused stranger kept its slot while its refusal was drained
  // (up to a second), so a few wrong hellos that are never closed filled a
  // cap and the token holder was refused.
  await using server = bind(demoEnv(), { maxConnections: 4 });
  const sessions = await Promise.all([RawPeer.login(server), RawPeer.login(server)]);
  const strangers = await Promise.all([
    RawPeer.open(server.addr.port),
    RawPeer.open(server.addr.port),
  ]);
  try {
    for (const s of strangers) {
      const reply = await s.call("hello", { token: "wrong" });
      assert.equal((reply.error as { code: number }).code, -32001);
    }
    // The strangers neither close nor go away: their refusals drain.
    const holder = await RawPeer.login(server);
    holder.close();
    for (const s of sessions) assert.ok((await s.call("tasks.list")).result);
  } finally {
    for (const p of [...sessions, ...strangers]) p.close();
  }
});
