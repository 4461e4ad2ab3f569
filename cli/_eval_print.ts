// What `hud eval` prints: the opening lines, the progress (one live line on
// a terminal, else a line per finished rollout), the job's table or JSON
// summary, the line of a limit that stopped the job, and the interrupt
// line. The figures are the library's (formatProgress, formatJobTable,
// Job.summary); this module only says where they go.

import { formatJobTable, formatProgress, formatReward } from "../eval/report.ts";
import { firstError, type Job, type JobProgress, type JobStop } from "../eval/job.ts";
import { EXIT_INTERRUPTED, type Io } from "./_common.ts";

/** What is safe to echo of an agent command: its program, never its arguments or assignments. */
export function commandShown(command: string): string {
  const words = command.trim().split(/\s+/);
  const program = words.find((w) => !/^[A-Za-z_][A-Za-z0-9_]*=/.test(w)) ?? "";
  const hidden = words.length - 1;
  return hidden > 0 ? `${program} (+${hidden} more words, not shown)` : program;
}

/** The opening lines: what runs against what, and a warning when no traces are kept. */
export function printStart(
  io: Io,
  what: { tasks: number; group: number; env: string; agent: string; out: string | undefined },
): void {
  io.err(`eval: ${what.tasks} tasks x ${what.group} from "${what.env}", agent: ${what.agent}\n`);
  if (what.out === undefined) {
    io.err("eval: no --out FILE: the traces are not kept (only the table below is printed)\n");
  }
}

/**
 * The progress on standard error: on a terminal one line redrawn in place,
 * otherwise a line per finished rollout. It remembers how many were done
 * when it last printed, for the interrupt line.
 */
export class ProgressLine {
  readonly #io: Io;
  #done = 0;

  constructor(io: Io) {
    this.#io = io;
  }

  /** Rollouts done at the last update. */
  get done(): number {
    return this.#done;
  }

  /** Prints `p` (a `TasksetRunOptions.onProgress` callback). */
  readonly show = (p: JobProgress): void => {
    this.#done = p.done;
    if (this.#io.live) {
      this.#io.err(`\r\x1b[2K${formatProgress(p)}`);
    } else if (p.last) {
      const what = p.last.reward === null
        ? `${p.last.status} (${firstError([p.last]) ?? "-"})`
        : formatReward(p.last.reward);
      this.#io.err(`${p.last.task.slug}: ${what}  (${formatProgress(p)})\n`);
    }
  };

  /** Ends the live line, so that what follows starts on a line of its own. */
  end(): void {
    if (this.#io.live) this.#io.err("\n");
  }
}

/**
 * The job on standard output (or `to` standard error, when the output
 * carries training rows): its table, or with `json` its summary.
 */
export function printJob(io: Io, job: Job, json: boolean, to: "out" | "err" = "out"): void {
  io[to](json ? JSON.stringify(job.summary()) + "\n" : formatJobTable(job));
}

/**
 * The line for a job a limit stopped: what was spent of what, how many
 * rollouts did not run, and (with a results file) how to go on.
 */
export function stopLine(stop: JobStop, notRun: number, total: number, resumable: boolean): string {
  const spent = stop.reason === "cost_limit"
    ? `$${stop.spent.toFixed(4)} of $${stop.limit}`
    : `${stop.spent} of ${stop.limit} tokens`;
  const flag = stop.reason === "cost_limit" ? "--cost-limit" : "--token-limit";
  const onward = resumable ? `; raise ${flag} (or leave it out) and rerun with --resume` : "";
  return `eval: stopped at the ${
    flag.slice(2)
  } (${spent} spent); ${notRun} of ${total} rollouts not run${onward}\n`;
}

/** Says how far an interrupted job got; returns the exit code. */
export function interrupted(io: Io, done: number, total: number): number {
  io.err(`interrupted: ${done} of ${total} rollouts done; rerun with --resume to finish\n`);
  return EXIT_INTERRUPTED;
}
