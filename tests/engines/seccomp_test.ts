// The seccomp profile's lists as data (container_test.ts checks what a
// container under it can do): no name in both lists or twice, bubblewrap's
// calls allowed, one architecture.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { ALLOWED_SYSCALLS, REFUSED_SYSCALLS, seccompProfile } from "../../engines/_seccomp.ts";

test("seccompProfile() allows bubblewrap's calls and none it refuses, each name once", () => {
  const profile = JSON.parse(seccompProfile()) as {
    defaultAction: string;
    architectures: string[];
    syscalls: { names: string[]; action: string }[];
  };
  assert.equal(profile.defaultAction, "SCMP_ACT_ERRNO");
  assert.equal(profile.architectures.length, 1);
  const allowed = profile.syscalls.flatMap((s) => s.action === "SCMP_ACT_ALLOW" ? s.names : []);
  assert.deepEqual(allowed, [...ALLOWED_SYSCALLS]);
  assert.equal(new Set(allowed).size, allowed.length, "a name is listed twice");
  const both = allowed.filter((name) => name in REFUSED_SYSCALLS);
  assert.deepEqual(both, []);
  for (const name of ["clone", "clone3", "unshare", "mount", "umount2", "pivot_root", "setns"]) {
    assert.ok(allowed.includes(name), name);
  }
  for (const name of ["keyctl", "bpf", "io_uring_setup", "init_module", "kexec_load"]) {
    assert.ok(!allowed.includes(name), name);
  }
});
