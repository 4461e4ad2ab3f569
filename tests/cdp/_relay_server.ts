// A test's stand-in for the control server's tunnel: a loopback listener
// that hands each connection to the browser's relay, as `tunnel.open` does.

import type { ChromiumProcess } from "../../cdp/_chromium.ts";

/** Closes a connection the relay may already have closed. */
function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch (error) {
    if (!(error instanceof Deno.errors.BadResource)) throw error;
  }
}

/** Serves `browser.attach` on 127.0.0.1 (port 0) until `close()`. */
export function serveRelay(browser: Pick<ChromiumProcess, "attach">): {
  port: number;
  close(): Promise<void>;
} {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns = new Set<Deno.Conn>();
  const tasks = new Set<Promise<void>>();
  const accepting = (async () => {
    for await (const conn of listener) {
      conns.add(conn);
      const task = browser.attach(conn, new Uint8Array()).catch(() => {}).finally(() => {
        conns.delete(conn);
        closeQuietly(conn);
      });
      tasks.add(task);
      task.finally(() => tasks.delete(task));
    }
  })().catch(() => {});
  return {
    port: listener.addr.port,
    async close() {
      listener.close();
      await accepting;
      for (const c of conns) closeQuietly(c);
      await Promise.allSettled([...tasks]);
    },
  };
}
