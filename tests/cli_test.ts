import { test } from "./_test.ts";
import assert from "node:assert/strict";
import { main } from "../cli.ts";
import { SubprocessRuntime } from "../runtime/mod.ts";
import { ChildProcess, waitFor, waitForLine } from "./_helpers.ts";
import { testSignal } from "./_deadline.ts";

const CLI = new URL("../cli.ts", import.meta.url).href;
const BASIC = decodeURIComponent(new URL("./fixtures/basic_env.ts", import.meta.url).pathname);
const MULTI = decodeURIComponent(new URL("./fixtures/multi_env.ts", import.meta.url).pathname);

interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the command line in this process, capturing what it prints. */
async function run(
  args: string[],
  options: { stdin?: string; signal?: AbortSignal; onStdout?: (text: string) => void } = {},
): Promise<Ran> {
  let stdout = "";
  let stderr = "";
  const stdin = options.stdin === undefined ? undefined : new Blob([options.stdin]).stream();
  const code = await main(args, {
    stdout: (text) => {
      stdout += text;
      options.onStdout?.(text);
    },
    stderr: (text) => stderr += text,
    stdin,
    signal: options.signal,
  });
  return { code, stdout, stderr };
}

/** Runs the command line in a child process. */
/** Runs cli.ts in a child whose environment adds `env` to this process's. */
async function spawnCliWith(env: Record<string, string>, ...args: string[]): Promise<Ran> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env,
    stdin: "null",
    signal: testSignal(),
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

function assertUsageError(ran: Ran, pattern: RegExp): void {
  assert.equal(ran.code, 2, ran.stderr);
  assert.equal(ran.stdout, "");
  assert.match(ran.stderr, /^error: [^\n]+\n$/);
  assert.match(ran.stderr, pattern);
}

test("main() prints help for the program and every command", async (t) => {
  await t.step("top level, listing the commands", async () => {
    for (const flag of ["--help", "-h", "help"]) {
      const ran = await run([flag]);
      assert.equal(ran.code, 0);
      assert.match(ran.stdout, /^Usage: hud <command> \[options\]/);
      for (const name of ["serve", "tasks", "start", "grade", "eval"]) {
        assert.match(ran.stdout, new RegExp(`^ {2}${name} +\\S`, "m"));
      }
    }
  });
  await t.step("each command", async () => {
    for (const name of ["serve", "tasks", "start", "grade"]) {
      for (const flag of ["--help", "-h"]) {
        const ran = await run([name, flag]);
        assert.equal(ran.code, 0);
        assert.match(ran.stdout, new RegExp(`^Usage: hud ${name} `));
        assert.match(ran.stdout, /-h, --help/);
        assert.equal(ran.stderr, "");
      }
      assert.equal((await run(["help", name])).stdout, (await run([name, "--help"])).stdout);
    }
  });
  await t.step("no command: usage on stderr, exit 2", async () => {
    const ran = await run([]);
    assert.equal(ran.code, 2);
    assert.match(ran.stderr, /^Usage: hud/);
  });
});

test("main() rejects bad usage with one line and exit code 2", async () => {
  assertUsageError(await run(["frobnicate"]), /unknown command "frobnicate"/);
  assertUsageError(await run(["--frob"]), /unknown option "--frob"/);
  assertUsageError(await run(["tasks", "--frob"]), /unknown option "--frob" \(see "hud tasks/);
  assertUsageError(await run(["serve"]), /missing FILE/);
  assertUsageError(await run(["serve", BASIC, "--port"]), /option "--port" needs a value/);
  assertUsageError(await run(["serve", BASIC, "--port", "http"]), /--port must be an integer/);
  assertUsageError(await run(["serve", BASIC, "--port", "70000"]), /--port must be an integer/);
  assertUsageError(await run(["serve", "a.ts", "b.ts"]), /unexpected argument "b.ts"/);
  assertUsageError(await run(["start"]), /missing TASK/);
  assertUsageError(await run(["start", "add", "--args", "{a:1}"]), /--args is not valid JSON/);
  assertUsageError(await run(["start", "add", "--args", "[1]"]), /--args must be a JSON object/);
  assertUsageError(
    await run(["start", "add", "--url", "tcp://127.0.0.1:1", "--source", BASIC]),
    /--url or --source, not both/,
  );
  assertUsageError(await run(["start", "add", "--answer", "3"]), /--answer needs --source/);
  assertUsageError(
    await run(["start", "add", "--source", BASIC, "--answer", "5", "--token-file", "/x"]),
    /--token-file needs --url, not --source/,
  );
  assertUsageError(await run(["start", "add", "--url", "http://x:1"]), /--url must be tcp:/);
  assertUsageError(await run(["start", "add", "--json=yes"]), /"--json" does not take a value/);
  assertUsageError(await run(["grade", "add"]), /missing --answer/);
  assertUsageError(await run(["grade", "add", "--answer", "-3"]), /write --answer=VALUE/);
  assertUsageError(await run(["tasks", BASIC, "--url", "tcp://a:1"]), /FILE or --url, not both/);
  for (const spec of ["vm:x", "k8s", "k8s:", "swarm", "slurm:", "slurmx"]) {
    assertUsageError(
      await run(["eval", BASIC, "--agent", "cat", "--runtime", spec]),
      new RegExp(
        `--runtime must be "local", "container:IMAGE", "swarm:IMAGE", "k8s:IMAGE" or "slurm\\[:PARTITION\\]", got "${spec}"`,
      ),
    );
  }
  assertUsageError(await run(["gc", "--namespace", "evals"]), /--namespace needs --kubernetes/);
  assertUsageError(
    await run(["gc", "--kubernetes", "--slurm"]),
    /give --kubernetes or --slurm, not both/,
  );
  assertUsageError(
    await run(["gc", "--slurm", "--older-than", "60"]),
    /--older-than does not apply to --slurm/,
  );
  assertUsageError(
    await run(["gc", "--kubernetes", "--socket", "/run/x.sock"]),
    /--socket is for containers: leave it out with --kubernetes/,
  );
});

test("main() fails with exit code 1 and one message when a command fails", async () => {
  const ran = await run(["tasks", MULTI]);
  assert.equal(ran.code, 1);
  assert.match(ran.stderr, /^error: Cannot load environment: .* exports several environments/);
  const missing = await run(["tasks", "no/such/env.ts"]);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /file "no\/such\/env.ts" not found/);
});

test("main() tasks lists a module's templates", async (t) => {
  await t.step("as a table", async () => {
    const ran = await run(["tasks", BASIC]);
    assert.equal(ran.code, 0, ran.stderr);
    assert.deepEqual(ran.stdout.split("\n"), [
      "ID    ARGS                        DESCRIPTION",
      "add   a: integer, b: integer = 2  Add two numbers",
      "echo  ...",
      "",
    ]);
  });
  await t.step("as JSON, picking by --env", async () => {
    const ran = await run(["tasks", MULTI, "--env", "beta-env", "--json"]);
    assert.equal(ran.code, 0, ran.stderr);
    const tasks = JSON.parse(ran.stdout);
    assert.deepEqual(tasks.map((task: { id: string }) => task.id), ["beta-env_task"]);
  });
});

test("main() start --source runs, reads the answer and grades in-process", async (t) => {
  await t.step("answer from standard input", async () => {
    const ran = await run(["start", "add", "--source", BASIC, "--args", '{"a":3}'], {
      stdin: "5\nignored\n",
    });
    assert.equal(ran.code, 0, ran.stderr);
    assert.equal(ran.stdout, 'What is 3 + 2?\n{"score":1}\n');
  });
  await t.step("answer from --answer, JSON output", async () => {
    const ran = await run(["start", "echo", "--source", BASIC, "--answer", "hi", "--json"]);
    assert.equal(ran.code, 0, ran.stderr);
    const [prompt, grade] = ran.stdout.trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(prompt, { prompt: "Say anything", args: {} });
    assert.deepEqual(grade, { score: 0.5, content: "hi" });
  });
  await t.step("standard input ends without an answer", async () => {
    const ran = await run(["start", "add", "--source", BASIC, "--args", '{"a":1}'], { stdin: "" });
    assert.equal(ran.code, 1);
    assert.match(ran.stderr, /^error: Cannot grade: standard input ended before an answer\n$/);
  });
  await t.step("arguments the template refuses", async () => {
    const ran = await run(["start", "add", "--source", BASIC, "--args", '{"z":1}'], { stdin: "" });
    assert.equal(ran.code, 1);
    assert.match(ran.stderr, /unknown arguments "z"/);
  });
});

test("main() serve runs until its signal aborts, and tasks reaches it by url", async () => {
  const controller = new AbortController();
  let announced = "";
  const serving = run(["serve", BASIC, "--port", "0"], {
    signal: controller.signal,
    onStdout: (text) => announced += text,
  });
  try {
    let ended: string | null = null;
    serving.then(
      (r) => ended = `serve ended with code ${r.code}: ${r.stderr}`,
      (e) => ended = `serve failed: ${e}`,
    );
    await waitForLine(() => announced, /^HUD_SERVE_PORT=(\d+)$/, {
      what: "HUD_SERVE_PORT line from serve",
      ms: 10_000,
      ended: () => ended,
    });
    // The generated token comes first, on its own line, then the port.
    const m = /^HUD_SERVE_TOKEN=([0-9a-f]{64})\nHUD_SERVE_PORT=(\d+)\n$/.exec(announced);
    assert.ok(m, announced);
    const [, token, port] = m;
    const ran = await run(["tasks", "--url", `tcp://:${token}@127.0.0.1:${port}`, "--json"]);
    assert.equal(ran.code, 0, ran.stderr);
    assert.deepEqual(JSON.parse(ran.stdout).map((t: { id: string }) => t.id), ["add", "echo"]);
  } finally {
    controller.abort();
  }
  const served = await serving;
  assert.equal(served.code, 0, served.stderr);
  assert.match(served.stderr, /^Serving "fixture" 0.3.0 on tcp:\/\/127.0.0.1:\d+/);
});

test("cli.ts end to end in child processes: serve, tasks, start, then grade elsewhere", async (t) => {
  // SubprocessRuntime runs "cli.ts serve" in a child of its own.
  await using served = await new SubprocessRuntime(BASIC).place();
  // The token goes by HUD_SERVE_TOKEN, as it should: in --url it would be on
  // the command line, for every local user to read (and cli.ts would warn).
  const [, token, address] = /^tcp:\/\/:([^@]+)@(.+)$/.exec(served.url)!;
  const url = `tcp://${address}`;
  const spawn = (...args: string[]) =>
    spawnCliWith({ HUD_SERVE_TOKEN: decodeURIComponent(token) }, ...args);

  await t.step("tasks --url", async () => {
    const ran = await spawn("tasks", "--url", url);
    assert.equal(ran.code, 0, ran.stderr);
    assert.match(ran.stdout, /^add {3}a: integer, b: integer = 2 {2}Add two numbers$/m);
  });

  await t.step("start in one process, grade its session from another", async () => {
    const started = await spawn(
      "start",
      "add",
      "--args",
      '{"a":2,"b":3}',
      "--url",
      url,
      "--json",
    );
    assert.equal(started.code, 0, started.stderr);
    const frame = JSON.parse(started.stdout);
    assert.equal(frame.prompt, "What is 2 + 3?");
    assert.match(frame.session_id, /^sess-[0-9a-f]{32}$/);

    const graded = await spawn(
      "grade",
      "add",
      "--answer",
      "5",
      "--url",
      url,
      "--session",
      frame.session_id,
    );
    assert.equal(graded.code, 0, graded.stderr);
    assert.deepEqual(JSON.parse(graded.stdout), { score: 1 });

    const again = await spawn("grade", "add", "--answer", "5", "--url", url);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /^error: no task in progress\n$/);
  });

  await t.step(
    "start prints the prompt and how to grade; grade adopts the lone parked task",
    async () => {
      const started = await spawn("start", "add", "--args", '{"a":40}', "--url", url);
      assert.equal(started.code, 0, started.stderr);
      assert.equal(started.stdout, "What is 40 + 2?\n");
      assert.match(started.stderr, /Session sess-[0-9a-f]{32} holds the task/);
      // As it was run (issue 38): not "hud grade" when it was deno run -A cli.ts.
      assert.match(
        started.stderr,
        /\n {2}deno run -A \S*cli\.ts grade add --url tcp:\/\/127.0.0.1:\d+ --session sess-/,
      );

      const wrongTemplate = await spawn("grade", "nope", "--answer", "42", "--url", url);
      assert.equal(wrongTemplate.code, 1);
      assert.match(wrongTemplate.stderr, /unknown template "nope" \(available: "add", "echo"\)/);

      const graded = await spawn("grade", "add", "--answer", "41", "--url", url);
      assert.equal(graded.code, 0, graded.stderr);
      assert.deepEqual(JSON.parse(graded.stdout), { score: 0 });
    },
  );

  await t.step("an unknown session", async () => {
    const ran = await spawn(
      "grade",
      "add",
      "--answer",
      "1",
      "--url",
      url,
      "--session",
      "sess-00000000",
    );
    assert.equal(ran.code, 1);
    assert.match(ran.stderr, /unknown session/);
  });

  await t.step("bad flags exit 2 from a real process", async () => {
    const ran = await spawn("start", "add", "--url", url, "--args", "{nope");
    assertUsageError(ran, /--args is not valid JSON/);
    const help = await spawn("grade", "--help");
    assert.equal(help.code, 0);
    assert.match(help.stdout, /^Usage: hud grade TASK \(--answer TEXT \| --answer-file PATH\)/);
  });
});

test("main() eval runs an external agent, streams results and resumes", async (t) => {
  const dir = await Deno.makeTempDir();
  try {
    const rows = `${dir}/rows.jsonl`;
    await Deno.writeTextFile(
      rows,
      [{ a: 1, b: 2 }, { a: 2, b: 2 }, { a: 5, b: 5 }]
        .map(({ a, b }) =>
          JSON.stringify({ env: "fixture", id: "add", args: { a, b }, slug: `add-${a}-${b}` })
        )
        .join("\n") + "\n",
    );
    const out = `${dir}/results.jsonl`;
    // The agent reads the prompt "What is A + B?" on stdin and computes it.
    const agent = `read -r q; set -- $q; echo $(( $3 + \${5%?} ))`;
    await t.step("every row graded, a table per task, results streamed", async () => {
      const ran = await run([
        "eval",
        BASIC,
        "--agent",
        agent,
        "--tasks",
        rows,
        "--group",
        "2",
        "--out",
        out,
      ]);
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, /^task +args +runs +graded +errored +mean reward +failures$/m);
      assert.match(ran.stdout, /^add-5-5 +\{"a":5,"b":5\} +2 +2 +0 +1\.000 ± 0\.000 +-$/m);
      assert.match(ran.stdout, /mean reward 1\.000 ± 0\.000 over 6 graded runs, 0 errored/);
      assert.match(ran.stdout, /^pass@1 1\.000 {2}pass@2 1\.000$/m);
      assert.match(ran.stderr, /add-1-2: 1 +\(done \d\/6/);
      const lines = (await Deno.readTextFile(out)).trim().split("\n");
      assert.equal(lines.length, 6);
    });
    await t.step("--resume keeps graded rollouts and runs nothing again", async () => {
      const ran = await run([
        "eval",
        BASIC,
        "--agent",
        "exit 9",
        "--tasks",
        rows,
        "--group",
        "2",
        "--out",
        out,
        "--resume",
      ]);
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, /mean reward 1\.000 ± 0\.000 over 6 graded runs, 0 errored/);
    });
    await t.step("a failing agent is recorded and what it wrote is still graded", async () => {
      const ran = await run([
        "eval",
        BASIC,
        "--agent",
        "exit 3",
        "--tasks",
        rows,
        "--timeout",
        "30",
      ]);
      assert.equal(ran.code, 0, "a failing agent is still graded");
      assert.match(ran.stdout, /mean reward 0\.000 ± 0\.000 over 3 graded runs/);
      assert.match(ran.stdout, /^add-1-2: agent: Agent command exited with code 3$/m);
    });
    await t.step("bad flags are usage errors", async () => {
      assertUsageError(await run(["eval", BASIC]), /missing --agent/);
      assertUsageError(await run(["eval", BASIC, "--agent", "x", "--group", "0"]), /--group/);
      assertUsageError(
        await run(["eval", BASIC, "--agent", "x", "--resume"]),
        /--resume needs --out/,
      );
      assertUsageError(
        await run(["eval", BASIC, "--agent", "x", "--bogus"]),
        /unknown option "--bogus"/,
      );
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("main() serve takes its token from --token-file and prints it nowhere", async (t) => {
  const dir = await Deno.makeTempDir();
  try {
    const file = `${dir}/token`;
    const token = "f".repeat(64);
    await Deno.writeTextFile(file, token + "\n", { mode: 0o600 });
    await t.step("--token-file: only the port line, and the token works", async () => {
      const controller = new AbortController();
      let announced = "";
      const serving = run(["serve", BASIC, "--port", "0", "--token-file", file], {
        signal: controller.signal,
        onStdout: (text) => announced += text,
      });
      try {
        await waitFor(() => announced.includes("\n"), 10_000);
        const port = /^HUD_SERVE_PORT=(\d+)\n$/.exec(announced)?.[1];
        assert.ok(port, announced);
        // A missing token and a wrong one are told apart, each with what to do.
        const refused = await run(["tasks", "--url", `tcp://127.0.0.1:${port}`]);
        assert.equal(refused.code, 1);
        assert.match(refused.stderr, /^error: unauthorized: no token: .*set HUD_SERVE_TOKEN/);
        const wrong = await run(["tasks", "--url", `tcp://:${"0".repeat(64)}@127.0.0.1:${port}`]);
        assert.equal(wrong.code, 1);
        assert.match(wrong.stderr, /^error: unauthorized: wrong token: .*check HUD_SERVE_TOKEN/m);
        assert.doesNotMatch(wrong.stderr, new RegExp(token));
        const ran = await run(["tasks", "--url", `tcp://:${token}@127.0.0.1:${port}`, "--json"]);
        assert.equal(ran.code, 0, ran.stderr);
      } finally {
        controller.abort();
      }
      const served = await serving;
      assert.equal(served.code, 0, served.stderr);
      assert.ok(!served.stdout.includes(token) && !served.stderr.includes(token));
    });
    await t.step("--no-auth-without-token: HUD's runtimes, which send none, get in", async () => {
      // What images built by `image` run (issue 24, point 8).
      const controller = new AbortController();
      let announced = "";
      const serving = run(
        ["serve", BASIC, "--port", "0", "--host", "0.0.0.0", "--no-auth-without-token"],
        { signal: controller.signal, onStdout: (text) => announced += text },
      );
      try {
        await waitFor(() => /HUD_SERVE_PORT=\d+\n/.test(announced), 10_000);
        assert.doesNotMatch(announced, /HUD_SERVE_TOKEN=/, "no token made, none printed");
        const port = /HUD_SERVE_PORT=(\d+)\n/.exec(announced)![1];
        const ran = await run(["tasks", "--url", `tcp://127.0.0.1:${port}`, "--json"]);
        assert.equal(ran.code, 0, ran.stderr);
      } finally {
        controller.abort();
      }
      const served = await serving;
      assert.equal(served.code, 0, served.stderr);
      assert.match(served.stderr, /without authentication/, "it says so");
    });
    await t.step("--no-auth-without-token with a token requires it", async () => {
      // The token in the environment of a process of its own: this process's
      // other test files (deno test --parallel) must not see it.
      await using serving = new ChildProcess(Deno.execPath(), {
        args: ["run", "-A", CLI, "serve", BASIC, "--port", "0", "--no-auth-without-token"],
        env: { HUD_SERVE_TOKEN: token, NO_COLOR: "1" },
      });
      const [, port] = await serving.waitForLine(/^HUD_SERVE_PORT=(\d+)$/m, "the port line");
      assert.equal(serving.stdout, `HUD_SERVE_PORT=${port}\n`, "the given token is not printed");
      const refused = await run(["tasks", "--url", `tcp://127.0.0.1:${port}`]);
      assert.match(refused.stderr, /unauthorized/);
      assert.equal((await serving.stop()).code, 0);
    });
    await t.step("bad combinations are usage errors", async () => {
      assertUsageError(
        await run(["serve", BASIC, "--no-auth", "--no-auth-without-token"]),
        /--no-auth or --no-auth-without-token/,
      );
      assertUsageError(
        await run(["serve", BASIC, "--no-auth", "--host", "0.0.0.0"]),
        /--no-auth on "0.0.0.0".*--insecure-listen/,
      );
      assertUsageError(await run(["serve", BASIC, "--insecure-listen"]), /needs --no-auth/);
      assertUsageError(
        await run(["serve", BASIC, "--no-auth", "--token-file", file]),
        /--token-file or --no-auth/,
      );
      assertUsageError(
        await run(["serve", BASIC, "--token-file", `${dir}/missing`]),
        /cannot read --token-file/,
      );
      assertUsageError(await run(["serve", BASIC, "--parked-ttl", "-1"]), /--parked-ttl/);
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
const FAST = decodeURIComponent(new URL("./fixtures/fast_env.ts", import.meta.url).pathname);
const FAILING = decodeURIComponent(
  new URL("./fixtures/failing_init_env.ts", import.meta.url).pathname,
);

/** Rows of the fast fixture (no slugs: eval computes them). */
async function fastRows(dir: string, n: number): Promise<string> {
  const path = `${dir}/rows.jsonl`;
  await Deno.writeTextFile(
    path,
    Array.from({ length: n }, (_, i) => JSON.stringify({ env: "fast", id: "echo", args: { n: i } }))
      .join("\n") + "\n",
  );
  return path;
}

test("main() eval never loses a results file", async (t) => {
  const dir = await Deno.makeTempDir();
  try {
    const rows = await fastRows(dir, 2);
    const out = `${dir}/r.jsonl`;
    const old = '{"an":"old result"}\nnot even JSON\n';
    await Deno.writeTextFile(out, old);
    await t.step("--out onto a non-empty file refuses, before the environment loads", async () => {
      const ran = await run(["eval", `${dir}/no_such_env.ts`, "--agent", "cat", "--out", out]);
      assert.equal(ran.code, 1);
      assert.match(ran.stderr, /^error: [^\n]+\n$/);
      assert.match(ran.stderr, /r\.jsonl" already holds results.*--resume.*--force/);
      assert.equal(await Deno.readTextFile(out), old);
    });
    await t.step(
      "--resume keeps every line in place, foreign and unparsable ones too",
      async () => {
        const ran = await run([
          "eval",
          FAST,
          "--agent",
          "cat",
          "--tasks",
          rows,
          "--out",
          out,
          "--resume",
        ]);
        assert.equal(ran.code, 0, ran.stderr);
        const text = await Deno.readTextFile(out);
        assert.ok(text.startsWith(old));
        assert.equal(text.split("\n").length - 1, 4);
      },
    );
    await t.step("a different --group on resume adds, keeping the first group's rows", async () => {
      const ran = await run([
        "eval",
        FAST,
        "--agent",
        "cat",
        "--tasks",
        rows,
        "--group",
        "3",
        "--out",
        out,
        "--resume",
      ]);
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, /over 6 graded runs/);
      assert.equal((await Deno.readTextFile(out)).split("\n").length - 1, 8);
    });
    await t.step("--force renames the old file aside and starts over", async () => {
      const before = await Deno.readTextFile(out);
      const ran = await run([
        "eval",
        FAST,
        "--agent",
        "cat",
        "--tasks",
        rows,
        "--out",
        out,
        "--force",
      ]);
      assert.equal(ran.code, 0, ran.stderr);
      const aside = /moved the old results to (\S+)/.exec(ran.stderr)?.[1];
      assert.ok(aside, ran.stderr);
      assert.equal(await Deno.readTextFile(aside), before);
      assert.equal((await Deno.readTextFile(out)).split("\n").length - 1, 2);
    });
    await t.step("a missing directory is made; one that cannot be is named", async () => {
      const deep = `${dir}/a/b/r.jsonl`;
      const ran = await run(["eval", FAST, "--agent", "cat", "--tasks", rows, "--out", deep]);
      assert.equal(ran.code, 0, ran.stderr);
      assert.equal((await Deno.readTextFile(deep)).split("\n").length - 1, 2);
      const blocked = await run(["eval", FAST, "--agent", "cat", "--out", `${out}/x/r.jsonl`]);
      assert.equal(blocked.code, 1);
      assert.match(
        blocked.stderr,
        /^error: Cannot write results: cannot create directory ".*r\.jsonl\/x"/,
      );
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("main() eval counts and explains every failure", async (t) => {
  const dir = await Deno.makeTempDir();
  try {
    const rows = await fastRows(dir, 2);
    await t.step("an empty --tasks file is refused, not run as nothing", async () => {
      const empty = `${dir}/empty.jsonl`;
      await Deno.writeTextFile(empty, "");
      const ran = await run(["eval", FAST, "--agent", "cat", "--tasks", empty]);
      assert.equal(ran.code, 2, ran.stderr);
      assert.match(ran.stderr, /^error: [^\n]*empty\.jsonl holds no rows[^\n]*--tasks\n$/);
      assert.equal(ran.stdout, "");
    });
    await t.step(
      "--tasks rows are checked before anything starts: template and arguments",
      async () => {
        const bad = `${dir}/bad.jsonl`;
        const row = (id: string, args: unknown, slug: string) =>
          JSON.stringify({ env: "fast", id, args, slug });
        await Deno.writeTextFile(
          bad,
          [row("echo", { n: 1 }, "one"), row("ecko", { n: 2 }, "two")].join("\n") + "\n",
        );
        const out = `${dir}/bad-results.jsonl`;
        let ran = await run(["eval", FAST, "--agent", "cat", "--tasks", bad, "--out", out]);
        assert.equal(ran.code, 1, ran.stderr);
        assert.equal(
          ran.stderr,
          `error: Cannot evaluate row 2 of ${bad} ("two"): unknown template "ecko" (available: "echo")\n`,
        );
        await assert.rejects(Deno.stat(out), Deno.errors.NotFound, "nothing ran");
        await Deno.writeTextFile(
          bad,
          [row("echo", { n: 1 }, "one"), row("echo", { n: "two" }, "two")].join("\n"),
        );
        ran = await run(["eval", FAST, "--agent", "cat", "--tasks", bad, "--out", out]);
        assert.equal(ran.code, 1, ran.stderr);
        assert.match(
          ran.stderr,
          /^error: Cannot evaluate row 2 of \S+bad\.jsonl \("two"\): argument "n" /,
        );
        assert.doesNotMatch(ran.stderr, /\n./);
        await assert.rejects(Deno.stat(out), Deno.errors.NotFound, "nothing ran");
      },
    );
    await t.step("an agent that cannot start: errored, exit 1, first error shown", async () => {
      const out = `${dir}/typo.jsonl`;
      const ran = await run(["eval", FAST, "--agent", "./agnet.sh", "--tasks", rows, "--out", out]);
      assert.equal(ran.code, 1, ran.stderr);
      assert.match(ran.stdout, /^echo-\S+ +\{"n":0\} +1 +0 +1 +- +agent$/m);
      assert.match(ran.stdout, /over 0 graded runs, 2 errored \(agent_error 2\), not in the mean/);
      // Both failed the same way: said once, with the way out (issue 44).
      assert.match(ran.stdout, /^all 2 rollouts errored the same way, agent_error \(/m);
      assert.match(
        ran.stdout,
        /^ {2}agent: Agent command could not start \(exit code 127\): .*agnet\.sh/m,
      );
      assert.match(ran.stdout, /^ {2}what to do: .*check --agent/m);
      assert.doesNotMatch(ran.stdout, /first error of each failing task/);
      const row = JSON.parse((await Deno.readTextFile(out)).split("\n")[0]);
      assert.equal(row.reward, null);
      assert.equal(row.status, "error");
      assert.match(row.trace.errors[0].message, /No such file or directory/);
      const again = await run([
        "eval",
        FAST,
        "--agent",
        "cat",
        "--tasks",
        rows,
        "--out",
        out,
        "--resume",
      ]);
      assert.equal(again.code, 0, again.stderr);
      assert.match(again.stdout, /over 2 graded runs, 0 errored/);
    });
    await t.step("an environment that cannot start fails fast, with its message", async () => {
      const out = `${dir}/failing.jsonl`;
      const ran = await run(["eval", FAILING, "--agent", "cat", "--group", "5", "--out", out]);
      assert.equal(ran.code, 1);
      assert.equal(
        ran.stderr,
        'error: Cannot start environment "failing": database unreachable at db:5432\n',
      );
      assert.equal(await Deno.readTextFile(out).catch(() => ""), "");
    });
    await t.step(
      "--json prints a summary; secrets on the command line are not echoed",
      async () => {
        const ran = await run([
          "eval",
          FAST,
          "--agent",
          "API_KEY=sk-very-secret cat",
          "--tasks",
          rows,
          "--group",
          "2",
          "--json",
        ]);
        assert.equal(ran.code, 0, ran.stderr);
        assert.doesNotMatch(ran.stderr + ran.stdout, /sk-very-secret/);
        const summary = JSON.parse(ran.stdout);
        assert.equal(summary.total, 4);
        assert.equal(summary.mean_reward, 1);
        assert.deepEqual(summary.pass_at, { "1": 1, "2": 1 });
        assert.deepEqual(summary.tasks.map((x: { args: unknown }) => x.args), [{ n: 0 }, { n: 1 }]);
      },
    );
    await t.step("usage errors exit 2", async () => {
      assertUsageError(
        await run(["eval", FAST, "--agent", "cat", "--agent-timeout", "9", "--timeout", "5"]),
        /--agent-timeout \(9 s\) must be less than --timeout/,
      );
      assertUsageError(
        await run(["eval", FAST, "--agent", "cat", "--force"]),
        /--force needs --out/,
      );
      assertUsageError(
        await run(["eval", FAST, "--agent", "cat", "--pass-env", "A=B"]),
        /--pass-env takes a variable name/,
      );
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("main() behaves like a Unix tool", async (t) => {
  await t.step("--version matches deno.json", async () => {
    const config = JSON.parse(
      await Deno.readTextFile(new URL("../deno.json", import.meta.url)),
    );
    const ran = await run(["--version"]);
    assert.equal(ran.code, 0);
    assert.equal(ran.stdout, `hud ${config.version}\n`);
  });
  await t.step("help for an unknown command is a usage error", async () => {
    assertUsageError(await run(["help", "bogus"]), /unknown command "bogus"/);
  });
  await t.step("start with an unknown template lists the templates", async () => {
    const ran = await run(["start", "nosuch", "--source", BASIC, "--answer", "1"]);
    assert.equal(ran.code, 1);
    assert.match(ran.stderr, /unknown template "nosuch" \(available: "add", "echo"\)/);
  });
  await t.step("a refused connection says so, within --ready-timeout", async () => {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = listener.addr.port;
    listener.close();
    const ran = await run(["tasks", "--url", `tcp://127.0.0.1:${port}`, "--ready-timeout", "0.3"]);
    assert.equal(ran.code, 1);
    assert.match(ran.stderr, /not ready after 300 ms .*: connection refused/i);
  });
  await t.step(
    "a wrong port: one refused connection says nothing listens there, naming it",
    async () => {
      const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      const port = listener.addr.port;
      listener.close();
      for (const command of [["tasks"], ["start", "add"], ["grade", "add", "--answer", "3"]]) {
        const started = performance.now();
        const ran = await run([...command, "--url", `tcp://127.0.0.1:${port}`]);
        const ms = performance.now() - started;
        assert.equal(ran.code, 1, ran.stderr);
        assert.equal(
          ran.stderr,
          `error: Cannot connect to tcp://127.0.0.1:${port}: nothing listens there (connection refused); start the environment there first ("hud serve FILE --port ${port}"), or wait for one that is starting with --ready-timeout S\n`,
        );
        // Not the 10 s of retries of before: one refusal is the answer (bound loosely, for a loaded machine).
        assert.ok(ms < 5_000, `${command[0]} took ${Math.round(ms)} ms`);
      }
    },
  );
  await t.step("a port in use names the address", async () => {
    using listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const ran = await run(["serve", BASIC, "--port", String(listener.addr.port)]);
    assert.equal(ran.code, 1);
    assert.match(
      ran.stderr,
      new RegExp(`address 127\\.0\\.0\\.1:${listener.addr.port} is already in use`),
    );
  });
  await t.step("grade --answer-file - and a path", async () => {
    const { bind } = await import("../mod.ts");
    const { env } = await import("./fixtures/basic_env.ts");
    await using server = bind(env);
    const started = await run(["start", "add", "--args", '{"a":1,"b":2}', "--url", server.url]);
    assert.equal(started.code, 0, started.stderr);
    const graded = await run(["grade", "add", "--answer-file", "-", "--url", server.url], {
      stdin: "3\n",
    });
    assert.equal(graded.code, 0, graded.stderr);
    assert.equal(JSON.parse(graded.stdout).score, 1);
    const file = await Deno.makeTempFile();
    try {
      await Deno.writeTextFile(file, "4\n");
      await run(["start", "add", "--args", '{"a":1,"b":2}', "--url", server.url]);
      const wrong = await run(["grade", "add", "--answer-file", file, "--url", server.url]);
      assert.equal(wrong.code, 0, wrong.stderr);
      assert.equal(JSON.parse(wrong.stdout).score, 0);
    } finally {
      await Deno.remove(file);
    }
    assertUsageError(
      await run(["grade", "add", "--answer", "1", "--answer-file", "-"]),
      /--answer or --answer-file, not both/,
    );
  });
  await t.step("paths with # and % load, for tasks and eval", async () => {
    const dir = await Deno.makeTempDir();
    try {
      const weird = `${dir}/a#b%20c`;
      await Deno.mkdir(weird);
      const sdk = new URL("../mod.ts", import.meta.url).href;
      await Deno.writeTextFile(
        `${weird}/env%1.ts`,
        `import { Environment } from "${sdk}";
export const env = new Environment("weird");
env.template({ id: "hi" }, async function* () {
  const answer = yield "hi";
  yield answer === "hi" ? 1 : 0;
});
`,
      );
      const listed = await run(["tasks", `${weird}/env%1.ts`]);
      assert.equal(listed.code, 0, listed.stderr);
      assert.match(listed.stdout, /^hi /m);
      const ran = await run(["eval", `${weird}/env%1.ts`, "--agent", "cat"]);
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, /over 1 graded runs, 0 errored/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
  await t.step("no colour codes in errors that go to a pipe", async () => {
    const dir = await Deno.makeTempDir();
    try {
      await Deno.writeTextFile(`${dir}/bad.ts`, "export const = ;\n");
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", CLI, "tasks", `${dir}/bad.ts`],
        stdin: "null",
        env: { NO_COLOR: "" },
      }).output();
      const stderr = new TextDecoder().decode(out.stderr);
      assert.equal(out.code, 1, stderr);
      assert.match(stderr, /^error: Cannot load environment from/);
      assert.ok(!stderr.includes("\x1b["), "no escape codes");
      assert.equal(stderr.split("\n").length, 2, "one line");
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
});

test("main() report and view refuse a file that is not a results file, in one line", async () => {
  const dir = await Deno.makeTempDir({ prefix: "hud-report-notresults-" });
  try {
    const empty = `${dir}/empty.jsonl`;
    await Deno.writeTextFile(empty, "");
    for (
      const args of [
        ["report", BASIC],
        ["report", BASIC, "--html", `${dir}/r.html`],
        ["report", BASIC, "--atif", `${dir}/atif`],
        ["report", empty, BASIC],
        ["view", BASIC],
      ]
    ) {
      const ran = await run(args);
      assert.equal(ran.code, 1, `${args.join(" ")}: ${ran.stdout}${ran.stderr}`);
      assert.match(
        ran.stderr,
        /^error: Cannot read results: "[^"]*basic_env\.ts" is not a results file \(none of its \d+ lines is a rollout record\); give the JSONL that "eval --out" writes\n$/,
      );
      assert.equal(ran.stdout, "");
    }
    await assert.rejects(Deno.stat(`${dir}/r.html`), Deno.errors.NotFound);
    // A results file with no rollout yet is an empty job, not an error.
    const ran = await run(["report", empty]);
    assert.equal(ran.code, 0, ran.stderr);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
