// A model server for bench/proxy.ts, in its own process: it answers every
// chat call in vLLM's shape (return_token_ids), with PROMPT prompt ids and
// COMPLETION completion ids and logprobs, whole or streamed as one chunk per
// token, after DELAY ms. Prints its port.
const delay = Number(Deno.args[0] ?? 0);
const promptLength = Number(Deno.args[1] ?? 2000);
const completionLength = Number(Deno.args[2] ?? 100);
const prompt = Array.from({ length: promptLength }, (_, i) => (i * 7919) % 150_000);
const ids = Array.from({ length: completionLength }, (_, i) => 1000 + i);
const usage = { prompt_tokens: promptLength, completion_tokens: completionLength };
const whole = JSON.stringify({
  id: "chatcmpl-b",
  object: "chat.completion",
  model: "policy",
  prompt_token_ids: prompt,
  choices: [{
    index: 0,
    finish_reason: "stop",
    message: { role: "assistant", content: "w ".repeat(completionLength) },
    token_ids: ids,
    logprobs: { content: ids.map((id) => ({ token: `token_id:${id}`, logprob: -0.5 })) },
  }],
  usage,
});
const head = { id: "chatcmpl-b", object: "chat.completion.chunk", model: "policy" };
const streamed = [
  { ...head, prompt_token_ids: prompt, choices: [{ index: 0, delta: { role: "assistant" } }] },
  ...ids.map((id, i) => ({
    ...head,
    choices: [{
      index: 0,
      delta: { content: "w " },
      token_ids: [id],
      logprobs: { content: [{ token: `token_id:${id}`, logprob: -0.5 }] },
      finish_reason: i === ids.length - 1 ? "stop" : null,
    }],
  })),
  { ...head, choices: [], usage },
].map((c) => `data: ${JSON.stringify(c)}\n\n`).join("") + "data: [DONE]\n\n";
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
  const body = await req.json();
  if (delay > 0) await new Promise((r) => setTimeout(r, delay));
  if (!body.stream) return new Response(whole, { headers: { "content-type": "application/json" } });
  return new Response(streamed, { headers: { "content-type": "text/event-stream" } });
});
console.log(server.addr.port);
