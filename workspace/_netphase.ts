// A command of the environment's own (a setup step, a grading command) run
// under a network policy of its own instead of the workspace's: the agent's
// sandbox with that policy's network, and for an allowlist an egress proxy
// started for the command and stopped after it.

import type { SandboxConfig } from "./_sandbox.ts";
import type { ParsedPolicy } from "./_netpolicy.ts";
import { startEgressProxy } from "./_egress.ts";
import { PROXY_ENV } from "./_egress_relay.ts";
import { denoBinary } from "./_sftp.ts";

/** A sandbox and variables under another policy; `close()` stops its proxy. */
export interface PhaseNetwork extends AsyncDisposable {
  readonly sandbox: SandboxConfig;
  readonly env: Record<string, string>;
}

/**
 * `sandbox` and `env` with `policy`'s network in place of the workspace's.
 * @throws {Error} for an allowlist where no sandbox runs commands, or without a deno binary
 */
export async function phaseNetwork(
  sandbox: SandboxConfig,
  env: Readonly<Record<string, string>>,
  policy: ParsedPolicy,
): Promise<PhaseNetwork> {
  const rest = Object.fromEntries(Object.entries(env).filter(([k]) => !(k in PROXY_ENV)));
  const base = { ...sandbox, egress: undefined, network: policy.mode === "public" };
  if (policy.mode !== "allowlist") {
    return { sandbox: base, env: rest, [Symbol.asyncDispose]: () => Promise.resolve() };
  }
  if (sandbox.isolation === "none") {
    throw new Error(
      'Cannot run in workspace: a network allowlist needs a sandbox (this workspace runs with isolation "none")',
    );
  }
  const deno = denoBinary();
  if (deno === null) {
    throw new Error("Cannot run in workspace: a network allowlist needs a deno binary on PATH");
  }
  const proxy = await startEgressProxy(policy);
  return {
    sandbox: { ...base, egress: { dir: proxy.dir, deno } },
    env: { ...rest, ...PROXY_ENV },
    [Symbol.asyncDispose]: () => proxy.close(),
  };
}
