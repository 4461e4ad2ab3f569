// `hud shell`: a parked task's workspace from the command line, as the agent
// reaches it; and `start`'s hints, which repeat the command as it was run.

import { test, withCounterparts } from "../_test.ts";
import { SANDBOX, SCRIPT } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { Environment, string } from "../../mod.ts";
import { bind } from "../../server.ts";
import { addWorkspace } from "../../workspace/mod.ts";
import { testSignal } from "../_deadline.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

/** An environment whose task writes a note into a directory of its own, and names it. */
function noteEnv(root: string): Environment {
  const env = new Environment("notes", { version: "1.0.0" });
  const workspace = addWorkspace(env, root, { trackFiles: false });
  env.template({ id: "note", args: { word: string() } }, async function* ({ word }) {
    const dir = await Deno.makeTempDir({ dir: root, prefix: "task-" });
    await Deno.writeTextFile(`${dir}/note.txt`, `${word}\n`);
    await Deno.chmod(dir, 0o777);
    const answer = yield {
      prompt: `In ${dir}: what does note.txt say?`,
      bindings: { shell: { cwd: dir } },
    };
    const check = await workspace.exec(["grep", "-qx", String(answer), "note.txt"], { cwd: dir });
    yield check.code === 0 ? 1 : 0;
  });
  return env;
}

/** The command line in this process; what it printed. */
async function run(args: string[], stdin?: string) {
  let stdout = "";
  let stderr = "";
  const code = await main(args, {
    stdout: (t) => stdout += t,
    stderr: (t) => stderr += t,
    stdin: stdin === undefined ? undefined : new Blob([stdin]).stream(),
    signal: testSignal(),
  });
  return { code, stdout, stderr };
}

test("hud shell opens a parked task's workspace, as start says, where its files are", {
  needs: [SANDBOX],
}, async (t) => {
  const root = await Deno.makeTempDir({ prefix: "hud-shell-" });
  const tokenFile = `${root}.token`;
  const env = noteEnv(root);
  await env.start();
  try {
    await using server = bind(env);
    await Deno.writeTextFile(tokenFile, server.token!, { mode: 0o600 });
    const url = `tcp://127.0.0.1:${server.addr.port}`;
    const at = ["--url", url, "--token-file", tokenFile];
    const started = await run(["start", "note", "--args", '{"word":"hello"}', ...at]);
    assert.equal(started.code, 0, started.stderr);
    const dir = /^In (\S+):/.exec(started.stdout)![1];
    const session = /^Session (\S+) holds the task/m.exec(started.stderr)![1];

    await t.step("start names the command that opens it, in the task's directory", () => {
      assert.match(
        started.stderr,
        new RegExp(
          `\\nOpen its shell with:\\n  hud shell --url ${url} --token-file "${tokenFile}" --cwd '${dir}'\\n`,
        ),
      );
    });
    await t.step("a command runs there, and its exit code is the command line's", async () => {
      const cat = await run(["shell", ...at, "--cwd", dir, "--", "cat", "note.txt"]);
      assert.equal(cat.code, 0, cat.stderr);
      assert.equal(cat.stdout, "hello\n");
      const failed = await run(["shell", ...at, "--", "exit 3"]);
      assert.equal(failed.code, 3, failed.stderr);
    });
    await t.step("without a command, a shell reads standard input", async () => {
      const shell = await run(["shell", ...at, "--cwd", dir], "echo $((2 + 3))\npwd\n");
      assert.equal(shell.code, 0, shell.stderr);
      assert.equal(shell.stdout, `5\n${dir}\n`);
    });
    await t.step(
      "it is the agent's sandbox: the agent's user, no view of this process",
      async () => {
        const who = await run(["shell", ...at, "--", `id -u; cat /proc/${Deno.pid}/environ; true`]);
        assert.equal(who.code, 0, who.stderr);
        assert.match(
          who.stdout,
          Deno.uid() === 0 ? /^59\d\d\d\n$/ : new RegExp(`^${Deno.uid()}\n$`),
        );
      },
    );
    await t.step(withCounterparts({
      name: "on a terminal, an interactive shell with a terminal of its own",
      fn: async () => {
        // script(1) gives the command line a terminal; what is typed goes in as keys.
        const typed = `cd '${dir}'; tty >/dev/null && echo "tty:$(cat note.txt)"; exit 4\n`;
        const out = new Deno.Command("script", {
          args: ["-qec", `${Deno.execPath()} run -A cli.ts shell --url ${url}`, "/dev/null"],
          cwd: ROOT,
          env: { HUD_SERVE_TOKEN: server.token!, NO_COLOR: "1", TERM: "xterm" },
          stdin: "piped",
          stdout: "piped",
          stderr: "piped",
          signal: testSignal(),
        }).spawn();
        // Keys are typed once the remote shell shows its prompt (raw mode set by then).
        const reader = out.stdout.getReader();
        let text = "";
        while (!/[$#] $/.test(text)) {
          const { value, done } = await reader.read();
          if (done) break;
          text += new TextDecoder().decode(value);
        }
        const writer = out.stdin.getWriter();
        await writer.write(new TextEncoder().encode(typed));
        await writer.close();
        while (true) {
          const { value, done } = await reader.read();
          if (done) break;
          text += new TextDecoder().decode(value);
        }
        const done = await out.status;
        await out.stderr.cancel();
        assert.match(text, /tty:hello/, text);
        assert.equal(done.code, 4, text);
      },
    }, [SCRIPT]));
    await t.step("a binding that is no shell is refused, naming the way out", async () => {
      const ran = await run(["shell", ...at, "--capability", "nope"]);
      assert.equal(ran.code, 1);
      assert.match(ran.stderr, /^error: .*"nope"/);
    });
    await t.step("the task is still parked, and grades", async () => {
      const graded = await run(["grade", "note", ...at, "--session", session, "--answer", "hello"]);
      assert.equal(graded.code, 0, graded.stderr);
      assert.equal(JSON.parse(graded.stdout).score, 1);
    });
  } finally {
    await env.stop();
    await Deno.remove(root, { recursive: true });
    await Deno.remove(tokenFile).catch(() => {});
  }
});

test("hud start's hints repeat the command as it was run: deno run -A cli.ts from a checkout", async () => {
  const env = new Environment("arith", { version: "1.0.0" });
  env.template({ id: "say", args: { word: string() } }, async function* ({ word }) {
    const answer = yield `Say ${word}`;
    yield answer === word ? 1 : 0;
  });
  await using server = bind(env);
  const url = `tcp://127.0.0.1:${server.addr.port}`;
  // Run as the README says, from the checkout: the hint says that, not "hud grade".
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "cli.ts", "start", "say", "--args", '{"word":"hi"}', "--url", url],
    cwd: ROOT,
    env: { HUD_SERVE_TOKEN: server.token!, NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: testSignal(),
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, stderr);
  assert.match(stderr, /Grade it with:\n {2}deno run -A cli\.ts grade say --url /);
  assert.doesNotMatch(stderr, /hud grade/);
  assert.doesNotMatch(stderr, /Open its shell/, "no shell to open here");
  // Called from code, the program's name; and as given.
  const withToken = `tcp://:${server.token}@127.0.0.1:${server.addr.port}`;
  const inProcess = await run(["start", "say", "--args", '{"word":"hi"}', "--url", withToken]);
  assert.match(inProcess.stderr, /Grade it with:\n {2}hud grade say /);
  let said = "";
  await main(["start", "say", "--args", '{"word":"hi"}', "--url", withToken], {
    stdout: () => {},
    stderr: (t) => said += t,
    program: "deno run -A /opt/hud/cli.ts",
  });
  assert.match(said, /Grade it with:\n {2}deno run -A \/opt\/hud\/cli\.ts grade say /);
});
