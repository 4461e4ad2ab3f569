// hud gc's networks and volumes: what a Harbor compose task makes besides
// containers (harbor/_compose_run.ts labels them with its process), left by
// a run that was killed, removed by removeStaleNetworks() and
// removeStaleVolumes() (and `hud gc`); a live process's stay.

import { test } from "../_test.ts";
import { type Counterpart, ENGINE, PODMAN } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { OWNER_LABEL, removeStaleNetworks, removeStaleVolumes } from "../../engines/mod.ts";
import { EngineClient } from "../../engines/_engine.ts";

const PODMAN_SOCKET = Deno.env.get("HUD_TEST_PODMAN_SOCKET") || "/run/podman/podman.sock";
/** Above Linux's largest pid (2^22): no process has it, as a killed run's. */
const GONE = 4194305;

function suite(label: string, socket: string | undefined, needs: readonly Counterpart[]) {
  test({
    name:
      `removeStaleNetworks() and removeStaleVolumes() remove a killed run's, not a live one's (${label})`,
    needs,
  }, async () => {
    using engine = await EngineClient.open(socket);
    const tag = `hud-test-gc-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
    const made = { networks: [] as string[], volumes: [] as string[] };
    try {
      for (const [who, owner] of [["gone", GONE], ["live", Deno.pid]] as const) {
        const Labels = { [OWNER_LABEL]: String(owner), "dev.hud.harbor.project": tag };
        await engine.call("POST", "/networks/create", { Name: `${tag}-${who}`, Labels });
        made.networks.push(`${tag}-${who}`);
        await engine.call("POST", "/volumes/create", { Name: `${tag}-${who}`, Labels });
        made.volumes.push(`${tag}-${who}`);
      }
      const networks = await removeStaleNetworks({ socket });
      const volumes = await removeStaleVolumes({ socket });
      assert.ok(networks.includes(`${tag}-gone`), JSON.stringify(networks));
      assert.ok(volumes.includes(`${tag}-gone`), JSON.stringify(volumes));
      assert.ok(!networks.includes(`${tag}-live`) && !volumes.includes(`${tag}-live`));
      assert.deepEqual(await left(engine, tag), {
        networks: [`${tag}-live`],
        volumes: [`${tag}-live`],
      });
    } finally {
      for (const n of made.networks) {
        await engine.call("DELETE", `/networks/${n}`).catch(() => {});
      }
      for (const v of made.volumes) await engine.call("DELETE", `/volumes/${v}`).catch(() => {});
    }
    assert.deepEqual(await left(engine, tag), { networks: [], volumes: [] });
  });
}

/** The networks and volumes of the test's own `tag`, by name. */
async function left(engine: EngineClient, tag: string) {
  const filters = encodeURIComponent(JSON.stringify({ label: [`dev.hud.harbor.project=${tag}`] }));
  const networks = await engine.call("GET", `/networks?filters=${filters}`) as { Name: string }[];
  const volumes = await engine.call("GET", `/volumes?filters=${filters}`) as {
    Volumes?: { Name: string }[] | null;
  };
  return {
    networks: networks.map((n) => n.Name).sort(),
    volumes: (volumes.Volumes ?? []).map((v) => v.Name).sort(),
  };
}

suite("default engine", undefined, [ENGINE]);
suite("Podman", PODMAN_SOCKET, [PODMAN]);

test({
  name: "hud gc names the networks and volumes it removed",
  needs: [ENGINE],
}, async () => {
  using engine = await EngineClient.open();
  const name = `hud-test-gc-cli-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  const Labels = { [OWNER_LABEL]: String(GONE) };
  await engine.call("POST", "/networks/create", { Name: name, Labels });
  await engine.call("POST", "/volumes/create", { Name: name, Labels });
  try {
    const { main } = await import("../../cli.ts");
    let out = "";
    let err = "";
    const io = { stdout: (t: string) => out += t, stderr: (t: string) => err += t };
    assert.equal(await main(["gc"], io), 0);
    assert.ok(out.split("\n").includes(`network/${name}`), out);
    assert.ok(out.split("\n").includes(`volume/${name}`), out);
    assert.match(
      err,
      /gc: removed \d+ containers?, \d+ snapshot images?, \d+ networks? and \d+ volumes?/,
    );
  } finally {
    await engine.call("DELETE", `/networks/${name}`).catch(() => {});
    await engine.call("DELETE", `/volumes/${name}`).catch(() => {});
  }
});
