// `hud start TASK`: start a task and print its prompt, either parked on a
// served environment (--url) or run in this process and graded (--source).

import type { Environment, PromptFrame } from "../env.ts";
import { HudProtocolError } from "../errors.ts";
import { loadEnvironment } from "../loader.ts";
import { abortable } from "../_internal/async.ts";
import { redactUrl } from "../_internal/auth.ts";
import { errorMessage } from "../_internal/util.ts";
import { shellQuote } from "../_internal/shell.ts";
import {
  EXIT_OK,
  type Io,
  parseCommand,
  PROGRAM,
  stringOption,
  unknownTemplate,
  UsageError,
  type Values,
} from "./_common.ts";
import {
  connectTo,
  DEFAULT_URL,
  readyTimeoutHelp,
  resolveTarget,
  tokenFileHelp,
} from "./_connect.ts";

function parseJsonObject(flag: string, text: string | undefined): Record<string, unknown> {
  if (text === undefined) return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new UsageError(`${flag} is not valid JSON: ${errorMessage(err)}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new UsageError(`${flag} must be a JSON object, got ${text}`);
  }
  return value as Record<string, unknown>;
}

function promptText(prompt: unknown): string {
  return typeof prompt === "string" ? prompt : JSON.stringify(prompt, null, 2);
}

/** Reads one line (without its newline); `null` when the stream ends first with nothing. */
async function readLine(stream: ReadableStream<Uint8Array>): Promise<string | null> {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let text = "";
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) {
        text += decoder.decode();
        return text === "" ? null : text.replace(/\r$/, "");
      }
      text += decoder.decode(value, { stream: true });
      const nl = text.indexOf("\n");
      if (nl >= 0) return text.slice(0, nl).replace(/\r$/, "");
    }
  } finally {
    await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

async function startSource(
  taskId: string,
  taskArgs: Record<string, unknown>,
  file: string,
  values: Values,
  io: Io,
): Promise<number> {
  const env: Environment = await loadEnvironment(file, { name: stringOption(values, "env") });
  const json = values.json === true;
  if (!env.hasTemplate(taskId)) throw unknownTemplate("start", taskId, env.listTasks());
  await env.start();
  try {
    const task = await env.startTask(taskId, taskArgs);
    try {
      io.out(json ? JSON.stringify(task.prompt) + "\n" : promptText(task.prompt.prompt) + "\n");
      let answer = stringOption(values, "answer");
      if (answer === undefined) {
        const stdin = io.stdin();
        if (stdin === Deno.stdin.readable && Deno.stdin.isTerminal()) io.err("Answer: ");
        const line = await abortable(readLine(stdin), io.signal);
        if (line === null) throw new Error("Cannot grade: standard input ended before an answer");
        answer = line;
      }
      const grade = await task.grade(answer);
      io.out(JSON.stringify(grade) + "\n");
    } finally {
      await task.cancel();
    }
  } finally {
    await env.stop();
  }
  return EXIT_OK;
}

/** The help of `hud start`. */
export const USAGE: string =
  `Usage: ${PROGRAM} start TASK [--args JSON] [--url URL] [--token-file PATH] [--json]
       ${PROGRAM} start TASK [--args JSON] --source FILE [--env NAME] [--answer TEXT] [--json]

Starts a task from template TASK and prints its prompt.

With --url (the split flow), the task stays parked on the served
environment when this command exits, and the session id that holds it is
printed on standard error; grade it later, from any process, with
"${PROGRAM} grade TASK --answer TEXT --session ID".

With --source, the environment runs in this process: the prompt is
printed, the answer is read from one line of standard input (or taken from
--answer), and the grade is printed as JSON.

Options:
  --args JSON     the task's arguments, a JSON object (default: {})
  --url URL       a served environment (default: ${DEFAULT_URL})
${tokenFileHelp(21)}
  --source FILE   run the environment module FILE in this process
  --env NAME      with --source: the environment, by export or environment name
  --answer TEXT   with --source: the answer, instead of reading standard input
  --json          print the prompt frame as JSON (with "session_id" when
                  served), then with --source the grade
${readyTimeoutHelp(21)}
  -h, --help      show this help
`;

/**
 * Starts the task on the served environment and leaves it parked; prints
 * the prompt, and on standard error how to grade it.
 */
async function startParked(
  taskId: string,
  taskArgs: Record<string, unknown>,
  values: Values,
  io: Io,
): Promise<number> {
  const target = await resolveTarget(values, io);
  await using client = await connectTo(target, io, values);
  let prompt: PromptFrame;
  try {
    prompt = await client.startTask(taskId, taskArgs);
  } catch (err) {
    if (err instanceof HudProtocolError && /unknown task/.test(err.message)) {
      throw unknownTemplate("start", taskId, await client.listTasks());
    }
    throw err;
  }
  const sessionId = client.sessionId;
  if (values.json) {
    io.out(JSON.stringify({ ...prompt, session_id: sessionId }) + "\n");
  } else {
    io.out(promptText(prompt.prompt) + "\n");
    const tokenFile = target.tokenFile === undefined
      ? ""
      : ` --token-file ${JSON.stringify(target.tokenFile)}`;
    const at = `--url ${redactUrl(target.url)}${tokenFile}`;
    io.err(
      `Session ${sessionId} holds the task. Grade it with:\n  ${io.program} grade ${taskId} ${at} --session ${sessionId} --answer TEXT\n`,
    );
    const shell = client.manifest.bindings.find((b) => b.family === "ssh");
    if (shell !== undefined) {
      const cwd = shellCwd(prompt, shell.name);
      io.err(
        `Open its shell with:\n  ${io.program} shell ${at}${
          shell.name === "shell" ? "" : ` --capability ${shell.name}`
        }${cwd === undefined ? "" : ` --cwd ${shellQuote(cwd)}`}\n`,
      );
    }
  }
  // Closing without "bye" leaves the task parked for the grader.
  return EXIT_OK;
}

/** The directory the task's prompt gives its shell binding (`bindings.shell.cwd`), if any. */
function shellCwd(prompt: PromptFrame, name: string): string | undefined {
  const binding = prompt.bindings?.[name];
  const cwd = binding !== null && typeof binding === "object"
    ? (binding as { cwd?: unknown }).cwd
    : undefined;
  return typeof cwd === "string" ? cwd : undefined;
}

/** Runs `hud start` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "start",
    usage: USAGE,
    options: {
      args: { type: "string" },
      url: { type: "string" },
      "token-file": { type: "string" },
      source: { type: "string" },
      env: { type: "string" },
      answer: { type: "string" },
      json: { type: "boolean" },
      "ready-timeout": { type: "string" },
    },
    positionals: { names: ["TASK"], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [taskId] } = parsed;
  const taskArgs = parseJsonObject("--args", stringOption(values, "args"));
  const source = stringOption(values, "source");
  if (source !== undefined && values.url !== undefined) {
    throw new UsageError("give --url or --source, not both");
  }
  if (source !== undefined && values["token-file"] !== undefined) {
    throw new UsageError("--token-file needs --url, not --source");
  }
  if (source !== undefined) return await startSource(taskId, taskArgs, source, values, io);
  if (values.env !== undefined) throw new UsageError("--env needs --source");
  if (values.answer !== undefined) {
    throw new UsageError(`--answer needs --source; with --url, answer with "${PROGRAM} grade"`);
  }
  return await startParked(taskId, taskArgs, values, io);
}
