import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { Capability, Environment } from "../../mod.ts";
import { tunnelTarget } from "../../_server/tunnel.ts";

test("tunnelTarget() reaches only published capabilities", () => {
  const env = new Environment("tunnels", {
    capabilities: [
      new Capability({ name: "echo", protocol: "tcp/1", url: "tcp://127.0.0.1:4000" }),
      new Capability({ name: "portless", protocol: "x/1", url: "x://nowhere" }),
    ],
  });
  const handler = { attach: () => Promise.resolve() };
  env.addCapability(
    new Capability({ name: "inproc", protocol: "x/1", url: "tcp://127.0.0.1:0" }),
    handler,
  );
  const open = (params: unknown) => tunnelTarget(env, { id: 1, method: "tunnel.open", params });
  assert.deepEqual(open({ capability: "echo" }), {
    name: "echo",
    hostname: "127.0.0.1",
    port: 4000,
  });
  assert.deepEqual(open({ capability: "inproc" }), { name: "inproc", handler });
  const refusal = (code: number, message: string) => ({
    error: { jsonrpc: "2.0", id: 1, error: { code, message } },
  });
  assert.deepEqual(open({ capability: "nope" }), refusal(-32000, "unknown capability: nope"));
  assert.deepEqual(open({ capability: 7 }), refusal(-32602, "capability must be a string"));
  assert.deepEqual(open([1]), refusal(-32602, "capability must be a string"));
  assert.deepEqual(
    open({ capability: "portless" }),
    refusal(-32602, "capability portless has no host:port in its url"),
  );
  assert.deepEqual(
    open({ capability: "127.0.0.1:22" }),
    refusal(-32000, "unknown capability: 127.0.0.1:22"),
    "never an address the client picks",
  );
});
