// Time for `view` to show the table of a 10,000-rollout results file in
// headless Chromium, from navigation start to the table rendered.
//
//   deno run -A bench/viewer.ts [rollouts]
//
// The file holds robolab-shaped records (prompt, file-tracking diffs, grade:
// about 3 KB each). Prints, as medians of several page loads: cold (first
// load after the server started, so it includes reading the file) and warm,
// both read from the page's own clock (`performance.mark` at first render);
// and, cold, when the whole job page was drawn (`hud-ready`: the summary,
// the plots and the per-task table, which the page asks for after the table).
// The floor is the same page over an empty results file, loaded in the same
// rounds: what the shared machine charges for any page load at that moment.

import { startViewer } from "../viewer/mod.ts";
import { launchChromium } from "../cdp/_chromium.ts";

const N = Number(Deno.args[0] ?? 10_000);
const RUNS = 5;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

function record(i: number): Record<string, unknown> {
  const difficulty = 1 + (i % 3);
  const slug = `fix_bug-${(i * 2654435761 >>> 0).toString(16).padStart(8, "0")}`;
  const t0 = Date.UTC(2026, 0, 1) + i * 1000;
  const iso = (ms: number) => new Date(t0 + ms).toISOString();
  const reward = [1, 0.5, 0][(i * 7) % 3];
  const patch = [
    `--- a/fix-${i}/count.sh`,
    `+++ b/fix-${i}/count.sh`,
    "@@ -2,7 +2,7 @@",
    " # Prints the numbers 1..N, one per line.",
    " n=$1",
    " i=1",
    '-while [ "$i" -lt "$n" ]; do',
    '+while [ "$i" -le "$n" ]; do',
    '   echo "$i"',
    "   i=$((i + 1))",
    " done",
    "",
  ].join("\n");
  const failed = i % 50 === 0;
  return {
    job_id: "bench",
    group_id: `bench:${slug}`,
    task: { env: "robolab", id: "fix_bug", args: { difficulty, seed: i }, slug },
    repeat: 0,
    status: failed ? "error" : "completed",
    reward: failed ? null : reward,
    failed_phase: failed ? "agent" : null,
    trace: {
      status: failed ? "error" : "completed",
      stop_reason: failed ? "agent_error" : "graded",
      content: String(i),
      started_at: iso(0),
      ended_at: iso(2500 + (i % 1000)),
      errors: failed
        ? [{ phase: "agent", message: "agent exited with code 1", name: "Error" }]
        : [],
      steps: [
        { type: "setup", timestamp: iso(10), content: { id: "fix_bug", args: { difficulty } } },
        {
          type: "user",
          timestamp: iso(20),
          content: `In /tmp/robolab/fix-${i}: count.sh N should print the numbers 1 to N, ` +
            "one per line, but it has a bug. Fix it so that ./check.sh passes.",
        },
        {
          type: "filetracking.diff",
          timestamp: iso(1500),
          content: {
            files_changed: 1,
            patches: [{ path: `fix-${i}/count.sh`, status: "modified", patch }],
          },
        },
        { type: "agent", timestamp: iso(2000), content: String(i) },
        {
          type: "evaluate",
          timestamp: iso(2400),
          content: {
            score: reward,
            subscores: { check: 1, answer: reward === 1 ? 1 : 0 },
            info: { check_output: "", expected: String(i) },
          },
        },
      ],
    },
  };
}

const dir = await Deno.makeTempDir({ prefix: "viewer_bench_" });
const file = `${dir}/results.jsonl`;
const lines: string[] = [];
for (let i = 0; i < N; i++) lines.push(JSON.stringify(record(i)));
await Deno.writeTextFile(file, lines.join("\n") + "\n");
const bytes = (await Deno.stat(file)).size;
const empty = `${dir}/empty.jsonl`;
await Deno.writeTextFile(empty, "");

const browser = await launchChromium({ signal: AbortSignal.timeout(60_000) });
try {
  const cold: number[] = [];
  const warm: number[] = [];
  const floor: number[] = [];
  // When the whole job page (summary, plots, per-task table) was drawn, cold.
  const drawn: number[] = [];
  for (let run = 0; run < RUNS; run++) {
    // A new server per run, so that each first load reads the file afresh.
    await using viewer = await startViewer([file]);
    await using floorViewer = await startViewer([empty]);
    await using cdp = browser.connect();
    for (
      const [into, target, n] of [[cold, viewer, N], [warm, viewer, N], [
        floor,
        floorViewer,
        0,
      ]] as const
    ) {
      await using page = await cdp.newPage("about:blank");
      const signal = AbortSignal.timeout(60_000);
      await page.navigate(target.url, { signal });
      let at: number | null = null;
      for (let i = 0; i < 600 && at === null; i++) {
        at = await page.evaluate<number | null>(
          "(performance.getEntriesByName('hud-table-ready')[0] || {}).startTime ?? null",
          { signal },
        );
        if (at === null) await new Promise((r) => setTimeout(r, 50));
      }
      if (at === null) throw new Error("the table never rendered");
      const shown = await page.evaluate<string>("document.getElementById('count').textContent");
      if (shown !== `Showing ${n} of ${n} rollouts`) throw new Error(`unexpected: ${shown}`);
      into.push(at);
      if (into === cold) {
        let done: number | null = null;
        for (let i = 0; i < 600 && done === null; i++) {
          done = await page.evaluate<number | null>(
            "(performance.getEntriesByName('hud-ready')[0] || {}).startTime ?? null",
            { signal },
          );
          if (done === null) await new Promise((r) => setTimeout(r, 50));
        }
        if (done === null) throw new Error("the page never said it was ready");
        drawn.push(done);
      }
      if (Deno.env.get("VIEWER_BENCH_DEBUG")) {
        console.error(
          await page.evaluate(
            "JSON.stringify(performance.getEntries().filter((e) => e.entryType !== 'resource' || true).map((e) => [e.name.slice(-30), e.entryType, Math.round(e.startTime), Math.round(e.duration)]))",
          ),
        );
      }
    }
  }
  console.log(JSON.stringify({
    figure: "viewer_table_ready_ms",
    rollouts: N,
    file_mb: +(bytes / 1e6).toFixed(1),
    cold_ms: Math.round(median(cold)),
    warm_ms: Math.round(median(warm)),
    floor_ms: Math.round(median(floor)),
    cold_over_floor: +(median(cold) / median(floor)).toFixed(2),
    cold_all: cold.map(Math.round),
    warm_all: warm.map(Math.round),
    floor_all: floor.map(Math.round),
    cold_drawn_ms: Math.round(median(drawn)),
    cold_drawn_all: drawn.map(Math.round),
    target_ms: 1000,
  }));
} finally {
  await browser.close();
  await Deno.remove(dir, { recursive: true });
}
