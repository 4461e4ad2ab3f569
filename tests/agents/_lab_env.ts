// A one-task lab for the eval --model test: a workspace at $AGENTS_LAB_ROOT
// with a misspelt script; the answer must be its fixed output.
import { addWorkspace, Environment } from "../../mod.ts";

const root = Deno.env.get("AGENTS_LAB_ROOT");
if (!root) throw new Error("Cannot load the lab: set AGENTS_LAB_ROOT");

export const env = new Environment("lab");
addWorkspace(env, root, { env: { HOME: root } });
env.template({ id: "greet" }, async function* () {
  await Deno.writeTextFile(`${root}/greet.sh`, "echo helo\n");
  const answer = yield "greet.sh misspells hello. Fix it, then submit its output.";
  yield answer === "hello" ? 1 : 0;
});
