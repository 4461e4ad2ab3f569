// Where `hud eval` runs its rollouts: `--runtime local` (this process),
// `container:IMAGE`, `swarm:IMAGE`, `k8s:IMAGE` or `slurm[:PARTITION]`. The
// engines' code loads only when --runtime names one.

import type { Environment } from "../env.ts";
import { moduleUrl } from "../loader.ts";
import { LocalRuntime } from "../runtime/local.ts";
import type { RuntimeProvider } from "../runtime/placement.ts";
import { stringOption, UsageError, type Values } from "./_common.ts";

/** What `--runtime` and the `--container-*` flags ask for. */
export interface RuntimeChoice {
  readonly kind: "local" | "container" | "swarm" | "k8s" | "slurm";
  /** The image, or (slurm) the partition; `""` for none. */
  readonly where: string;
  /** With container: the bridge network instead of none. */
  readonly network: boolean;
  /** With container: variables for the environment in each container. */
  readonly env: Record<string, string>;
}

/**
 * Reads `--runtime` and the `--container-*` flags.
 * @throws {UsageError} for a spec it does not know, a malformed
 *   `--container-env`, or a container flag without `container:IMAGE`
 */
export function runtimeChoice(values: Values): RuntimeChoice {
  const spec = stringOption(values, "runtime") ?? "local";
  if (spec !== "local" && !/^(container|swarm|k8s):\S+$|^slurm(:\S+)?$/.test(spec)) {
    throw new UsageError(
      `--runtime must be "local", "container:IMAGE", "swarm:IMAGE", "k8s:IMAGE" or "slurm[:PARTITION]", got "${spec}"`,
    );
  }
  const kind = spec.split(":")[0] as RuntimeChoice["kind"];
  const env: Record<string, string> = {};
  for (const pair of (values["container-env"] ?? []) as string[]) {
    const m = pair.match(/^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/s);
    if (m === null) throw new UsageError(`--container-env takes NAME=VALUE, got "${pair}"`);
    env[m[1]] = m[2];
  }
  for (const flag of ["container-network", "container-env"]) {
    if (values[flag] !== undefined && kind !== "container") {
      throw new UsageError(`--${flag} needs --runtime container:IMAGE`);
    }
  }
  const where = spec.slice(kind.length + 1);
  return { kind, where, network: values["container-network"] === true, env };
}

/** What the runtime is made for. */
export interface RuntimeUse {
  /** The environment module (slurm's nodes load it themselves). */
  readonly file: string;
  readonly env: Environment;
  /** `--env`, as given. */
  readonly envName: string | undefined;
  /** Rollouts at once: a pool has a server per concurrent rollout, and one for the held placement. */
  readonly maxConcurrent: number;
  /** How long pods and jobs may live should this process die without removing them, in ms. */
  readonly lifetime: number;
}

/**
 * The runtime `choice` names; `pool` is set for those that hold servers
 * (close it at the end: none may outlive the run).
 */
export async function evalRuntime(
  choice: RuntimeChoice,
  use: RuntimeUse,
): Promise<{ runtime: RuntimeProvider; pool: { close(): Promise<void> } | null }> {
  const { where, kind } = choice;
  const replicas = use.maxConcurrent + 1;
  if (kind === "local") return { runtime: new LocalRuntime(use.env), pool: null };
  if (kind === "swarm") {
    const { SwarmRuntime } = await import("../engines/swarm.ts");
    return pool(new SwarmRuntime(where, { maxReplicas: replicas }));
  }
  if (kind === "k8s") {
    const { KubernetesRuntime } = await import("../engines/kubernetes.ts");
    return pool(
      new KubernetesRuntime(where, {
        pool: { minReplicas: 1, maxReplicas: replicas },
        activeDeadline: use.lifetime,
      }),
    );
  }
  if (kind === "slurm") {
    const { SlurmRuntime } = await import("../engines/slurm.ts");
    return pool(
      new SlurmRuntime({
        // The nodes load it themselves: an absolute file url (or the url given).
        module: moduleUrl(use.file).href,
        envName: use.envName,
        partition: where === "" ? undefined : where,
        tasks: replicas,
        announceHost: Deno.env.get("HUD_ANNOUNCE_HOST") || undefined,
        time: use.lifetime,
      }),
    );
  }
  const { ContainerRuntime } = await import("../engines/container.ts");
  // close() waits for the containers that rollouts cut short release in
  // the background: none may outlive the run.
  return pool(new ContainerRuntime(where, { network: choice.network, env: choice.env }));
}

function pool<T extends RuntimeProvider & { close(): Promise<void> }>(
  runtime: T,
): { runtime: T; pool: T } {
  return { runtime, pool: runtime };
}
