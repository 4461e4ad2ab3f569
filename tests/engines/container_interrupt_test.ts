// Issue 30, point 4: SIGINT at a random point of `hud eval --runtime
// container:IMAGE` leaves no container with our labels, running or exited.
// Skipped without an engine socket.

import { test } from "../_test.ts";
import { ENGINE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { buildEnvironmentImage, OWNER_LABEL } from "../../engines/mod.ts";
import { EngineClient, findEngineSocket } from "../../engines/_engine.ts";
import { ChildProcess } from "../_helpers.ts";
import { withDeadline } from "../_deadline.ts";

function engineSocket(): string | null {
  try {
    return findEngineSocket();
  } catch {
    return null;
  }
}
const SOCKET = engineSocket();
const IMAGE = "hud-test-interrupt:latest";
const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const BASIC = new URL("../fixtures/basic_env.ts", import.meta.url).pathname;
const TRIES = 20;

/** Every container (running or not) that the process `pid` labelled as its own. */
async function containersOf(engine: EngineClient, pid: number): Promise<string[]> {
  const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${pid}`] }));
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
    State: string;
  }[];
  return list.map((c) => `${c.Id.slice(0, 12)} (${c.State})`);
}

const BATCHES = 5;
const PER_BATCH = TRIES / BATCHES;
const dir = SOCKET === null ? "" : await Deno.makeTempDir({ prefix: "hud_interrupt_" });
const rows = `${dir}/rows.jsonl`;
// Answers after a little while, so that rollouts overlap the signal.
const agent = `sleep 0.$((RANDOM % 4)); read -r q; set -- $q; echo $(( $3 + \${5%?} ))`;

test({
  name: "cli.ts eval --runtime container: (interrupts) the image",
  needs: [ENGINE],
  fn: withDeadline(55_000, async () => {
    await Deno.writeTextFile(
      rows,
      [1, 2, 3, 4, 5, 6].map((a) =>
        JSON.stringify({ env: "fixture", id: "add", args: { a, b: 2 }, slug: `add-${a}` })
      ).join("\n") + "\n",
    );
    await buildEnvironmentImage(BASIC, IMAGE, {
      envName: "fixture",
      envVersion: "0.3.0",
      socket: SOCKET!,
      signal: AbortSignal.timeout(50_000),
    });
  }),
});

// ${TRIES} tries in all, in batches that each fit a test's bound.
for (let batch = 0; batch < BATCHES; batch++) {
  test({
    name: `cli.ts eval --runtime container: SIGINT at random points leaves no container (tries ${
      batch * PER_BATCH + 1
    }-${(batch + 1) * PER_BATCH} of ${TRIES})`,
    needs: [ENGINE],
    fn: withDeadline(55_000, async () => {
      using engine = await EngineClient.open(SOCKET!);
      const leaks: string[] = [];
      for (let i = 0; i < PER_BATCH; i++) {
        // Spread over start-up, the held placement and the rollouts.
        const after = Math.floor(Math.random() * 4_000);
        const child = new ChildProcess(Deno.execPath(), {
          args: [
            "run",
            "-A",
            CLI,
            "eval",
            BASIC,
            "--agent",
            agent,
            "--tasks",
            rows,
            "--runtime",
            `container:${IMAGE}`,
            "--max-concurrent",
            "3",
          ],
          env: { DOCKER_HOST: `unix://${SOCKET}`, NO_COLOR: "1" },
        });
        await new Promise((r) => setTimeout(r, after));
        const status = await child.stop("SIGINT", 30_000);
        const left = await containersOf(engine, child.pid);
        if (left.length > 0) {
          leaks.push(`SIGINT after ${after} ms (exit ${status.code}) left ${left.join(", ")}`);
          for (const c of left) {
            await engine.call("DELETE", `/containers/${c.split(" ")[0]}?force=true`).catch(
              () => {},
            );
          }
        }
      }
      assert.deepEqual(
        leaks,
        [],
        `${leaks.length} of ${PER_BATCH} interrupted runs left containers`,
      );
    }),
  });
}

test({
  name: "cli.ts eval --runtime container: (interrupts) clean up",
  needs: [ENGINE],
  fn: async () => {
    await Deno.remove(dir, { recursive: true });
    using engine = await EngineClient.open(SOCKET!);
    await engine.call("DELETE", `/images/${encodeURIComponent(IMAGE)}?force=1`).catch(() => {});
  },
});
