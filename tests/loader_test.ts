import { test } from "./_test.ts";
import assert from "node:assert/strict";
import { Environment, loadEnvironment } from "../mod.ts";

const fixture = (name: string) => new URL(`./fixtures/${name}`, import.meta.url);

/** `to` (a file URL) as a path relative to the current directory. */
function relativeToCwd(to: URL): string {
  const from = Deno.cwd().split("/").filter(Boolean);
  const target = decodeURIComponent(to.pathname).split("/").filter(Boolean);
  let common = 0;
  while (common < from.length && from[common] === target[common]) common++;
  return [...from.slice(common).map(() => ".."), ...target.slice(common)].join("/");
}

test("loadEnvironment() picks a module's only environment", async (t) => {
  await t.step("from a path relative to the current directory", async () => {
    const path = relativeToCwd(fixture("basic_env.ts"));
    assert.ok(!path.startsWith("/"));
    const env = await loadEnvironment(path);
    assert.ok(env instanceof Environment);
    assert.equal(env.name, "fixture");
    assert.deepEqual(env.listTasks().map((task) => task.id), ["add", "echo"]);
  });
  await t.step("from an absolute path and from a URL, the same module instance", async () => {
    const byUrl = await loadEnvironment(fixture("basic_env.ts"));
    const byPath = await loadEnvironment(decodeURIComponent(fixture("basic_env.ts").pathname));
    assert.equal(byUrl, byPath);
  });
  await t.step("by its export name or its environment name", async () => {
    const url = fixture("basic_env.ts");
    const env = await loadEnvironment(url);
    assert.equal(await loadEnvironment(url, { name: "alias" }), env);
    assert.equal(await loadEnvironment(url, { name: "fixture" }), env);
  });
});

test("loadEnvironment() selects among several environments", async (t) => {
  const url = fixture("multi_env.ts");
  await t.step("by export name", async () => {
    assert.equal((await loadEnvironment(url, { name: "beta" })).name, "beta-env");
  });
  await t.step("by environment name", async () => {
    assert.equal((await loadEnvironment(url, { name: "beta-env" })).name, "beta-env");
    assert.equal((await loadEnvironment(url, { name: "alpha" })).name, "alpha");
  });
  await t.step("refuses to guess without a name, listing the candidates", async () => {
    await assert.rejects(loadEnvironment(url), (err: Error) => {
      assert.ok(err instanceof RangeError);
      assert.match(err.message, /exports several environments/);
      assert.match(err.message, /"alpha" \(environment "alpha"\)/);
      assert.match(err.message, /"beta" \(environment "beta-env"\)/);
      return true;
    });
  });
  await t.step("refuses a name two environments share", async () => {
    await assert.rejects(loadEnvironment(url, { name: "twin" }), (err: Error) => {
      assert.ok(err instanceof RangeError);
      assert.match(err.message, /several environments named "twin": "twinOne".*"twinTwo"/);
      return true;
    });
    assert.equal((await loadEnvironment(url, { name: "twinTwo" })).name, "twin");
  });
  await t.step("refuses an unknown name, listing what is available", async () => {
    await assert.rejects(loadEnvironment(url, { name: "gamma" }), (err: Error) => {
      assert.ok(err instanceof RangeError);
      assert.match(err.message, /has no environment "gamma"; available: "alpha"/);
      return true;
    });
  });
});

test("loadEnvironment() reports modules it cannot use", async (t) => {
  await t.step("a module without an environment", async () => {
    await assert.rejects(loadEnvironment(fixture("no_env.ts")), {
      name: "TypeError",
      message: /exports no Environment/,
    });
  });
  await t.step("an export that only looks like one by name", async () => {
    await assert.rejects(
      loadEnvironment(fixture("basic_env.ts"), { name: "notAnEnvironment" }),
      RangeError,
    );
  });
  await t.step("a missing file", async () => {
    await assert.rejects(loadEnvironment("tests/fixtures/does_not_exist.ts"), (err: Error) => {
      assert.ok(err instanceof Deno.errors.NotFound);
      assert.match(err.message, /file "tests\/fixtures\/does_not_exist.ts" not found/);
      return true;
    });
  });
  await t.step("a module that throws on import, with the cause kept", async () => {
    await assert.rejects(loadEnvironment(fixture("broken_env.ts")), (err: Error) => {
      assert.match(err.message, /Cannot load environment from .*: fixture refuses to load/);
      // On the first line, which the command line prints: where it threw.
      assert.match(err.message.split("\n")[0], /\(at \/.*\/fixtures\/broken_env\.ts:3:\d+\)$/);
      assert.equal((err.cause as Error).message, "fixture refuses to load");
      return true;
    });
  });
  await t.step("a syntax error names its line, in the module or a file it imports", async () => {
    const dir = await Deno.makeTempDir({ prefix: "loader-syntax-" });
    try {
      await Deno.writeTextFile(`${dir}/bad.ts`, "export const a = 1;\nconst b = ;\n");
      await Deno.writeTextFile(
        `${dir}/imports_bad.ts`,
        'import "./bad.ts";\nexport const x = 1;\n',
      );
      await Deno.writeTextFile(
        `${dir}/throws.ts`,
        "export const a = 1;\nconst o: { v?: string } = {};\no.v!.trim();\n",
      );
      await Deno.writeTextFile(`${dir}/imports_throws.ts`, 'import "./throws.ts";\n');
      const cases: [string, RegExp][] = [
        ["bad.ts", /: SyntaxError: Expression expected \(at \/.*\/bad\.ts:2:11\)$/],
        ["imports_bad.ts", /: SyntaxError: Expression expected \(at \/.*\/bad\.ts:2:11\)$/],
        [
          "imports_throws.ts",
          /: Cannot read properties of undefined .* \(at \/.*\/throws\.ts:3:\d+\)$/,
        ],
      ];
      for (const [file, first] of cases) {
        await assert.rejects(loadEnvironment(`${dir}/${file}`), (err: Error) => {
          // Before: "SyntaxError: Expression expected", no line, no file.
          assert.match(err.message.split("\n")[0], first, file);
          return true;
        });
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
  await t.step("bad arguments", async () => {
    await assert.rejects(loadEnvironment(""), TypeError);
    await assert.rejects(loadEnvironment(42 as unknown as string), TypeError);
    await assert.rejects(loadEnvironment(fixture("basic_env.ts"), { name: "" }), TypeError);
  });
});

test("loadEnvironment() refuses a module that serves when imported, before it binds or prints; serve() elsewhere meanwhile serves", async (t) => {
  const { serve } = await import("../server.ts");
  const dir = await Deno.makeTempDir({ prefix: "hud_unguarded_" });
  const mod = new URL("../mod.ts", import.meta.url).href;
  try {
    // Awaits before it serves, and serves through a function of its own: the
    // module's top level is still what the call comes from.
    const file = `${dir}/unguarded.ts`;
    await Deno.writeTextFile(
      file,
      `import { Environment, serve } from "${mod}";
export const env = new Environment("unguarded");
env.template({ id: "hi" }, async function* () { yield "hi"; yield 1; });
async function main() {
  await new Promise((r) => setTimeout(r, 10));
  return await serve(env, { handleSignals: false, announce: (line) => { throw new Error("announced " + line); } });
}
await new Promise((r) => setTimeout(r, 10));
await main();
`,
    );
    await t.step("the import fails, naming the way out; nothing was announced", async () => {
      await assert.rejects(
        loadEnvironment(file),
        new Error(
          `Cannot load environment from "${file}": Cannot serve "unguarded" while its module is ` +
            `loaded as an environment: guard the serve() call with "if (import.meta.main)" ` +
            `(at ${file}:6:16)`,
        ),
      );
    });
    await t.step(
      "a serve() of this process while another module loads is not refused",
      async () => {
        const slow = `${dir}/slow.ts`;
        await Deno.writeTextFile(
          slow,
          `import { Environment } from "${mod}";
await new Promise((r) => setTimeout(r, 300));
export const env = new Environment("slow");
`,
        );
        const loading = loadEnvironment(slow);
        const env = new Environment("here");
        const lines: string[] = [];
        const server = await serve(env, { handleSignals: false, announce: (l) => lines.push(l) });
        await server.shutdown();
        assert.match(lines.at(-1)!, /^HUD_SERVE_PORT=\d+$/);
        assert.equal((await loading).name, "slow");
      },
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
