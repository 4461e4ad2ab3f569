// What `hud eval` adds for training: the recording model proxy a command
// agent's calls go through (--model-proxy; its options read and checked
// with the other flags, in cli/_eval_options.ts), which listens for the
// run's span only, and the stream of finished groups' training rows
// (--training-out). Both are resources of the run: evaluate() starts them
// and releaseRun() ends them. Keys come from the environment, never argv.

import type { ModelRoute, ModelRouter } from "../agents/command.ts";
import type { AgentContext } from "../eval/agent.ts";
import type { RunRecord } from "../eval/results.ts";
import type { Run } from "../eval/run.ts";
import { trainingRows } from "../eval/training.ts";
import type { ModelProxy } from "../proxy/proxy.ts";
import type { ProxyConfig } from "../proxy/_config.ts";
import { openPrivate } from "../_internal/private_file.ts";
import { writeAll } from "../_internal/io.ts";
import type { Io } from "./_common.ts";

/**
 * The run's recording proxy, as the command agent's router: made with its
 * config when the flags are read (the agent is made then too), it listens
 * from {@linkcode RunProxy.start} to {@linkcode RunProxy.shutdown}. The
 * proxy's code loads only when one is asked for.
 */
export class RunProxy implements ModelRouter {
  readonly #config: ProxyConfig;
  #proxy: ModelProxy | null = null;

  constructor(config: ProxyConfig) {
    this.#config = config;
  }

  /** Starts listening. */
  async start(): Promise<void> {
    const { ModelProxy } = await import("../proxy/proxy.ts");
    this.#proxy ??= new ModelProxy(this.#config);
  }

  /**
   * A route for `run` (see {@linkcode ModelProxy.open}).
   * @throws {Error} before {@linkcode RunProxy.start}
   */
  open(run: Run, context: AgentContext): ModelRoute {
    if (this.#proxy === null) {
      throw new Error("Cannot open a model route: the proxy is not started");
    }
    return this.#proxy.open(run, context);
  }

  /** Closes every route and stops listening. Idempotent. */
  async shutdown(): Promise<void> {
    await this.#proxy?.shutdown();
    this.#proxy = null;
  }
}

/**
 * Where `--training-out` writes each finished group's training rows (as
 * export-training writes them), one JSON line each: a file that grows, or
 * standard output (`-`).
 */
export class TrainingOut {
  readonly #write: (text: string) => Promise<void>;
  readonly #close: () => void;

  private constructor(write: (text: string) => Promise<void>, close: () => void) {
    this.#write = write;
    this.#close = close;
  }

  /** Opens `path` (created 0600: rows hold what traces hold), or `-` for `io.out`. */
  static async open(path: string, io: Io): Promise<TrainingOut> {
    if (path === "-") return new TrainingOut((text) => Promise.resolve(io.out(text)), () => {});
    const file = await openPrivate(path);
    const encoder = new TextEncoder();
    return new TrainingOut((text) => writeAll(file, encoder.encode(text)), () => file.close());
  }

  /** Writes a group's rows (a `TasksetRunOptions.onGroup` callback). */
  readonly write = (records: RunRecord[]): Promise<void> =>
    this.#write(trainingRows(records).map((r) => JSON.stringify(r) + "\n").join(""));

  /** Closes the file. */
  close(): void {
    this.#close();
  }
}
