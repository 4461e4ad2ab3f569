// The TOML reader against the toml-test suite (tests/fixtures/toml/README.md
// says where each case comes from), real Harbor task.toml files, and the
// positions its errors name.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  parseToml,
  TomlDateTime,
  TomlSyntaxError,
  type TomlTable,
  type TomlValue,
} from "../../harbor/mod.ts";

const FIXTURES = new URL("../fixtures/toml/", import.meta.url);

/** Every `*.toml` under `dir`, as paths relative to it, sorted. */
function tomlFiles(dir: URL, prefix = ""): string[] {
  const out: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    if (entry.isDirectory) {
      out.push(...tomlFiles(new URL(`${entry.name}/`, dir), `${prefix}${entry.name}/`));
    } else if (entry.name.endsWith(".toml")) out.push(`${prefix}${entry.name}`);
  }
  return out.sort();
}

type Tagged = { type: string; value: string } | Tagged[] | { [key: string]: Tagged };

function isTaggedValue(v: Tagged): v is { type: string; value: string } {
  return !Array.isArray(v) && Object.keys(v).length === 2 && typeof v.type === "string" &&
    typeof v.value === "string";
}

/** toml-test's date-time equality: `T`, upper case, fractions to the millisecond. */
function normaliseDateTime(text: string): string {
  return text.toUpperCase().replace(" ", "T").replace(
    /\.(\d+)/,
    (_, digits: string) => {
      const ms = digits.slice(0, 3).replace(/0+$/, "");
      return ms === "" ? "" : `.${ms}`;
    },
  );
}

const DATE_KINDS: Record<string, string> = {
  "datetime": "offset-date-time",
  "datetime-local": "local-date-time",
  "date-local": "local-date",
  "time-local": "local-time",
};

/** Why `actual` differs from toml-test's `expected`, or null. */
function mismatch(actual: TomlValue, expected: Tagged, path: string): string | null {
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual)) return `${path}: expected an array, got ${String(actual)}`;
    if (actual.length !== expected.length) {
      return `${path}: expected ${expected.length} elements, got ${actual.length}`;
    }
    for (let i = 0; i < expected.length; i++) {
      const m = mismatch(actual[i], expected[i], `${path}[${i}]`);
      if (m !== null) return m;
    }
    return null;
  }
  if (isTaggedValue(expected)) {
    const { type, value } = expected;
    switch (type) {
      case "string":
        return actual === value ? null : `${path}: expected ${JSON.stringify(value)}`;
      case "bool":
        return String(actual) === value && typeof actual === "boolean"
          ? null
          : `${path}: expected ${value}`;
      case "integer":
        return (typeof actual === "bigint" ||
            (typeof actual === "number" && Number.isSafeInteger(actual))) &&
            BigInt(actual) === BigInt(value)
          ? null
          : `${path}: expected integer ${value}, got ${String(actual)}`;
      case "float": {
        if (typeof actual !== "number") return `${path}: expected a float, got ${String(actual)}`;
        const want = value === "nan"
          ? NaN
          : /^[+-]?inf$/.test(value)
          ? (value[0] === "-" ? -Infinity : Infinity)
          : Number(value);
        return Object.is(actual, want) || actual === want
          ? null
          : `${path}: expected float ${value}, got ${actual}`;
      }
      default: {
        const kind = DATE_KINDS[type];
        if (kind === undefined) return `${path}: unknown type ${type}`;
        if (!(actual instanceof TomlDateTime)) return `${path}: expected a ${type}`;
        if (actual.kind !== kind) return `${path}: expected a ${kind}, got a ${actual.kind}`;
        return normaliseDateTime(actual.toString()) === normaliseDateTime(value)
          ? null
          : `${path}: expected ${value}, got ${actual}`;
      }
    }
  }
  if (
    typeof actual !== "object" || actual === null || Array.isArray(actual) ||
    actual instanceof TomlDateTime
  ) {
    return `${path}: expected a table, got ${String(actual)}`;
  }
  const want = Object.keys(expected).sort();
  const got = Object.keys(actual).sort();
  if (JSON.stringify(want) !== JSON.stringify(got)) {
    return `${path}: expected keys ${JSON.stringify(want)}, got ${JSON.stringify(got)}`;
  }
  for (const key of want) {
    const m = mismatch(
      (actual as TomlTable)[key],
      (expected as Record<string, Tagged>)[key],
      `${path}.${key}`,
    );
    if (m !== null) return m;
  }
  return null;
}

test("parseToml() reads every valid toml-test case as the suite expects", async (t) => {
  const dir = new URL("valid/", FIXTURES);
  const cases = tomlFiles(dir);
  assert.ok(cases.length >= 100, `only ${cases.length} valid cases`);
  for (const name of cases) {
    await t.step(name, () => {
      const bytes = Deno.readFileSync(new URL(name, dir));
      const expected = JSON.parse(
        Deno.readTextFileSync(new URL(name.replace(/\.toml$/, ".json"), dir)),
      ) as Tagged;
      const m = mismatch(parseToml(bytes), expected, "$");
      assert.equal(m, null);
    });
  }
});

test("parseToml() refuses every invalid toml-test case with a positioned error", async (t) => {
  const dir = new URL("invalid/", FIXTURES);
  const cases = tomlFiles(dir);
  assert.ok(cases.length >= 100, `only ${cases.length} invalid cases`);
  for (const name of cases) {
    await t.step(name, () => {
      const bytes = Deno.readFileSync(new URL(name, dir));
      let parsed: unknown;
      try {
        parsed = parseToml(bytes);
      } catch (err) {
        assert.ok(err instanceof TomlSyntaxError, String(err));
        assert.match(err.message, /^Cannot parse TOML: line \d+, column \d+: \S/);
        return;
      }
      assert.fail(
        `parsed as ${JSON.stringify(parsed, (_, v) => typeof v === "bigint" ? String(v) : v)}`,
      );
    });
  }
});

test("parseToml() reads task.toml files in the shapes Harbor tasks use", async (t) => {
  const dir = new URL("harbor/", FIXTURES);
  const read = (name: string) => parseToml(Deno.readFileSync(new URL(name, dir)));

  await t.step("Terminal-Bench 2's keys", () => {
    const task = read("tb2-shape.toml");
    assert.equal(task.version, "2.0");
    assert.deepEqual(task.agent, { timeout_sec: 1800 });
    assert.deepEqual(task.verifier, { timeout_sec: 900 });
    assert.deepEqual(task.environment, {
      allow_internet: false,
      build_timeout_sec: 900,
      cpus: 2,
      memory_mb: 4096,
      storage_mb: 10240,
      workdir: "/app",
    });
    assert.deepEqual((task.metadata as TomlTable).subcategories, []);
    assert.equal(((task.metadata as TomlTable).tags as string[]).length, 8);
  });

  await t.step("comments, sub-tables and env tables", () => {
    const task = read("comments-env-tables.toml");
    assert.equal(task.schema_version, "1.4");
    const metadata = task.metadata as TomlTable;
    assert.equal(metadata.author_name, "HUD SDK tests");
    assert.deepEqual(metadata.harness, { verifier: { gpus: 0 } });
    assert.match(metadata.verification_explanation as string, /through its own simulator/);
    const environment = task.environment as TomlTable;
    assert.equal(environment.network_mode, "public");
    assert.deepEqual(environment.env, {
      QUEUE_SEEDS: "3,5,8",
      QUEUE_RATE: "0.25",
      QUEUE_LENGTH: "500",
    });
    assert.deepEqual((task.verifier as TomlTable).env, {
      QUEUE_VERIFY_LENGTH: "500",
      QUEUE_VERIFY_BUDGET_SEC: "2",
      QUEUE_VERIFY_MAX_REWARD: "1.0",
    });
    assert.equal((task.agent as TomlTable).timeout_sec, 21600);
  });

  await t.step("empty sub-tables and arrays", () => {
    const task = read("empty-tables.toml");
    assert.deepEqual((task.verifier as TomlTable).env, {});
    assert.deepEqual(task.solution, { env: {} });
    assert.deepEqual((task.environment as TomlTable).mcp_servers, []);
    assert.equal((task.environment as TomlTable).allow_internet, true);
  });

  await t.step("the shape of Harbor's documented example: arrays of tables, inline tables", () => {
    const task = read("arrays-of-tables.toml");
    // Keys after [[metadata.authors]] belong to that element, as TOML says.
    assert.deepEqual(task.metadata, {
      authors: [{
        name: "Test Author",
        email: "author@hud-sdk.invalid",
        difficulty_explanation: "A one-step task for the reader's tests",
        category: "programming",
        tags: ["trivial"],
      }],
    });
    assert.deepEqual(task.verifier, { timeout_sec: 120, env: { TOKEN_NAME: "not-a-secret" } });
    assert.deepEqual((task.environment as TomlTable).gpu_types, ["H100", "A100"]);
    assert.deepEqual((task.environment as TomlTable).mcp_servers, [{
      name: "tools",
      transport: "streamable-http",
      url: "http://tools:8000/mcp",
    }]);
  });
});

test("parseToml() names the line and column of an error", async (t) => {
  const cases: [string, string][] = [
    ["a = 1\nb = 2\nc = [1,\n  2,\n  =]\n", 'line 5, column 3: expected a value, got "="'],
    ["[agent]\ntimeout_sec = 1\n[agent]\n", "line 3, column 1: table [agent] is defined twice"],
    ["a.b = 1\na.b.c = 2\n", "line 2, column 1: cannot set a.b.c: a.b is a number"],
    ['k = "δδδ\\q"\n', "line 1, column 9: invalid escape \\q"],
    ["k = 1 2\n", 'line 1, column 7: expected the end of the line, got "2"'],
    ["k = {a = 1,\nb = 2}\n", "line 1, column 12: an inline table must be on one line"],
    [
      "k = 9223372036854775808\n",
      "line 1, column 5: integer 9223372036854775808 does not fit in 64 bits",
    ],
    [
      "k = 2021-02-29\n",
      "line 1, column 5: invalid date-time 2021-02-29: day 29 is out of range for 2021-02",
    ],
    ['k = "unterminated\n', "line 1, column 18: a newline is not allowed in a one-line string"],
    ["[a]\nb = 1\n[a.b]\n", "line 3, column 1: cannot define table [a.b]: it is a number"],
    ["x = [1]\n[[x]]\n", "line 2, column 1: cannot define array of tables [[x]]: it is an array"],
    [
      "[t]\nk = { a = 1 }\n[t.k.b]\n",
      "line 3, column 1: cannot define a table under t.k: it is an inline table",
    ],
    [
      "[a.b.c]\nz = 9\n[a]\nb.c.t = 1\n",
      "line 4, column 1: cannot set b.c.t: table [a.b.c] is defined by a header, not by dotted keys",
    ],
  ];
  for (const [source, message] of cases) {
    await t.step(JSON.stringify(source), () => {
      assert.throws(() => parseToml(source), (err: unknown) => {
        assert.ok(err instanceof TomlSyntaxError);
        assert.equal(err.message, `Cannot parse TOML: ${message}`);
        const [, line, column] = /line (\d+), column (\d+)/.exec(message)!;
        assert.equal(err.line, Number(line));
        assert.equal(err.column, Number(column));
        return true;
      });
    });
  }
});

test("parseToml() takes bytes: a leading BOM is skipped, bad UTF-8 is located", () => {
  const bom = new Uint8Array([0xef, 0xbb, 0xbf, ...new TextEncoder().encode("a = 1\n")]);
  assert.deepEqual(parseToml(bom), { a: 1 });
  const bad = new Uint8Array([...new TextEncoder().encode('a = 1\nb = "é'), 0xff, 0x22, 0x0a]);
  assert.throws(() => parseToml(bad), {
    name: "TomlSyntaxError",
    message: "Cannot parse TOML: line 2, column 7: the document is not valid UTF-8",
  });
  assert.throws(() => parseToml("a = '\ud800'"), {
    message: "Cannot parse TOML: line 1, column 6: a lone surrogate is not Unicode",
  });
  assert.throws(() => parseToml(42 as unknown as string), TypeError);
});

test("parseToml() keeps own keys: __proto__ and constructor are ordinary names", () => {
  const table = parseToml('__proto__ = 1\nconstructor.x = "y"\n[toString]\n');
  assert.deepEqual(Object.keys(table), ["__proto__", "constructor", "toString"]);
  assert.equal(Object.getPrototypeOf(table), Object.prototype);
  assert.equal(Object.getOwnPropertyDescriptor(table, "__proto__")?.value, 1);
  assert.deepEqual(table.constructor, { x: "y" });
});

test("parseToml() gives integers beyond 2^53 as bigint, within as numbers", () => {
  const t = parseToml(
    "a = 9007199254740991\nb = 9007199254740992\nc = -0x1\n".replace("-0x1", "-1"),
  );
  assert.equal(t.a, 9007199254740991);
  assert.equal(t.b, 9007199254740992n);
  assert.equal(t.c, -1);
});

test("TomlDateTime keeps the precision and offset it was written with", () => {
  const odt = parseToml("t = 1979-05-27t00:32:00.999999-07:00\n").t as TomlDateTime;
  assert.equal(odt.kind, "offset-date-time");
  assert.equal(odt.toString(), "1979-05-27T00:32:00.999999-07:00");
  assert.equal(JSON.stringify({ odt }), '{"odt":"1979-05-27T00:32:00.999999-07:00"}');
  assert.equal(odt.toDate().toISOString(), "1979-05-27T07:32:00.999Z");
  assert.equal(new TomlDateTime("0001-01-01T00:00:00Z").toDate().getUTCFullYear(), 1);
  const local = new TomlDateTime("1979-05-27");
  assert.equal(local.kind, "local-date");
  assert.throws(() => local.toDate(), {
    name: "TypeError",
    message: 'Cannot convert TOML local-date "1979-05-27" to a Date: it has no offset',
  });
  assert.throws(() => new TomlDateTime("1979-13-01"), {
    name: "SyntaxError",
    message: 'Cannot read TOML date-time "1979-13-01": month 13 is out of range',
  });
});
