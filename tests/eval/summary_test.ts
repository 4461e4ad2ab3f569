// One summarizer behind every view of a job: after the guides' own
// workflow (docs/evals.md and docs/viewer.md: eval --group 3 --out, Ctrl-C
// midway, eval --resume), eval's table, eval --json, report, view's data
// endpoint and Job.load say the same counts, and the attempts that a later
// one replaced are history.

import { test } from "../_test.ts";
import { LINUX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { Job } from "../../eval/mod.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;
const FAST = new URL("../fixtures/fast_env.ts", import.meta.url).pathname;
/** Passes the tasks whose number is a multiple of 3, slowly enough to be caught midway. */
const AGENT = 'sleep 0.4; n=$(cat); if [ $((n % 3)) -eq 0 ]; then echo "$n"; else echo no; fi';

function cli(args: string[], tmp: string): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", CLI, ...args],
    env: { TMPDIR: tmp, NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

async function output(
  child: Deno.ChildProcess,
): Promise<{ code: number; out: string; err: string }> {
  const o = await child.output();
  const text = new TextDecoder();
  return { code: o.code, out: text.decode(o.stdout), err: text.decode(o.stderr) };
}

interface Counts {
  total: number;
  graded: number;
  errored: number;
  superseded: number;
  pass1: string;
  pass3: string;
}

/** The counts in `formatJobTable`'s closing lines. */
function tableCounts(text: string): Counts {
  const m = /over (\d+) graded runs, (\d+) errored/.exec(text);
  const p = /^pass@1 (\S+) {2}pass@3 (\S+)$/m.exec(text);
  const s = /^(\d+) earlier attempts? replaced by a later one, not counted$/m.exec(text);
  assert.ok(m && p, `no summary lines in:\n${text}`);
  return {
    total: Number(m[1]) + Number(m[2]),
    graded: Number(m[1]),
    errored: Number(m[2]),
    superseded: s ? Number(s[1]) : 0,
    pass1: p[1],
    pass3: p[2],
  };
}

/** The same counts of a JSON summary, pass@k as the table prints it. */
function jsonCounts(s: Record<string, unknown>): Counts {
  const pass = s.pass_at as Record<string, number | null>;
  return {
    total: s.total as number,
    graded: s.graded as number,
    errored: s.errored as number,
    superseded: s.superseded as number,
    pass1: pass["1"]?.toFixed(3) ?? "-",
    pass3: pass["3"]?.toFixed(3) ?? "-",
  };
}

test({
  name:
    "eval, eval --json, report, view and Job.load count alike after an interrupted, resumed run",
  needs: [LINUX],
}, async () => {
  const tmp = await Deno.makeTempDir({ prefix: "summary-test-" });
  try {
    const rows = `${tmp}/rows.jsonl`;
    await Deno.writeTextFile(
      rows,
      [0, 1, 2, 3, 4, 5].map((n) => JSON.stringify({ env: "fast", id: "echo", args: { n } }))
        .join("\n") + "\n",
    );
    const out = `${tmp}/r.jsonl`;
    const args = [
      "eval",
      FAST,
      "--agent",
      AGENT,
      "--tasks",
      rows,
      "--group",
      "3",
      "--max-concurrent",
      "3",
      "--out",
      out,
    ];

    // Ctrl-C once a few rollouts are in: the ones running are cancelled.
    const first = cli(args, tmp);
    const deadline = Date.now() + 60_000;
    while ((await Deno.readTextFile(out).catch(() => "")).split("\n").length <= 4) {
      if (Date.now() > deadline) throw new Error("eval wrote no 4 lines in 60 s");
      await new Promise((r) => setTimeout(r, 20));
    }
    first.kill("SIGINT");
    const stopped = await output(first);
    assert.equal(stopped.code, 130, stopped.err);
    const lines = (await Deno.readTextFile(out)).trim().split("\n").map((l) => JSON.parse(l));
    const cancelled = lines.filter((r) => r.status === "cancelled").length;
    assert.ok(cancelled > 0, "the interrupt cancelled a running rollout");

    const resumed = await output(cli([...args, "--resume"], tmp));
    assert.equal(resumed.code, 0, resumed.err);
    const asJson = await output(cli([...args, "--resume", "--json"], tmp));
    assert.equal(asJson.code, 0, asJson.err);
    const report = await output(cli(["report", out], tmp));
    assert.equal(report.code, 0, report.err);

    // view: its data endpoint, from the url it prints.
    const stop = new AbortController();
    let printed = "";
    let announced: (url: string) => void;
    const url = new Promise<string>((resolve) => announced = resolve);
    const viewing = main(["view", out, "--port", "0"], {
      stdout: (text) => {
        printed += text;
        const m = /http:\/\/\S+/.exec(printed);
        if (m) announced(m[0]);
      },
      stderr: () => {},
      signal: stop.signal,
    });
    let viewed: Record<string, unknown>;
    try {
      const page = new URL(await url);
      const api = new URL("api/summary", page);
      api.search = page.search;
      api.searchParams.set("file", "0");
      const res = await fetch(api);
      assert.equal(res.status, 200);
      viewed = await res.json();
    } finally {
      stop.abort();
      assert.equal(await viewing, 0);
    }

    const loaded = (await Job.load(out)).summary();
    const expected: Counts = {
      total: 18,
      graded: 18,
      errored: 0,
      superseded: cancelled,
      pass1: "0.333",
      pass3: "0.333",
    };
    assert.deepEqual(tableCounts(resumed.out), expected, `eval:\n${resumed.out}`);
    assert.deepEqual(jsonCounts(JSON.parse(asJson.out)), expected, "eval --json");
    assert.deepEqual(tableCounts(report.out), expected, `report:\n${report.out}`);
    assert.deepEqual(jsonCounts(viewed), expected, "view's /api/summary");
    assert.deepEqual(
      jsonCounts(loaded as unknown as Record<string, unknown>),
      expected,
      "Job.load",
    );
    // The replaced attempts are history, not a task's first error.
    assert.doesNotMatch(report.out, /first error|cancelled/);
    // Every view is the one summary: the JSON ones agree to the last digit.
    assert.deepEqual(viewed, JSON.parse(JSON.stringify(loaded)));
    for (const t of loaded.tasks) assert.equal(t.runs, 3);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});

test("meanAndError() gives alike rewards exactly, without float noise", async () => {
  const { meanAndError } = await import("../../eval/_summary.ts");
  // Three 0.1s summed and divided gave 0.10000000000000002 ± 9.81e-18.
  assert.deepEqual(meanAndError([0.1, 0.1, 0.1]), { mean: 0.1, stderr: 0 });
  assert.deepEqual(meanAndError([0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]), { mean: 0.7, stderr: 0 });
  assert.deepEqual(meanAndError([0.3]), { mean: 0.3, stderr: null });
  assert.deepEqual(meanAndError([]), { mean: null, stderr: null });
  const { mean, stderr } = meanAndError([0, 1]);
  assert.equal(mean, 0.5);
  assert.equal(stderr, 0.5);
});
