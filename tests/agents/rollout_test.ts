// End to end: a robolab-like environment with a real SSH workspace; a
// scripted model (OpenAI-compatible and Anthropic) runs bash over SSH,
// reads and writes files, then submits; the answer is graded.

import { test } from "../_test.ts";
import { SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { addWorkspace, Environment, rollout } from "../../mod.ts";
import { ChatAgent } from "../../agents/mod.ts";
import { anthropicReply, completion, delta, scriptedServer, stream } from "./_scripted.ts";

function labTask(root: string) {
  const env = new Environment("lab");
  addWorkspace(env, root, { env: { HOME: root } });
  return env.template({ id: "fix" }, async function* () {
    await Deno.writeTextFile(`${root}/greet.sh`, "echo helo\n");
    const answer = yield "greet.sh misspells hello. Fix it, then submit its output.";
    const fixed = (await Deno.readTextFile(`${root}/greet.sh`)).includes("hello");
    yield { score: (fixed ? 0.5 : 0) + (answer === "hello" ? 0.5 : 0), info: { fixed, answer } };
  });
}

test("ChatAgent rollout: bash and file tools over a real SSH workspace, submit graded", {
  needs: [SANDBOX],
}, async () => {
  const root = await Deno.makeTempDir({ prefix: "agents-e2e-" });
  try {
    const task = labTask(root);
    await using model = scriptedServer([
      stream([
        delta({
          tool_calls: [
            { index: 0, id: "c0", function: { name: "list_dir", arguments: '{"path": "."}' } },
            {
              index: 1,
              id: "c1",
              function: { name: "read_file", arguments: '{"path": "greet.sh"}' },
            },
          ],
        }),
        delta({}, "tool_calls"),
      ]),
      stream([
        delta({
          tool_calls: [{
            index: 0,
            id: "c2",
            function: {
              name: "write_file",
              arguments: '{"path": "greet.sh", "content": "echo hello\\n"}',
            },
          }],
        }),
        delta({}, "tool_calls"),
      ]),
      stream([
        delta({
          tool_calls: [{
            index: 0,
            id: "c3",
            function: {
              name: "bash",
              arguments: '{"command": "bash greet.sh; echo oops >&2; exit 3"}',
            },
          }],
        }),
        delta({}, "tool_calls"),
      ]),
      stream([
        delta({
          tool_calls: [{
            index: 0,
            id: "c4",
            function: { name: "submit", arguments: '{"answer": "hello"}' },
          }],
        }),
        delta({}, "tool_calls"),
      ]),
    ]);
    const agent = new ChatAgent({
      model: "scripted",
      baseUrl: model.baseUrl,
      sampling: { temperature: 0 },
    });
    const run = await rollout(task(), agent, { rolloutTimeout: 30_000, fileTracking: false });
    assert.deepEqual(run.trace.errors, []);
    assert.equal(run.reward, 1);
    const names = (model.received[0].body.tools as { function: { name: string } }[])
      .map((t) => t.function.name).sort();
    assert.deepEqual(names, ["bash", "list_dir", "read_file", "submit", "write_file"]);
    const results = run.trace.steps.filter((s) => s.type === "tool").map((s) =>
      (s.content as { result: string }).result
    );
    assert.equal(results.length, 5);
    assert.match(results[0], /^greet\.sh$/m);
    assert.equal(results[1], "echo helo\n");
    assert.match(results[2], /^wrote 11 characters to greet\.sh$/);
    assert.equal(results[3], "exit_code: 3\nstdout:\nhello\n\nstderr:\noops\n");
    assert.equal(results[4], "submitted");
    // What the model saw is what ran.
    const last = model.received[3].body.messages as { role: string; content: string }[];
    assert.equal(last.at(-1)!.content, results[3]);
    assert.equal(run.trace.steps.filter((s) => s.type === "model").length, 4);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test(
  "ChatAgent rollout: bash output over the limit is cut with a note",
  { needs: [SANDBOX] },
  async () => {
    const root = await Deno.makeTempDir({ prefix: "agents-e2e-" });
    try {
      const task = labTask(root);
      await using model = scriptedServer([
        completion({ tool_calls: [["bash", '{"command": "seq 1 5000"}']] }),
        completion({ content: "hello" }),
      ]);
      const agent = new ChatAgent({
        model: "scripted",
        baseUrl: model.baseUrl,
        stream: false,
        shell: { outputLimit: 200 },
      });
      const run = await rollout(task(), agent, { rolloutTimeout: 30_000, fileTracking: false });
      assert.deepEqual(run.trace.errors, []);
      assert.equal(run.reward, 0.5);
      const out = (run.trace.steps.find((s) =>
        s.type === "tool"
      )!.content as { result: string }).result;
      assert.match(out, /^exit_code: 0\nstdout:\n1\n2\n3\n/);
      assert.match(out, /\[\.\.\. \d+ characters cut: output over 200 \.\.\.\]/);
      assert.match(out, /4999\n5000\n$/);
      assert.ok(out.length < 400);
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
);

test("ChatAgent rollout over the Anthropic Messages API: tool_use, tool_result, graded", {
  needs: [SANDBOX],
}, async () => {
  const root = await Deno.makeTempDir({ prefix: "agents-e2e-" });
  try {
    const task = labTask(root);
    await using model = scriptedServer([
      anthropicReply([
        { type: "text", text: "Fixing." },
        {
          type: "tool_use",
          id: "tu_1",
          name: "bash",
          input: { command: "sed -i s/helo/hello/ greet.sh" },
        },
        { type: "tool_use", id: "tu_2", name: "bash", input: { command: "bash greet.sh" } },
      ]),
      anthropicReply([{ type: "text", text: "hello" }]),
    ]);
    const agent = new ChatAgent({
      format: "anthropic",
      model: "claude-scripted",
      baseUrl: model.origin,
      apiKey: "sk-ant-test",
      parallelToolCalls: false,
      sampling: { temperature: 0, maxTokens: 256 },
      system: "Be brief.",
    });
    const run = await rollout(task(), agent, { rolloutTimeout: 30_000, fileTracking: false });
    assert.deepEqual(run.trace.errors, []);
    assert.equal(run.reward, 1);
    const [first, second] = model.received;
    assert.equal(first.path, "/v1/messages");
    assert.equal(first.headers.get("x-api-key"), "sk-ant-test");
    assert.equal(first.headers.get("anthropic-version"), "2023-06-01");
    assert.equal(first.headers.get("authorization"), null);
    assert.equal(first.body.system, "Be brief.");
    assert.equal(first.body.max_tokens, 256);
    assert.deepEqual(first.body.tool_choice, { type: "auto", disable_parallel_tool_use: true });
    const tools = first.body.tools as { name: string; input_schema: { required: string[] } }[];
    assert.deepEqual(tools.find((t) => t.name === "bash")!.input_schema.required, ["command"]);
    const msgs = second.body.messages as { role: string; content: Record<string, unknown>[] }[];
    assert.deepEqual(msgs.map((m) => m.role), ["user", "assistant", "user"]);
    assert.deepEqual(msgs[1].content.map((b) => b.type), ["text", "tool_use", "tool_use"]);
    assert.deepEqual(msgs[1].content[1].input, { command: "sed -i s/helo/hello/ greet.sh" });
    assert.deepEqual(msgs[2].content.map((b) => [b.type, b.tool_use_id]), [
      ["tool_result", "tu_1"],
      ["tool_result", "tu_2"],
    ]);
    assert.equal(msgs[2].content[1].content, "exit_code: 0\nstdout:\nhello\n");
    const calls = run.trace.steps.filter((s) => s.type === "model");
    assert.equal(calls[0].info?.format, "anthropic");
    assert.equal(calls[0].info?.input_tokens, 12);
    assert.equal(calls[0].info?.finish_reason, "tool_use");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

test("ChatAgent rollout: the shell tools start in the task's bindings.shell.cwd", {
  needs: [SANDBOX],
}, async () => {
  const root = await Deno.makeTempDir({ prefix: "agents-cwd-" });
  try {
    const env = new Environment("lab");
    addWorkspace(env, root, { env: { HOME: root } });
    const task = env.template({ id: "where" }, async function* () {
      const dir = await Deno.makeTempDir({ dir: root, prefix: "task-" });
      await Deno.writeTextFile(`${dir}/note.txt`, "in the task's directory\n");
      const answer = yield { prompt: "Where are you?", bindings: { shell: { cwd: dir } } };
      const wrote = await Deno.readTextFile(`${dir}/out.txt`).catch(() => "");
      yield { score: answer === dir && wrote === "written" ? 1 : 0, info: { dir } };
    });
    const call = (id: string, name: string, args: unknown) => ({
      index: 0,
      id,
      function: { name, arguments: JSON.stringify(args) },
    });
    await using model = scriptedServer([
      // `;` must not take the second command out of the directory.
      stream([delta({ tool_calls: [call("a", "bash", { command: "cd /; pwd; cat note.txt" })] })]),
      stream([
        delta({ tool_calls: [call("b", "bash", { command: "pwd && ls" })] }),
        delta({}, "tool_calls"),
      ]),
      stream([
        delta({ tool_calls: [call("c", "read_file", { path: "note.txt" })] }),
        delta({}, "tool_calls"),
      ]),
      stream([
        delta({ tool_calls: [call("d", "write_file", { path: "out.txt", content: "written" })] }),
        delta({}, "tool_calls"),
      ]),
      stream([
        delta({ tool_calls: [call("e", "list_dir", { path: "." })] }),
        delta({}, "tool_calls"),
      ]),
      (r) => {
        const out = (r.body.messages as { role: string; content: string }[])
          .filter((m) => m.role === "tool").map((m) => m.content);
        const dir = /stdout:\n(\S+)/.exec(out[1])![1];
        return completion({ tool_calls: [["submit", JSON.stringify({ answer: dir })]] })(r, 0);
      },
    ]);
    const agent = new ChatAgent({ model: "m", baseUrl: model.baseUrl, retry: { baseDelay: 1 } });
    const run = await rollout(task(), agent, { rolloutTimeout: 60_000, fileTracking: false });
    assert.deepEqual(run.trace.errors, []);
    const dir = (run.bindings.shell as { cwd: string }).cwd;
    const results = run.trace.steps.filter((s) => s.type === "tool").map((s) =>
      (s.content as { result: string }).result
    );
    // The first call's `cd /` stays inside that call; its pwd says so.
    assert.match(results[0], /stdout:\n\/\n/);
    assert.match(results[1], new RegExp(`stdout:\\n${dir}\\nnote\\.txt`));
    assert.equal(results[2], "in the task's directory\n");
    assert.match(results[4], /note\.txt/);
    assert.match(results[4], /out\.txt/);
    assert.equal(run.reward, 1, JSON.stringify(run.grade));
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
