// The rollout page on what graders and model agents may write: a grade
// combined from checks (nested subscores, a breakdown with each check's
// output), and model calls carrying token ids and log-probabilities. Read
// from a static report in headless Chromium.

import { test } from "../_test.ts";
import { CHROMIUM } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { toAtif } from "../../eval/mod.ts";
import type { RunRecord } from "../../eval/mod.ts";

const at = (ms: number) => new Date(Date.UTC(2026, 5, 1) + ms).toISOString();
const LOGPROBS = [-0.25, -0.5, -0.75, -1, -0.5];

const RECORD = {
  job_id: "job-1",
  group_id: "job-1:grade-1",
  task: { env: "lab", id: "grade", args: {}, slug: "grade-1" },
  repeat: 0,
  status: "completed",
  reward: 0.7666666666666666,
  failed_phase: null,
  subscores: { tests: 0.6666666666666666, judge: 1, "judge/Cites a source": 1 },
  agent: { kind: "model", name: "tiny", settings: { api: "openai" } },
  trace: {
    status: "completed",
    stop_reason: "graded",
    content: "done",
    started_at: at(0),
    ended_at: at(3000),
    errors: [],
    steps: [
      { type: "user", timestamp: at(10), content: "Make the tests pass." },
      {
        type: "model",
        timestamp: at(900),
        content: {
          request: [{ role: "system", content: "Be brief." }, {
            role: "user",
            content: "Make the tests pass.",
          }],
          reply: { role: "assistant", content: "done", tool_calls: [] },
        },
        info: {
          model: "tiny",
          latency_ms: 850,
          input_tokens: 30,
          output_tokens: 5,
          finish_reason: "stop",
          completion_token_ids: [101, 102, 103, 104, 105],
          prompt_token_ids: Array.from({ length: 30 }, (_, i) => i),
          logprobs: LOGPROBS,
        },
      },
      { type: "agent", timestamp: at(950), content: "done" },
      {
        type: "evaluate",
        timestamp: at(2900),
        content: {
          score: 0.7666666666666666,
          subscores: { tests: 0.6666666666666666, judge: 1, "judge/Cites a source": 1 },
          info: {
            breakdown: [
              {
                name: "tests",
                value: 0.6666666666666666,
                weight: 0.7,
                info: { exit_code: 1, timed_out: false, stdout: "2 passed\n1 failed: test_sum\n" },
              },
              {
                name: "judge",
                value: 1,
                weight: 0.3,
                children: [{
                  name: "Cites a source",
                  value: 1,
                  info: { explanation: "It names the RFC." },
                }],
              },
            ],
          },
        },
      },
    ],
  },
};

test("the rollout page shows a combined grade's checks and keeps token ids compact", {
  needs: [CHROMIUM],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "viewer-grade-" });
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  try {
    const file = `${dir}/r.jsonl`;
    await Deno.writeTextFile(file, JSON.stringify(RECORD) + "\n");
    const out = `${dir}/r.html`;
    assert.equal(await main(["report", file, "--html", out], { stderr: () => {} }), 0);
    const signal = AbortSignal.timeout(45_000);
    browser = await launchChromium({ signal });
    await using cdp = browser.connect();
    await using page = await cdp.newPage("about:blank", { signal });
    await page.navigate(`file://${out}#/r/0/0`, { signal });
    for (let i = 0; i < 200; i++) {
      if (await page.evaluate("document.documentElement.dataset.ready === '1'")) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal(await page.evaluate("document.documentElement.dataset.view"), "rollout");
    // 3 significant digits on the page, for the score and every subscore.
    assert.equal(await page.evaluate("document.getElementById('r-score').textContent"), "0.767");
    assert.deepEqual(
      await page.evaluate(
        "[...document.querySelectorAll('table.subscores tbody tr')].map((tr) => [tr.children[0].textContent, tr.children[1].textContent, tr.children[0].style.paddingLeft])",
      ),
      [["tests", "0.667", "0.5rem"], ["judge", "1", "0.5rem"], ["Cites a source", "1", "1.5rem"]],
    );
    // What each check saw, as text.
    const breakdown = await page.evaluate<string>(
      "document.querySelector('ul.breakdown').innerText",
    );
    assert.match(breakdown, /tests 0\.667 × 0\.7/);
    assert.match(breakdown, /exit code 1 · timed out false/);
    assert.match(breakdown, /2 passed\n1 failed: test_sum/);
    assert.match(breakdown, /Cites a source 1\n+explanation It names the RFC\./);
    // Token ids and log-probabilities: counts and a mean, not arrays.
    const head = await page.evaluate<string>(
      "document.querySelector('li.msg-assistant .msg-head').textContent",
    );
    assert.match(head, /completion token ids: 5/);
    assert.match(head, /prompt token ids: 30/);
    assert.match(head, /logprobs: 5, mean -0\.6/);
    const seen = await page.evaluate<string>("document.body.innerText");
    assert.ok(!seen.includes("101, 102") && !seen.includes("[101"), "no token id arrays");
    assert.ok(!seen.includes("0.6666666"), "no raw floats");
  } finally {
    await browser?.close();
    await Deno.remove(dir, { recursive: true });
  }
});

test("toAtif() carries token ids and log-probabilities into the step's metrics", () => {
  const t = toAtif(RECORD as unknown as RunRecord, { sdkVersion: "0.1.0" });
  const step = t.steps.find((s) => s.source === "agent")!;
  assert.deepEqual(step.metrics?.logprobs, LOGPROBS);
  assert.deepEqual(step.metrics?.completion_token_ids, [101, 102, 103, 104, 105]);
  assert.equal(step.metrics?.prompt_token_ids?.length, 30);
  assert.equal(t.agent.version, "0.1.0");
  assert.deepEqual((t.extra?.hud as Record<string, unknown>).subscores, RECORD.subscores);
});

/** A graded record whose grade `content` is given. */
function gradedRecord(repeat: number, content: Record<string, unknown>) {
  return {
    job_id: "job-2",
    group_id: "job-2:checks",
    task: { env: "lab", id: "checks", args: {}, slug: "checks" },
    repeat,
    status: "completed",
    reward: content.score,
    failed_phase: null,
    trace: {
      status: "completed",
      started_at: at(0),
      ended_at: at(1000),
      errors: [],
      steps: [{ type: "evaluate", timestamp: at(900), content }],
    },
  };
}

test("the rollout page opens a failed check's output and folds a passed one's", {
  needs: [CHROMIUM],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "viewer-fold-" });
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  const failing = Array.from({ length: 21 }, (_, i) => `FAILED test_${i}`).join("\n");
  try {
    const file = `${dir}/r.jsonl`;
    const records = [
      gradedRecord(0, {
        score: 0.5,
        info: {
          breakdown: [
            { name: "tests", value: 0, weight: 0.5, info: { stdout: failing } },
            { name: "lint", value: 1, weight: 0.5, info: { stdout: "OK\n" } },
            { name: "escape", value: 0, weight: -1, info: { stdout: "not escaped\n" } },
          ],
          check_output: "expected 3\ngot 2",
        },
      }),
      gradedRecord(1, { score: 1, info: { check_output: "all good\nOK" } }),
    ];
    await Deno.writeTextFile(file, records.map((r) => JSON.stringify(r)).join("\n") + "\n");
    const out = `${dir}/r.html`;
    assert.equal(await main(["report", file, "--html", out], { stderr: () => {} }), 0);
    const signal = AbortSignal.timeout(45_000);
    browser = await launchChromium({ signal });
    await using cdp = browser.connect();
    await using page = await cdp.newPage("about:blank", { signal });
    /** Each text block of the grade: its lines, and whether it shows open. */
    const blocks = async (i: number) => {
      await page.navigate(`file://${out}#/r/0/${i}`, { signal });
      for (let n = 0; n < 200; n++) {
        if (await page.evaluate("document.documentElement.dataset.ready === '1'")) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      return await page.evaluate<[string, boolean][]>(
        "[...document.querySelectorAll('#grade details.long')].map((d) => [d.querySelector('pre').textContent.split('\\n')[0], d.open])",
      );
    };
    // Was: the 21 failing lines folded ("21 lines, ..."), the passing "OK" shown.
    assert.deepEqual(await blocks(0), [
      ["FAILED test_0", true],
      ["OK", false],
      ["not escaped", false],
      ["expected 3", true],
    ]);
    assert.deepEqual(await blocks(1), [["all good", false]]);
  } finally {
    await browser?.close();
    await Deno.remove(dir, { recursive: true });
  }
});
