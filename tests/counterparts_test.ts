// What a test needs besides Deno (tests/_counterparts.ts, `needs` in
// tests/_test.ts): skipped where missing, saying which and how to install it,
// and counted in deno test's summary; failed where required (CI).

import { test, withCounterparts } from "./_test.ts";
import assert from "node:assert/strict";
import { counterpart, isRequired, requireVar } from "./_counterparts.ts";

const TEST = new URL("./_test.ts", import.meta.url).href;

/** Runs `deno test` on a file of tests that need a counterpart this machine lacks. */
async function runSuite(env: Record<string, string>): Promise<{ code: number; out: string }> {
  const dir = await Deno.makeTempDir({ prefix: "hud-counterparts-" });
  try {
    await Deno.writeTextFile(
      `${dir}/needs_test.ts`,
      `import { test } from ${JSON.stringify(TEST)};
import { counterpart } from ${JSON.stringify(new URL("./_counterparts.ts", import.meta.url).href)};
const WIDGET = counterpart("widget", "apt-get install widget", () => "widget not found");
const HERE = counterpart("here", "nothing to do", () => null);
test("uses the widget", { needs: [WIDGET] }, () => {
  throw new Error("ran without its widget");
});
test("uses what is here", { needs: [HERE] }, () => {});
test({ name: "a definition that uses the widget", needs: [WIDGET, HERE], fn() {} });
`,
    );
    const clean: Record<string, string> = { NO_COLOR: "1", HUD_REQUIRE_ALL: "", CI: "", ...env };
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["test", "-A", "--no-lock", "--no-check", `${dir}/needs_test.ts`],
      env: clean,
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(60_000),
    }).output();
    const text = (b: Uint8Array) => new TextDecoder().decode(b);
    return { code: out.code, out: text(out.stdout) + text(out.stderr) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

test("test({ needs }) skips a test whose counterpart is missing, saying which and how to get it", async () => {
  const { code, out } = await runSuite({});
  assert.equal(code, 0, out);
  assert.match(
    out,
    /^uses the widget \[skipped: needs widget \(widget not found; apt-get install widget\)\] \.\.\. ignored/m,
  );
  assert.match(
    out,
    /^a definition that uses the widget \[skipped: needs widget \(.*\)\] \.\.\. ignored/m,
  );
  assert.match(out, /^uses what is here \.\.\. ok/m);
  // The summary names how many were skipped.
  assert.match(out, /^ok \| 1 passed \| 0 failed \| 2 ignored/m);
});

test("test({ needs }) fails, naming the counterpart, where it is required", async () => {
  const envs: Record<string, string>[] = [
    { HUD_REQUIRE_ALL: "1" },
    { HUD_REQUIRE_WIDGET: "1" },
    { CI: "true" },
  ];
  for (const env of envs) {
    const { code, out } = await runSuite(env);
    assert.notEqual(code, 0, out);
    assert.match(
      out,
      /Missing counterpart, required here \(HUD_REQUIRE_ALL=1 or HUD_REQUIRE_WIDGET\): needs widget \(widget not found; apt-get install widget\)/,
    );
    assert.doesNotMatch(out, /ran without its widget/);
    assert.match(out, /^FAILED \| 1 passed \| 2 failed/m, JSON.stringify(env));
  }
});

test("withCounterparts() leaves a test alone when all it needs is here, or it is ignored anyway", () => {
  const fn = () => {};
  const here = counterpart("here", "-", () => null);
  const absent = counterpart("absent", "-", () => "gone");
  assert.deepEqual(withCounterparts({ name: "t", fn }, [here]), { name: "t", fn });
  assert.deepEqual(withCounterparts({ name: "t", fn, ignore: true }, [absent]), {
    name: "t",
    fn,
    ignore: true,
  });
});

test("counterpart() probes once, when first asked; requireVar() spells the variable", () => {
  let probes = 0;
  const c = counterpart("mount-namespace", "-", () => {
    probes++;
    return null;
  });
  assert.equal(probes, 0);
  assert.equal(c.missing, null);
  assert.equal(c.missing, null);
  assert.equal(probes, 1);
  assert.equal(requireVar("mount-namespace"), "HUD_REQUIRE_MOUNT_NAMESPACE");
  assert.equal(c.requireVar, "HUD_REQUIRE_MOUNT_NAMESPACE");
  assert.equal(typeof isRequired("mount-namespace"), "boolean");
});
