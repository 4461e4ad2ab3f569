// The firewall guard (.ci/engine/guard.sh) is shared by the engines
// (engine_up.sh), the swarm (swarm_up.sh) and the clusters (k8s_up.sh,
// slurm_up.sh): each acquires it as a user and releases it, and the last
// user to go removes it, only if a user added it. These tests drive the
// script with a chain and a registry of their own (GUARD_CHAIN,
// GUARD_USERS), so that the machine's guard is never touched.

import { test } from "../_test.ts";
import { IPTABLES, LINUX, ROOT_USER } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { ENGINE_DIR } from "./_clusters.ts";

const GUARD = `${ENGINE_DIR}guard.sh`;
const CHAIN = `HUD-GT-${Deno.pid}`;

async function guard(users: string, ...args: string[]): Promise<{ code: number; text: string }> {
  const out = await new Deno.Command("bash", {
    args: [GUARD, ...args],
    env: { GUARD_CHAIN: CHAIN, GUARD_USERS: users },
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, text: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

async function ok(users: string, ...args: string[]): Promise<string> {
  const { code, text } = await guard(users, ...args);
  assert.equal(code, 0, `guard.sh ${args.join(" ")}: ${text}`);
  return text;
}

/** Whether the test's chain is in both tables, and FORWARD jumps to it. */
async function chainIn(): Promise<boolean> {
  const present: boolean[] = [];
  for (const table of ["filter", "mangle"]) {
    const out = await new Deno.Command("iptables", {
      args: ["-w", "-t", table, "-S", "FORWARD"],
      stdout: "piped",
      stderr: "null",
    }).output();
    present.push(new TextDecoder().decode(out.stdout).includes(`-j ${CHAIN}`));
  }
  assert.equal(present[0], present[1], "the chain is in one table only");
  return present[0];
}

test({
  name: "guard.sh: the last of its users removes the guard, only if a user added it",
  needs: [LINUX, ROOT_USER, IPTABLES],
  async fn(t) {
    const dir = await Deno.makeTempDir({ prefix: "hud-guard-" });
    const users = `${dir}/users`;
    const witness = async (name: string) => {
      await Deno.mkdir(`${dir}/${name}`);
      return `path ${dir}/${name}`;
    };
    try {
      await t.step("two users: the guard stays until both are gone", async () => {
        assert.equal(await chainIn(), false);
        await ok(users, "acquire", "swarm", await witness("swarm"));
        assert.equal(await chainIn(), true);
        await ok(users, "acquire", "br-k8s", await witness("k8s"));
        await ok(users, "release", "swarm");
        assert.equal(await chainIn(), true, "the first to go removed the guard");
        assert.equal((await ok(users, "users")).trim(), "br-k8s");
        await ok(users, "release", "br-k8s");
        assert.equal(await chainIn(), false);
        assert.equal(await Deno.stat(users).catch(() => null), null, "the registry stays");
      });

      await t.step("a guard that was there before its users stays after them", async () => {
        await ok(users, "add");
        await ok(users, "acquire", "engine", await witness("engine"));
        await ok(users, "release", "engine");
        assert.equal(await chainIn(), true);
        await ok(users, "del");
        assert.equal(await chainIn(), false);
      });

      await t.step("a user killed before its release no longer counts", async () => {
        await ok(users, "acquire", "br-slurm", await witness("slurm"));
        await ok(users, "acquire", "brswarm", await witness("swarm2"));
        await Deno.remove(`${dir}/slurm`); // its bridge (witness) went with it
        assert.equal((await ok(users, "users")).trim(), "brswarm");
        await ok(users, "release", "brswarm");
        assert.equal(await chainIn(), false);
      });

      await t.step("bad usage changes nothing", async () => {
        await ok(users, "add");
        for (
          const args of [["acquire", "x"], ["acquire", "a b", "path /"], ["release"], ["remove"]]
        ) {
          const { code, text } = await guard(users, ...args);
          assert.equal(code, 2, `guard.sh ${args.join(" ")}: ${text}`);
          assert.equal(text.trim().split("\n").length, 1, text);
        }
        assert.equal(await chainIn(), true, "a bad action removed the guard");
        await ok(users, "del");
      });
    } finally {
      await guard(users, "del");
      await Deno.remove(dir, { recursive: true });
    }
  },
});
