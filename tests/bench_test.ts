// The benchmark program must keep running: `bench/run.ts --quick` runs every
// figure at small sizes. Nothing here looks at the figures' values beyond
// their being numbers; correctness counts (every rollout graded) are checked.

import { test } from "./_test.ts";
import { OPENSSH_CLIENT, SSHD } from "./_counterparts.ts";
import assert from "node:assert/strict";
import { killProcessGroup, liveGroupMembers } from "../_internal/process.ts";
import { waitingFor } from "./_deadline.ts";

const RUN = new URL("../bench/run.ts", import.meta.url).pathname;

interface Figure {
  figure: string;
  name: string;
  value: number;
  ratio: number;
  graded_ok?: number;
}

test("bench/run.ts --quick runs every figure to the end and leaves no process", async () => {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", RUN, "--quick"],
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    // A group of its own, so that whatever it started can be found and ended.
    detached: true,
  }).spawn();
  const output = child.output();
  let ran: Deno.CommandOutput;
  try {
    ran = await waitingFor("bench/run.ts --quick", output);
  } finally {
    await killProcessGroup(child.pid, 2_000, output);
  }
  const stdout = new TextDecoder().decode(ran.stdout);
  const stderr = new TextDecoder().decode(ran.stderr);
  assert.equal(ran.code, 0, `exit ${ran.code}; stderr: ${stderr.slice(-2000)}`);
  assert.deepEqual(liveGroupMembers(child.pid), [], "processes left in its group");

  const figures = stdout.split("\n").filter((l) => l.startsWith('{"figure"')).map((l) =>
    JSON.parse(l) as Figure
  );
  const ids = new Set(figures.map((f) => f.figure.split(" ")[0]));
  // Figure 8 compares with OpenSSH; without it (and where it is not required), it is skipped.
  const openssh = [SSHD, OPENSSH_CLIENT];
  const withSsh = openssh.every((c) => c.missing === null || c.required);
  assert.deepEqual([...ids], ["1", "2", "3", "4", "5", "6a", "6b", "7", ...(withSsh ? ["8"] : [])]);
  if (!withSsh) {
    assert.match(
      stdout,
      /\nfigure 8 skipped: OpenSSH's \S+ is not installed \(apt-get install openssh-\w+\)\n/,
    );
  }
  for (const f of figures) {
    assert.ok(Number.isFinite(f.value) && Number.isFinite(f.ratio), JSON.stringify(f));
  }
  // Every held session and every rollout was graded.
  for (const f of figures.filter((f) => f.figure.startsWith("3 "))) assert.equal(f.value, 100);
  for (const f of figures.filter((f) => f.figure.startsWith("6"))) {
    assert.equal(f.graded_ok, Number(/\((\d+) tasks/.exec(f.name)?.[1]), JSON.stringify(f));
  }
  assert.match(stdout, /\ntotal [\d.]+ s; load average at the end /);
});
