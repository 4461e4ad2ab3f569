// Issue 30, point 5: what `hud eval` says on its progress and interrupt
// lines, and without --out.
import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { ChildProcess, waitForLine } from "../_helpers.ts";
import { formatReward } from "../../eval/report.ts";
import { testSignal } from "../_deadline.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const fixture = (name: string) => new URL(`../fixtures/${name}`, import.meta.url).pathname;
const FAST = fixture("fast_env.ts");

async function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { NO_COLOR: "1" },
    stdin: "null",
    signal: testSignal(),
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

test("cli.ts eval: the interrupt line counts what the last progress line counted", async () => {
  // Rollouts 0-2 answer at once, the rest hang until the signal cuts them short.
  const agent = `read -r n; [ "$n" -lt 3 ] && echo $n || exec sleep 60`;
  const child = new ChildProcess(Deno.execPath(), {
    args: ["run", "-A", CLI, "eval", FAST, "--agent", agent, "--max-concurrent", "8"],
    env: { NO_COLOR: "1" },
  });
  try {
    const stderr = () => child.stderr;
    await waitForLine(stderr, /\(done 3\/100 /, { what: "three graded rollouts", ms: 30_000 });
  } finally {
    await child.stop("SIGINT", 30_000);
  }
  const lines = child.stderr.split("\n");
  const progress = lines.filter((l) => /\(done \d+\/100/.test(l));
  const lastDone = /\(done (\d+)\/100/.exec(progress.at(-1)!)![1];
  const interrupted = lines.find((l) => l.startsWith("interrupted: "));
  assert.equal(child.status?.code, 130, child.describe());
  assert.equal(
    interrupted,
    `interrupted: ${lastDone} of 100 rollouts done; rerun with --resume to finish`,
    progress.join("\n"),
  );
  assert.equal(lastDone, "3", progress.join("\n"));
});

test("cli.ts eval prints rewards with 3 significant digits, and says when no traces are kept", async () => {
  assert.equal(formatReward(0.7666666666666666), "0.767");
  assert.equal(formatReward(1), "1");
  assert.equal(formatReward(0.5), "0.5");
  assert.equal(formatReward(1 / 3000), "0.000333");
  const dir = await Deno.makeTempDir({ prefix: "hud_eval_lines_" });
  try {
    const env = `${dir}/thirds_env.ts`;
    const mod = new URL("../../mod.ts", import.meta.url).href;
    await Deno.writeTextFile(
      env,
      `import { Environment } from "${mod}";
export const env = new Environment("thirds", { version: "1.0.0" });
env.template({ id: "third" }, async function* () {
  yield "Say anything";
  yield 0.7666666666666666;
});
`,
    );
    const ran = await cli("eval", env, "--agent", "echo hi");
    assert.equal(ran.code, 0, ran.stderr);
    assert.match(ran.stderr, /^third: 0\.767 {2}\(done 1\/1 /m);
    assert.match(
      ran.stderr,
      /^eval: no --out FILE: the traces are not kept \(only the table below is printed\)$/m,
    );
    const kept = await cli("eval", env, "--agent", "echo hi", "--out", `${dir}/r.jsonl`);
    assert.equal(kept.code, 0, kept.stderr);
    assert.doesNotMatch(kept.stderr, /traces are not kept/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
