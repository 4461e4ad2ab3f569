// The job page of a job whose rollouts started from workspace snapshots, in
// headless Chromium: the rollouts that share a snapshot are listed as its
// branches, with the snapshot's ancestry, its figures and a link to each.

import { test } from "../_test.ts";
import { BWRAP, CHROMIUM } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Job, rollout, type RunRecord, Taskset } from "../../eval/mod.ts";
import type { CdpSession } from "../../cdp/mod.ts";
import { launchChromium } from "../../cdp/_chromium.ts";
import { startViewer } from "../../viewer/mod.ts";
import type { WorkspaceSnapshot } from "../../workspace/mod.ts";
import { snapshotMethod } from "../../workspace/_snapshot.ts";
import { appendAgent, appendRows, forkRuntime, prepared, WORKSPACES } from "../eval/_forks.ts";

// Loads libc's mount calls (once per process) before the test's sanitizer counts them.
await snapshotMethod();

async function until(page: CdpSession, expression: string, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (await page.evaluate(expression, { signal: AbortSignal.timeout(10_000) })) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`Timed out waiting for ${what}`);
}

test("viewer: rollouts that share a snapshot show as its branches on the job page", {
  needs: [CHROMIUM, BWRAP],
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "viewer-branches-" });
  let browser: Awaited<ReturnType<typeof launchChromium>> | null = null;
  const runtime = forkRuntime();
  try {
    // A state after the setup (a), and one saved midway through a rollout from it (b).
    const a = await prepared(1);
    let b: WorkspaceSnapshot | null = null;
    await rollout(
      appendRows(0)[0],
      appendAgent(async (root) => {
        b = await WORKSPACES.get(root)!.snapshot();
      }),
      { runtime, from: a },
    );
    const midway: WorkspaceSnapshot = b!;
    const out = `${dir}/r.jsonl`;
    // Task 1's rollouts branch from a, task 2's from b; the job removes both at its end.
    await new Taskset(appendRows(1, 2)).run(appendAgent(), {
      runtime,
      from: (task) => Promise.resolve(task.args.n === 1 ? a : midway),
      group: 2,
      out,
    });
    assert.ok(a.removed && midway.removed);
    // The page's rows are the file's records, in order.
    const records: RunRecord[] = (await Deno.readTextFile(out)).trim().split("\n").map((l) =>
      JSON.parse(l)
    );
    const job = await Job.load(out);
    assert.equal(job.summary().snapshots.length, 2);

    await using viewer = await startViewer([out]);
    const signal = AbortSignal.timeout(60_000);
    browser = await launchChromium({ signal });
    await using cdp = browser.connect();
    await using page = await cdp.newPage("about:blank", { signal });
    await page.navigate(viewer.url + "#/f/0", { signal });
    await until(
      page,
      "document.documentElement.dataset.ready === '1' && document.documentElement.dataset.view === 'job'",
      "the job page",
    );
    const groups = await page.evaluate<
      { id: string; head: string; figures: string; branches: string[]; links: string[] }[]
    >(
      `[...document.querySelectorAll('#branches .snapshot')].map((g) => ({
        id: g.dataset.snapshot,
        head: g.querySelector('h3').textContent,
        figures: g.querySelector('p').textContent,
        branches: [...g.querySelectorAll('li.branch')].map((li) => li.textContent),
        links: [...g.querySelectorAll('li.branch a')].map((a) => a.getAttribute('href')),
      }))`,
    );
    const rowsOf = (n: number) =>
      records.map((r, i) => ({ r, i })).filter(({ r }) => r.task.args.n === n);
    const firstHead = groups[0].head;
    // In the order the file first met each snapshot (rollouts finish in any order).
    const byId = (x: { id: string }, y: { id: string }) => x.id < y.id ? -1 : 1;
    assert.deepEqual(groups.map((g) => g.id), job.summary().snapshots.map((s) => s.id));
    assert.deepEqual(
      groups.sort(byId),
      [
        {
          id: a.id,
          head: a.id,
          figures: "2 rollouts, 2 graded; mean reward 2, best 2",
          branches: rowsOf(1).map(({ r }) => `${r.task.slug} · repeat ${r.repeat + 1} — reward 2`),
          links: rowsOf(1).map(({ i }) => `#/r/0/${i}`),
        },
        {
          id: midway.id,
          head: `${midway.id} after ${a.id}`,
          figures: "2 rollouts, 2 graded; mean reward 3, best 3",
          branches: rowsOf(2).map(({ r }) => `${r.task.slug} · repeat ${r.repeat + 1} — reward 3`),
          links: rowsOf(2).map(({ i }) => `#/r/0/${i}`),
        },
      ].sort(byId),
    );
    // A branch's link opens its rollout.
    await page.evaluate(`document.querySelector('#branches li.branch a').click()`);
    await until(
      page,
      "document.documentElement.dataset.ready === '1' && document.documentElement.dataset.view === 'rollout'",
      "the rollout page",
    );
    // It names the snapshot it started from, and that one's ancestry.
    const fromText = await page.evaluate<string>(`document.querySelector('#r-from')?.textContent`);
    assert.equal(fromText, firstHead);
  } finally {
    await browser?.close();
    await Deno.remove(dir, { recursive: true });
  }
});
