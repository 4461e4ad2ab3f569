// Rollouts per second of the fixture environment's `add` task
// (tests/fixtures/basic_env.ts) through a runtime: `rollouts` rollouts,
// `concurrency` at a time, every one graded 1 or the run throws. Shared by
// bench/containers.ts and bench/clusters.ts.

import type { RuntimeProvider } from "../runtime/placement.ts";
import { Taskset } from "../eval/taskset.ts";
import { functionAgent } from "../eval/agent.ts";
import { taskSlug } from "../env.ts";

/** Returns [rollouts per second, seconds]. */
export async function throughput(
  runtime: RuntimeProvider,
  rollouts: number,
  concurrency: number,
): Promise<[number, number]> {
  const rows = Array.from({ length: rollouts }, (_, i) => ({
    env: "fixture",
    id: "add",
    args: { a: i, b: 1 },
    slug: taskSlug("add", { a: i, b: 1 }),
  }));
  const agent = functionAgent((prompt) => {
    const [a, b] = String(prompt).match(/\d+/g)!.map(Number);
    return String(a + b);
  });
  const t0 = performance.now();
  const job = await new Taskset(rows).run(agent, {
    runtime,
    maxConcurrent: concurrency,
    signal: AbortSignal.timeout(600_000),
  });
  const s = (performance.now() - t0) / 1000;
  const good = job.runs.filter((r) => r.reward === 1).length;
  if (good !== rollouts) throw new Error(`${rollouts - good} rollouts failed`);
  return [rollouts / s, s];
}
