// The flags `eval` takes for training: a recording model proxy between a
// command agent and its model server (--model-proxy), and the stream of
// finished groups' training rows (--training-out), kept here so that
// cli/eval.ts only spreads them in and calls two functions. Keys come from
// the environment, never from argv.

import type { RunRecord } from "../eval/results.ts";
import { trainingRows } from "../eval/training.ts";
import { openPrivate } from "../_internal/private_file.ts";
import { writeAll } from "../_internal/io.ts";
import type { Io } from "./_common.ts";
import type { ModelProxy } from "../proxy/proxy.ts";
import { PROXY_SERVERS, type ProxyServer } from "../proxy/_config.ts";

/** parseArgs options for the proxy and the rows. */
export const TRAINING_FLAGS = {
  "model-proxy": { type: "string" },
  "model-server": { type: "string" },
  "proxy-model": { type: "string" },
  "training-out": { type: "string" },
} as const;

/** The help lines for {@linkcode TRAINING_FLAGS}. */
export const TRAINING_FLAGS_HELP =
  `  --model-proxy URL     with --agent: put a recording proxy between the agent
                        and the model server at URL (its base url, up to /v1;
                        Anthropic's origin): each rollout gets its own
                        OPENAI_BASE_URL, OPENAI_API_KEY, ANTHROPIC_BASE_URL and
                        ANTHROPIC_API_KEY, and every call it makes is recorded
                        in its trace, with token ids where the server gives
                        them; the server's key (OPENAI_API_KEY, or
                        ANTHROPIC_API_KEY) stays with the proxy
  --model-server KIND   what serves URL: llama-server, vllm, sglang (asked for
                        token ids in their own fields), openai (any other
                        OpenAI-compatible server) or anthropic (default: openai)
  --proxy-model NAME    the model the proxy asks for, whatever the agent names
  --training-out FILE   append each group's training rows (as export-training
                        writes them) as JSON lines to FILE as soon as the
                        group is done; "-" writes them to standard output,
                        and the closing table to standard error
`;

function text(values: Record<string, unknown>, key: string): string | undefined {
  return typeof values[key] === "string" ? values[key] as string : undefined;
}

/**
 * Checks the flags before anything starts; `fail` makes the usage error.
 * @throws what `fail` makes, for a bad flag or one without what it needs
 */
export function checkTrainingFlags(
  values: Record<string, unknown>,
  isCommand: boolean,
  fail: (message: string) => Error,
): void {
  if (text(values, "training-out") === "") throw fail("--training-out needs a file, or -");
  if (text(values, "model-proxy") === undefined) {
    for (const k of ["model-server", "proxy-model"]) {
      if (text(values, k) !== undefined) throw fail(`--${k} needs --model-proxy`);
    }
    return;
  }
  if (!isCommand) throw fail("--model-proxy records a command agent's calls: use it with --agent");
  const server = text(values, "model-server") ?? "openai";
  if (!PROXY_SERVERS.includes(server as ProxyServer)) {
    throw fail(`--model-server must be one of ${PROXY_SERVERS.join(", ")}, got "${server}"`);
  }
  if (text(values, "proxy-model")?.trim() === "") throw fail("--proxy-model must name a model");
}

/**
 * The proxy `--model-proxy` asks for (flags checked by
 * {@linkcode checkTrainingFlags}), started, or `null` without it. The proxy
 * module loads only when asked for.
 */
export async function startProxy(values: Record<string, unknown>): Promise<ModelProxy | null> {
  const upstream = text(values, "model-proxy");
  if (upstream === undefined) return null;
  const { serveModelProxy } = await import("../proxy/proxy.ts");
  return serveModelProxy({
    upstream,
    server: (text(values, "model-server") ?? "openai") as ProxyServer,
    model: text(values, "proxy-model"),
  });
}

/** Writes finished groups' rows; `close()` when the job is done. */
export interface GroupWriter {
  /** Writes a group's rows. */
  write(records: RunRecord[]): Promise<void>;
  /** Closes the file. */
  close(): void;
}

/** The writer `--training-out` asks for, or `null` without it. */
export async function groupWriter(
  values: Record<string, unknown>,
  io: Io,
): Promise<GroupWriter | null> {
  const path = text(values, "training-out");
  if (path === undefined) return null;
  const encode = (records: RunRecord[]) =>
    trainingRows(records).map((r) => JSON.stringify(r) + "\n").join("");
  if (path === "-") {
    return { write: (records) => Promise.resolve(io.out(encode(records))), close() {} };
  }
  // Rows hold what traces hold: the file is its owner's alone.
  const file = await openPrivate(path);
  return {
    write: (records) => writeAll(file, new TextEncoder().encode(encode(records))),
    close: () => file.close(),
  };
}
