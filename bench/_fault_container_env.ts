// The environment bench/faults.ts places in containers (with --containers N),
// to kill them mid-rollout: the prompt is a number, the right answer is the
// number itself; the agent takes its time, which is when containers die.
import { Environment } from "../env.ts";
import { integer } from "../schema.ts";

/** The environment in the image. */
export const env = new Environment("faults-container", { version: "1.0.0" });

env.template({ id: "echo", args: { n: integer() } }, async function* ({ n }) {
  const answer = yield `Answer with the number ${n}.`;
  yield String(answer).trim() === String(n) ? 1 : 0;
});
