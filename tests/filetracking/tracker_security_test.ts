// A standalone file tracker's port has a credential (issue 23: "no
// capability listens without a credential"): the tracker reads the
// workspace as the server's user, so on its own port it serves only the
// users in `allowUsers`, by default its own uid, as the client's forwarders
// do. Before, any local user read a 0600 file's content through its `diff`.

import { test } from "../_test.ts";
import { LINUX, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { startFileTracker } from "../../filetracking/mod.ts";
import { NOBODY, runAs } from "../_uid.ts";

const SECRET = "s3cret-only-root-reads-this";

/** One `diff` over raw TCP, as `asNobody` or as us: the reply line, or "". */
async function diffAs(asNobody: boolean, port: number): Promise<string> {
  const request = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "diff" });
  const ran = await runAs(asNobody, [
    "bash",
    "-c",
    `exec 3<>/dev/tcp/127.0.0.1/${port} && printf '%s\\n' '${request}' >&3 && head -n 1 <&3`,
  ]);
  return ran.stdout;
}

test({
  name: "startFileTracker() on its port serves only allowUsers: another uid is refused",
  // Needs root to act as another user, and Linux's socket tables.
  needs: [LINUX, ROOT_USER],
  async fn(t) {
    const root = await Deno.makeTempDir();
    try {
      await t.step("by default: our own uid reads the diff, uid 65534 is closed", async () => {
        const errors: unknown[] = [];
        await using tracker = await startFileTracker(root, { onError: (e) => errors.push(e) });
        await Deno.writeTextFile(`${root}/key.txt`, `${SECRET}\n`, { mode: 0o600 });
        await Deno.chmod(`${root}/key.txt`, 0o600);
        const theirs = await diffAs(true, tracker.addr.port);
        assert.ok(!theirs.includes(SECRET), `uid ${NOBODY} read the 0600 file: ${theirs}`);
        assert.equal(theirs, "");
        assert.equal(errors.length, 1, errors.map(String).join("\n"));
        assert.match(
          String(errors[0]),
          new RegExp(
            `File tracker refused a connection from uid ${NOBODY}: it serves uid 0 \\(add others with allowUsers\\)`,
          ),
        );
        const ours = await diffAs(false, tracker.addr.port);
        assert.ok(ours.includes(SECRET), ours);
        assert.equal(errors.length, 1);
      });
      await t.step('allowUsers lets the listed uids in, and "any" everyone', async () => {
        for (const allowUsers of [[0, NOBODY], "any"] as const) {
          await using tracker = await startFileTracker(root, { allowUsers });
          await Deno.writeTextFile(`${root}/more.txt`, "more\n");
          assert.match(await diffAs(true, tracker.addr.port), /more\.txt/, String(allowUsers));
          await Deno.remove(`${root}/more.txt`);
        }
      });
      await t.step("a bad list is refused before anything listens", async () => {
        await assert.rejects(
          startFileTracker(root, { allowUsers: [-1] }),
          /TypeError: Cannot start file tracker: allowUsers must be "any" or a list of uids, got \[-1\]/,
        );
      });
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});
