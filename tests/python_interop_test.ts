// Interop with Python peers written from PROTOCOL.md alone: a client that
// drives our server, and a server that our client drives.
import { test } from "./_test.ts";
import { counterpart, pythonExecutable } from "./_counterparts.ts";
import assert from "node:assert/strict";
import { Capability, connect } from "../mod.ts";
import { serve } from "../server.ts";
import { ChildProcess, demoEnv, echoServer } from "./_helpers.ts";
import { testSignal, waitingFor, withDeadline } from "./_deadline.ts";

// The interpreter itself, not a launcher: pyenv's `python3` is a chain of
// bash scripts that takes seconds to start on a loaded machine.
const python = await pythonExecutable();
/** A python3 on PATH. */
const PYTHON_ON_PATH = counterpart(
  "python3",
  "apt-get install python3",
  () => python ? null : "no python3 on PATH",
);
// Isolated (-I) and without site packages (-S): the fixtures use only the
// standard library, and start faster without site's .pth imports.
const PY_FLAGS = ["-I", "-S"];

test({
  name: "serve() with auth: false is driven by a Python client that follows PROTOCOL.md",
  needs: [PYTHON_ON_PATH],
  async fn() {
    const echo = echoServer();
    const env = demoEnv();
    env.addCapability(
      new Capability({ name: "echo", protocol: "tcp/1", url: `tcp://127.0.0.1:${echo.port}` }),
    );
    const lines: string[] = [];
    // --no-auth: HUD's Python clients send no token.
    const server = await serve(env, {
      auth: false,
      announce: (l) => lines.push(l),
      handleSignals: false,
    });
    try {
      const port = Number(lines.map((l) => /^HUD_SERVE_PORT=(\d+)$/.exec(l)?.[1]).find(Boolean));
      assert.ok(port, `no HUD_SERVE_PORT line among ${JSON.stringify(lines)}`);
      const script = new URL("./fixtures/py_client.py", import.meta.url).pathname;
      const { code, stdout, stderr } = await waitingFor(
        "the Python client to finish",
        new Deno.Command(python, {
          args: [...PY_FLAGS, script, String(port)],
          stdout: "piped",
          stderr: "piped",
          // Ends the client when the test's deadline passes.
          signal: testSignal(),
        }).output(),
      );
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

test({
  name: "connect() drives a Python server that follows PROTOCOL.md",
  needs: [PYTHON_ON_PATH],
  fn: withDeadline(40_000, async () => {
    const echo = echoServer();
    const script = new URL("./fixtures/py_server.py", import.meta.url).pathname;
    // Its standard error is kept: a failure below prints it.
    await using server = new ChildProcess(python, {
      args: [...PY_FLAGS, script, String(echo.port)],
    });
    try {
      const [, port] = await server.waitForLine(/^HUD_SERVE_PORT=(\d+)$/, "control port");
      const url = `tcp://127.0.0.1:${port}`;
      const options = { readyTimeout: 10_000, signal: testSignal() };
      {
        await using client = await connect(url, options);
        assert.deepEqual(client.manifest.env, { name: "pyenv", version: "0.6.0" });
        assert.deepEqual((await client.listTasks()).map((t) => t.id), ["add", "exact", "nan"]);
        // Integers beyond 2^53 both ways, digit for digit (issue 24, points 2 and 5).
        const big = 2n ** 60n + 1n;
        assert.deepEqual(await client.startTask("exact", { n: big }), {
          prompt: big,
          sent: "1152921504606846977",
        });
        // NaN and the infinities both ways, as json.dumps writes them (issue 42, point 1).
        assert.deepEqual(await client.startTask("exact", { n: [NaN, -Infinity, Infinity] }), {
          prompt: [NaN, -Infinity, Infinity],
          sent: "[nan, -inf, inf]",
        });
        // A NaN score is read, and refused as a grade; the connection goes on.
        await client.startTask("nan");
        await assert.rejects(client.grade({ answer: 1 }), {
          name: "ProtocolViolationError",
          message: "Invalid grade: score must be a finite number, got NaN",
        });
        assert.deepEqual(await client.startTask("add", { a: 3 }), { prompt: "add:3:2" });
        assert.deepEqual(await client.grade({ answer: "5" }), { score: 1 }, "1.0 reads as 1");
        await assert.rejects(client.grade({ answer: "5" }), { code: -32600 });
        // The capability is reached through our forwarder and the Python tunnel.
        const local = new URL(client.binding("echo").url.replace("tcp:", "http:"));
        const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(local.port) });
        try {
          await conn.write(new TextEncoder().encode("through python"));
          await conn.closeWrite();
          const got = await waitingFor(
            "the echo through the Python tunnel",
            new Response(conn.readable).text(),
            { onTimeout: () => conn.close() },
          );
          assert.equal(got, "through python");
        } catch (err) {
          try {
            conn.close();
          } catch { /* closed by the read to the end */ }
          throw err;
        }
        // Start here, leave the task parked, grade it from a second client.
        await client.startTask("add", { a: 10, b: 5 });
      }
      await using grader = await connect(url, options);
      assert.deepEqual(await grader.grade({ answer: 15 }), { score: 1 });
    } catch (err) {
      throw new Error(`${(err as Error).message}\n${server.describe()}`, { cause: err });
    } finally {
      await echo.close();
    }
  }),
});
