// `hud gc`: remove what killed runs left behind: containers, or with
// --kubernetes pods and their Secrets, or with --slurm jobs. The engines'
// code loads only for the one asked for.

import { EXIT_OK, type Io, parseCommand, PROGRAM, stringOption, UsageError } from "./_common.ts";

/** The help of `hud gc`. */
export const USAGE: string =
  `Usage: ${PROGRAM} gc [--older-than SECONDS] [--socket PATH | --kubernetes [--namespace NS] | --slurm]

Removes what the runtimes of runs that were killed left behind, and prints
its names: the containers ContainerRuntime started (by default), the pods
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
  const { values } = parsed;
  const olderText = stringOption(values, "older-than");
  const olderThan = olderText === undefined ? undefined : Number(olderText);
  if (olderThan !== undefined && (!Number.isFinite(olderThan) || olderThan < 0)) {
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
  const ms = olderThan === undefined ? undefined : olderThan * 1000;
  if (slurm) {
    if (ms !== undefined) {
      throw new UsageError(
        "--older-than does not apply to --slurm: only jobs of gone runs are cancelled",
      );
    }
    const { cancelStaleJobs } = await import("../engines/slurm.ts");
    const cancelled = await cancelStaleJobs();
    for (const id of cancelled) io.out(`${id}\n`);
    io.err(`gc: cancelled ${cancelled.length} job${cancelled.length === 1 ? "" : "s"}\n`);
    return EXIT_OK;
  }
  if (kubernetes) {
    const { removeStalePods } = await import("../engines/kubernetes.ts");
    const removed = await removeStalePods({ namespace, olderThan: ms });
    for (const name of removed) io.out(`${name}\n`);
    const pods = removed.filter((r) => r.startsWith("pod/")).length;
    const secrets = removed.length - pods;
    io.err(
      `gc: removed ${pods} pod${pods === 1 ? "" : "s"} and ${secrets} secret${
        secrets === 1 ? "" : "s"
      }\n`,
    );
    return EXIT_OK;
  }
  const { removeStaleContainers } = await import("../engines/gc.ts");
  const removed = await removeStaleContainers({ socket, olderThan: ms });
  for (const id of removed) io.out(`${id}\n`);
  io.err(`gc: removed ${removed.length} container${removed.length === 1 ? "" : "s"}\n`);
  return EXIT_OK;
}
