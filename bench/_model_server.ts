// A scripted OpenAI-compatible server for bench/agents.ts, in its own
// process: it waits DELAY ms, then calls the `noop` tool until the request
// holds STEPS tool results, then answers. Prints its port.
const delay = Number(Deno.args[0] ?? 0);
const steps = Number(Deno.args[1] ?? 50);
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
  const body = await req.json();
  if (delay > 0) await new Promise((r) => setTimeout(r, delay));
  const done = body.messages.filter((m: { role: string }) => m.role === "tool").length >= steps;
  const usage = { prompt_tokens: 100, completion_tokens: 10 };
  if (!body.stream) {
    return Response.json({
      choices: [{
        index: 0,
        finish_reason: done ? "stop" : "tool_calls",
        message: done ? { role: "assistant", content: "done" } : {
          role: "assistant",
          content: null,
          tool_calls: [{
            id: "c",
            type: "function",
            function: { name: "noop", arguments: '{"n": 1}' },
          }],
        },
      }],
      usage,
    });
  }
  const chunks = done
    ? [{ choices: [{ index: 0, delta: { content: "done" }, finish_reason: "stop" }] }]
    : [
      {
        choices: [{
          index: 0,
          delta: { tool_calls: [{ index: 0, id: "c", function: { name: "noop", arguments: "" } }] },
        }],
      },
      {
        choices: [{
          index: 0,
          delta: { tool_calls: [{ index: 0, function: { arguments: '{"n": ' } }] },
        }],
      },
      {
        choices: [{
          index: 0,
          delta: { tool_calls: [{ index: 0, function: { arguments: "1}" } }] },
          finish_reason: "tool_calls",
        }],
      },
    ];
  const text = [...chunks, { choices: [], usage }].map((c) =>
    `data: ${JSON.stringify(c)}\n\n`
  ).join("") +
    "data: [DONE]\n\n";
  return new Response(text, { headers: { "content-type": "text/event-stream" } });
});
console.log(server.addr.port);
