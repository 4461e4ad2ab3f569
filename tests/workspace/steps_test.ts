// The workspace's steps, each on its own and in-process: options resolved
// once into a config record, a grading command's arguments checked before
// it runs, and the gate that stops the agent's processes while grading.

import { test } from "../_test.ts";
import { LINUX } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { workspaceConfig } from "../../workspace/_config.ts";
import { gradeCommand } from "../../workspace/_grade.ts";
import { AgentGate } from "../../workspace/_gate.ts";
import type { WorkspaceExecOptions } from "../../workspace/workspace.ts";

test("workspaceConfig() applies every default once, with the root made absolute", () => {
  const config = workspaceConfig("some/dir", {});
  const { onError, ...rest } = config;
  assert.deepEqual(rest, {
    name: "shell",
    root: `${Deno.cwd()}/some/dir`,
    user: "agent",
    env: {},
    isolation: "auto",
    keepCapabilities: false,
    protect: [],
    lifetime: "session",
    network: false,
    netPolicy: { mode: "none", allow: [], deny: [], nameServer: null },
    uid: undefined,
    gid: undefined,
    uidRange: [59000, 59999],
    limits: undefined,
    mounts: [],
    hostname: "127.0.0.1",
    port: 0,
    writeKeyFile: true,
    trackFiles: true,
    snapshots: null,
    from: null,
  });
  assert.equal(typeof onError, "function");
  assert.deepEqual(workspaceConfig("/r", { snapshots: true }).snapshots, {
    method: "auto",
    maxCount: 32,
    maxBytes: 8 * 1024 ** 3,
  });
  const given = workspaceConfig("/srv", { name: "sh", isolation: "none", uid: 0, port: 2222 });
  assert.deepEqual([given.name, given.root, given.isolation, given.uid, given.port], [
    "sh",
    "/srv",
    "none",
    0,
    2222,
  ]);
});

test("workspaceConfig() refuses what addWorkspace() refuses, naming it", () => {
  const cases: [string, Parameters<typeof workspaceConfig>[1], ErrorConstructor, RegExp][] = [
    ["", {}, TypeError, /root must be a non-empty string/],
    ["/r", { isolation: "vm" as "none" }, RangeError, /unknown isolation "vm"/],
    ["/r", { uid: -1 }, RangeError, /invalid uid "-1"/],
    ["/r", { gid: 1.5 }, RangeError, /invalid gid "1.5"/],
    ["/r", { uidRange: [10, 5] }, RangeError, /invalid uidRange "10,5"/],
    ["/r", { snapshots: { maxCount: 0 } }, RangeError, /invalid snapshots.maxCount "0"/],
    ["/r", { snapshots: { maxBytes: 1.5 } }, RangeError, /invalid snapshots.maxBytes "1.5"/],
    [
      "/r",
      { snapshots: { method: "reflink" as "copy" } },
      RangeError,
      /unknown snapshots.method "reflink"/,
    ],
    ["/r", { limits: { memory: 0 } }, RangeError, /invalid limits\.memory "0"/],
    ["/r", { mounts: ["opt"] }, TypeError, /mounts must be absolute paths, got "opt"/],
  ];
  for (const [root, options, type, message] of cases) {
    assert.throws(() => workspaceConfig(root, options), (err: unknown) => {
      assert.ok(err instanceof type, `${err}`);
      assert.match((err as Error).message, /^Cannot add workspace: /);
      assert.match((err as Error).message, message);
      return true;
    });
  }
});

test("gradeCommand() checks a grading command before it runs, with its defaults", () => {
  const command = gradeCommand("shell", "/srv/ws", ["make", "test"], {
    cwd: "/srv/ws/./sub/../sub",
    files: { "tests/t.py": "x" },
  });
  assert.equal(command.cwd, "/srv/ws/sub");
  assert.equal(command.timeout, 600_000);
  assert.equal(command.maxOutput, 1024 * 1024);
  assert.deepEqual(command.files, [["tests/t.py", "x"]]);
  const refused: [WorkspaceExecOptions, ErrorConstructor, RegExp][] = [
    [{ cwd: "/srv/ws/../other" }, RangeError, /cwd "\/srv\/ws\/\.\.\/other" is outside the root/],
    [{ timeout: -1 }, RangeError, /invalid timeout "-1"/],
    [{ files: { "/abs": "x" } }, TypeError, /invalid file "\/abs"/],
    [{ files: { "a/../b": "x" } }, TypeError, /invalid file "a\/\.\.\/b"/],
    [{ timeoutMs: 5 } as WorkspaceExecOptions, TypeError, /option "timeoutMs" is now "timeout"/],
  ];
  for (const [options, type, message] of refused) {
    assert.throws(() => gradeCommand("shell", "/srv/ws", ["true"], options), (err: unknown) => {
      assert.ok(err instanceof type, `${err}`);
      assert.match((err as Error).message, /^Cannot run in workspace "shell": /);
      assert.match((err as Error).message, message);
      return true;
    });
  }
  assert.throws(() => gradeCommand("shell", "/srv/ws", [], {}), TypeError);
});

/** The state letter of `pid` in /proc (`S` sleeping, `T` stopped...). */
function state(pid: number): string {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
}

test({
  name: "AgentGate stops the agent's processes while a phase holds it, until the last ends",
  needs: [LINUX],
}, async () => {
  const gate = new AgentGate();
  const child = new Deno.Command("sleep", { args: ["60"], stdin: "null", detached: true })
    .spawn();
  gate.track(child);
  try {
    assert.equal(gate.held, false);
    await gate.hold();
    await gate.hold(); // a second phase, nested
    assert.equal(gate.held, true);
    assert.match(state(child.pid), /^[Tt]$/);
    let opened = false;
    gate.opened.then(() => opened = true);
    gate.release();
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(opened, false, "one phase still holds the agent");
    assert.match(state(child.pid), /^[Tt]$/);
    gate.release();
    await gate.opened;
    assert.equal(gate.held, false);
    assert.doesNotMatch(state(child.pid), /^[Tt]$/);
  } finally {
    await gate.killAll([]);
  }
  assert.equal((await child.status).signal, "SIGKILL");
});
