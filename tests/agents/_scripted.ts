// A scripted model server on 127.0.0.1:0: each request gets the next reply
// of a script, and every request is kept for the test to inspect.

/** A request the server received. */
export interface Received {
  path: string;
  headers: Headers;
  body: Record<string, unknown>;
}

/** One scripted reply: a function of the request (and its index). */
export type Reply = (request: Received, index: number) => Response | Promise<Response>;

export interface ScriptedServer extends AsyncDisposable {
  /** `http://127.0.0.1:PORT/v1` */
  baseUrl: string;
  /** `http://127.0.0.1:PORT` */
  origin: string;
  received: Received[];
}

export function scriptedServer(script: Reply[]): ScriptedServer {
  const received: Received[] = [];
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    async (req) => {
      const body = await req.json();
      const r: Received = { path: new URL(req.url).pathname, headers: req.headers, body };
      const index = received.length;
      received.push(r);
      const reply = script[index];
      if (!reply) {
        return Response.json({ error: { message: `script has no reply #${index}` } }, {
          status: 400,
        });
      }
      return await reply(r, index);
    },
  );
  const origin = `http://127.0.0.1:${server.addr.port}`;
  return {
    baseUrl: `${origin}/v1`,
    origin,
    received,
    async [Symbol.asyncDispose]() {
      await server.shutdown();
    },
  };
}

let callId = 0;

/** A non-streaming Chat Completions reply. */
export function completion(
  message: { content?: string | null; tool_calls?: [string, string][]; refusal?: string },
  usage = { prompt_tokens: 10, completion_tokens: 5 },
): Reply {
  return () =>
    Response.json({
      id: "chatcmpl-1",
      object: "chat.completion",
      choices: [{
        index: 0,
        finish_reason: message.tool_calls ? "tool_calls" : "stop",
        message: {
          role: "assistant",
          content: message.content ?? null,
          ...(message.refusal ? { refusal: message.refusal } : {}),
          ...(message.tool_calls
            ? {
              tool_calls: message.tool_calls.map(([name, args]) => ({
                id: `call_${++callId}`,
                type: "function",
                function: { name, arguments: args },
              })),
            }
            : {}),
        },
      }],
      usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens },
    });
}

/** An SSE reply of these chunks (objects are sent as JSON), then `[DONE]` unless `cut`. */
export function stream(chunks: unknown[], options: { cut?: boolean } = {}): Reply {
  return () => {
    const enc = new TextEncoder();
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (const c of chunks) {
          controller.enqueue(
            enc.encode(`data: ${typeof c === "string" ? c : JSON.stringify(c)}\n\n`),
          );
        }
        if (!options.cut) controller.enqueue(enc.encode("data: [DONE]\n\n"));
        controller.close();
      },
    });
    return new Response(body, { headers: { "content-type": "text/event-stream" } });
  };
}

/** A Chat Completions stream chunk with this delta. */
export function delta(d: Record<string, unknown>, finish: string | null = null): unknown {
  return {
    object: "chat.completion.chunk",
    choices: [{ index: 0, delta: d, finish_reason: finish }],
  };
}

/** An error status with an OpenAI-shaped body. */
export function failure(
  status: number,
  message: string,
  headers: Record<string, string> = {},
  code?: string,
): Reply {
  return () =>
    Response.json({ error: { message, type: "error", ...(code ? { code } : {}) } }, {
      status,
      headers,
    });
}

/** An Anthropic Messages reply. */
export function anthropicReply(
  blocks: Record<string, unknown>[],
  stopReason = blocks.some((b) => b.type === "tool_use") ? "tool_use" : "end_turn",
): Reply {
  return () =>
    Response.json({
      id: "msg_1",
      type: "message",
      role: "assistant",
      content: blocks,
      stop_reason: stopReason,
      usage: { input_tokens: 12, output_tokens: 7 },
    });
}
