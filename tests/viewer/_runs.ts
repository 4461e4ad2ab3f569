// Real robolab runs for the viewer's page tests and the ATIF export test:
// one by a command agent (examples/ssh_agent.sh over OpenSSH), one by a
// ChatAgent talking to a scripted OpenAI-compatible server that repairs
// count.sh with bash tool calls and submits what the asked command printed.

import { Taskset } from "../../mod.ts";
import { ChatAgent, CommandAgent } from "../../agents/mod.ts";
import { fixBug } from "../../examples/robolab.ts";
import { type Received, scriptedServer } from "../agents/_scripted.ts";

/** The tasks: one the agents solve, one they cannot. */
export const TASKS = [fixBug({ difficulty: 1, seed: 1 }), fixBug({ difficulty: 3, seed: 1 })];

const SSH_AGENT = new URL("../../examples/ssh_agent.sh", import.meta.url).pathname;

/** What the scripted model's last bash call printed, the answer it submits. */
function lastToolText(messages: Record<string, unknown>[]): string {
  const tool = messages.filter((m) => m.role === "tool").pop();
  // The bash tool says `exit_code: 0`, then `stdout:` and the output.
  return String(tool?.content ?? "").trim().split("\n").pop() ?? "";
}

/**
 * The scripted model's next reply, from the conversation so far: look at
 * the program, repair it and run the check, run the asked command, submit.
 */
function nextReply(request: Received): Response {
  const messages = request.body.messages as Record<string, unknown>[];
  const prompt = String(messages.find((m) => m.role === "user")?.content ?? "");
  const dir = /^In (\S+):/.exec(prompt)?.[1] ?? ".";
  const ask = /`([^`]+)`/.exec(prompt)?.[1] ?? "true";
  const turn = messages.filter((m) => m.role === "assistant").length;
  const calls: [string, Record<string, unknown>, string][] = [
    ["I will look at the program first.", { command: `cd ${dir} && ls && cat count.sh` }, "bash"],
    [
      "The loop stops one short: -lt should be -le. I will fix it and try it.",
      { command: `cd ${dir} && sed -i 's/-lt "$n"/-le "$n"/' count.sh && ./count.sh 3` },
      "bash",
    ],
    ["Now the asked command.", { command: `cd ${dir} && ${ask}` }, "bash"],
  ];
  const [content, args, name] = turn < calls.length
    ? calls[turn]
    : ["Submitting the output.", { answer: lastToolText(messages) }, "submit"];
  return Response.json({
    id: `chatcmpl-${turn}`,
    object: "chat.completion",
    choices: [{
      index: 0,
      finish_reason: "tool_calls",
      message: {
        role: "assistant",
        content,
        tool_calls: [{
          id: `call_${turn}_${Math.random().toString(36).slice(2, 8)}`,
          type: "function",
          function: { name, arguments: JSON.stringify(args) },
        }],
      },
    }],
    usage: { prompt_tokens: 400 + 150 * turn, completion_tokens: 40 + turn, cost: 0.0004 },
  });
}

/**
 * Runs both agents over {@linkcode TASKS} into `dir`/command.jsonl (once
 * each) and `dir`/model.jsonl (twice each).
 */
export async function robolabRuns(dir: string): Promise<{ command: string; model: string }> {
  const command = `${dir}/command.jsonl`;
  const model = `${dir}/model.jsonl`;
  const commandAgent = new CommandAgent(SSH_AGENT);
  await new Taskset(TASKS).run(commandAgent, { out: command, maxConcurrent: 2 });
  await commandAgent.whenIdle();
  await using server = scriptedServer(Array.from({ length: 40 }, () => nextReply));
  const chat = new ChatAgent({
    model: "scripted-robolab",
    baseUrl: server.baseUrl,
    apiKey: "sk-test-not-secret",
    stream: false,
    maxSteps: 6,
    sampling: { temperature: 0 },
  });
  await new Taskset(TASKS).run(chat, { out: model, maxConcurrent: 1, group: 2 });
  return { command, model };
}
