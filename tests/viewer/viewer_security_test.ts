// The viewer's credential (issue 23, point 4): every local uid can reach a
// loopback port, so the page and its API answer only requests that carry the
// token in the url `view` printed.

import { test } from "../_test.ts";
import { CURL, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { main } from "../../cli.ts";
import { startViewer } from "../../viewer/mod.ts";
import { curlAs } from "../_uid.ts";

const SECRET = "secret-record-1f2e3d";

async function privateResults(): Promise<{ dir: string; file: string }> {
  const dir = await Deno.makeTempDir({ prefix: "viewer-private-" });
  await Deno.chmod(dir, 0o700);
  const file = `${dir}/results.jsonl`;
  const record = {
    job_id: "j",
    group_id: "j:t",
    task: { env: "e", id: "t", args: {}, slug: "t" },
    repeat: 0,
    status: "completed",
    reward: 1,
    failed_phase: null,
    trace: { steps: [{ type: "agent", timestamp: "", content: SECRET }] },
  };
  await Deno.writeTextFile(file, JSON.stringify(record) + "\n", { mode: 0o600 });
  await Deno.chmod(file, 0o600);
  return { dir, file };
}

test({
  name: "startViewer() answers only requests with its token: another uid reads nothing",
  needs: [ROOT_USER, CURL],
  async fn() {
    const { dir, file } = await privateResults();
    try {
      await using viewer = await startViewer([file]);
      const base = `http://127.0.0.1:${viewer.addr.port}`;
      const paths = ["/", "/api/rows?file=0&from=0", "/api/record?file=0&i=0"];
      for (const path of paths) {
        const got = await curlAs(true, base + path);
        assert.equal(got.status, 403, `uid 65534 got ${got.status} for ${path}: ${got.body}`);
        assert.ok(!got.body.includes(SECRET));
        const wrong = await curlAs(true, `${base}${path}${path.includes("?") ? "&" : "?"}token=x`);
        assert.equal(wrong.status, 403);
      }
      // The url it gives carries the token; with it the record is read.
      const token = new URL(viewer.url).searchParams.get("token");
      assert.match(token ?? "", /^[0-9a-f]{64}$/);
      assert.equal(token, viewer.token);
      const page = await curlAs(false, viewer.url, ["-D", "-"]);
      assert.equal(page.status, 200);
      assert.match(page.body, /referrer-policy: no-referrer/i);
      const record = await curlAs(false, `${base}/api/record?file=0&i=0`, [
        "-H",
        `authorization: Bearer ${token}`,
      ]);
      assert.equal(record.status, 200);
      assert.ok(record.body.includes(SECRET));
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

test("cli.ts view prints its url with the token once", async () => {
  const { dir, file } = await privateResults();
  const stop = new AbortController();
  let printed = "";
  let announced: (url: string) => void;
  const url = new Promise<string>((resolve) => announced = resolve);
  const viewing = main(["view", file, "--port", "0"], {
    stdout: (text) => {
      printed += text;
      const m = /http:\/\/\S+/.exec(printed);
      if (m) announced(m[0]);
    },
    stderr: () => {},
    signal: stop.signal,
  });
  try {
    const shown = await url;
    assert.equal(printed.split("token=").length, 2, `printed: ${printed}`);
    const token = new URL(shown).searchParams.get("token") ?? "";
    assert.match(token, /^[0-9a-f]{64}$/);
    const res = await fetch(new URL(`api/record?file=0&i=0&token=${token}`, shown));
    assert.ok((await res.text()).includes(SECRET));
    const bare = await fetch(new URL("api/record?file=0&i=0", shown));
    await bare.body?.cancel();
    assert.equal(bare.status, 403);
  } finally {
    stop.abort();
    assert.equal(await viewing, 0);
    await Deno.remove(dir, { recursive: true });
  }
});
