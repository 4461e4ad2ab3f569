// `hud eval`'s flags that set Taskset.run() options (and the model proxy's)
// are checked once, by the library (tasksetRunConfig, proxyConfig), before
// the environment loads; its refusal is the usage error, in the flags' words.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { tasksetRunConfig, type TasksetRunOptions } from "../../eval/taskset.ts";
import { type ModelProxyOptions, proxyConfig, type ProxyServer } from "../../proxy/_config.ts";

const MISSING = "/nonexistent/env_module.ts";

async function evalUsage(...args: string[]): Promise<string> {
  let stdout = "";
  let stderr = "";
  const code = await main(["eval", MISSING, "--agent", "cat", ...args], {
    stdout: (t) => stdout += t,
    stderr: (t) => stderr += t,
  });
  assert.equal(code, 2, stderr);
  assert.equal(stdout, "");
  assert.match(stderr, /^error: [^\n]+\n$/);
  return stderr.slice("error: ".length, -1);
}

/** The library's refusal of `options`, without its prefix. */
function libraryRefusal(options: TasksetRunOptions): string {
  try {
    tasksetRunConfig(options);
  } catch (err) {
    return (err as Error).message.replace(/^Cannot run taskset: /, "");
  }
  throw new Error(`tasksetRunConfig accepted ${JSON.stringify(options)}`);
}

test("hud eval: a run option's refusal is the library's, naming the flag, before the module loads", async () => {
  // The flags, the options they set, and how each names its option.
  const cases: [string[], TasksetRunOptions, Record<string, string>][] = [
    [["--group", "0"], { group: 0 }, { group: "--group" }],
    [["--max-concurrent", "0"], { maxConcurrent: 0 }, { maxConcurrent: "--max-concurrent" }],
    [["--retries", "1.5"], { retries: 1.5 }, { retries: "--retries" }],
    [["--timeout", "0"], { rolloutTimeout: 0 }, { rolloutTimeout: "--timeout" }],
    [["--agent-timeout", "0"], { agentTimeout: 0 }, { agentTimeout: "--agent-timeout" }],
    [["--resume"], { resume: true }, { resume: "--resume", out: "--out" }],
    [["--force"], { force: true }, { force: "--force", out: "--out" }],
  ];
  for (const [flags, options, names] of cases) {
    let expected = libraryRefusal(options);
    for (const [option, flag] of Object.entries(names)) {
      expected = expected.replace(new RegExp(`\\b${option}\\b`), flag);
    }
    assert.equal(await evalUsage(...flags), expected, flags.join(" "));
  }
});

test("hud eval: refusals quote the flag's text and state durations in seconds", async () => {
  assert.equal(
    await evalUsage("--timeout", "0"),
    '--timeout must be a positive number, got "0"',
  );
  assert.equal(
    await evalUsage("--group", "two"),
    '--group must be a positive integer, got "two"',
  );
  assert.equal(
    await evalUsage("--retries", "x"),
    '--retries must be an integer of at least 0, got "x"',
  );
  assert.equal(
    await evalUsage("--agent-timeout", "9", "--timeout", "5"),
    "--agent-timeout (9 s) must be less than --timeout (5 s)",
  );
  assert.equal(
    await evalUsage("--agent-timeout", "700"),
    "--agent-timeout (700 s) must be less than --timeout (600 s)",
    "the default --timeout counts",
  );
  assert.equal(
    await evalUsage("--cost-limit", "0"),
    '--cost-limit must be a positive number, got "0"',
  );
});

test("hud eval harbor:PATH checks --group as Taskset.run() does, before reading the path", async () => {
  let stderr = "";
  const code = await main(["eval", "harbor:/nonexistent", "--agent", "oracle", "--group", "0"], {
    stdout: () => {},
    stderr: (t) => stderr += t,
  });
  assert.equal(code, 2, stderr);
  assert.equal(stderr, 'error: --group must be a positive integer, got "0"\n');
});

test("hud eval: the model proxy's flags are checked by proxyConfig(), naming the flags, before the module loads", async () => {
  const up = "http://127.0.0.1:1/v1";
  const cases: [string[], ModelProxyOptions, Record<string, string>][] = [
    [["--model-proxy", "ftp://h/v1"], { upstream: "ftp://h/v1" }, { upstream: "--model-proxy" }],
    [["--model-proxy", "not a url"], { upstream: "not a url" }, { upstream: "--model-proxy" }],
    [
      ["--model-proxy", up, "--model-server", "tgi"],
      { upstream: up, server: "tgi" as ProxyServer },
      { server: "--model-server" },
    ],
    [["--model-proxy", up, "--proxy-model", " "], { upstream: up, model: " " }, {
      model: "--proxy-model",
    }],
  ];
  for (const [flags, options, names] of cases) {
    let expected: string;
    try {
      proxyConfig(options);
      throw new Error(`proxyConfig accepted ${JSON.stringify(options)}`);
    } catch (err) {
      expected = (err as Error).message.replace(/^Cannot start model proxy: /, "");
    }
    for (const [option, flag] of Object.entries(names)) {
      expected = expected.replace(new RegExp(`^${option}\\b`), flag);
    }
    assert.equal(await evalUsage(...flags), expected, flags.join(" "));
  }
  assert.equal(
    await evalUsage("--model-proxy", up, "--model-server", "tgi"),
    '--model-server must be one of llama-server, vllm, sglang, openai, anthropic, got "tgi"',
  );
  assert.equal(await evalUsage("--proxy-model", "m"), "--proxy-model needs --model-proxy");
  assert.equal(await evalUsage("--training-out", ""), "--training-out needs a file, or -");
});

test("hud eval: --token-limit and --cost-limit take a command agent's calls through --model-proxy", async () => {
  assert.equal(
    await evalUsage("--token-limit", "100"),
    "--token-limit and --cost-limit count a model's calls: use them with --model or --model-proxy",
  );
  let stderr = "";
  const code = await main([
    "eval",
    MISSING,
    "--agent",
    "cat",
    "--model-proxy",
    "http://127.0.0.1:1/v1",
    "--token-limit",
    "100",
  ], { stdout: () => {}, stderr: (t) => stderr += t });
  // Past the flags: the module is what is missing.
  assert.equal(code, 1, stderr);
  assert.match(stderr, /env_module\.ts/);
});
