// `hud export-harbor FILE --out DIR`: an environment's tasks as Harbor task
// folders (harbor/export.ts says what a folder holds and how it runs).

import { exportHarborTasks } from "../harbor/export.ts";
import { Taskset } from "../eval/taskset.ts";
import type { TaskRow } from "../env.ts";
import {
  EXIT_OK,
  type Io,
  parseCommand,
  PROGRAM,
  secondsOption,
  stringOption,
  UsageError,
  type Values,
} from "./_common.ts";

/** The help of `hud export-harbor`. */
export const USAGE: string =
  `Usage: ${PROGRAM} export-harbor FILE --out DIR (--from IMAGE | --image TAG) [--env NAME]
                         [--tasks ROWS] [--repository REPO] [--answer-file PATH | --no-answer]
                         [--agent-user NAME] [--agent-timeout S] [--verifier-timeout S]
                         [--socket PATH]

Writes the tasks of the environment in FILE as Harbor task folders in DIR
(new or empty), one per task: task.toml (docker_image, a healthcheck that
waits for the task to start), instruction.md (the task's prompt, from
starting it once here), environment/Dockerfile and tests/test.sh, which
grades through the environment and writes /logs/verifier/reward.txt. Each
task's image is built FROM the environment's image with an entrypoint that
serves the environment on the container's loopback and starts the task
before Harbor's command runs. Run them with Harbor, or with
"${PROGRAM} eval harbor:DIR".

Options:
  --out DIR              where to write the folders (required; new or empty)
  --from IMAGE           build the environment's image FROM IMAGE, one with
                         bash (Harbor runs bash -c), as "${PROGRAM} image base" makes
  --image TAG            use this image of the environment ("${PROGRAM} image" built
                         it FROM an image with bash) instead of building one
  --env NAME             the environment, by export or environment name
  --tasks ROWS           the tasks, a JSONL file of rows (as "${PROGRAM} eval --tasks");
                         default: the module's "tasks" export, else every
                         template that takes no arguments
  --repository REPO      tag the task images REPO:TASK (default:
                         hud-harbor-export/ENV-DIGEST, DIGEST from --out)
  --answer-file PATH     where the agent writes its answer, named in
                         instruction.md (default: /logs/agent/answer.txt)
  --no-answer            grade with an empty answer and name no file
  --agent-user NAME      run the agent as NAME, a user without privileges
                         made in the image ([agent] user): it cannot read the
                         environment's token, and the grade kills what it
                         left running (default: the image's user, root)
  --agent-timeout S      [agent] timeout_sec (default: 600)
  --verifier-timeout S   [verifier] timeout_sec (default: 600)
  --socket PATH          the engine's socket (default: DOCKER_HOST, then
                         /var/run/docker.sock, then Podman's)
  -h, --help             show this help
`;

/**
 * The image flags: `--from IMAGE` or `--image TAG`, exactly one.
 * @throws {UsageError} for both or neither
 */
function imageFlags(values: Values): { from?: string; image?: string } {
  const from = stringOption(values, "from");
  const image = stringOption(values, "image");
  if (from !== undefined && image !== undefined) {
    throw new UsageError("give --from or --image, not both");
  }
  if (from === undefined && image === undefined) {
    throw new UsageError(
      `give --from IMAGE (a base with bash; "${PROGRAM} image base" makes one) or --image TAG`,
    );
  }
  return { from, image };
}

/** The answer file the instruction names: `--answer-file`, none with `--no-answer`, or the default. */
function answerFlag(values: Values): string | null | undefined {
  const answerFile = stringOption(values, "answer-file");
  if (answerFile !== undefined && values["no-answer"]) {
    throw new UsageError("give --answer-file or --no-answer, not both");
  }
  return values["no-answer"] ? null : answerFile;
}

/** The rows of `--tasks ROWS`, or `undefined` (the module's) without it. */
async function taskRows(tasksFile: string | undefined): Promise<TaskRow[] | undefined> {
  if (tasksFile === undefined) return undefined;
  const tasks = [...(await Taskset.load(tasksFile)).rows];
  if (tasks.length === 0) {
    throw new UsageError(`${tasksFile} holds no rows: add tasks to it, or leave out --tasks`);
  }
  return tasks;
}

/** Runs `hud export-harbor` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "export-harbor",
    usage: USAGE,
    options: {
      out: { type: "string" },
      from: { type: "string" },
      image: { type: "string" },
      env: { type: "string" },
      tasks: { type: "string" },
      repository: { type: "string" },
      "answer-file": { type: "string" },
      "no-answer": { type: "boolean" },
      "agent-user": { type: "string" },
      "agent-timeout": { type: "string" },
      "verifier-timeout": { type: "string" },
      socket: { type: "string" },
    },
    positionals: { names: ["FILE"], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [file] } = parsed;
  const out = stringOption(values, "out");
  if (out === undefined) {
    throw new UsageError(`--out is required (see "${PROGRAM} export-harbor --help")`);
  }
  const { from, image } = imageFlags(values);
  const answerFile = answerFlag(values);
  const agentTimeoutSec = secondsOption("--agent-timeout", stringOption(values, "agent-timeout"));
  const verifierTimeoutSec = secondsOption(
    "--verifier-timeout",
    stringOption(values, "verifier-timeout"),
  );
  const result = await exportHarborTasks(file, out, {
    env: stringOption(values, "env"),
    tasks: await taskRows(stringOption(values, "tasks")),
    from,
    image,
    repository: stringOption(values, "repository"),
    answerFile,
    agentUser: stringOption(values, "agent-user"),
    agentTimeout: agentTimeoutSec === undefined ? undefined : agentTimeoutSec * 1000,
    verifierTimeout: verifierTimeoutSec === undefined ? undefined : verifierTimeoutSec * 1000,
    socket: stringOption(values, "socket"),
    signal: io.signal,
  });
  for (const t of result.tasks) io.out(`${t.path} ${t.image}\n`);
  io.err(`Wrote ${result.tasks.length} Harbor tasks to ${out} (images FROM ${result.envImage})\n`);
  return EXIT_OK;
}
