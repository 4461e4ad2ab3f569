import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { completion, type Received, scriptedServer } from "./_scripted.ts";

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

test("cli eval --model runs a ChatAgent; the key comes from the environment only", {
  needs: [SANDBOX],
}, async () => {
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
        [["--model", "m", "--max-tokens", "0"], /--max-tokens must be a positive integer/],
        [["--model", "m", "--system", " "], /--system must not be empty/],
        [["--system", "x"], /--system needs --model/],
        [["--model", "m", "--prompt-tokens", "llama-server"], /--prompt-tokens needs --tokens/],
        [["--model", "m", "--pricing", "/nonexistent.json"], /--pricing: no file/],
        [["--model", "m", "--retries", "x"], /--retries must be an integer of at least 0/],
        [["--model", "m", "--cost-limit", "0"], /--cost-limit must be a positive number/],
        [["--agent", "true", "--cost-limit", "1"], /use them with --model/],
        [["--model", "m", "--limit", "0"], /--limit must be a positive integer/],
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

const BUDGET = new URL("../fixtures/budget_env.ts", import.meta.url).pathname;

/** A model that answers each "Answer N." with N, at 1000 prompt and 100 completion tokens. */
function answering(count: number) {
  return Array.from({ length: count }, () => (r: Received) => {
    const msgs = r.body.messages as { role: string; content: string }[];
    const n = /Answer (\d+)/.exec(msgs.find((m) => m.role === "user")!.content)![1];
    return completion({ content: n }, { prompt_tokens: 1000, completion_tokens: 100 })(r, 0);
  });
}

test("cli eval --cost-limit stops the job; --resume finishes it with no rollout graded twice", async () => {
  const dir = await Deno.makeTempDir({ prefix: "agents-budget-" });
  try {
    const log = `${dir}/graded.log`;
    const out = `${dir}/results.jsonl`;
    // $10 per million prompt tokens, $100 per million completion tokens: $0.02 a call.
    await Deno.writeTextFile(
      `${dir}/prices.json`,
      JSON.stringify({ priced: { input: 10, output: 100 } }),
    );
    await using model = scriptedServer(answering(12));
    const base = [
      "eval",
      BUDGET,
      "--model",
      "priced",
      "--base-url",
      model.baseUrl,
      "--pricing",
      `${dir}/prices.json`,
      "--max-concurrent",
      "1",
      "--out",
      out,
    ];
    const env = { BUDGET_LOG: log, OPENAI_API_KEY: "sk-x" };
    const first = await cli([...base, "--cost-limit", "0.05"], env);
    assert.equal(first.code, 1, first.stderr);
    assert.match(
      first.stderr,
      /stopped at the cost-limit \(\$0\.0600 of \$0\.05 spent\); 3 of 6 rollouts not run; raise --cost-limit \(or leave it out\) and rerun with --resume/,
    );
    assert.match(first.stdout, /; cost \$0\.06\n/);
    assert.equal(model.received.length, 3);

    // The same limit again: the job has spent it already; nothing runs.
    const again = await cli([...base, "--cost-limit", "0.05", "--resume"], env);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /3 of 6 rollouts not run/);
    assert.equal(model.received.length, 3);

    const rest = await cli([...base, "--resume"], env);
    assert.equal(rest.code, 0, rest.stderr);
    assert.equal(model.received.length, 6);
    const graded = (await Deno.readTextFile(log)).trim().split("\n").sort();
    assert.deepEqual(graded, ["say-1", "say-2", "say-3", "say-4", "say-5", "say-6"]);
    const records = (await Deno.readTextFile(out)).trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(records.map((r) => r.task.slug).sort(), graded);
    assert.ok(records.every((r) => r.reward === 1));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("cli eval --filter and --limit run part of the tasks; --system and --max-tokens reach the model", async () => {
  const dir = await Deno.makeTempDir({ prefix: "agents-filter-" });
  try {
    const log = `${dir}/graded.log`;
    await using model = scriptedServer(answering(4));
    const ran = await cli([
      "eval",
      BUDGET,
      "--model",
      "m",
      "--base-url",
      model.baseUrl,
      "--filter",
      "*-2",
      "--filter",
      "say-5",
      "--filter",
      "say-1",
      "--limit",
      "2",
      "--system",
      "You answer with the number.",
      "--max-tokens",
      "12",
    ], { BUDGET_LOG: log });
    assert.equal(ran.code, 0, ran.stderr);
    assert.match(ran.stderr, /eval: 2 tasks x 1/);
    assert.deepEqual((await Deno.readTextFile(log)).trim().split("\n").sort(), ["say-1", "say-2"]);
    const body = model.received[0].body;
    assert.equal(body.max_tokens, 12);
    assert.deepEqual(
      (body.messages as { content: string }[])[0].content,
      "You answer with the number.",
    );
    const none = await cli(["eval", BUDGET, "--model", "m", "--filter", "nope*"], {
      BUDGET_LOG: log,
    });
    assert.equal(none.code, 2);
    assert.match(none.stderr, /--filter "nope\*" matches none of the 6 tasks/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
