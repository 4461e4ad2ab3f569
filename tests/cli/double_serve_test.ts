// Issue 30, point 5: `cli.ts serve` on a module that serves itself when
// imported (no `import.meta.main` guard) says so, instead of serving twice;
// issue 38: nor does the module's own serve() bind or print (a port and a
// token in `tasks`' output), under `serve`, `tasks` or any command that loads it.
import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { testSignal } from "../_deadline.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const MOD = new URL("../../mod.ts", import.meta.url).href;

test("cli.ts serve refuses a module that serves itself without the import.meta.main guard", async () => {
  const dir = await Deno.makeTempDir({ prefix: "hud_double_serve_" });
  try {
    const file = `${dir}/unguarded.ts`;
    await Deno.writeTextFile(
      file,
      `import { Environment, serve } from "${MOD}";
export const env = new Environment("unguarded");
env.template({ id: "hi" }, async function* () { yield "hi"; yield 1; });
await serve(env, { handleSignals: false });
`,
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CLI, "serve", file, "--port", "0"],
      env: { NO_COLOR: "1" },
      stdin: "null",
      signal: testSignal(),
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 1, stderr);
    assert.equal(
      stderr,
      `error: Cannot load environment from "${file}": Cannot serve "unguarded" while its module ` +
        `is loaded as an environment: guard the serve() call with "if (import.meta.main)" ` +
        `(at ${file}:4:7)\n`,
    );
    // Neither the module's own server (refused before it binds: issue 38) nor the command line's.
    assert.equal(stdout, "");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("cli.ts tasks on a module that serves itself when imported prints no port or token, and says why", async () => {
  const dir = await Deno.makeTempDir({ prefix: "hud_double_serve_" });
  try {
    const file = `${dir}/unguarded.ts`;
    await Deno.writeTextFile(
      file,
      `import { Environment, serve } from "${MOD}";
export const env = new Environment("unguarded");
env.template({ id: "hi" }, async function* () { yield "hi"; yield 1; });
await serve(env);
`,
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CLI, "tasks", file],
      env: { NO_COLOR: "1" },
      stdin: "null",
      signal: testSignal(),
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    const stderr = new TextDecoder().decode(out.stderr);
    // Was: HUD_SERVE_TOKEN=<the token> and HUD_SERVE_PORT= above the task table, exit 0.
    assert.doesNotMatch(stdout + stderr, /HUD_SERVE_(TOKEN|PORT)=/);
    assert.equal(stdout, "");
    assert.equal(out.code, 1, stderr);
    assert.match(
      stderr,
      /^error: Cannot load environment from .*"if \(import\.meta\.main\)" \(at \S+unguarded\.ts:4:7\)\n$/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
