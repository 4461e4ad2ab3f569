// The computer tool (issue 40): ChatAgent offers an rfb binding's desktop to
// a model as Anthropic's computer_20250124 tool or an OpenAI-compatible
// function tool; screenshots reach the model as images (Anthropic's
// tool_result image block; a user message of image parts after the tool
// messages for Chat Completions), scaled to the model's screen, with its
// coordinates scaled back; traces keep the screenshots as files beside the
// results, and the viewer shows them with the action's point drawn on.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { ChatAgent } from "../../agents/mod.ts";
import { computerTool, ImageResult, modelScreen } from "../../agents/computer.ts";
import { anthropicBody, openAiBody } from "../../agents/mod.ts";
import { Environment } from "../../env.ts";
import { Taskset } from "../../eval/mod.ts";
import { resultsFilesDir } from "../../eval/results.ts";
import { RfbClient } from "../../rfb/mod.ts";
import { LocalRuntime } from "../../runtime/mod.ts";
import { startViewer } from "../../viewer/mod.ts";
import { addDesktop, addWorkspace } from "../../workspace/mod.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { accept38, type FakeIo, fakeServer, rawRect, update } from "../rfb/_fake.ts";
import { decodePng } from "../rfb/_png_decode.ts";
import { buttonTask, desktop, findColour } from "../rfb/_x.ts";
import { SANDBOX } from "../_counterparts.ts";
import { anthropicReply, completion, type Received, scriptedServer } from "./_scripted.ts";

/**
 * A scripted desktop: answers full and one-pixel requests (not incremental
 * ones, so the screen is still), records pointer and key events.
 */
function fakeDesktop(width: number, height: number, events: number[][]) {
  return fakeServer(async (io: FakeIo) => {
    await accept38(io, width, height);
    for (;;) {
      const type = await io.read.u8().catch(() => null);
      if (type === null) return;
      if (type === 3) {
        const incremental = await io.read.u8();
        const [x, y, w, h] = [
          await io.read.u16(),
          await io.read.u16(),
          await io.read.u16(),
          await io.read.u16(),
        ];
        if (!incremental) await io.write(update(1), rawRect(x, y, w, h, [0, 0x80, 0]));
      } else if (type === 5) {
        events.push([5, await io.read.u8(), await io.read.u16(), await io.read.u16()]);
      } else if (type === 4) {
        const down = await io.read.u8();
        await io.read.bytes(2);
        events.push([4, down, await io.read.u32()]);
      } else throw new Error(`unexpected message ${type}`);
    }
  });
}

const context = () => ({ run: null as never, signal: AbortSignal.timeout(20_000) });

test("modelScreen() fits the desktop into 1280x800 unless a size is given", () => {
  assert.deepEqual(modelScreen({ width: 1600, height: 1000 }), { width: 1280, height: 800 });
  assert.deepEqual(modelScreen({ width: 1024, height: 768 }), { width: 1024, height: 768 });
  assert.deepEqual(modelScreen({ width: 2560, height: 1440 }), { width: 1280, height: 720 });
  assert.deepEqual(modelScreen({ width: 1600, height: 1000 }, { width: 1024, height: 640 }), {
    width: 1024,
    height: 640,
  });
  assert.throws(
    () => modelScreen({ width: 10, height: 10 }, { width: 100 }),
    /give both width and height/,
  );
});

test("computerTool() scales the model's coordinates to the desktop and answers with scaled screenshots", async () => {
  const events: number[][] = [];
  await using server = fakeDesktop(1600, 1000, events);
  await using vnc = await RfbClient.connect({ port: server.port });
  const tool = computerTool(vnc, { settleQuiet: 50 });
  assert.deepEqual(tool.anthropic?.definition, {
    type: "computer_20250124",
    name: "computer",
    display_width_px: 1280,
    display_height_px: 800,
  });
  assert.equal(tool.anthropic?.beta, "computer-use-2025-01-24");

  const shot = await tool.call({ action: "screenshot" }, context());
  assert.ok(shot instanceof ImageResult);
  const png = await decodePng(shot.images[0].data);
  assert.deepEqual([png.width, png.height], [1280, 800]);
  assert.deepEqual([...png.rgb.subarray(0, 3)], [0, 0x80, 0]);

  events.length = 0;
  await tool.call({ action: "left_click", coordinate: [640, 400], text: "shift" }, context());
  await tool.call({
    action: "scroll",
    coordinate: [1279, 799],
    scroll_direction: "up",
    scroll_amount: 2,
  }, context());
  await tool.call({ action: "key", text: "ctrl+a Delete" }, context());
  assert.equal(await tool.call({ action: "cursor_position" }, context()), "X=1279,Y=799");
  assert.deepEqual(events, [
    [4, 1, 0xffe1],
    [5, 0, 800, 500],
    [5, 1, 800, 500],
    [5, 0, 800, 500],
    [4, 0, 0xffe1],
    [5, 0, 1599, 999],
    [5, 8, 1599, 999],
    [5, 0, 1599, 999],
    [5, 8, 1599, 999],
    [5, 0, 1599, 999],
    [4, 1, 0xffe3],
    [4, 1, 0x61],
    [4, 0, 0x61],
    [4, 0, 0xffe3],
    [4, 1, 0xffff],
    [4, 0, 0xffff],
  ]);

  // Bad input: one line for the model, nothing sent.
  events.length = 0;
  await assert.rejects(
    tool.call({ action: "left_click", coordinate: [1280, 10] }, context()),
    /^RangeError: coordinate \[1280, 10\] is off the 1280x800 screen$/,
  );
  await assert.rejects(
    tool.call({ action: "fly" }, context()),
    /unknown action "fly"; use one of screenshot, /,
  );
  await assert.rejects(tool.call({ action: "type" }, context()), /type needs text/);
  // A model's reply can be tens of MiB: text past 10,000 characters is refused, not typed.
  await assert.rejects(
    tool.call({ action: "type", text: "a".repeat(10_001) }, context()),
    /^RangeError: text is 10001 characters; at most 10000$/,
  );
  await assert.rejects(
    tool.call({ action: "key", text: "a ".repeat(5_001) }, context()),
    /text is 10002 characters; at most 10000/,
  );
  await assert.rejects(
    tool.call({ action: "left_click", coordinate: [1, 1], text: "shift".repeat(2_001) }, context()),
    /text is 10005 characters; at most 10000/,
  );
  await assert.rejects(
    tool.call({ action: "mouse_move" }, context()),
    /mouse_move needs coordinate/,
  );
  await assert.rejects(
    tool.call({ action: "wait", duration: 60 }, context()),
    /duration must be 0 to 10 seconds/,
  );
  await assert.rejects(
    tool.call({ action: "left_click", coordinate: [1, "a"] }, context()),
    /coordinate must be \[x, y\]/,
  );
  assert.deepEqual(events, []);
});

test("anthropicBody() and openAiBody() carry tool pictures and Anthropic's own tool definition", () => {
  const request = {
    messages: [
      { role: "user" as const, content: "go" },
      {
        role: "assistant" as const,
        content: "",
        toolCalls: [{ id: "c1", name: "computer", arguments: "{}" }],
      },
      {
        role: "tool" as const,
        toolCallId: "c1",
        name: "computer",
        content: "",
        images: [{ mediaType: "image/png", data: "iVBORw0K" }],
      },
    ],
    tools: [{
      name: "computer",
      description: "d",
      parameters: { type: "object" },
      anthropic: { definition: { type: "computer_20250124", name: "computer" }, beta: "b" },
    }],
  };
  const a = anthropicBody("m", request) as { messages: { content: unknown[] }[]; tools: unknown[] };
  assert.deepEqual(a.tools, [{ type: "computer_20250124", name: "computer" }]);
  assert.deepEqual(a.messages[2].content, [{
    type: "tool_result",
    tool_use_id: "c1",
    content: [{
      type: "image",
      source: { type: "base64", media_type: "image/png", data: "iVBORw0K" },
    }],
  }]);
  const o = openAiBody("m", request, false) as {
    messages: Record<string, unknown>[];
    tools: unknown[];
  };
  assert.equal(o.messages[2].role, "tool");
  assert.equal(o.messages[2].content, "(the screenshot follows)");
  assert.deepEqual(o.messages[3], {
    role: "user",
    content: [
      { type: "text", text: "The screen after tool call c1:" },
      { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0K" } },
    ],
  });
  assert.deepEqual((o.tools[0] as { function: { name: string } }).function.name, "computer");
});

/** The PNG the model got last, from an Anthropic or a Chat Completions request. */
function lastPicture(request: Received): Uint8Array {
  const messages = request.body.messages as { role: string; content: unknown }[];
  for (const m of messages.toReversed()) {
    if (!Array.isArray(m.content)) continue;
    for (const block of (m.content as Record<string, unknown>[]).toReversed()) {
      if (block.type === "image_url") {
        const url = (block.image_url as { url: string }).url;
        return Uint8Array.fromBase64(url.slice(url.indexOf(",") + 1));
      }
      if (block.type === "tool_result" && Array.isArray(block.content)) {
        const image = (block.content as Record<string, unknown>[]).find((b) => b.type === "image");
        if (image) return Uint8Array.fromBase64((image.source as { data: string }).data);
      }
    }
  }
  throw new Error("no picture in the request");
}

/** Where the green button is in the picture the model got, in the picture's pixels. */
async function buttonIn(request: Received): Promise<[number, number]> {
  const png = await decodePng(lastPicture(request));
  const rgba = new Uint8Array(png.width * png.height * 4);
  for (let i = 0; i < png.width * png.height; i++) {
    rgba.set(png.rgb.subarray(i * 3, i * 3 + 3), i * 4);
  }
  const at = findColour({ width: png.width, height: png.height, rgba }, [0, 0xc0, 0]);
  if (at === null) throw new Error(`no button in the ${png.width}x${png.height} picture`);
  return [at.x, at.y];
}

const NEEDS = ["Xvnc", "tkinter", "chromium"];

for (const format of ["anthropic", "openai"] as const) {
  test({
    name:
      `ChatAgent (${format}) clicks a button it sees in the computer tool's screenshot: reward 1, screenshots as files, drawn in the viewer`,
    needs: [desktop(NEEDS), SANDBOX],
    async fn() {
      let clicked: [number, number] = [0, 0];
      const tool = (input: Record<string, unknown>, id: string) =>
        format === "anthropic"
          ? anthropicReply([{ type: "tool_use", id, name: "computer", input }])
          : completion({ tool_calls: [["computer", JSON.stringify(input)]] });
      await using model = scriptedServer([
        tool({ action: "screenshot" }, "t1"),
        async (request, i) => {
          clicked = await buttonIn(request);
          return await tool({ action: "left_click", coordinate: clicked }, "t2")(request, i);
        },
        format === "anthropic"
          ? anthropicReply([{
            type: "tool_use",
            id: "t3",
            name: "submit",
            input: { answer: "done" },
          }])
          : completion({ tool_calls: [["submit", '{"answer":"done"}']] }),
      ]);
      const root = await Deno.makeTempDir({ prefix: "hud-computer-" });
      const out = `${root}-results.jsonl`;
      const env = new Environment("buttons");
      const workspace = addWorkspace(env, root, { trackFiles: false });
      // Larger than the model's screen: the picture is scaled to 1280x800 and the click back.
      const desktop = addDesktop(env, { workspace, width: 1600, height: 1000 });
      const press = buttonTask(env, desktop);
      const agent = new ChatAgent({
        format,
        model: "scripted",
        baseUrl: format === "anthropic" ? model.origin : model.baseUrl,
        apiKey: "test-key",
        stream: false,
        capabilityTools: true,
        maxSteps: 5,
      });
      let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
      try {
        const job = await new Taskset([press({ seed: 5 })]).run(agent, {
          runtime: new LocalRuntime(env),
          out,
          fileTracking: false,
        });
        const record = job.runs[0];
        assert.equal(record.reward, 1, JSON.stringify(record.trace));

        // The model saw the computer tool in its own shape, and pictures of 1280x800.
        const first = model.received[0];
        const tools = first.body.tools as Record<string, unknown>[];
        if (format === "anthropic") {
          assert.equal(first.headers.get("anthropic-beta"), "computer-use-2025-01-24");
          assert.deepEqual(tools.find((t) => t.name === "computer"), {
            type: "computer_20250124",
            name: "computer",
            display_width_px: 1280,
            display_height_px: 800,
          });
        } else {
          const fn = tools.map((t) => t.function as Record<string, unknown>).find((f) =>
            f.name === "computer"
          )!;
          assert.match(String(fn.description), /1280x800 screen/);
        }
        const picture = await decodePng(lastPicture(model.received[1]));
        assert.deepEqual([picture.width, picture.height], [1280, 800]);

        // The trace holds references; the pictures are files beside the results.
        const steps =
          (record.trace as { steps: { type: string; content?: Record<string, unknown> }[] }).steps;
        const shots = steps.filter((s) => s.type === "tool" && s.content?.name === "computer");
        assert.equal(shots.length, 2);
        const refs = shots.flatMap((s) =>
          s.content!.images as { file: string; media_type: string }[]
        );
        assert.equal(refs.length, 2);
        const line = await Deno.readTextFile(out);
        assert.doesNotMatch(line, /iVBORw0K/, "a picture in the JSON");
        for (const ref of refs) {
          assert.match(ref.file, /^[0-9a-f]{64}\.png$/);
          assert.equal(ref.media_type, "image/png");
          const bytes = await Deno.readFile(`${resultsFilesDir(out)}/${ref.file}`);
          assert.deepEqual([...bytes.subarray(1, 4)], [0x50, 0x4e, 0x47]);
          assert.equal(
            (await Deno.stat(`${resultsFilesDir(out)}/${ref.file}`)).mode! & 0o777,
            0o600,
          );
        }

        // The viewer serves them to its token only, and draws the click on the picture.
        await using viewer = await startViewer([out]);
        const url = new URL(`files/${refs[1].file}?file=0`, viewer.url);
        const stranger = await fetch(url);
        assert.equal(stranger.status, 403);
        await stranger.body?.cancel();
        const served = await fetch(url, { headers: { authorization: `Bearer ${viewer.token}` } });
        assert.equal(served.headers.get("content-type"), "image/png");
        assert.deepEqual(
          await served.bytes(),
          await Deno.readFile(`${resultsFilesDir(out)}/${refs[1].file}`),
        );
        const missing = await fetch(new URL(`files/${"0".repeat(64)}.png?file=0`, viewer.url), {
          headers: { authorization: `Bearer ${viewer.token}` },
        });
        assert.equal(missing.status, 404);
        await missing.body?.cancel();
        // Only <sha256>.<image type> of a results file it serves, never a path out of .files/.
        const real = refs[1].file;
        for (
          const path of [
            "files/../../../../etc/passwd",
            "files/..%2f..%2f..%2fetc%2fpasswd",
            `files/%2e%2e%2f${real}`,
            `files/${real}%00.png`,
            `files/${real.toUpperCase()}`,
            `files/${real.replace(".png", ".jsonl")}`,
            `files/${real}?file=1`,
            `files/${real}?file=-1`,
          ]
        ) {
          const r = await fetch(new URL(path.includes("?") ? path : `${path}?file=0`, viewer.url), {
            headers: { authorization: `Bearer ${viewer.token}` },
          });
          assert.equal(r.status, 404, path);
          await r.body?.cancel();
        }

        const signal = AbortSignal.timeout(60_000);
        browser = await launchChromium({ signal });
        await using cdp = browser.connect();
        await using page = await cdp.newPage("about:blank", { signal });
        await page.navigate(viewer.url + "#/r/0/0", { signal });
        let marks: { left: string; top: string; loaded: number }[] = [];
        for (let i = 0; i < 200; i++) {
          marks = await page.evaluate(
            `[...document.querySelectorAll("figure.shot .mark")].map((m) => ({
            left: m.style.left, top: m.style.top,
            loaded: m.parentElement.querySelector("img").naturalWidth }))`,
            { signal },
          );
          if (marks.length > 0) break;
          await new Promise((r) => setTimeout(r, 50));
        }
        assert.deepEqual(marks, [{
          left: `${(100 * clicked[0]) / 1280}%`,
          top: `${(100 * clicked[1]) / 800}%`,
          loaded: 1280,
        }]);
        assert.equal(
          await page.evaluate<number>(`document.querySelectorAll("figure.shot img").length`, {
            signal,
          }),
          2,
        );
      } finally {
        await browser?.close();
        await Deno.remove(root, { recursive: true });
        await Deno.remove(out).catch(() => {});
        await Deno.remove(resultsFilesDir(out), { recursive: true }).catch(() => {});
      }
    },
  });
}
