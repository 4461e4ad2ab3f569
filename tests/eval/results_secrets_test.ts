// Results files keep no secrets and no reader but their owner (issue 23,
// point 5): an agent reads an API key and an OpenSSH private key planted in
// its workspace, once as a command agent and once as ChatAgent against a
// scripted model, through `cli.ts eval` run with umask 000; the results file
// is 0600 in a directory no wider than 0700, and holds neither secret.

import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { completion, scriptedServer } from "../agents/_scripted.ts";
import { Trace } from "../../eval/trace.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const LAB = new URL("../fixtures/secrets_env.ts", import.meta.url).pathname;
const AGENT = new URL("../fixtures/secrets_agent.sh", import.meta.url).pathname;

/** A fresh OpenSSH private key, as `ssh-keygen` writes it. */
async function opensshKey(dir: string): Promise<string> {
  const path = `${dir}/id_ed25519`;
  const made = await new Deno.Command("ssh-keygen", {
    args: ["-q", "-t", "ed25519", "-N", "", "-C", "planted", "-f", path],
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.ok(made.success, new TextDecoder().decode(made.stderr));
  const key = await Deno.readTextFile(path);
  await Deno.remove(path);
  await Deno.remove(`${path}.pub`);
  return key;
}

/** `cli.ts eval LAB ...args` with umask 000; its exit code and output. */
async function evalWithUmask0(args: string[], env: Record<string, string>) {
  const out = await new Deno.Command("bash", {
    args: [
      "-c",
      'umask 000 && exec "$@"',
      "bash",
      Deno.execPath(),
      "run",
      "-A",
      CLI,
      "eval",
      LAB,
      ...args,
    ],
    env: { NO_COLOR: "1", ...env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(120_000),
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

interface Planted {
  apiKey: string;
  privateKey: string;
  plant: Record<string, string>;
}

async function plant(dir: string): Promise<Planted> {
  const apiKey = Array.from(
    crypto.getRandomValues(new Uint8Array(20)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  const privateKey = await opensshKey(dir);
  return {
    apiKey,
    privateKey,
    plant: {
      "service.env": `REGION=eu\nWEATHER_API_KEY=${apiKey}\n`,
      "notes.txt": `deploy with this key:\n${privateKey}`,
    },
  };
}

/** Every secret's trace in `text`: the API key, and each line of the key's body. */
function leaks(text: string, planted: Planted): string[] {
  const found: string[] = [];
  if (text.includes(planted.apiKey)) found.push("the API key");
  for (const line of planted.privateKey.split("\n")) {
    if (line.length >= 16 && !line.startsWith("-----") && text.includes(line)) {
      found.push(`the private key's line "${line.slice(0, 12)}..."`);
    }
  }
  if (text.includes("BEGIN OPENSSH PRIVATE KEY-----\\n")) found.push("the key's armour");
  return found;
}

async function checkResults(out: string, planted: Planted): Promise<void> {
  const text = await Deno.readTextFile(out);
  assert.deepEqual(leaks(text, planted), [], "secrets in results.jsonl");
  // The agent did read them: what replaced them is there.
  assert.match(text, /\[REDACTED OPENSSH PRIVATE KEY\]/);
  assert.match(text, /WEATHER_API_KEY=\[REDACTED value\]/);
  const mode = (await Deno.stat(out)).mode! & 0o777;
  assert.equal(mode, 0o600, `results file mode ${mode.toString(8)}`);
  const dirMode = (await Deno.stat(out.slice(0, out.lastIndexOf("/")))).mode! & 0o777;
  assert.equal(dirMode & 0o077, 0, `results directory mode ${dirMode.toString(8)}`);
}

test("cli.ts eval with a command agent keeps planted secrets out of a 0600 results file", {
  needs: [SANDBOX],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "results-secrets-" });
  try {
    const planted = await plant(dir);
    const root = `${dir}/ws`;
    await Deno.mkdir(root);
    const out = `${dir}/out/job/results.jsonl`;
    const ran = await evalWithUmask0(["--agent", AGENT, "--out", out], {
      SECRETS_LAB_ROOT: root,
      SECRETS_PLANT: JSON.stringify(planted.plant),
    });
    assert.equal(ran.code, 0, ran.stderr);
    await checkResults(out, planted);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("cli.ts eval --model keeps what ChatAgent read out of a 0600 results file", {
  needs: [SANDBOX],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "results-secrets-" });
  try {
    const planted = await plant(dir);
    const root = `${dir}/ws`;
    await Deno.mkdir(root);
    const out = `${dir}/out/job/results.jsonl`;
    await using model = scriptedServer([
      completion({ tool_calls: [["bash", '{"command": "cat service.env notes.txt"}']] }),
      completion({ tool_calls: [["read_file", '{"path": "notes.txt"}']] }),
      completion({ tool_calls: [["submit", '{"answer": "read them"}']] }),
    ]);
    const ran = await evalWithUmask0(
      ["--model", "scripted", "--base-url", model.baseUrl, "--max-steps", "4", "--out", out],
      {
        SECRETS_LAB_ROOT: root,
        SECRETS_PLANT: JSON.stringify(planted.plant),
        OPENAI_API_KEY: "sk-test-not-a-real-key-0000000000",
      },
    );
    assert.equal(ran.code, 0, ran.stderr);
    // The model was given them (that is the agent's business); the file keeps none.
    const sent = JSON.stringify(model.received.map((r) => r.body));
    assert.ok(sent.includes(planted.apiKey), "the model never saw the API key");
    await checkResults(out, planted);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("Trace redacts what it records: steps, info, failures and the answer", () => {
  const key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n" +
    "-----END OPENSSH PRIVATE KEY-----\n";
  const trace = new Trace();
  const content = { request: [{ role: "tool", content: `$ cat id\n${key}` }] };
  trace.record("model", content, { stderr: "DB_PASSWORD=correct-horse-battery" });
  trace.fail("agent", new Error("Agent command exited with code 1: GH ghp_" + "a".repeat(36)));
  trace.setContent(`the key is ${key}`);
  const json = JSON.stringify(trace);
  for (const secret of ["b3BlbnNzaC1rZXktdjEAAAAABG5vbmU", "correct-horse-battery", "ghp_aaaa"]) {
    assert.ok(!json.includes(secret), `${secret} in ${json}`);
  }
  assert.match(json, /\[REDACTED OPENSSH PRIVATE KEY\]/);
  assert.match(json, /\[REDACTED GitHub token\]/);
  // What the caller passed is left as it was.
  assert.ok(content.request[0].content.includes("b3BlbnNz"));
});

test("cli.ts report --html writes its page 0600 whatever the umask", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const results = `${dir}/results.jsonl`;
    const record = {
      job_id: "job",
      group_id: "job:t",
      task: { env: "e", id: "t", args: {}, slug: "t" },
      repeat: 0,
      status: "completed",
      reward: 1,
      failed_phase: null,
      trace: { started_at: "2026-01-01T00:00:00.000Z", ended_at: null, errors: [], steps: [] },
    };
    await Deno.writeTextFile(results, JSON.stringify(record) + "\n");
    const page = `${dir}/report.html`;
    // The page holds every trace of the results it was given: as private as they are.
    const ran = await new Deno.Command("bash", {
      args: ["-c", 'umask 000 && exec "$@"', "bash", Deno.execPath(), "run", "-A", CLI, "report"]
        .concat([results, "--html", page]),
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(60_000),
    }).output();
    assert.equal(ran.code, 0, new TextDecoder().decode(ran.stderr));
    const mode = (await Deno.stat(page)).mode! & 0o777;
    assert.equal(mode, 0o600, `report mode ${mode.toString(8)}`);
    assert.match(await Deno.readTextFile(page), /^<!doctype html>/i);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
