// Scan time of the file tracker on a 10,000-file workspace.
//
//   deno run -A bench/filetracking.ts [files]
//
// Prints: the baseline (first full scan, every file read and hashed), a
// snapshot and a diff with nothing changed (stat only), and a diff after
// editing 100 files (100 files read and diffed). Medians of several runs.

import { FileTrackerClient, startFileTracker } from "../filetracking/tracker.ts";

const FILES = Number(Deno.args[0] ?? 10_000);
const PER_DIR = 50;
const EDITS = 100;
const RUNS = 5;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

async function time<T>(fn: () => Promise<T>): Promise<[number, T]> {
  const t0 = performance.now();
  const value = await fn();
  return [performance.now() - t0, value];
}

const root = await Deno.makeTempDir({ prefix: "ft_bench_" });
try {
  // A source tree: PER_DIR files per directory, two levels deep, 1-4 KiB each.
  const lines = Array.from({ length: 100 }, (_, i) => `    value_${i} = compute(${i}) + offset\n`);
  let bytes = 0;
  const paths: string[] = [];
  for (let i = 0; i < FILES; i++) {
    const dir = `pkg${Math.floor(i / (PER_DIR * 20))}/mod${Math.floor(i / PER_DIR) % 20}`;
    if (i % PER_DIR === 0) await Deno.mkdir(`${root}/${dir}`, { recursive: true });
    const path = `${dir}/file${i}.py`;
    const text = `# file ${i}\n` + lines.slice(0, 30 + (i % 70)).join("");
    bytes += text.length;
    paths.push(path);
    await Deno.writeTextFile(`${root}/${path}`, text);
  }
  await Deno.writeTextFile(`${root}/.gitignore`, "*.log\n/build/\n__generated__/\n");
  // Age every file past the tracker's racy window: a steady-state workspace.
  const old = new Date(Date.now() - 3_600_000);
  await Promise.all(paths.map((p) => Deno.utime(`${root}/${p}`, old, old)));

  const baseline: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    const [ms, tracker] = await time(() => startFileTracker(root));
    baseline.push(ms);
    await tracker.shutdown();
  }

  await using tracker = await startFileTracker(root);
  await using client = await FileTrackerClient.connect(tracker.url);
  const snapshot: number[] = [];
  const unchanged: number[] = [];
  const unchangedScan: number[] = [];
  const edited: number[] = [];
  const editedScan: number[] = [];
  let changed = 0;
  let scanned = 0;
  for (let r = 0; r < RUNS; r++) {
    snapshot.push((await time(() => client.snapshot()))[0]);
    const [ms, diff] = await time(() => client.diff());
    unchanged.push(ms);
    unchangedScan.push(diff.scan_duration_ms);
    for (let k = 0; k < EDITS; k++) {
      const p = paths[(k * 97 + r * 13) % paths.length];
      const text = await Deno.readTextFile(`${root}/${p}`);
      await Deno.writeTextFile(`${root}/${p}`, text.replace("compute(5)", `compute(${r}${k})`));
    }
    const [ms2, diff2] = await time(() => client.diff());
    edited.push(ms2);
    editedScan.push(diff2.scan_duration_ms);
    changed = diff2.files_changed;
    scanned = diff2.files_scanned;
  }

  const f = (ms: number) => `${ms.toFixed(1).padStart(8)} ms`;
  console.log(
    `workspace: ${FILES} files, ${(bytes / 1024 / 1024).toFixed(1)} MiB, ${scanned} tracked`,
  );
  console.log(`baseline (start, read + hash every file): ${f(median(baseline))}`);
  console.log(`snapshot, nothing changed (round trip):    ${f(median(snapshot))}`);
  console.log(
    `diff, nothing changed (round trip / scan): ${f(median(unchanged))} / ${
      f(median(unchangedScan))
    }`,
  );
  console.log(
    `diff, ${EDITS} files edited (round trip / scan): ${f(median(edited))} / ${
      f(median(editedScan))
    }` +
      `  (${changed} patches)`,
  );
} finally {
  await Deno.remove(root, { recursive: true });
}
