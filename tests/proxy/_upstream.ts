// Model servers for the proxy's tests: replies written here in the shapes
// that vLLM, sglang, llama-server and Anthropic document (their protocol
// definitions: vLLM's chat_completion/protocol.py and completion/protocol.py,
// sglang's entrypoints/openai/protocol.py, llama-server's README), and a
// toy server whose chat template and tokenizer are simple enough that a
// test can say which prompt extends which.

import { isRecord } from "../../_internal/util.ts";
import { type Received, type ScriptedServer, scriptedServer } from "../agents/_scripted.ts";

/** An SSE body of these events (objects as JSON), each with an `event:` line when a name is given. */
export function sse(events: (unknown | [string, unknown])[]): Response {
  const text = events.map((e) => {
    const [name, data] = Array.isArray(e) && e.length === 2 && typeof e[0] === "string"
      ? e as [string, unknown]
      : [null, e];
    return `${name ? `event: ${name}\n` : ""}data: ${
      typeof data === "string" ? data : JSON.stringify(data)
    }\n\n`;
  }).join("");
  return new Response(text, { headers: { "content-type": "text/event-stream" } });
}

/** The events of an SSE reply, parsed: `[event name, data]`. */
export async function readSse(response: Response): Promise<[string, unknown][]> {
  const text = await response.text();
  return text.split("\n\n").filter((b) => b.trim() !== "").map((block) => {
    let name = "";
    let data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) name = line.slice(7);
      if (line.startsWith("data: ")) data += line.slice(6);
    }
    let parsed: unknown = data;
    try {
      parsed = JSON.parse(data);
    } catch {
      // [DONE]
    }
    return [name, parsed];
  });
}

/** A vLLM chat reply (`return_token_ids`: `prompt_token_ids` on top, `token_ids` on the choice). */
export function vllmChat(
  prompt: number[],
  ids: number[],
  message: Record<string, unknown>,
  finish = "stop",
): Record<string, unknown> {
  return {
    id: "chatcmpl-v",
    object: "chat.completion",
    model: "policy",
    prompt_token_ids: prompt,
    choices: [{
      index: 0,
      message: { role: "assistant", ...message },
      finish_reason: finish,
      token_ids: ids,
      logprobs: {
        content: ids.map((id, i) => ({ token: `token_id:${id}`, logprob: -0.25 * (i + 1) })),
      },
    }],
    usage: { prompt_tokens: prompt.length, completion_tokens: ids.length },
  };
}

/** The chunks vLLM streams for the same reply: prompt ids in the first, id deltas in each. */
export function vllmChatChunks(prompt: number[], ids: number[], text: string[]): unknown[] {
  const head = { id: "chatcmpl-v", object: "chat.completion.chunk", model: "policy" };
  const chunks: unknown[] = [{
    ...head,
    prompt_token_ids: prompt,
    choices: [{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }],
  }];
  text.forEach((piece, i) => {
    chunks.push({
      ...head,
      choices: [{
        index: 0,
        delta: { content: piece },
        finish_reason: i === text.length - 1 ? "stop" : null,
        token_ids: [ids[i]],
        logprobs: { content: [{ token: `token_id:${ids[i]}`, logprob: -0.5 }] },
      }],
    });
  });
  chunks.push({
    ...head,
    choices: [],
    usage: { prompt_tokens: prompt.length, completion_tokens: ids.length },
  });
  chunks.push("[DONE]");
  return chunks;
}

/** An sglang chat reply (`return_prompt_token_ids` and `return_token_ids`: both on the choice). */
export function sglangChat(
  prompt: number[],
  ids: number[],
  message: Record<string, unknown>,
): Record<string, unknown> {
  return {
    id: "s1",
    object: "chat.completion",
    model: "policy",
    choices: [{
      index: 0,
      message: { role: "assistant", reasoning_content: null, ...message },
      logprobs: {
        content: ids.map((_, i) => ({ token: `t${i}`, bytes: [], logprob: -1, top_logprobs: [] })),
      },
      finish_reason: message.tool_calls ? "tool_calls" : "stop",
      matched_stop: null,
      prompt_token_ids: prompt,
      token_ids: ids,
    }],
    usage: { prompt_tokens: prompt.length, completion_tokens: ids.length, total_tokens: 0 },
  };
}

// The toy server: every character is a token (its code point); a chat
// template of role markers. A reply's tokens are exactly what the template
// renders of it in the history, so that a harness that keeps its history
// sends prompts that extend each turn's prompt and completion.

const MARK: Record<string, number> = {
  system: 1_000_001,
  user: 1_000_002,
  assistant: 1_000_003,
  tool: 1_000_004,
};
/** The toy's end-of-turn token. */
export const END = 1_000_000;

function toyText(text: string): number[] {
  return [...text].map((c) => c.codePointAt(0)!);
}

/** What the toy template renders of a message's body (its content, then its tool calls). */
function toyBody(m: Record<string, unknown>): number[] {
  const content = typeof m.content === "string" ? m.content : "";
  const calls = Array.isArray(m.tool_calls)
    ? m.tool_calls.filter(isRecord).map((c) => {
      const fn = isRecord(c.function) ? c.function : {};
      return `<call ${fn.name} ${fn.arguments}>`;
    }).join("")
    : "";
  return toyText(content + calls);
}

/** The toy's prompt ids for a chat request's messages. */
export function toyPrompt(messages: unknown[]): number[] {
  const out: number[] = [];
  for (const m of messages.filter(isRecord)) {
    out.push(MARK[String(m.role)] ?? MARK.user, ...toyBody(m), END);
  }
  out.push(MARK.assistant);
  return out;
}

/**
 * A toy server that answers each chat call, in order, with `replies`
 * (assistant messages), in vLLM's shape, streamed when asked; it keeps what
 * it received.
 */
export function toyServer(replies: Record<string, unknown>[]): {
  handler: (r: Received, i: number) => Response;
} {
  return {
    handler(r, i) {
      const reply = replies[Math.min(i, replies.length - 1)];
      const prompt = toyPrompt(r.body.messages as unknown[]);
      const ids = [...toyBody(reply), END];
      const finish = reply.tool_calls ? "tool_calls" : "stop";
      if (r.body.stream !== true) return Response.json(vllmChat(prompt, ids, reply, finish));
      const head = { id: "chatcmpl-toy", object: "chat.completion.chunk", model: "policy" };
      const calls = Array.isArray(reply.tool_calls)
        ? reply.tool_calls.map((c, index) => ({ index, ...c }))
        : undefined;
      return sse([
        {
          ...head,
          prompt_token_ids: prompt,
          choices: [{ index: 0, delta: { role: "assistant" } }],
        },
        {
          ...head,
          choices: [{
            index: 0,
            delta: { content: reply.content ?? "", ...(calls ? { tool_calls: calls } : {}) },
            token_ids: ids,
            finish_reason: finish,
          }],
        },
        {
          ...head,
          choices: [],
          usage: { prompt_tokens: prompt.length, completion_tokens: ids.length },
        },
        "[DONE]",
      ]);
    },
  };
}

/** Two tool calls, then the answer: what the toy model says to every rollout. */
export const REPLIES: Record<string, unknown>[] = [
  {
    content: "",
    tool_calls: [{
      id: "call_1",
      type: "function",
      function: { name: "bash", arguments: '{"command":"ls"}' },
    }],
  },
  {
    content: "",
    tool_calls: [{
      id: "call_2",
      type: "function",
      function: { name: "bash", arguments: '{"command":"pwd"}' },
    }],
  },
  { content: "done" },
];

/**
 * The toy server as toylab_env.ts's tasks meet it: each rollout's calls are
 * answered by their turn (a re-rendered history counts as turn 3).
 */
export function toyLabServer(rollouts: number): ScriptedServer {
  const { handler } = toyServer(REPLIES);
  // Each rollout's calls come in order; the server answers by the call's turn.
  return scriptedServer(
    Array(rollouts * 3).fill((r: Parameters<typeof handler>[0]) => {
      const turn = (r.body.messages as { role: string }[]).filter((m) => m.role === "assistant")
        .length;
      const rerendered = String((r.body.messages as { content: string }[])[1]?.content).includes(
        "What you ran so far",
      );
      return handler(r, rerendered ? 2 : turn);
    }),
  );
}
