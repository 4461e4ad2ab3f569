/**
 * A local trace viewer for results files (the JSONL a job writes):
 * {@linkcode startViewer} serves it on 127.0.0.1 and follows files that are
 * still being written; {@linkcode renderReport} writes the same page as one
 * self-contained HTML file. The page shows the job summary (mean reward ±
 * standard error, pass@k, errors by phase, duration), a sortable, filterable
 * table of rollouts rendered virtually, each rollout's steps with coloured
 * file diffs and its grade, and a side-by-side comparison of two files.
 * `cli.ts view` and `cli.ts report --html` are its command line.
 *
 * @module
 */

export {
  renderReport,
  type ReportOptions,
  startViewer,
  type ViewerOptions,
  type ViewerServer,
} from "./viewer.ts";
