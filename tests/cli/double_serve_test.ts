// Issue 30, point 5: `cli.ts serve` on a module that serves itself when
// imported (no `import.meta.main` guard) says so, instead of serving twice.
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
      `error: Cannot serve "${file}": the module serves its environment itself when imported; ` +
        `guard its serve() call with "if (import.meta.main)"\n`,
    );
    // The module's own server announced itself once; the command line did not serve it again.
    assert.equal(stdout.match(/^HUD_SERVE_PORT=/gm)?.length, 1, stdout);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
