// A real model: llama.cpp's llama-server with the tiny tool-calling model,
// when both are present (built and trained outside the tests, never here).
// Such a model follows the protocol, not the task: this checks the
// protocol only (tool calls parsed and run over SSH, results fed back, the
// loop ends, the trace holds every call, the answer is graded).

import assert from "node:assert/strict";
import { addWorkspace, Environment, rollout } from "../../mod.ts";
import { ChatAgent } from "../../agents/mod.ts";

const DIR = Deno.env.get("HUD_LLAMA_DIR") ?? "/var/cache/hud-sdk/llama";
const SERVER = `${DIR}/bin/llama-server`;
/** The committed fixture; its recipe is beside it (tests/fixtures/llama/README.md). */
const MODEL = Deno.env.get("HUD_LLAMA_MODEL") ??
  new URL("../fixtures/llama/tiny-toolcall.gguf", import.meta.url).pathname;
/** Set by .ci/run, which builds llama-server: there a missing binary is a failure, not a skip. */
const REQUIRED = Deno.env.get("HUD_REQUIRE_LLAMA") === "1";

function exists(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

const missing = [SERVER, MODEL].filter((p) => !exists(p));
if (missing.length > 0 && !REQUIRED) {
  console.log(
    `llama_test: skipped: ${missing.join(" and ")} not found ` +
      "(build it: bash tests/fixtures/llama/build_llama_server.sh /var/cache/hud-sdk/llama)",
  );
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

Deno.test({
  name: "ChatAgent against llama-server with the tiny tool-calling model",
  ignore: missing.length > 0 && !REQUIRED,
  async fn() {
    assert.deepEqual(missing, [], "HUD_REQUIRE_LLAMA=1 but llama-server or the model is missing");
    const port = freePort();
    const child = new Deno.Command(SERVER, {
      args: [
        "-m",
        MODEL,
        "--jinja",
        "--temp",
        "0",
        "--host",
        "127.0.0.1",
        "--port",
        String(port),
        "-c",
        "4096",
        "-np",
        "1",
      ],
      stdout: "null",
      stderr: "null",
    }).spawn();
    const root = await Deno.makeTempDir({ prefix: "agents-llama-" });
    try {
      const base = `http://127.0.0.1:${port}`;
      const until = Date.now() + 40_000;
      for (;;) {
        const ok = await fetch(`${base}/health`).then(async (r) => {
          await r.body?.cancel();
          return r.ok;
        }, () => false);
        if (ok) break;
        if (Date.now() > until) throw new Error(`llama-server on ${base} not healthy after 40 s`);
        await new Promise((r) => setTimeout(r, 200));
      }
      const env = new Environment("lab");
      addWorkspace(env, root, { env: { HOME: root } });
      const task = env.template({ id: "hello" }, async function* () {
        await Deno.writeTextFile(`${root}/note.txt`, "hello\n");
        const answer = yield "Run cat note.txt with bash, then submit what it printed.";
        yield String(answer).includes("hello") ? 1 : 0;
      });
      const agent = new ChatAgent({
        model: "tiny",
        baseUrl: `${base}/v1`,
        sampling: { temperature: 0, maxTokens: 128 },
        maxSteps: 4,
      });
      const run = await rollout(task(), agent, { rolloutTimeout: 55_000, fileTracking: false });
      // The loop ended and the run was graded, whatever the model said.
      assert.notEqual(run.grade, null, JSON.stringify(run.trace.errors));
      const models = run.trace.steps.filter((s) => s.type === "model");
      const tools = run.trace.steps.filter((s) => s.type === "tool");
      assert.ok(models.length >= 1);
      const asked = models.flatMap((s) =>
        ((s.content as { reply: { tool_calls?: { id: string }[] } }).reply.tool_calls ?? [])
          .map((c) => c.id)
      );
      assert.ok(asked.length >= 1, "the model made no tool call");
      assert.deepEqual(tools.map((s) => (s.content as { id: string }).id), asked);
      for (const s of tools) {
        const c = s.content as { name: string; result: string };
        if (c.name === "bash" && s.info?.is_error === false) assert.match(c.result, /^exit_code: /);
      }
      for (const s of models) assert.equal(typeof s.info?.latency_ms, "number");
    } finally {
      child.kill("SIGTERM");
      await child.status;
      await Deno.remove(root, { recursive: true });
    }
  },
});
