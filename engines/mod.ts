/**
 * Engine-backed runtimes: environments placed by a container engine
 * (Docker or Podman, through the Docker Engine API over its unix socket),
 * a Docker Swarm, Kubernetes or Slurm. Each implements the runtime
 * contract of `@hud/sdk/runtime`.
 *
 * - {@linkcode ContainerRuntime}: an environment image in a Docker or Podman
 *   container, one per placement; {@linkcode buildEnvironmentImage} makes
 *   the image, {@linkcode removeStaleContainers},
 *   {@linkcode removeStaleSnapshots}, {@linkcode removeStaleNetworks} and
 *   {@linkcode removeStaleVolumes} clean up after a killed run. Its
 *   `snapshot()` commits a placed container into an image that `placeFrom()`
 *   (a rollout's or a job's `from`) starts new containers of.
 * - {@linkcode SwarmRuntime}: a pool of replicas of an environment image on a
 *   Docker Swarm across hosts, each leased to one rollout at a time, scaled
 *   with demand.
 * - {@linkcode KubernetesRuntime}: an environment image in a bare Pod per
 *   placement, or a pool of pods leased to rollouts, through the API server
 *   (no kubectl); {@linkcode removeStalePods} cleans up after a killed run.
 * - {@linkcode SlurmRuntime}: a TypeScript environment module served by the
 *   tasks of a Slurm allocation (Deno on the nodes, no image), leased to
 *   rollouts; {@linkcode cancelStaleJobs} cleans up after a killed run.
 *
 * @module
 */

export { EngineError } from "./_engine.ts";
export { CONTAINER_PORT, CONTROL_LABEL, ENV_LABEL, OWNER_LABEL } from "./_constants.ts";
export { HOST_LABEL, RUNTIME_LABEL } from "./_constants.ts";
export {
  ContainerRuntime,
  type ContainerRuntimeOptions,
  type ContainerSnapshot,
  type ContainerSnapshotOptions,
} from "./container.ts";
export type {
  ContainerNetwork,
  ContainerNetworkPhases,
  ContainerPhaseNetwork,
  ContainerVolume,
} from "./_container_network.ts";
export type { PublicNetwork } from "./_network_support.ts";
export { buildEnvironmentImage, type BuildImageOptions } from "./image.ts";
export {
  removeStaleContainers,
  removeStaleNetworks,
  type RemoveStaleOptions,
  removeStaleSnapshots,
  removeStaleVolumes,
} from "./gc.ts";
export { SwarmRuntime, type SwarmRuntimeOptions } from "./swarm.ts";
export {
  KubeApiError,
  type KubernetesOwner,
  type KubernetesPoolOptions,
  KubernetesRuntime,
  type KubernetesRuntimeOptions,
  removeStalePods,
  type RemoveStalePodsOptions,
} from "./kubernetes.ts";
export {
  cancelStaleJobs,
  type CancelStaleJobsOptions,
  OWNER_COMMENT,
  SlurmError,
  SlurmRuntime,
  type SlurmRuntimeOptions,
} from "./slurm.ts";
