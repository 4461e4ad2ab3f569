// `hud gc`: remove what killed runs left behind: containers, snapshot
// images, compose tasks' networks and volumes, or with --kubernetes pods
// and their Secrets, or with --slurm jobs. The engines' code loads only for
// the one asked for.

import {
  EXIT_OK,
  type Io,
  parseCommand,
  PROGRAM,
  stringOption,
  UsageError,
  type Values,
} from "./_common.ts";

/** The help of `hud gc`. */
export const USAGE: string =
  `Usage: ${PROGRAM} gc [--older-than SECONDS] [--socket PATH | --kubernetes [--namespace NS] | --slurm]

Removes what the runtimes of runs that were killed left behind, and prints
its names: the containers ContainerRuntime started, the snapshot
images it committed and the networks and volumes of Harbor compose tasks
(by default), the pods
and Secrets of KubernetesRuntime (--kubernetes, on the cluster KUBECONFIG
names, or the one this runs in), or the jobs of SlurmRuntime (--slurm,
through slurmrestd when SLURMRESTD is set, else scancel). Only what a
process of this machine made that is gone goes, and with --older-than also
what live runs made that long ago (not with --slurm).

Options:
  --older-than SECONDS  also remove what live runs made this long ago
  --socket PATH         the container engine's socket
  --kubernetes          pods and Secrets instead of containers
  --namespace NS        with --kubernetes: the namespace (default: the
                        kubeconfig context's)
  --slurm               Slurm jobs instead of containers
  -h, --help            show this help
`;

/** What to remove: containers (through `socket`), pods and Secrets, or Slurm jobs. */
type GcTarget =
  | { kind: "containers"; socket: string | undefined; olderThan: number | undefined }
  | { kind: "kubernetes"; namespace: string | undefined; olderThan: number | undefined }
  | { kind: "slurm" };

/**
 * The target the flags name, with `--older-than` in ms.
 * @throws {UsageError} for flags that do not go together
 */
function gcTarget(values: Values): GcTarget {
  const olderText = stringOption(values, "older-than");
  const olderSeconds = olderText === undefined ? undefined : Number(olderText);
  if (olderSeconds !== undefined && (!Number.isFinite(olderSeconds) || olderSeconds < 0)) {
    throw new UsageError(`--older-than must be a number of seconds, got "${olderText}"`);
  }
  const socket = stringOption(values, "socket");
  const namespace = stringOption(values, "namespace");
  const kubernetes = values.kubernetes === true;
  const slurm = values.slurm === true;
  if (kubernetes && slurm) throw new UsageError("give --kubernetes or --slurm, not both");
  if (socket !== undefined && (kubernetes || slurm)) {
    throw new UsageError(
      `--socket is for containers: leave it out with --${kubernetes ? "kubernetes" : "slurm"}`,
    );
  }
  if (namespace !== undefined && !kubernetes) {
    throw new UsageError("--namespace needs --kubernetes");
  }
  const olderThan = olderSeconds === undefined ? undefined : olderSeconds * 1000;
  if (slurm && olderThan !== undefined) {
    throw new UsageError(
      "--older-than does not apply to --slurm: only jobs of gone runs are cancelled",
    );
  }
  if (slurm) return { kind: "slurm" };
  if (kubernetes) return { kind: "kubernetes", namespace, olderThan };
  return { kind: "containers", socket, olderThan };
}

/** `n thing` or `n things`. */
function count(n: number, thing: string): string {
  return `${n} ${thing}${n === 1 ? "" : "s"}`;
}

/** Removes what `target` names; prints each name on stdout and the count on stderr. */
async function collect(target: GcTarget, io: Io): Promise<void> {
  if (target.kind === "slurm") {
    const { cancelStaleJobs } = await import("../engines/slurm.ts");
    const cancelled = await cancelStaleJobs();
    for (const id of cancelled) io.out(`${id}\n`);
    io.err(`gc: cancelled ${count(cancelled.length, "job")}\n`);
  } else if (target.kind === "kubernetes") {
    const { removeStalePods } = await import("../engines/kubernetes.ts");
    const { namespace, olderThan } = target;
    const removed = await removeStalePods({ namespace, olderThan });
    for (const name of removed) io.out(`${name}\n`);
    const pods = removed.filter((r) => r.startsWith("pod/")).length;
    io.err(`gc: removed ${count(pods, "pod")} and ${count(removed.length - pods, "secret")}\n`);
  } else {
    const gc = await import("../engines/gc.ts");
    const options = { socket: target.socket, olderThan: target.olderThan };
    // Containers first: what they stand on or use goes after them.
    const removed = await gc.removeStaleContainers(options);
    const images = await gc.removeStaleSnapshots(options);
    const networks = await gc.removeStaleNetworks(options);
    const volumes = await gc.removeStaleVolumes(options);
    for (const id of [...removed, ...images]) io.out(`${id}\n`);
    for (const name of networks) io.out(`network/${name}\n`);
    for (const name of volumes) io.out(`volume/${name}\n`);
    io.err(
      `gc: removed ${count(removed.length, "container")}, ${
        count(images.length, "snapshot image")
      }, ${count(networks.length, "network")} and ${count(volumes.length, "volume")}\n`,
    );
  }
}

/** Runs `hud gc` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "gc",
    usage: USAGE,
    options: {
      "older-than": { type: "string" },
      socket: { type: "string" },
      kubernetes: { type: "boolean" },
      namespace: { type: "string" },
      slurm: { type: "boolean" },
    },
    positionals: { names: [], min: 0 },
  }, io);
  if (parsed === null) return EXIT_OK;
  await collect(gcTarget(parsed.values), io);
  return EXIT_OK;
}
