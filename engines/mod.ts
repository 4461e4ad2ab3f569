/**
 * Engine-backed runtimes: environments placed by a container engine
 * (Docker or Podman, through the Docker Engine API over its unix socket).
 * Each implements the runtime contract of `@hud/sdk/runtime`.
 *
 * - {@linkcode ContainerRuntime}: an environment image in a Docker or Podman
 *   container, one per placement; {@linkcode buildEnvironmentImage} makes
 *   the image, {@linkcode removeStaleContainers} cleans up after a killed run.
 * - {@linkcode SwarmRuntime}: a pool of replicas of an environment image on a
 *   Docker Swarm across hosts, each leased to one rollout at a time, scaled
 *   with demand.
 *
 * @module
 */

export { EngineError } from "./_engine.ts";
export {
  CONTAINER_PORT,
  ContainerRuntime,
  type ContainerRuntimeOptions,
  CONTROL_LABEL,
  ENV_LABEL,
  OWNER_LABEL,
} from "./container.ts";
export { buildEnvironmentImage, type BuildImageOptions } from "./image.ts";
export { removeStaleContainers, type RemoveStaleOptions } from "./gc.ts";
export { SwarmRuntime, type SwarmRuntimeOptions } from "./swarm.ts";
