// `cli.ts serve` gives itself SERVER_V8_FLAGS (issue 42, memory): the same
// process, re-executed with them before it loads the environment, unless V8
// flags were chosen for it.

import { test } from "../_test.ts";
import { LINUX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { connect } from "../../client.ts";
import { SERVER_V8_FLAGS } from "../../_server/v8_flags.ts";
import { ChildProcess } from "../_helpers.ts";
import { testSignal } from "../_deadline.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const FIXTURE = new URL("../fixtures/young_generation_env.ts", import.meta.url).pathname;

/**
 * Serves the fixture with `denoFlags` before the script, under `permissions`;
 * what its probe task reports.
 */
async function served(denoFlags: string[], permissions = ["-A"]): Promise<{
  argv: string[];
  environ: string[];
  report: Record<string, unknown>;
}> {
  await using child = new ChildProcess(Deno.execPath(), {
    args: ["run", ...permissions, ...denoFlags, CLI, "serve", FIXTURE, "--port", "0", "--no-auth"],
    env: { NO_COLOR: "1" },
  });
  try {
    const [, port] = await child.waitForLine(/^HUD_SERVE_PORT=(\d+)$/m, "the port line");
    // The process image's arguments and the environment it started with
    // (later changes do not show).
    const argv = Deno.readTextFileSync(`/proc/${child.pid}/cmdline`).split("\0").slice(0, -1);
    const environ = Deno.readTextFileSync(`/proc/${child.pid}/environ`).split("\0");
    await using client = await connect(`tcp://127.0.0.1:${port}`, { signal: testSignal() });
    const report = await client.startTask("probe");
    return { argv, environ, report };
  } catch (err) {
    throw new Error(`${(err as Error).message}; ${child.describe()}`, { cause: err });
  }
}

test({
  name: "cli.ts serve runs with SERVER_V8_FLAGS when none were chosen",
  needs: [LINUX],
  async fn() {
    const { argv, environ, report } = await served([]);
    const flags = `DENO_V8_FLAGS=${SERVER_V8_FLAGS.join(",")}`;
    assert.ok(environ.includes(flags), `the same process, re-executed with ${flags}`);
    assert.deepEqual(argv.slice(1), [
      "run",
      "-A",
      new URL("../../cli/_serve_main.ts", import.meta.url).href,
      FIXTURE,
      "--port",
      "0",
      "--no-auth",
    ], "into the serve command alone, with the same arguments");
    assert.ok(
      (report.new_space_mib as number) <= 4,
      `the young generation stays small: ${report.new_space_mib} MiB`,
    );
    assert.equal(report.deno_v8_flags, null, "what the environment starts does not inherit them");
    assert.equal(report.applied, null);
  },
});

test({
  name: "cli.ts serve keeps the V8 flags it was given, even none",
  needs: [LINUX],
  async fn() {
    for (const given of [["--v8-flags"], ["--v8-flags=--max-semi-space-size=16"]]) {
      const { environ, report } = await served(given);
      assert.ok(!environ.some((e) => e.startsWith("DENO_V8_FLAGS=")), `${given}: not re-executed`);
      assert.ok(
        (report.new_space_mib as number) > 8,
        `${given}: V8 grows the young generation: ${report.new_space_mib} MiB`,
      );
    }
  },
});

test({
  name: "cli.ts serve without --allow-all serves under V8's defaults",
  needs: [LINUX],
  async fn() {
    // Deno reads /proc/self/cmdline and environ only under --allow-all,
    // whatever --allow-read says: serve goes on without re-executing.
    const permissions = ["--allow-read", "--allow-net", "--allow-env", "--allow-ffi"];
    const { environ, report } = await served([], permissions);
    assert.ok(!environ.some((e) => e.startsWith("DENO_V8_FLAGS=")), "not re-executed");
    assert.equal(report.deno_v8_flags, null);
  },
});
