// A project of the user's own beside a checkout of the SDK (issue 30), for
// tests/cli/user_project_test.ts and tests/engines/user_image_test.ts.
import assert from "node:assert/strict";
import { testSignal } from "./_deadline.ts";

export const SDK: string = decodeURIComponent(new URL("../", import.meta.url).pathname).replace(
  /\/$/,
  "",
);

/** The JSON block of docs/environments.md's "Depending on the SDK from another project" section. */
export async function readmeImportMap(): Promise<Record<string, string>> {
  const readme = await Deno.readTextFile(`${SDK}/docs/environments.md`);
  const section = readme.slice(readme.indexOf("## Depending on the SDK from another project"));
  const block = /```json\n([\s\S]*?)```/.exec(section);
  assert.ok(block, "the README's section shows an import map");
  return (JSON.parse(block[1]) as { imports: Record<string, string> }).imports;
}

// The environment imports the root and a subpath export, and serves itself
// behind the import.meta.main guard.
export const ENV_MODULE: string = `import { Environment, integer, serve } from "@hud/sdk";
import { ChatAgent } from "@hud/sdk/agents";

export const env = new Environment("userland", { version: "1.0.0" });
const add = env.template(
  { id: "add", description: \`Add (agents: \${typeof ChatAgent})\`, args: { a: integer(), b: integer() } },
  async function* ({ a, b }) {
    const answer = yield \`What is \${a} + \${b}?\`;
    yield Number(answer) === a + b ? 1 : 0;
  },
);
export const tasks = [add({ a: 1, b: 2 }), add({ a: 3, b: 4 })];

if (import.meta.main) await serve(env);
`;

// Reads "What is A + B?" and answers the sum.
export const AGENT: string = `read -r q; set -- $q; echo $(( $3 + \${5%?} ))`;

export interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs deno with `args` in `cwd`. */
export async function deno(cwd: string, ...args: string[]): Promise<Ran> {
  return await command(Deno.execPath(), cwd, args);
}

/** Runs `program` with `args` in `cwd`, capturing its output. */
export async function command(program: string, cwd: string, args: string[]): Promise<Ran> {
  const out = await new Deno.Command(program, {
    args,
    cwd,
    stdin: "null",
    env: { NO_COLOR: "1" },
    signal: testSignal(),
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

/** A temporary dir holding `hud-sdk` (this checkout) and `project` (the user's). */
export async function makeProject(map: Record<string, string>): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "hud_user_project_" });
  await Deno.symlink(SDK, `${dir}/hud-sdk`);
  await Deno.mkdir(`${dir}/project`);
  await Deno.writeTextFile(`${dir}/project/deno.json`, JSON.stringify({ imports: map }, null, 2));
  await Deno.writeTextFile(`${dir}/project/env.ts`, ENV_MODULE);
  return dir;
}
