// `hud eval --agent CMD --model-proxy URL --training-out FILE`: the proxy
// and the stream of finished groups from the command line, with a Python
// harness and the toy model server.

import { PYTHON3, pythonExecutable } from "../_counterparts.ts";
import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { toyLabServer } from "./_upstream.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const FIXTURES = new URL("../fixtures/proxy/", import.meta.url).pathname;
const ENV = `${FIXTURES}toylab_env.ts`;
const KEY = "sk-cli-upstream-key-0123456789abcdef";

const python = await pythonExecutable();
const AGENT = `${python} -I -S ${FIXTURES}openai_agent.py`;

async function cli(args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    signal: AbortSignal.timeout(50_000),
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

test({
  name:
    "cli eval --model-proxy --training-out: each group's rows in a file as it finishes, the same rows export-training writes, the key in no file",
  needs: [PYTHON3],
  async fn() {
    const dir = await Deno.makeTempDir();
    try {
      await using server = toyLabServer(3);
      const ran = await cli([
        "eval",
        ENV,
        "--agent",
        AGENT,
        "--model-proxy",
        server.baseUrl,
        "--model-server",
        "vllm",
        "--group",
        "3",
        "--max-concurrent",
        "2",
        "--out",
        `${dir}/results.jsonl`,
        "--training-out",
        `${dir}/rows.jsonl`,
      ], { OPENAI_API_KEY: KEY });
      assert.equal(ran.code, 0, ran.stderr);
      const rows = (await Deno.readTextFile(`${dir}/rows.jsonl`)).trim().split("\n").map((l) =>
        JSON.parse(l)
      );
      assert.equal(rows.length, 3);
      for (const row of rows) {
        assert.deepEqual(row.group_rewards, [1, 1, 1]);
        assert.equal(row.sequences.length, 1);
        assert.equal(row.tokens_complete, true);
      }
      assert.equal((await Deno.stat(`${dir}/rows.jsonl`)).mode! & 0o777, 0o600);
      for (const r of server.received) {
        assert.equal(r.headers.get("authorization"), `Bearer ${KEY}`);
      }
      // export-training makes the same rows from the results file.
      const exported = await cli([
        "export-training",
        `${dir}/results.jsonl`,
        "--out",
        `${dir}/exported.jsonl`,
      ]);
      assert.equal(exported.code, 0, exported.stderr);
      const again = (await Deno.readTextFile(`${dir}/exported.jsonl`)).trim().split("\n").map((
        l,
      ) => JSON.parse(l));
      const key = (r: { repeat: number }) => r.repeat;
      assert.deepEqual(
        again.sort((a, b) => key(a) - key(b)).map((r) => r.sequences),
        rows.sort((a, b) => key(a) - key(b)).map((r) => r.sequences),
      );
      for (const file of ["results.jsonl", "rows.jsonl", "exported.jsonl"]) {
        assert.doesNotMatch(await Deno.readTextFile(`${dir}/${file}`), new RegExp(KEY), file);
      }
      assert.doesNotMatch(ran.stdout + ran.stderr, new RegExp(KEY));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

test({
  name:
    "cli eval --training-out -: the rows on standard output, one JSON line each, the table on standard error",
  needs: [PYTHON3],
  async fn() {
    await using server = toyLabServer(2);
    const ran = await cli([
      "eval",
      ENV,
      "--agent",
      AGENT,
      "--model-proxy",
      server.baseUrl,
      "--model-server",
      "vllm",
      "--group",
      "2",
      "--training-out",
      "-",
    ]);
    assert.equal(ran.code, 0, ran.stderr);
    const lines = ran.stdout.trim().split("\n");
    assert.equal(lines.length, 2);
    for (const line of lines) assert.deepEqual(JSON.parse(line).group_rewards, [1, 1]);
    assert.match(ran.stderr, /mean reward/);
  },
});

test("cli eval: bad proxy and training flags are usage errors", async () => {
  for (
    const [args, pattern] of [
      [["--agent", "true", "--model-server", "vllm"], /--model-server needs --model-proxy/],
      [["--agent", "true", "--proxy-model", "m"], /--proxy-model needs --model-proxy/],
      [["--model", "m", "--model-proxy", "http://127.0.0.1:1/v1"], /use it with --agent/],
      [
        ["--agent", "true", "--model-proxy", "http://127.0.0.1:1/v1", "--model-server", "tgi"],
        /--model-server must be one of llama-server, vllm, sglang, openai, anthropic, got "tgi"/,
      ],
      [["--agent", "true", "--training-out", ""], /--training-out needs a file, or -/],
    ] as const
  ) {
    const ran = await cli(["eval", ENV, ...args]);
    assert.equal(ran.code, 2, `${args.join(" ")}: ${ran.stderr}`);
    assert.match(ran.stderr, pattern);
  }
});
