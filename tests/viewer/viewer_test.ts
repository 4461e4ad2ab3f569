// The viewer, in a real headless Chromium driven by the CDP client: results
// files made by real robolab runs, served by `cli.ts view`, and the page it
// shows checked through the DOM.

import { test } from "../_test.ts";
import { CHROMIUM, SANDBOX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { type Agent, functionAgent, Taskset } from "../../mod.ts";
import type { CdpClient, CdpSession } from "../../cdp/mod.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { renderReport, startViewer } from "../../viewer/mod.ts";
import { encodeTurnTokens } from "../../eval/mod.ts";
import { fixBug, scriptedAgent } from "../../examples/robolab.ts";

/** The diff line the scripted agent's repair of count.sh leaves. */
const FIXED_LINE = '+while [ "$i" -le "$n" ]; do';
const XSS_ANSWER = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">';
const GAVE_UP = "no repair known for total.sh";

const TASKS = [
  fixBug({ difficulty: 1, seed: 1 }),
  fixBug({ difficulty: 3, seed: 1 }),
  fixBug({ difficulty: 3, seed: 2 }),
];

/**
 * The scripted agent on count.sh; on total.sh it gives up with seed 2 (an
 * agent-phase error) and answers with markup with seed 1.
 */
const agentA: Agent = {
  async run(run, context) {
    const { difficulty, seed } = run.task.args as { difficulty: number; seed: number };
    if (difficulty === 3 && seed === 2) throw new Error(GAVE_UP);
    if (difficulty === 3) run.answer = XSS_ANSWER;
    else await scriptedAgent.run(run, context);
  },
};
/** An agent that changes nothing and answers nothing useful. */
const agentB: Agent = functionAgent(() => "no idea");

/** Evaluates `expression` until it is truthy, or fails naming `what`. */
async function until<T>(
  page: CdpSession,
  expression: string,
  what: string,
  timeout = 15_000,
): Promise<T> {
  const deadline = Date.now() + timeout;
  let last: unknown;
  while (Date.now() < deadline) {
    last = await page.evaluate(expression, { signal: AbortSignal.timeout(10_000) });
    if (last) return last as T;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Timed out after ${timeout} ms waiting for ${what} (last: ${String(last)})`);
}

async function shoot(page: CdpSession, path: string): Promise<void> {
  await Deno.writeFile(path, await page.screenshot({ signal: AbortSignal.timeout(15_000) }));
}

const ROWS_JS = "[...document.querySelectorAll('#rollouts tbody tr.row')]";
/** True once the page has drawn `view` completely (the page's own ready flag). */
const READY = (view: string) =>
  `document.documentElement.dataset.ready === '1' && document.documentElement.dataset.view === '${view}'`;

test("cli.ts view shows robolab results in Chromium", { needs: [CHROMIUM, SANDBOX] }, async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "viewer-test-" });
  const fileA = `${dir}/a.jsonl`;
  const fileB = `${dir}/b.jsonl`;
  const stop = new AbortController();
  let viewing: Promise<number> | null = null;
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  let cdp: CdpClient | null = null;
  try {
    const jobA = await new Taskset(TASKS).run(agentA, {
      out: fileA,
      maxConcurrent: 3,
      rolloutTimeout: 420_000,
    });
    const jobB = await new Taskset(TASKS).run(agentB, {
      out: fileB,
      maxConcurrent: 3,
      rolloutTimeout: 420_000,
    });
    assert.equal(jobA.runs.length, 3);
    assert.equal(jobB.runs.length, 3);
    // Keep the last line of A back, to append while the page is open.
    const linesA = (await Deno.readTextFile(fileA)).trimEnd().split("\n");
    const held = linesA.pop()!;
    await Deno.writeTextFile(fileA, linesA.join("\n") + "\n");

    let printed = "";
    let announced: (url: string) => void;
    const url = new Promise<string>((resolve) => announced = resolve);
    viewing = main(["view", fileA, fileB, "--port", "0"], {
      stdout: (text) => {
        printed += text;
        const m = /http:\/\/\S+/.exec(printed);
        if (m) announced(m[0]);
      },
      stderr: () => {},
      signal: stop.signal,
    });
    const signal = AbortSignal.timeout(60_000);
    browser = await launchChromium({ signal });
    cdp = browser.connect();
    const page = await cdp.newPage("about:blank", { signal });
    await page.send("Emulation.setDeviceMetricsOverride", {
      width: 1100,
      height: 700,
      deviceScaleFactor: 1,
      mobile: false,
    }, { signal });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const viewUrl = await Promise.race([
      url,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error("view printed no url within 10 s")), 10_000);
      }),
    ]).finally(() => clearTimeout(timer));
    await page.navigate(viewUrl, { signal });

    await t.step("the table lists every rollout, with the failing task's error", async () => {
      await until(page, `${ROWS_JS}.length === 2`, "2 rows in the table");
      assert.equal(
        await page.evaluate("document.getElementById('count').textContent"),
        "Showing 2 of 2 rollouts",
      );
      const errors = await page.evaluate<string[]>(
        `${ROWS_JS}.map((tr) => tr.querySelector('.error').textContent)`,
      );
      const statuses = await page.evaluate<string[]>(
        `${ROWS_JS}.map((tr) => tr.querySelector('.status').textContent)`,
      );
      const gaveUp = jobA.runs.findIndex((r) => r.failed_phase === "agent");
      assert.ok(gaveUp >= 0);
      // The held-back line may be any of the three; count what is shown.
      const shown = linesA.map((l) => JSON.parse(l).failed_phase);
      if (shown.includes("agent")) {
        assert.ok(errors.includes(GAVE_UP), `no "${GAVE_UP}" in ${JSON.stringify(errors)}`);
        // The status names the failure's class.
        assert.ok(statuses.includes("error (agent_error)"), JSON.stringify(statuses));
      }
    });

    await t.step("new rows appear while the file is written", async () => {
      await Deno.writeTextFile(fileA, held + "\n", { append: true });
      await until(page, `${ROWS_JS}.length === 3`, "the appended row");
      assert.equal(
        await page.evaluate("document.getElementById('count').textContent"),
        "Showing 3 of 3 rollouts",
      );
      const errors = await page.evaluate<string[]>(
        `${ROWS_JS}.map((tr) => tr.querySelector('.error').textContent)`,
      );
      assert.ok(errors.includes(GAVE_UP), `no "${GAVE_UP}" in ${JSON.stringify(errors)}`);
      assert.match(
        await page.evaluate<string>("document.getElementById('s-errored').textContent"),
        /failures: agent_error 1/,
      );
      await shoot(page, `${dir}/table.png`);
    });

    await t.step("sorting by reward orders the rows", async () => {
      const rewards = () =>
        page.evaluate<string[]>(`${ROWS_JS}.map((tr) => tr.querySelector('.reward').textContent)`);
      await page.evaluate("document.querySelector('th[data-key=reward] button').click()");
      await until(
        page,
        "document.querySelector('th[data-key=reward]').getAttribute('aria-sort') === 'ascending'",
        "ascending sort",
      );
      const up = (await rewards()).map(Number);
      assert.deepEqual(up, [...up].sort((a, b) => a - b));
      await page.evaluate("document.querySelector('th[data-key=reward] button').click()");
      await until(
        page,
        "document.querySelector('th[data-key=reward]').getAttribute('aria-sort') === 'descending'",
        "descending sort",
      );
      const down = (await rewards()).map(Number);
      assert.deepEqual(down, [...down].sort((a, b) => b - a));
      assert.equal(down[0], 1);
    });

    await t.step("the filter narrows the rows", async () => {
      await page.evaluate(
        "const f = document.getElementById('filter'); f.value = 'seed\":2'; " +
          "f.dispatchEvent(new Event('input'))",
      );
      await until(page, `${ROWS_JS}.length === 1`, "one row after filtering");
      await page.evaluate(
        "const g = document.getElementById('filter'); g.value = ''; " +
          "g.dispatchEvent(new Event('input'))",
      );
      await until(page, `${ROWS_JS}.length === 3`, "three rows again");
    });

    await t.step("a rollout shows its steps and the agent's diff", async () => {
      const slug = TASKS[0].slug;
      await page.evaluate(
        `[...document.querySelectorAll('#rollouts a')].find((a) => a.textContent === ${
          JSON.stringify(slug)
        }).click()`,
      );
      await until(page, READY("rollout"), "the rollout view");
      const added = await page.evaluate<string[]>(
        "[...document.querySelectorAll('pre.diff .line.add')].map((l) => l.textContent.trimEnd())",
      );
      assert.ok(added.includes(FIXED_LINE), `no ${FIXED_LINE} in ${JSON.stringify(added)}`);
      const removed = await page.evaluate<string[]>(
        "[...document.querySelectorAll('pre.diff .line.del')].map((l) => l.textContent.trimEnd())",
      );
      assert.ok(removed.includes('-while [ "$i" -lt "$n" ]; do'));
      const steps = await page.evaluate<string[]>(
        "[...document.querySelectorAll('#conversation > li .role')].map((r) => r.textContent)",
      );
      assert.equal(steps[0], "task");
      assert.ok(steps.includes("user") && steps.includes("answer") && steps.includes("grade"));
      assert.ok(steps.indexOf("files") < steps.indexOf("grade"));
      const subscores = await page.evaluate<string>(
        "document.querySelector('table.subscores').textContent",
      );
      assert.match(subscores, /check1/);
      await shoot(page, `${dir}/rollout.png`);
    });

    await t.step("agent output is shown as text, never run as markup", async () => {
      const i = jobA.runs.findIndex((r) => r.trace.content === XSS_ANSWER);
      assert.ok(i >= 0, "no rollout answered with markup");
      const slug = jobA.runs[i].task.slug;
      await page.evaluate("location.hash = '#/f/0'");
      await until(page, READY("job"), "the table");
      await page.evaluate(
        `[...document.querySelectorAll('#rollouts a')].find((a) => a.textContent === ${
          JSON.stringify(slug)
        }).click()`,
      );
      await until(page, READY("rollout"), "the rollout view");
      const texts = await page.evaluate<string[]>(
        "[...document.querySelectorAll('li.msg-answer pre.content')].map((p) => p.textContent)",
      );
      assert.deepEqual(texts, [XSS_ANSWER]);
      assert.equal(await page.evaluate("typeof window.__xss"), "undefined");
      assert.equal(
        await page.evaluate("document.querySelectorAll('main img, main script').length"),
        0,
      );
    });

    await t.step("the comparison lines up the tasks of two files", async () => {
      await page.evaluate("location.hash = '#/compare/0/1'");
      await until(page, READY("compare"), "the comparison view");
      const rows = await page.evaluate<string[][]>(
        "[...document.querySelectorAll('#compare tbody tr')].map((tr) => " +
          "[...tr.children].map((c) => c.textContent))",
      );
      assert.equal(rows.length, 3);
      const bySlug = new Map(rows.map((r) => [r[0], r]));
      for (const task of TASKS) {
        const a = jobA.runs.find((r) => r.task.slug === task.slug)!.reward!;
        const b = jobB.runs.find((r) => r.task.slug === task.slug)!.reward!;
        const row = bySlug.get(task.slug)!;
        // Three significant digits, no trailing zeros.
        const sig = (x: number) => String(Number(x.toPrecision(3)));
        assert.deepEqual(row.slice(2), [
          sig(a),
          sig(b),
          (b > a ? "+" : b < a ? "\u2212" : "\u00b1") + sig(Math.abs(b - a)),
        ]);
      }
      // The fixed task scored 1 in A and 0 in B: the largest change comes first.
      assert.equal(rows[0][0], TASKS[0].slug);
      assert.equal(rows[0][4], "\u22121");
      // And as a plot: one bar per task in both files, the change in mean reward.
      assert.equal(
        await page.evaluate("document.querySelector('figure.plot figcaption').textContent"),
        "Change per task",
      );
      assert.equal(
        await page.evaluate("document.querySelectorAll('figure.plot rect.bar').length"),
        3,
      );
      await shoot(page, `${dir}/compare.png`);
    });

    for (const name of ["table", "rollout", "compare"]) {
      const png = await Deno.readFile(`${dir}/${name}.png`);
      assert.deepEqual([...png.subarray(1, 4)], [0x50, 0x4e, 0x47]);
    }
    await page.close({ signal });
  } finally {
    await cdp?.close();
    await browser?.close();
    stop.abort();
    const code = await viewing;
    await Deno.remove(dir, { recursive: true });
    if (code !== null) assert.equal(code, 0);
  }
});

test("cli.ts report --html writes a page that works from disk", { needs: [CHROMIUM] }, async () => {
  const dir = await Deno.makeTempDir({ prefix: "viewer-report-" });
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  try {
    const file = `${dir}/r.jsonl`;
    const records = [0, 1, 2].map((i) => ({
      job_id: "job",
      group_id: `job:t${i % 2}`,
      task: { env: "e", id: "t", args: { i }, slug: `t-${i}` },
      repeat: i,
      status: i === 2 ? "error" : "completed",
      reward: i === 2 ? null : i,
      failed_phase: i === 2 ? "start" : null,
      trace: {
        started_at: "2026-01-01T00:00:00.000Z",
        ended_at: "2026-01-01T00:00:01.500Z",
        errors: i === 2 ? [{ phase: "start", message: "</script><b>boom</b>", name: "Error" }] : [],
        steps: [{ type: "user", timestamp: "2026-01-01T00:00:00.000Z", content: "<!-- hi" }],
      },
    }));
    await Deno.writeTextFile(file, records.map((r) => JSON.stringify(r)).join("\n") + "\n");
    const out = `${dir}/report.html`;
    let stderr = "";
    const code = await main(["report", file, "--html", out], {
      stdout: () => {},
      stderr: (t) => stderr += t,
    });
    assert.equal(code, 0, stderr);
    const html = await Deno.readTextFile(out);
    assert.ok(!html.includes("</script><b>"), "record text ends the data block");
    assert.doesNotMatch(html, /(src|href)=["']?(https?:)?\/\//, "the page loads nothing");

    const signal = AbortSignal.timeout(45_000);
    browser = await launchChromium({ signal });
    await using cdp = browser.connect();
    await using page = await cdp.newPage("about:blank", { signal });
    await page.navigate(`file://${out}`, { signal });
    await until(page, `${ROWS_JS}.length === 3`, "3 rows from disk");
    await until(page, READY("job"), "the job page from disk");
    assert.equal(
      await page.evaluate("document.getElementById('s-mean').textContent"),
      "0.5 \u00b1 0.5",
    );
    assert.match(
      await page.evaluate<string>("document.getElementById('s-errored').textContent"),
      // A record older than the classes (no error_class) reads as today's class.
      /^1 \(start_error 1\)$/,
    );
    assert.match(
      await page.evaluate<string>("document.getElementById('s-duration').textContent"),
      /^1\.5 s/,
    );
    const errors = await page.evaluate<string[]>(
      `${ROWS_JS}.map((tr) => tr.querySelector('.error').textContent)`,
    );
    assert.ok(errors.includes("</script><b>boom</b>"));
    assert.equal(await page.evaluate("document.querySelectorAll('main b').length"), 0);
  } finally {
    await browser?.close();
    await Deno.remove(dir, { recursive: true });
  }
});

test(
  "cli.ts report --html shows alike rewards without float noise, and compares them as the same",
  {
    needs: [CHROMIUM],
  },
  async () => {
    const dir = await Deno.makeTempDir({ prefix: "viewer-noise-" });
    let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
    /** A results file of task "t" with these rewards, one repeat each. */
    const write = async (name: string, rewards: number[]) => {
      const lines = rewards.map((reward, repeat) =>
        JSON.stringify({
          job_id: name,
          group_id: `${name}:t`,
          task: { env: "e", id: "t", args: {}, slug: "t" },
          repeat,
          status: "completed",
          reward,
          failed_phase: null,
          trace: { steps: [] },
        })
      );
      await Deno.writeTextFile(`${dir}/${name}.jsonl`, lines.join("\n") + "\n");
      return `${dir}/${name}.jsonl`;
    };
    try {
      // The same rewards in another order: their sums differ in the last bit.
      const files = [
        await write("a", [0.45, 0.45, 0.1]),
        await write("b", [0.1, 0.45, 0.45]),
        await write("c", [0.1, 0.1, 0.1]),
      ];
      const out = `${dir}/report.html`;
      assert.equal(await main(["report", ...files, "--html", out], { stderr: () => {} }), 0);
      const signal = AbortSignal.timeout(45_000);
      browser = await launchChromium({ signal });
      await using cdp = browser.connect();
      await using page = await cdp.newPage("about:blank", { signal });
      await page.navigate(`file://${out}#/f/2`, { signal });
      await until(page, READY("job"), "the job page of c");
      // Was "0.1 ± 9.81e-18".
      assert.equal(
        await page.evaluate("document.getElementById('s-mean').textContent"),
        "0.1 \u00b1 0",
      );
      await page.evaluate("location.hash = '#/compare/0/1'");
      await until(page, READY("compare"), "the comparison of a and b");
      // Was "0 better, 1 worse, 0 same": a change of one part in 1e16, in red.
      assert.match(
        await page.evaluate<string>("document.getElementById('cmp-counts').textContent"),
        /^0 better, 0 worse, 1 same/,
      );
      const row = await page.evaluate<string[]>(
        "[...document.querySelector('#compare tbody tr').children].map((c) => c.textContent)",
      );
      assert.equal(row.at(-1), "\u00b10");
    } finally {
      await browser?.close();
      await Deno.remove(dir, { recursive: true });
    }
  },
);

test("cli.ts report --html shows a model step's tokens as counts, not as base64", {
  needs: [CHROMIUM],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "viewer-tokens-" });
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  try {
    const ids = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);
    const first = { promptIds: ids(1200, 1), completionIds: ids(300, 5000), logprobs: null };
    const second = {
      promptIds: [...first.promptIds, ...first.completionIds, ...ids(40, 9000)],
      completionIds: ids(500, 7000),
      logprobs: ids(500, 0).map((i) => -i / 1000),
    };
    const stored = [encodeTurnTokens(first, null), encodeTurnTokens(second, first)];
    const step = (i: number) => ({
      type: "model",
      timestamp: "2026-01-01T00:00:00.000Z",
      content: { reply: { content: `turn ${i}` } },
      info: { model: "tiny", input_tokens: 1200, output_tokens: 300, tokens: stored[i] },
    });
    const record = {
      job_id: "job",
      group_id: "job:t",
      task: { env: "e", id: "t", args: {}, slug: "t" },
      repeat: 0,
      status: "completed",
      reward: 1,
      trace: { errors: [], steps: [step(0), step(1)] },
    };
    const file = `${dir}/r.jsonl`;
    await Deno.writeTextFile(file, JSON.stringify(record) + "\n");
    const out = `${dir}/report.html`;
    assert.equal(
      await main(["report", file, "--html", out], { stdout: () => {}, stderr: () => {} }),
      0,
    );
    const signal = AbortSignal.timeout(45_000);
    browser = await launchChromium({ signal });
    await using cdp = browser.connect();
    await using page = await cdp.newPage("about:blank", { signal });
    await page.navigate(`file://${out}#/r/0/0`, { signal });
    await until(page, READY("rollout"), "the rollout view");
    const heads = await page.evaluate<string[]>(
      "[...document.querySelectorAll('li.msg-assistant .msg-head')].map((h) => h.textContent)",
    );
    assert.equal(heads.length, 2, JSON.stringify(heads));
    assert.match(heads[0], /completion token ids: 300 · prompt token ids: 1200/);
    assert.doesNotMatch(heads[0], /logprobs/);
    assert.match(
      heads[1],
      /completion token ids: 500 · prompt token ids: 1540 · logprobs: 500, mean -0\.25/,
    );
    const seen = await page.evaluate<string>("document.body.innerText");
    for (const t of stored) {
      assert.ok(!seen.includes(t.completion_ids!.slice(0, 40)), "token ids shown as base64");
    }
  } finally {
    await browser?.close();
    await Deno.remove(dir, { recursive: true });
  }
});

test("startViewer() refuses a foreign Host header and unknown records", async () => {
  const file = await Deno.makeTempFile({ suffix: ".jsonl" });
  try {
    await using viewer = await startViewer([file]);
    // fetch() sets Host itself: speak HTTP by hand.
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: viewer.addr.port });
    try {
      await conn.write(
        new TextEncoder().encode(
          "GET / HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
        ),
      );
      const head = new Uint8Array(64);
      const n = await conn.read(head);
      assert.match(new TextDecoder().decode(head.subarray(0, n ?? 0)), /^HTTP\/1\.1 403/);
    } finally {
      conn.close();
    }
    const missing = await fetch(new URL(`api/record?file=0&i=0&token=${viewer.token}`, viewer.url));
    await missing.body?.cancel();
    assert.equal(missing.status, 404);
    const page = await fetch(viewer.url);
    assert.match(await page.text(), /Content-Security-Policy/);
  } finally {
    await Deno.remove(file);
  }
});

test("renderReport() and cli.ts view name a missing file in one line", async () => {
  await assert.rejects(renderReport(["/nonexistent/r.jsonl"]), {
    name: "TypeError",
    message:
      'Cannot write report: "/nonexistent/r.jsonl" is not a file (run a job with --out first)',
  });
  let stderr = "";
  const code = await main(["view", "/nonexistent/r.jsonl"], {
    stdout: () => {},
    stderr: (t) => stderr += t,
  });
  assert.equal(code, 1);
  assert.equal(stderr.trim().split("\n").length, 1);
  assert.match(stderr, /"\/nonexistent\/r\.jsonl" is not a file/);
});

test("startViewer() on 127.0.0.2 is loopback too: it refuses a foreign Host header", async () => {
  const file = await Deno.makeTempFile({ suffix: ".jsonl" });
  try {
    await using viewer = await startViewer([file], { hostname: "127.0.0.2" });
    const ask = async (host: string) => {
      const conn = await Deno.connect({ hostname: "127.0.0.2", port: viewer.addr.port });
      try {
        await conn.write(
          new TextEncoder().encode(
            `GET /?token=${viewer.token} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`,
          ),
        );
        const head = new Uint8Array(64);
        const n = await conn.read(head);
        return new TextDecoder().decode(head.subarray(0, n ?? 0));
      } finally {
        conn.close();
      }
    };
    assert.match(await ask("rebind.attacker.example"), /^HTTP\/1\.1 403/);
    assert.match(await ask(`127.0.0.2:${viewer.addr.port}`), /^HTTP\/1\.1 200/);
  } finally {
    await Deno.remove(file);
  }
});

test("the viewer's headline: the mean and pass@k over the same graded rollouts, named in words", {
  needs: [CHROMIUM],
}, async () => {
  // Issue 36: with 2 of 3 rollouts errored the page said "Mean reward 1"
  // beside pass@1 0.333: two denominators, neither named.
  const dir = await Deno.makeTempDir({ prefix: "viewer-headline-" });
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  try {
    const file = `${dir}/r.jsonl`;
    const records = [0, 1, 2].map((i) => ({
      job_id: "job",
      group_id: "job:t",
      task: { env: "e", id: "t", args: {}, slug: "t" },
      repeat: i,
      status: i === 0 ? "completed" : "error",
      reward: i === 0 ? 1 : null,
      failed_phase: i === 0 ? null : "agent",
      error_class: i === 0 ? null : "model_unavailable",
      trace: {
        started_at: "2026-01-01T00:00:00.000Z",
        ended_at: "2026-01-01T00:00:01.000Z",
        errors: i === 0 ? [] : [{
          phase: "agent",
          message: "model server http://127.0.0.1:9/v1/chat/completions unavailable",
          name: "ModelUnavailableError",
          class: "model_unavailable",
        }],
        steps: [],
      },
    }));
    await Deno.writeTextFile(file, records.map((r) => JSON.stringify(r)).join("\n") + "\n");
    const out = `${dir}/report.html`;
    assert.equal(
      await main(["report", file, "--html", out], { stdout: () => {}, stderr: () => {} }),
      0,
    );
    const signal = AbortSignal.timeout(45_000);
    browser = await launchChromium({ signal });
    await using cdp = browser.connect();
    await using page = await cdp.newPage("about:blank", { signal });
    await page.navigate(`file://${out}`, { signal });
    await until(page, READY("job"), "the job page from disk");
    const text = (id: string) =>
      page.evaluate<string>(`document.getElementById('${id}').textContent`);
    assert.equal(await text("s-mean"), "1");
    assert.equal(await text("s-mean-over"), " over 1 graded rollout; 2 errored, not in the mean");
    assert.equal(await text("s-pass"), "pass@1 1, pass@3 \u2013", "over the same graded rollout");
    assert.match(
      await text("s-pass-over"),
      /^ over graded rollouts, as the mean \(errored ones left out\)/,
    );
    assert.match(await text("s-errored"), /^2 \(model_unavailable 2\)/);
    // One graded: not every rollout errored alike, so no "every rollout errored" line.
    assert.equal(await page.evaluate("document.getElementById('s-common')"), null);
  } finally {
    await browser?.close();
    await Deno.remove(dir, { recursive: true });
  }
});
