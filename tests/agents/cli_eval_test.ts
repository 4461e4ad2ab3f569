import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { completion, scriptedServer } from "./_scripted.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const LAB = new URL("./_lab_env.ts", import.meta.url).pathname;

async function cli(args: string[], env: Record<string, string>) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    signal: AbortSignal.timeout(50_000),
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

test("cli eval --model runs a ChatAgent; the key comes from the environment only", async () => {
  const root = await Deno.makeTempDir({ prefix: "agents-cli-" });
  try {
    await using model = scriptedServer([
      completion({
        tool_calls: [["bash", '{"command": "sed -i s/helo/hello/ greet.sh && bash greet.sh"}']],
      }),
      completion({ tool_calls: [["submit", '{"answer": "hello"}']] }),
    ]);
    const ran = await cli(
      [
        "eval",
        LAB,
        "--model",
        "scripted",
        "--base-url",
        model.baseUrl,
        "--max-steps",
        "3",
        "--temperature",
        "0",
      ],
      { AGENTS_LAB_ROOT: root, OPENAI_API_KEY: "sk-from-env" },
    );
    assert.equal(ran.code, 0, ran.stderr);
    assert.match(ran.stderr, /agent: openai model "scripted"/);
    assert.match(ran.stdout, /greet/);
    assert.equal(model.received.length, 2);
    assert.equal(model.received[0].headers.get("authorization"), "Bearer sk-from-env");
    assert.equal(model.received[0].body.temperature, 0);
    assert.ok(!(ran.stdout + ran.stderr).includes("sk-from-env"));
    assert.equal(await Deno.readTextFile(`${root}/greet.sh`), "echo hello\n");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("cli eval: bad model flags are usage errors", async () => {
  const root = await Deno.makeTempDir({ prefix: "agents-cli-" });
  try {
    const env = { AGENTS_LAB_ROOT: root };
    for (
      const [args, pattern] of [
        [["--model", "m", "--agent", "x"], /pass --agent or --model, not both/],
        [["--base-url", "http://127.0.0.1:1/v1"], /--base-url needs --model/],
        [["--model", "m", "--max-steps", "0"], /--max-steps must be a positive integer, got "0"/],
        [["--model", "m", "--temperature", "hot"], /--temperature must be a number from 0 to 2/],
        [["--model", "m", "--api", "gemini"], /--api must be "openai" or "anthropic"/],
      ] as const
    ) {
      const ran = await cli(["eval", LAB, ...args], env);
      assert.equal(ran.code, 2, `${args.join(" ")}: ${ran.stderr}`);
      assert.match(ran.stderr, pattern);
    }
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
