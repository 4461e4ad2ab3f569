// `hud grade TASK`: grade a task that `hud start --url` left parked.

import { abortable } from "../_internal/async.ts";
import { errorMessage } from "../_internal/util.ts";
import type { HudClient } from "../client.ts";
import type { GradeFrame } from "../env.ts";
import { HudProtocolError } from "../errors.ts";
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
  readyTimeoutMs,
  resolveTarget,
  tokenFileHelp,
} from "./_connect.ts";

/** The help of `hud grade`. */
export const USAGE: string =
  `Usage: ${PROGRAM} grade TASK (--answer TEXT | --answer-file PATH) [--url URL]
                 [--token-file PATH] [--session ID]

Grades a task that "${PROGRAM} start --url" left parked, and prints the grade
as JSON. With --session, resumes that session and grades its task; without,
the environment grades its only parked task (and refuses when several are
parked).

TASK is the template the task was started from; it is checked to exist,
and with --session, against the session's task (which the server names).

Options:
  --answer TEXT       the answer
  --answer-file PATH  read the answer from a file, or from standard input
                      with "-" (one trailing newline is dropped)
  --url URL           the served environment (default: ${DEFAULT_URL})
${tokenFileHelp(22)}
  --session ID        the session id "${PROGRAM} start" printed
${readyTimeoutHelp(22)}
  -h, --help          show this help
`;

/** Where the answer comes from: `--answer` TEXT, or the `--answer-file` at a path (`-`: standard input). */
type AnswerSource = { text: string } | { file: string };

/**
 * Which of `--answer` and `--answer-file` was given.
 * @throws {UsageError} for both or neither
 */
function answerSource(values: Values): AnswerSource {
  const text = stringOption(values, "answer");
  const file = stringOption(values, "answer-file");
  if (text !== undefined && file !== undefined) {
    throw new UsageError("give --answer or --answer-file, not both");
  }
  if (text !== undefined) return { text };
  if (file === undefined) {
    throw new UsageError(`missing --answer or --answer-file (see "${PROGRAM} grade --help")`);
  }
  return { file };
}

/** The answer `source` gives; a file's without one trailing newline. */
async function readAnswer(source: AnswerSource, io: Io): Promise<string> {
  if ("text" in source) return source.text;
  const { file } = source;
  const text = file === "-"
    ? await abortable(new Response(io.stdin()).text(), io.signal)
    : await Deno.readTextFile(file).catch((err) => {
      throw new Error(`Cannot read answer file "${file}": ${errorMessage(err)}`, { cause: err });
    });
  return text.endsWith("\n") ? text.slice(0, -1).replace(/\r$/, "") : text;
}

/**
 * Grades the task `session` (or the lone parked one) holds with `answer`,
 * once `taskId` is known to be its template.
 */
async function gradeParked(
  client: HudClient,
  taskId: string,
  session: string | undefined,
  answer: string,
  program: string,
): Promise<GradeFrame> {
  const templates = await client.listTasks();
  if (!templates.some((t) => t.id === taskId)) throw unknownTemplate("grade", taskId, templates);
  const held = client.manifest.taskId;
  if (held !== undefined && held !== taskId) {
    throw new Error(
      `Cannot grade "${taskId}": session ${session} holds a task of template "${held}"; ` +
        `run "${program} grade ${held} --session ${session}"`,
    );
  }
  return await client.grade({ answer }).catch((err) => {
    // The server counts the parked tasks in protocol terms; the way out here is a flag.
    if (err instanceof HudProtocolError && /parked sessions hold a task/.test(err.message)) {
      const parked = /^(\d+)/.exec(err.message)?.[1] ?? "several";
      throw new Error(
        `Cannot grade "${taskId}": ${parked} tasks are parked; pass --session ID, the id ` +
          `"${program} start" printed`,
        { cause: err },
      );
    }
    throw err;
  });
}

/** Runs `hud grade` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "grade",
    usage: USAGE,
    options: {
      answer: { type: "string" },
      "answer-file": { type: "string" },
      url: { type: "string" },
      "token-file": { type: "string" },
      session: { type: "string" },
      "ready-timeout": { type: "string" },
    },
    positionals: { names: ["TASK"], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [taskId] } = parsed;
  const source = answerSource(values);
  const target = await resolveTarget(values, io);
  readyTimeoutMs(values); // a bad value is a usage error before anything is read
  const answer = await readAnswer(source, io);
  const session = stringOption(values, "session");
  await using client = await connectTo(target, io, values, { sessionId: session });
  const grade = await gradeParked(client, taskId, session, answer, io.program);
  io.out(JSON.stringify(grade) + "\n");
  return EXIT_OK;
}
