import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { markSecret, redactDeep, redactSecrets } from "../../_internal/redact.ts";
import { controlAddress, generateToken, TokenVerifier } from "../../_internal/auth.ts";
import { AnthropicBackend, CommandAgent, OpenAiBackend } from "../../agents/mod.ts";
import { Environment, LocalRuntime, rollout } from "../../mod.ts";

const KEY =
  "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";

test("redactDeep() redacts every string of a value, copying only what changed", async (t) => {
  await t.step("strings nested in objects and arrays, keys too", () => {
    const value = {
      request: [{ role: "tool", content: `cat id:\n${KEY}` }],
      info: { "MY_API_KEY=abcdefgh12345678": 1, n: 3 },
    };
    assert.deepEqual(redactDeep(value), {
      request: [{ role: "tool", content: "cat id:\n[REDACTED OPENSSH PRIVATE KEY]" }],
      info: { "MY_API_KEY=[REDACTED value]": 1, n: 3 },
    });
    assert.equal(value.request[0].content.includes("b3BlbnNz"), true, "the input is not changed");
  });
  await t.step("nothing to redact: the same value back", () => {
    const value = { a: ["x", 1, null, { b: true }] };
    assert.equal(redactDeep(value), value);
    assert.equal(redactDeep("plain"), "plain");
    assert.equal(redactDeep(7), 7);
  });
  await t.step("what JSON would write: toJSON() results, a __proto__ key kept as a key", () => {
    const withJson = { toJSON: () => ({ note: "password=hunter2hunter2" }) };
    assert.deepEqual(redactDeep(withJson), { note: "password=[REDACTED value]" });
    const odd = JSON.parse('{"__proto__": "password=abcdefgh12345678"}');
    const out = redactDeep(odd) as Record<string, unknown>;
    assert.deepEqual(Object.keys(out), ["__proto__"]);
    assert.equal(Object.getPrototypeOf(out), Object.prototype);
    assert.equal(JSON.stringify(out), '{"__proto__":"password=[REDACTED value]"}');
  });
  await t.step("nesting past the depth is cut to a note", () => {
    let deep: unknown = KEY;
    for (let i = 0; i < 100; i++) deep = [deep];
    assert.ok(!JSON.stringify(redactDeep(deep)).includes("b3Blbn"));
  });
});

/** `n` random characters of `alphabet`: a value with no recognisable shape. */
function random(n: number, alphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789") {
  const bytes = crypto.getRandomValues(new Uint8Array(n));
  return Array.from(bytes, (b) => alphabet[b % alphabet.length]).join("");
}

// Issue 43, point 1: shapes the redactor missed. Each row: its name, the
// text around a fresh secret, and what the text must read after.
const SHAPES: [string, (v: string) => string, string][] = [
  ["*_TOKEN=", (v) => `export GITHUB_TOKEN=${v}`, "export GITHUB_TOKEN=[REDACTED value]"],
  [
    "HUD_SERVE_TOKEN=",
    (v) => `HUD_SERVE_TOKEN=${v} deno run -A cli.ts serve`,
    "HUD_SERVE_TOKEN=[REDACTED value] deno run -A cli.ts serve",
  ],
  ["lower-case token:", (v) => `api token: ${v}`, "api token: [REDACTED value]"],
  [
    "Authorization: Bearer",
    (v) => `Authorization: Bearer ${v}`,
    "Authorization: Bearer [REDACTED credential]",
  ],
  [
    "curl -H authorization",
    (v) => `curl -H 'authorization: token ${v}' https://x`,
    "curl -H 'authorization: token [REDACTED credential]' https://x",
  ],
  [
    "Authorization as JSON",
    (v) => `{"Authorization": "Basic ${v}"}`,
    '{"Authorization": "Basic [REDACTED credential]"}',
  ],
  ["Bearer alone", (v) => `headers: Bearer ${v}`, "headers: Bearer [REDACTED credential]"],
  [
    "scheme://user:pass@host",
    (v) => `postgres://app:${v}@db.internal:5432/app`,
    "postgres://app:[REDACTED password]@db.internal:5432/app",
  ],
  [
    "the control url",
    (v) => `tcp://:${v}@127.0.0.1:8765`,
    "tcp://:[REDACTED password]@127.0.0.1:8765",
  ],
  ["DB_PASS=", (v) => `DB_PASS=${v}\nDB_HOST=db`, "DB_PASS=[REDACTED value]\nDB_HOST=db"],
  ["MYSQL_PWD=", (v) => `MYSQL_PWD=${v}`, "MYSQL_PWD=[REDACTED value]"],
  ["*_PASSWORD:", (v) => `SMTP_PASSWORD: '${v}'`, "SMTP_PASSWORD: '[REDACTED value]'"],
  ["*_SECRET=", (v) => `STRIPE_WEBHOOK_SECRET=${v}`, "STRIPE_WEBHOOK_SECRET=[REDACTED value]"],
  ["JSON token", (v) => `{"token": "${v}", "n": 1}`, '{"token": "[REDACTED value]", "n": 1}'],
  ["JSON password", (v) => `{"password":"${v}"}`, '{"password":"[REDACTED value]"}'],
  ["JSON secret", (v) => `{"secret": "${v}"}`, '{"secret": "[REDACTED value]"}'],
  ["JSON api_key", (v) => `{"api_key": "${v}"}`, '{"api_key": "[REDACTED value]"}'],
  // JSON held as text in a JSON string (a tool call's arguments) stays JSON.
  [
    "an Authorization header in JSON in JSON",
    (v) => JSON.stringify({ command: `curl -H "Authorization: Bearer ${v}"` }),
    JSON.stringify({ command: 'curl -H "Authorization: Bearer [REDACTED credential]"' }),
  ],
  [
    "a password in JSON in JSON",
    (v) => JSON.stringify({ file: `{"password": "${v}"}` }),
    JSON.stringify({ file: '{"password": "[REDACTED value]"}' }),
  ],
];

test("redactSecrets() hides the secret shapes of issue 43, keeping the names", async (t) => {
  for (const [name, make, after] of SHAPES) {
    await t.step(name, () => {
      const text = make(random(20));
      const out = redactSecrets(text);
      assert.equal(out, after);
      assert.equal(redactSecrets(out), out, "twice changes nothing more");
      if (text.startsWith("{")) assert.doesNotThrow(() => JSON.parse(out), out);
    });
  }
});

test("redactSecrets() keeps what only looks like a secret's name", () => {
  const kept = [
    "tokenizer=bert-base-uncased",
    "bypass=enabled-always",
    "PWD=/home/user/project OLDPWD=/home/user",
    'max_tokens=1024 "input_tokens": 123456789',
    "token_ref = ${API_TOKEN}",
    "Authorization: Bearer $OPENAI_API_KEY",
    "the bearer of bad news",
    "https://example.com/a?b=c and ssh://git@github.com/x and user@example.com",
    "GIT_ASKPASS is unset; passing=yes",
  ];
  for (const text of kept) assert.equal(redactSecrets(text), text);
});

test("redactDeep() replaces members named like secrets whole, whatever their length", () => {
  const value = {
    access_token: "short",
    password: "pw",
    api_key: "k-1",
    nested: [{ client_secret: "abc", HUD_SERVE_TOKEN: "xyz", "db.pass": "p", mysql_pwd: "q" }],
    headers: { Authorization: "Bearer abc", "proxy-authorization": "opaque" },
    // Not secrets: counts, token ids, and names that only contain the word.
    tokens: { prompt_ids: [1, 2] },
    max_tokens: 5,
    input_tokens: "12",
    passed: "yes",
    tokenizer: "bpe",
    token: "",
  };
  assert.deepEqual(redactDeep(value), {
    access_token: "[REDACTED value]",
    password: "[REDACTED value]",
    api_key: "[REDACTED value]",
    nested: [{
      client_secret: "[REDACTED value]",
      HUD_SERVE_TOKEN: "[REDACTED value]",
      "db.pass": "[REDACTED value]",
      mysql_pwd: "[REDACTED value]",
    }],
    headers: {
      Authorization: "Bearer [REDACTED credential]",
      "proxy-authorization": "[REDACTED credential]",
    },
    tokens: { prompt_ids: [1, 2] },
    max_tokens: 5,
    input_tokens: "12",
    passed: "yes",
    tokenizer: "bpe",
    token: "",
  });
});

test("redactSecrets() hides the values this process holds as secrets, whatever their shape", async (t) => {
  await t.step("markSecret(): as is, percent-encoded in a url, escaped in JSON text", () => {
    const value = `${random(12)}/+"${random(6)}`;
    markSecret(value, "weather key");
    const texts = [
      `key ${value} end`,
      `https://api.example/today?k=${encodeURIComponent(value)}&x=1`,
      JSON.stringify({ env: { W: value } }),
    ];
    for (const text of texts) {
      const out = redactSecrets(text);
      assert.ok(!out.includes(value) && !out.includes(encodeURIComponent(value)), out);
      assert.match(out, /\[REDACTED weather key\]/);
    }
    assert.doesNotThrow(() => JSON.parse(redactSecrets(texts[2])));
  });
  await t.step("a token this process made, even inside a longer run of hex", () => {
    const token = generateToken();
    const out = redactSecrets(`HEX=0x${token}ff and ${token.toUpperCase()}`);
    assert.ok(!out.includes(token), out);
    assert.equal(out.split("[REDACTED token]").length, 2);
  });
  await t.step("a token a server checks, one put in a control address", () => {
    const checked = `tok-${random(40)}`;
    new TokenVerifier(checked);
    const inUrl = `url-${random(40)}`;
    controlAddress("127.0.0.1", 1, inUrl);
    // Past the url's own shape: the value alone, as an agent might print it.
    for (const v of [checked, inUrl]) assert.equal(redactSecrets(`v=${v};`), "v=[REDACTED token];");
  });
  await t.step("model backends' API keys and a command agent's env file", async () => {
    const openai = `o-${random(30)}`;
    const anthropic = `a-${random(30)}`;
    new OpenAiBackend({ model: "m", apiKey: openai, baseUrl: "http://127.0.0.1:9/v1" });
    new AnthropicBackend({ model: "m", apiKey: anthropic, baseUrl: "http://127.0.0.1:9" });
    for (const v of [openai, anthropic]) {
      assert.equal(redactSecrets(`[${v}]`), "[[REDACTED model API key]]");
    }
    const dir = await Deno.makeTempDir();
    try {
      const fromFile = random(24);
      const plain = random(24);
      await Deno.writeTextFile(`${dir}/agent.env`, `AGENT_API_KEY=${fromFile}\nREGION=${plain}\n`);
      await Deno.writeTextFile(`${dir}/agent.sh`, "#!/bin/sh\ncat >/dev/null\necho ok\n", {
        mode: 0o755,
      });
      const agent = new CommandAgent([`${dir}/agent.sh`], { envFile: `${dir}/agent.env` });
      const env = new Environment("e");
      const task = env.template({ id: "t" }, async function* () {
        yield "?";
        yield 1;
      });
      const run = await rollout(task(), agent, { runtime: new LocalRuntime(env) });
      assert.equal(run.reward, 1, JSON.stringify(run.trace.errors));
      assert.equal(
        redactSecrets(`${fromFile} ${plain}`),
        `[REDACTED value of AGENT_API_KEY] ${plain}`,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
  await t.step("markSecret() refuses a value too short to hide", () => {
    assert.throws(() => markSecret("abc"), {
      name: "RangeError",
      message: "Cannot mark a secret: it must be a string of at least 8 characters, got 3",
    });
  });
});

test("redactSecrets() holds the values of secret-named variables and those HUD_SECRET_ENV names", async () => {
  const [named, listed, plain, path] = [random(24), random(24), random(24), `/tmp/${random(12)}`];
  const program = `
    import { redactSecrets } from ${
    JSON.stringify(new URL("../../_internal/redact.ts", import.meta.url).href)
  };
    console.log(redactSecrets(Deno.args.join(" ")));
  `;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", program, named, listed, plain, path],
    env: {
      LAB_DB_PASSWORD: named,
      LAB_SEED: listed,
      HUD_SECRET_ENV: "OTHER, LAB_SEED",
      LAB_REGION: plain,
      PWD: path,
      GIT_ASKPASS: path,
    },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  assert.equal(
    new TextDecoder().decode(out.stdout).trim(),
    `[REDACTED value of LAB_DB_PASSWORD] [REDACTED value of LAB_SEED] ${plain} ${path}`,
  );
});
