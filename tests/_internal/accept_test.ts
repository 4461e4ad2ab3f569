import { test } from "../_test.ts";
import { LINUX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { acceptLoop } from "../../_internal/accept.ts";

test("acceptLoop() hands over each connection and ends when the listener closes", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepted: Deno.Conn[] = [];
  const errors: unknown[] = [];
  let closing = false;
  const loop = acceptLoop(listener, (conn) => {
    accepted.push(conn);
    if (accepted.length === 1) throw new Error("handler broke");
  }, { closing: () => closing, onError: (e) => errors.push(e) });
  const a = await Deno.connect({ hostname: "127.0.0.1", port: listener.addr.port });
  const b = await Deno.connect({ hostname: "127.0.0.1", port: listener.addr.port });
  while (accepted.length < 2) await new Promise((r) => setTimeout(r, 5));
  closing = true;
  listener.close();
  await loop;
  for (const c of [a, b, ...accepted]) c.close();
  assert.equal(accepted.length, 2, "a throwing handler does not stop the loop");
  assert.deepEqual(errors.map((e) => String(e)), ["Error: handler broke"]);
});

test({
  name: "acceptLoop() outlives running out of file descriptors (the file tracker's listener)",
  needs: [LINUX],
  async fn() {
    const fixture = new URL("../fixtures/emfile_tracker.ts", import.meta.url);
    const out = await new Deno.Command("prlimit", {
      args: ["--nofile=64", Deno.execPath(), "run", "-A", fixture.pathname],
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(60_000),
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assert.ok(out.success, new TextDecoder().decode(out.stderr));
    const result = JSON.parse(text.trim().split("\n").at(-1)!);
    assert.match(result.filled, /Too many open files/, "the descriptor table did fill");
    assert.ok(
      result.errors.some((e: string) => /Too many open files/.test(e)),
      "the tracker's accept() saw EMFILE and reported it",
    );
    assert.equal(result.after, "files_scanned=0", "the tracker accepts again afterwards");
  },
});
