// Tokens never need a command line (issue 23, point 6): any local user reads
// /proc/PID/cmdline, so a token in --url is taken with a warning that names
// the ways that keep it off the command line (HUD_SERVE_TOKEN, --token-file),
// and --token-file refuses a file that its group or others can read.

import { test } from "./_test.ts";
import assert from "node:assert/strict";
import { main } from "../cli.ts";
import { bind, Environment } from "../mod.ts";

const TOKEN = "7".repeat(64);
const BASIC = decodeURIComponent(new URL("./fixtures/basic_env.ts", import.meta.url).pathname);

interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

async function run(args: string[]): Promise<Ran> {
  let stdout = "";
  let stderr = "";
  const code = await main(args, {
    stdout: (text) => stdout += text,
    stderr: (text) => stderr += text,
  });
  return { code, stdout, stderr };
}

function served() {
  const env = new Environment("tokens");
  env.template({ id: "t" }, async function* () {
    yield "?";
    yield 1;
  });
  return bind(env, { token: TOKEN });
}

async function tokenFile(dir: string, mode: number): Promise<string> {
  const path = `${dir}/token-${mode.toString(8)}`;
  await Deno.writeTextFile(path, TOKEN + "\n", { mode });
  await Deno.chmod(path, mode);
  return path;
}

function assertRefusedFile(ran: Ran, path: string, mode: number): void {
  assert.equal(ran.code, 2, ran.stderr);
  assert.equal(ran.stdout, "");
  assert.match(ran.stderr, /^error: [^\n]+\n$/, "one line");
  assert.ok(
    ran.stderr.includes(
      `--token-file "${path}" can be read by its group or others (mode 0${
        mode.toString(8)
      }); chmod 600 "${path}"`,
    ),
    ran.stderr,
  );
  assert.ok(!ran.stderr.includes(TOKEN));
}

test("cli.ts tasks: a token in --url works, with a warning naming HUD_SERVE_TOKEN and --token-file", async () => {
  await using server = served();
  const ran = await run([
    "tasks",
    "--url",
    `tcp://:${TOKEN}@127.0.0.1:${server.addr.port}`,
    "--json",
  ]);
  assert.equal(ran.code, 0, ran.stderr);
  assert.deepEqual(JSON.parse(ran.stdout).map((t: { id: string }) => t.id), ["t"]);
  const warnings = ran.stderr.split("\n").filter((l) => l !== "");
  assert.equal(warnings.length, 1, ran.stderr);
  assert.match(warnings[0], /^warning: .*--url.*HUD_SERVE_TOKEN.*--token-file/);
  assert.ok(!ran.stderr.includes(TOKEN));
});

test("cli.ts tasks, start and grade --token-file: the token from a file only its owner reads", async () => {
  await using server = served();
  const dir = await Deno.makeTempDir();
  try {
    const url = `tcp://127.0.0.1:${server.addr.port}`;
    const good = await tokenFile(dir, 0o600);
    const listed = await run(["tasks", "--url", url, "--token-file", good, "--json"]);
    assert.equal(listed.code, 0, listed.stderr);
    assert.equal(listed.stderr, "", "no warning without a token on the command line");
    const started = await run(["start", "t", "--url", url, "--token-file", good]);
    assert.equal(started.code, 0, started.stderr);
    const session = /--session (\S+)/.exec(started.stderr)?.[1];
    assert.ok(session, started.stderr);
    const graded = await run([
      "grade",
      "t",
      "--answer",
      "x",
      "--url",
      url,
      "--session",
      session,
      "--token-file",
      good,
    ]);
    assert.equal(graded.code, 0, graded.stderr);
    for (const mode of [0o640, 0o604, 0o644]) {
      const path = await tokenFile(dir, mode);
      assertRefusedFile(await run(["tasks", "--url", url, "--token-file", path]), path, mode);
    }
    const both = await run([
      "tasks",
      "--url",
      `tcp://:${TOKEN}@127.0.0.1:${server.addr.port}`,
      "--token-file",
      good,
    ]);
    assert.equal(both.code, 2);
    assert.match(both.stderr, /^error: [^\n]*--url or --token-file, not both[^\n]*\n$/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("cli.ts serve --token-file refuses a file its group or others can read", async () => {
  const dir = await Deno.makeTempDir();
  try {
    for (const mode of [0o640, 0o604]) {
      const path = await tokenFile(dir, mode);
      assertRefusedFile(
        await run(["serve", BASIC, "--port", "0", "--token-file", path]),
        path,
        mode,
      );
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

// Issue 43, point 4: the safe way is the easy way. Every command that takes
// a --url takes the token from HUD_SERVE_TOKEN or --token-file, and says so;
// the help and the docs show only those two.
test("cli.ts tasks, start and grade take the token from HUD_SERVE_TOKEN: none on the command line, no warning", async () => {
  await using server = served();
  const url = `tcp://127.0.0.1:${server.addr.port}`;
  Deno.env.set("HUD_SERVE_TOKEN", TOKEN);
  try {
    const listed = await run(["tasks", "--url", url, "--json"]);
    assert.equal(listed.code, 0, listed.stderr);
    assert.equal(listed.stderr, "");
    const started = await run(["start", "t", "--url", url]);
    assert.equal(started.code, 0, started.stderr);
    assert.ok(!started.stderr.includes(TOKEN), "the hint repeats no token");
    const session = /--session (\S+)/.exec(started.stderr)?.[1];
    assert.ok(session, started.stderr);
    const graded = await run(["grade", "t", "--answer", "x", "--url", url, "--session", session]);
    assert.equal(graded.code, 0, graded.stderr);
    assert.equal(graded.stderr, "");
  } finally {
    Deno.env.delete("HUD_SERVE_TOKEN");
  }
});

test("cli.ts help and the docs show the token only through HUD_SERVE_TOKEN and --token-file", async () => {
  const tokenInUrl = /tcp:\/\/[^\s`'"@/]*:[^\s`'"@/]*@/;
  for (const command of ["tasks", "start", "grade", "serve"]) {
    const help = (await run([command, "--help"])).stdout;
    assert.match(help, /--token-file/, `${command} --help`);
    assert.match(help, /HUD_SERVE_TOKEN/, `${command} --help`);
    assert.doesNotMatch(help, tokenInUrl, `${command} --help shows a token in a url`);
  }
  const root = new URL("../", import.meta.url);
  const docs = [
    "README.md",
    ...[...Deno.readDirSync(new URL("docs/", root))]
      .filter((e) => e.name.endsWith(".md")).map((e) => `docs/${e.name}`),
  ];
  for (const doc of docs) {
    // runtimes.md names a placement's `url` property, for code that hands an address on.
    if (doc === "docs/runtimes.md") continue;
    const text = await Deno.readTextFile(new URL(doc, root));
    const line = text.split("\n").find((l) => tokenInUrl.test(l) || /--token[ =]/.test(l));
    assert.equal(line, undefined, `${doc} shows a token on a command line or in a url`);
  }
});
