// Results files keep no secrets and no reader but their owner (issue 23,
// point 5): an agent reads an API key and an OpenSSH private key planted in
// its workspace, once as a command agent and once as ChatAgent against a
// scripted model, through `cli.ts eval` run with umask 000; the results file
// is 0600 in a directory no wider than 0700, and holds neither secret.

import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { completion, type Received, scriptedServer } from "../agents/_scripted.ts";
import { Trace } from "../../eval/trace.ts";
import { connect, functionAgent, Job, type RunRecord, Taskset } from "../../mod.ts";
import { markSecret } from "../../env.ts";
import { SubprocessRuntime } from "../../runtime/mod.ts";
import { leak } from "../fixtures/leaky_env.ts";
import { openResults } from "../../eval/results.ts";
import { toAtif, trainingRows, writeTrajectories } from "../../eval/mod.ts";
import { renderReport, startViewer } from "../../viewer/mod.ts";
import { generateToken } from "../../_internal/auth.ts";

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

/** `n` random letters and digits: a secret with no shape a pattern knows. */
function shapeless(n = 24): string {
  const abc = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
  return Array.from(crypto.getRandomValues(new Uint8Array(n)), (b) => abc[b % abc.length]).join("");
}

/**
 * A record as a results file written before issue 43 kept it: secrets of
 * every shape the issue names, a value this process marked secret and a
 * token it made, in the trace, the task's args, the agent's info.
 */
function leakyRecord() {
  const secrets = {
    serveToken: shapeless(),
    bearer: shapeless(),
    urlPassword: shapeless(),
    dbPass: shapeless(),
    member: shapeless(),
    marked: shapeless(),
    made: generateToken(),
  };
  markSecret(secrets.marked, "lab key");
  const record = {
    job_id: "job",
    group_id: "job:t",
    task: {
      env: "e",
      id: "t",
      args: { db: `postgres://app:${secrets.urlPassword}@db/x` },
      slug: "t",
    },
    repeat: 0,
    status: "completed",
    reward: 1,
    failed_phase: null,
    agent: { kind: "model", name: "m", settings: { api_key: secrets.member } },
    trace: {
      status: "completed",
      stop_reason: "graded",
      content: `done; the lab key is ${secrets.marked}`,
      started_at: "2026-01-01T00:00:00.000Z",
      ended_at: "2026-01-01T00:00:01.000Z",
      errors: [],
      steps: [
        { type: "user", timestamp: "2026-01-01T00:00:00.000Z", content: "Print the env" },
        {
          type: "model",
          timestamp: "2026-01-01T00:00:00.100Z",
          content: {
            request: [{ role: "user", content: `Print the env (lab key ${secrets.marked})` }],
            reply: {
              role: "assistant",
              content: null,
              tool_calls: [{
                id: "c1",
                type: "function",
                function: {
                  name: "bash",
                  arguments: JSON.stringify({
                    command: `curl -H "Authorization: Bearer ${secrets.bearer}" localhost`,
                  }),
                },
              }],
            },
          },
          info: { model: "m", input_tokens: 10, output_tokens: 5 },
        },
        {
          type: "tool",
          timestamp: "2026-01-01T00:00:00.200Z",
          content: {
            id: "c1",
            name: "bash",
            result: `HUD_SERVE_TOKEN=${secrets.serveToken}\nDB_PASS=${secrets.dbPass}\n` +
              `TOKEN_NOW=${secrets.made}`,
          },
          info: { is_error: false },
        },
        {
          type: "evaluate",
          timestamp: "2026-01-01T00:00:01.000Z",
          content: { score: 1, info: { config: { password: secrets.member } } },
        },
      ],
    },
  };
  return { secrets, record };
}

function leaked(text: string, secrets: Record<string, string>): string[] {
  return Object.entries(secrets).filter(([, v]) => text.includes(v)).map(([k]) => k);
}

test("Results, ATIF trajectories, training rows and the viewer's pages hold no secret, whatever file they read", async () => {
  const dir = await Deno.makeTempDir({ prefix: "sinks-secrets-" });
  try {
    const { secrets, record } = leakyRecord();
    // A file as an earlier version wrote it: every secret in the clear.
    const raw = `${dir}/raw.jsonl`;
    await Deno.writeTextFile(raw, JSON.stringify(record) + "\n", { mode: 0o600 });
    assert.equal(leaked(await Deno.readTextFile(raw), secrets).length, 7);

    // Results written now: the record is redacted as it is appended.
    const out = `${dir}/results.jsonl`;
    const results = await openResults(out, { resume: false, force: false });
    await results.append(record as unknown as RunRecord);
    await results.close();
    const written = await Deno.readTextFile(out);
    assert.deepEqual(leaked(written, secrets), [], written);
    assert.match(written, /HUD_SERVE_TOKEN=\[REDACTED value\]/);
    assert.match(written, /\[REDACTED lab key\]/);
    assert.match(written, /Bearer \[REDACTED credential\]/);
    // The tool call's arguments are still JSON.
    const back = JSON.parse(written.trim());
    const call = back.trace.steps[1].content.reply.tool_calls[0].function.arguments;
    assert.match(JSON.parse(call).command, /^curl -H "Authorization: Bearer \[REDACTED/);

    // ATIF from the old file.
    const files = await writeTrajectories(raw, `${dir}/atif`);
    assert.equal(files.length, 1);
    const atif = await Deno.readTextFile(files[0]);
    assert.deepEqual(leaked(atif, secrets), [], atif);
    assert.deepEqual(leaked(JSON.stringify(toAtif(record as unknown as RunRecord)), secrets), []);

    // Training rows from the old file, and from records in memory.
    const rows = JSON.stringify((await Job.load(raw)).exportTraining());
    assert.deepEqual(leaked(rows, secrets), [], rows);
    const direct = JSON.stringify(trainingRows([record as unknown as RunRecord]));
    assert.deepEqual(leaked(direct, secrets), []);
    assert.match(direct, /\[REDACTED lab key\]/);

    // The viewer: report --html's page, and the live viewer's page and API.
    const html = await renderReport([raw]);
    assert.deepEqual(leaked(html, secrets), []);
    assert.match(html, /REDACTED lab key/);
    await using viewer = await startViewer([raw]);
    const auth = { authorization: `Bearer ${viewer.token}` };
    for (const path of ["/", "/api/rows?file=0&from=0", "/api/record?file=0&i=0"]) {
      const res = await fetch(new URL(path, viewer.url), { headers: auth });
      assert.equal(res.status, 200, path);
      const body = await res.text();
      assert.deepEqual(leaked(body, secrets), [], `${path}: ${body.slice(0, 300)}`);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

const LEAKY = new URL("../fixtures/leaky_env.ts", import.meta.url).pathname;

test("cli.ts eval keeps the environment's own secrets out of results, whatever their shape", async () => {
  const dir = await Deno.makeTempDir({ prefix: "own-secrets-" });
  try {
    // Shapeless values: only their being this process's secrets can hide them.
    const secrets = { db: shapeless(), seed: shapeless(), model: shapeless() };
    // A model server that repeats the API key it was sent in its answer.
    const reflect = (r: Received, i: number) =>
      completion({
        tool_calls: [[
          "submit",
          JSON.stringify({ answer: `the key: ${r.headers.get("authorization")?.slice(7)}` }),
        ]],
      })(r, i);
    await using model = scriptedServer([reflect, reflect]);
    const out = `${dir}/results.jsonl`;
    const ran = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CLI, "eval", LEAKY, "--model", "scripted", "--base-url", model.baseUrl]
        .concat(["--max-steps", "2", "--out", out]),
      env: {
        NO_COLOR: "1",
        LAB_DB_PASSWORD: secrets.db,
        LAB_SEED: secrets.seed,
        HUD_SECRET_ENV: "LAB_SEED",
        OPENAI_API_KEY: secrets.model,
      },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(120_000),
    }).output();
    // "fail" fails (the run still writes both records): the exit code says so.
    const stderr = new TextDecoder().decode(ran.stderr);
    assert.notEqual(ran.code, 0, stderr);
    // The leaks were real: the model was sent every secret, and saw its key.
    const sent = JSON.stringify(model.received.map((r) => r.body));
    for (const v of Object.values(secrets)) {
      assert.ok(sent.includes(v), "the prompt leaked nothing");
    }
    const text = await Deno.readTextFile(out);
    assert.equal(text.trim().split("\n").length, 2, text);
    assert.deepEqual(leaked(text, secrets), [], text.slice(0, 2000));
    assert.match(text, /\[REDACTED value of LAB_DB_PASSWORD\]/);
    assert.match(text, /\[REDACTED value of LAB_SEED\]/);
    assert.match(text, /the key: \[REDACTED (value of OPENAI_API_KEY|model API key)\]/);
    // The failed task's message went through the redactor too.
    const failed = text.trim().split("\n").map((l) => JSON.parse(l)).find((r) =>
      r.task.id === "fail"
    );
    assert.match(failed.trace.errors[0].message, /the database refused .*\[REDACTED value of/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("A served environment's grades and errors never carry its token; results hold none", async () => {
  {
    await using placement = await new SubprocessRuntime(LEAKY).place();
    const token = placement.address.token!;
    assert.match(token, /^[0-9a-f]{64}$/);
    await using client = await connect(placement);
    // On the wire, from the environment's process: the prompt is the
    // author's to give (it leaks); the grade and the error are redacted there.
    const { prompt } = await client.startTask("leak", {});
    assert.ok(String(prompt).includes(`HUD_SERVE_TOKEN=${token}`), "the leak is real");
    const grade = await client.grade({ answer: token });
    const wire = JSON.stringify(grade);
    assert.ok(!wire.includes(token), wire.slice(0, 500));
    assert.match(wire, /\[REDACTED token\]/);
    await client.startTask("fail", {});
    await assert.rejects(() => client.grade({ answer: "x" }), (err: Error) => {
      assert.ok(!err.message.includes(token));
      assert.match(err.message, /the database refused .*\[REDACTED token\]/);
      return true;
    });
  }
  // And a job's results: the answer holds the bare token, the prompt and grade too.
  const dir = await Deno.makeTempDir({ prefix: "own-token-" });
  try {
    const tokens: string[] = [];
    const agent = functionAgent((prompt) => {
      const token = /HUD_SERVE_TOKEN=(\S+)/.exec(String(prompt))![1];
      tokens.push(token);
      return token;
    });
    const out = `${dir}/results.jsonl`;
    await new Taskset([leak()]).run(agent, { runtime: new SubprocessRuntime(LEAKY), out });
    assert.equal(tokens.length, 1);
    const text = await Deno.readTextFile(out);
    assert.ok(!text.includes(tokens[0]), text.slice(0, 2000));
    assert.match(text, /"content":"\[REDACTED token\]"/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
