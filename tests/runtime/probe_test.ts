import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { holdReady, probeReady } from "../../runtime/_probe.ts";
import { bind } from "../../server.ts";
import { HudProtocolError, NotReadyError } from "../../errors.ts";
import { demoEnv } from "../_helpers.ts";

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = l.addr.port;
  l.close();
  return port;
}

test("probeReady() waits for a server that starts late, with its token", async () => {
  const port = freePort();
  const token = "p".repeat(64);
  let server: ReturnType<typeof bind> | null = null;
  const timer = setTimeout(() => server = bind(demoEnv(), { port, token }), 300);
  try {
    await probeReady({ hostname: "127.0.0.1", port, token }, {
      readyTimeout: 20_000,
      retryInterval: 50,
    });
    assert.ok(server !== null);
  } finally {
    clearTimeout(timer);
    await (server as ReturnType<typeof bind> | null)?.shutdown();
  }
});

test("probeReady() fails at once on a wrong token, and in time where nothing listens", async () => {
  await using server = bind(demoEnv(), { token: "a".repeat(64) });
  await assert.rejects(
    probeReady({ hostname: "127.0.0.1", port: server.addr.port, token: "b".repeat(64) }, {
      readyTimeout: 30_000,
    }),
    (e: unknown) => e instanceof HudProtocolError && e.code === -32001,
  );
  await assert.rejects(
    probeReady({ hostname: "127.0.0.1", port: freePort() }, {
      readyTimeout: 30_000,
      refusedTimeout: 200,
    }),
    (e: unknown) => e instanceof NotReadyError && /nothing listens there/.test(e.message),
  );
});

test("holdReady() keeps its hello's session open, and its end says the server went away", async () => {
  const token = "h".repeat(64);
  const server = bind(demoEnv(), { token });
  try {
    const held = await holdReady(
      { hostname: "127.0.0.1", port: server.addr.port, token },
      { readyTimeout: 10_000 },
    );
    assert.equal(server.sessionCount, 1, "the hello's session is held");
    let ended = false;
    const watching = held.ended.then(() => ended = true);
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(ended, false, "nothing ends it while the server runs");
    await server.shutdown();
    await watching;
    held.close();
  } finally {
    await server.shutdown();
  }
});
