// The environment the benchmark drives: one trivial template, plus an
// `echo` capability when ECHO_PORT is set (for the tunnel figure).

import { Capability } from "../capability.ts";
import { Environment } from "../env.ts";
import { integer, optional } from "../schema.ts";

/** The benchmark environment. */
export const env = new Environment("bench");

/** Answer "x" to score 1; `n` only tells the rows of figure 6 apart. */
export const t = env.template({ id: "t", args: { n: optional(integer()) } }, async function* () {
  const answer = yield "p";
  yield answer === "x" ? 1 : 0;
});

const echoPort = Deno.env.get("ECHO_PORT");
if (echoPort) {
  env.addCapability(
    new Capability({ name: "echo", protocol: "tcp/1", url: `tcp://127.0.0.1:${echoPort}` }),
  );
}
