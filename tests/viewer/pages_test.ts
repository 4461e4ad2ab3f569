// The job and rollout pages of a command-agent run and of a model run, in
// headless Chromium: what a person sees once the page says it is ready
// (data-ready="1"), read from the DOM and from screenshots. With
// HUD_UPDATE_SCREENSHOT=1 the model run's rollout and job pages are written
// to docs/ for docs/viewer.md.

import { test } from "../_test.ts";
import { CHROMIUM, OPENSSH_CLIENT, SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Job } from "../../eval/mod.ts";
import type { CdpSession } from "../../cdp/mod.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { startViewer } from "../../viewer/mod.ts";
import { robolabRuns } from "./_runs.ts";

/** Evaluates `expression` until it is truthy, or fails naming `what`. */
async function until(page: CdpSession, expression: string, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  let last: unknown;
  while (Date.now() < deadline) {
    last = await page.evaluate(expression, { signal: AbortSignal.timeout(10_000) });
    if (last) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`Timed out waiting for ${what} (last: ${String(last)})`);
}

/** Opens `hash` of the viewer and waits for the page's own ready flag. */
async function open(page: CdpSession, url: string, hash: string, view: string): Promise<void> {
  await page.evaluate(`location.hash = ${JSON.stringify(hash)}`);
  if (!(await page.evaluate<boolean>(`location.href.startsWith(${JSON.stringify(url)})`))) {
    await page.navigate(url + hash, { signal: AbortSignal.timeout(20_000) });
  }
  await until(
    page,
    `document.documentElement.dataset.ready === '1' && document.documentElement.dataset.view === '${view}' && location.hash === ${
      JSON.stringify(hash)
    }`,
    `${view} page ${hash}`,
  );
}

const text = (page: CdpSession, selector: string) =>
  page.evaluate<string>(`document.querySelector(${JSON.stringify(selector)})?.textContent ?? ""`);
const texts = (page: CdpSession, selector: string) =>
  page.evaluate<string[]>(
    `[...document.querySelectorAll(${JSON.stringify(selector)})].map((e) => e.textContent)`,
  );

/** What a person can see of the page: visible text only (closed details hide theirs). */
const visible = (page: CdpSession) => page.evaluate<string>("document.body.innerText");

/**
 * Visible `pre` blocks that hold a JSON object or array of more than three
 * lines: the walls of JSON the pages must not show.
 */
const jsonWalls = (page: CdpSession) =>
  page.evaluate<string[]>(
    "[...document.querySelectorAll('main pre')].filter((p) => p.checkVisibility()).map((p) => p.innerText)" +
      ".filter((t) => /^\\s*[\\[{]/.test(t) && t.trim().split('\\n').length > 3)",
  );

/** Three significant digits, as the page writes numbers. */
const sig = (x: number) => String(Number(x.toPrecision(3)));
/** A count as the page writes it: exact below 10,000, else 3 significant digits and k. */
const count = (n: number) => n < 10_000 ? String(n) : `${sig(n / 1000)}k`;

async function shoot(page: CdpSession, path: string, maxHeight = 2400): Promise<Uint8Array> {
  const height = Math.min(
    maxHeight,
    await page.evaluate<number>("document.documentElement.scrollHeight"),
  );
  await page.send("Emulation.setDeviceMetricsOverride", {
    width: 1100,
    height,
    deviceScaleFactor: 1,
    mobile: false,
  });
  const png = await page.screenshot({ signal: AbortSignal.timeout(15_000) });
  await page.send("Emulation.setDeviceMetricsOverride", {
    width: 1100,
    height: 900,
    deviceScaleFactor: 1,
    mobile: false,
  });
  await Deno.writeFile(path, png);
  return png;
}

function assertPng(png: Uint8Array, what: string): void {
  assert.deepEqual([...png.subarray(1, 4)], [0x50, 0x4e, 0x47], `${what} is a PNG`);
  assert.ok(png.length > 20_000, `${what} shows something (${png.length} bytes)`);
}

const UPDATE = Deno.env.get("HUD_UPDATE_SCREENSHOT") !== undefined;
const docs = (name: string) => new URL(`../../docs/${name}`, import.meta.url).pathname;

test("viewer pages of a command-agent run and a model run read as a person would want", {
  needs: [CHROMIUM, SANDBOX, OPENSSH_CLIENT],
}, async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "viewer-pages-" });
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  try {
    const runs = await robolabRuns(dir);
    const modelJob = await Job.load(runs.model);
    const commandJob = await Job.load(runs.command);
    await using viewer = await startViewer([runs.model, runs.command]);
    const signal = AbortSignal.timeout(60_000);
    browser = await launchChromium({ signal });
    await using cdp = browser.connect();
    await using page = await cdp.newPage("about:blank", { signal });
    await page.send("Emulation.setDeviceMetricsOverride", {
      width: 1100,
      height: 900,
      deviceScaleFactor: 1,
      mobile: false,
    }, { signal });
    await page.navigate(viewer.url, { signal });

    await t.step("the model run's job page says what ran, what it used, and plots it", async () => {
      await open(page, viewer.url, "#/f/0", "job");
      const s = modelJob.summary();
      assert.match(
        await text(page, "#s-agent"),
        /model “scripted-robolab”.*api openai.*temperature 0/,
      );
      assert.equal(await text(page, "#s-env"), "robolab 1.0.0");
      assert.equal(
        await text(page, "#s-tokens"),
        `${count(s.input_tokens!)} in, ${count(s.output_tokens!)} out`,
      );
      assert.equal(await text(page, "#s-cost"), `$${sig(s.cost_usd!)}`);
      assert.match(
        await text(page, "#s-steps"),
        /^16 model calls \(4 per rollout\), 16 tool calls$/,
      );
      // Rounded for people, exact in the JSON: 0.2886751345948129 shows as 0.289.
      assert.ok(s.stderr !== null && String(s.stderr).length > 8);
      assert.equal(await text(page, "#s-mean"), `${sig(s.mean_reward!)} ± ${sig(s.stderr)}`);
      assert.equal(
        await text(page, "#s-pass"),
        `pass@1 ${sig(s.pass_at["1"]!)}, pass@2 ${sig(s.pass_at["2"]!)}`,
      );
      assert.equal(await text(page, "#s-subscores"), "check 0.5, answer 0.5");
      const plots = await page.evaluate<string[]>(
        "[...document.querySelectorAll('figure.plot figcaption')].map((c) => c.textContent)",
      );
      assert.deepEqual(plots, [
        "Reward distribution",
        "Mean reward per task",
        "Durations",
        "pass@k",
      ]);
      assert.ok(
        await page.evaluate<number>(
          "document.querySelectorAll('figure.plot svg rect.bar').length",
        ) >= 4,
      );
      // The per-task plot's labels name each task's arguments too.
      const labels = await page.evaluate<string[]>(
        "[...document.querySelectorAll('figure.plot svg text.tick > title')].map((e) => e.textContent)",
      );
      assert.deepEqual(labels, s.tasks.map((t) => `${t.slug} ${JSON.stringify(t.args)}`));
      // Per task: its arguments (issue 38: the slug alone), the mean, passes and subscores.
      const tasks = await page.evaluate<string[][]>(
        "[...document.querySelectorAll('#tasks tbody tr')].map((tr) => [...tr.children].map((c) => c.textContent))",
      );
      assert.deepEqual(
        tasks.map((r) => r.slice(0, 7)),
        s.tasks.map((t) => [
          t.slug,
          JSON.stringify(t.args),
          "2",
          `${sig(t.mean_reward!)} ± ${sig(t.stderr!)}`.replace(" ± 0", " ± 0"),
          `${t.passes}/2`,
          sig(t.subscores.check),
          sig(t.subscores.answer),
        ]),
      );
      // The repeat column reads "1 of 2", never a job id's tail.
      const repeats = await texts(page, "#rollouts tbody tr.row td:nth-child(3)");
      assert.deepEqual(repeats.sort(), ["1 of 2", "1 of 2", "2 of 2", "2 of 2"]);
      assert.ok(
        !(await visible(page)).includes(modelJob.id.slice(-12)) ||
          (await text(page, "#sum-h")).includes(modelJob.id),
        "the job id only in the heading",
      );
      const rowsText = (await texts(page, "#rollouts tbody tr.row")).join("\n");
      assert.ok(!rowsText.includes(modelJob.id.slice(-8)), rowsText);
      assert.match(rowsText, /check 1, answer 1/);
      assert.deepEqual(await jsonWalls(page), []);
      assert.ok(!(await visible(page)).includes("Loading"));
      const png = await shoot(page, `${dir}/model-job.png`);
      assertPng(png, "the model job page");
      if (UPDATE) await shoot(page, docs("viewer-job.png"), 1250);
    });

    await t.step("a model rollout reads as a conversation, not as JSON", async () => {
      const i = modelJob.runs.findIndex((r) => r.reward === 1);
      const record = modelJob.runs[i];
      const line = (await Deno.readTextFile(runs.model)).trim().split("\n")
        .findIndex((l) => JSON.parse(l).trace.started_at === record.trace.started_at);
      await open(page, viewer.url, `#/r/0/${line}`, "rollout");
      const roles = await texts(page, "#conversation > li.msg .role");
      // The system prompt first, as the model read it (issue 38: it came after the user's).
      assert.deepEqual(roles, [
        "system",
        "user",
        "assistant",
        "assistant",
        "assistant",
        "assistant",
        "answer",
      ]);
      // Tool calls: the command as a code block, JSON arguments once.
      const code = await texts(page, "#conversation .call pre.code");
      assert.equal(code.length, 3);
      assert.match(
        code[1],
        /&& sed -i 's\/-lt "\$n"\/-le "\$n"\/' count\.sh && \.\/count\.sh 3$/,
      );
      assert.ok(code.every((c) => !c.startsWith("{") && !c.includes('\\"')), code.join("\n"));
      assert.deepEqual(await texts(page, "#conversation .call .tool-name"), [
        "bash",
        "bash",
        "bash",
        "submit",
      ]);
      // Each tool result is shown once, under its call, and can be folded.
      assert.equal(
        await page.evaluate<number>(
          "document.querySelectorAll('#conversation details.result').length",
        ),
        4,
      );
      assert.equal(
        await page.evaluate<number>(
          "document.querySelectorAll('#conversation li.msg-tool').length",
        ),
        0,
      );
      const listing = await page.evaluate<number>(
        "[...document.querySelectorAll('main pre')].filter((p) => p.textContent.includes('stdout:\\ncount.sh\\n#!')).length",
      );
      assert.equal(listing, 1, "the ls output appears once");
      assert.match(
        await text(page, "#conversation > li.msg-assistant .msg-head"),
        /scripted-robolab · 400 in \/ 40 out tokens/,
      );
      // The system prompt is at the prompt's time, not after the first model call's.
      assert.deepEqual(
        await texts(page, "#conversation > li.msg-system time, #conversation > li.msg-user time"),
        Array(2).fill(await text(page, "#conversation > li.msg-user time")),
      );
      // The environment with its version (issue 38: its name alone).
      assert.equal(await text(page, "#r-env"), "robolab 1.0.0");
      // The grade with its subscores, the timeline, the agent's diff before the setup files.
      assert.equal(await text(page, "#r-score"), "1");
      assert.deepEqual(await texts(page, "table.subscores tbody th"), ["check", "answer"]);
      assert.ok(
        await page.evaluate<number>(
          "document.querySelectorAll('svg.timeline rect.span-model').length",
        ) === 4,
      );
      assert.ok(
        await page.evaluate<boolean>(
          "!!(document.getElementById('agent-diffs').compareDocumentPosition(document.getElementById('setup-files')) & Node.DOCUMENT_POSITION_FOLLOWING)",
        ),
        "the agent's diff comes before the setup files",
      );
      assert.equal(
        await page.evaluate<boolean>("document.getElementById('setup-files').open"),
        false,
      );
      assert.equal(
        await page.evaluate<number>("document.querySelectorAll('#setup-files .line.add').length"),
        0,
        "the starting files are a summary, not green diffs",
      );
      assert.match(
        await text(page, "#setup-files summary"),
        /^Starting files, set up by the environment: 1 file, 8 lines/,
      );
      assert.deepEqual(
        await texts(page, "#agent-diffs .line.add"),
        ['+while [ "$i" -le "$n" ]; do\n'],
      );
      assert.deepEqual(await jsonWalls(page), []);
      const seen = await visible(page);
      assert.ok(!seen.includes("Loading"), "no Loading… once ready");
      assert.ok(!seen.includes('{"role"') && !seen.includes("\\n"), "no JSON or escaped newlines");
      const png = await shoot(page, `${dir}/model-rollout.png`);
      assertPng(png, "the model rollout page");
      if (UPDATE) {
        await page.evaluate("scrollTo(0, 0)");
        await shoot(page, docs("viewer-rollout.png"), 1500);
      }
    });

    await t.step("the command-agent run: its job page and a rollout with text output", async () => {
      await open(page, viewer.url, "#/f/1", "job");
      assert.match(await text(page, "#s-agent"), /^command \S*ssh_agent\.sh max output bytes/);
      assert.equal(await text(page, "#s-tokens"), "not reported");
      assert.equal(await text(page, "#s-cost"), "not reported");
      assert.match(await text(page, "#s-steps"), /^\d+ trace steps$/);
      assert.deepEqual(await jsonWalls(page), []);
      assertPng(await shoot(page, `${dir}/command-job.png`), "the command job page");

      const record = commandJob.runs.find((r) => r.reward === 1)!;
      // Its line by its group and repeat: rollouts started side by side may share a start time.
      const line = (await Deno.readTextFile(runs.command)).trim().split("\n")
        .findIndex((l) => {
          const r = JSON.parse(l);
          return r.group_id === record.group_id && r.repeat === record.repeat &&
            r.reward === record.reward;
        });
      await open(page, viewer.url, `#/r/1/${line}`, "rollout");
      assert.match(await text(page, "li.msg-agent"), /The command exited with code 0/);
      assert.deepEqual(await texts(page, "li.msg-answer pre.content"), [
        String(record.trace.content),
      ]);
      assert.deepEqual(await jsonWalls(page), []);
      const seen = await visible(page);
      assert.ok(!seen.includes("Loading") && !seen.includes("\\n"), seen);
      assertPng(await shoot(page, `${dir}/command-rollout.png`), "the command rollout page");
    });
  } finally {
    await browser?.close();
    await Deno.remove(dir, { recursive: true });
  }
});
