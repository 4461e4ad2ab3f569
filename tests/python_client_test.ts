// Interop: a HUD client written in Python from PROTOCOL.md alone drives our
// server, as the Python SDK's client would.
import assert from "node:assert/strict";
import { Capability } from "../mod.ts";
import { serve } from "../server.ts";
import { demoEnv, echoServer } from "./_helpers.ts";

const python = await new Deno.Command("python3", {
  args: ["--version"],
  stdout: "null",
  stderr: "null",
})
  .output().then((o) => o.success, () => false);

Deno.test({
  name: "serve() is driven by a Python client that follows PROTOCOL.md",
  ignore: !python,
  async fn() {
    const echo = echoServer();
    const env = demoEnv();
    env.addCapability(
      new Capability({ name: "echo", protocol: "tcp/1", url: `tcp://127.0.0.1:${echo.port}` }),
    );
    const lines: string[] = [];
    const server = await serve(env, { announce: (l) => lines.push(l), handleSignals: false });
    try {
      const port = Number(lines[0].split("=")[1]);
      const script = new URL("./fixtures/py_client.py", import.meta.url).pathname;
      const { code, stdout, stderr } = await new Deno.Command("python3", {
        args: [script, String(port)],
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(code, 0, new TextDecoder().decode(stderr));
      const steps = new TextDecoder().decode(stdout).trim().split("\n").map((l) => JSON.parse(l));
      assert.deepEqual(steps, [
        ["hello", { name: "demo", version: "1.2.3" }, ["echo"]],
        ["tasks.list", ["add", "echo"]],
        ["tasks.start", { prompt: "add:3:2" }],
        ["tasks.grade", { score: 1 }],
        ["tasks.grade", { code: -32600, message: "no task in progress" }],
        ["bye", { goodbye: true }, true],
        ["tunnel.open", { capability: "echo" }, "raw bytes from python"],
      ]);
    } finally {
      await server.shutdown();
      await echo.close();
    }
  },
});
