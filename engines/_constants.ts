// What the engines stamp on what they make, and how their images are
// started: the labels on containers, services, pods, secrets and images, the
// port an image serves on, the variable that names its control socket.
// Shared by every engine, so that a sibling needs none of container.ts's
// code to use them.

/** The port an environment image serves on inside its container. */
export const CONTAINER_PORT = 8765;
/** Label on every container, service, pod and secret the engines make (value: the creating process's pid). */
export const OWNER_LABEL = "dev.hud.owner";
/** Label on every environment image: the environment's name. */
export const ENV_LABEL = "dev.hud.env";
/** Label on every environment image: the environment's version. */
export const ENV_VERSION_LABEL = "dev.hud.env.version";
/**
 * Label on images whose server can be reached through a unix socket (value
 * `socket`): those `buildEnvironmentImage` makes.
 */
export const CONTROL_LABEL = "dev.hud.control";
/**
 * Label on every container `ContainerRuntime` starts: the directory on this
 * host that holds its control socket, for `removeStaleContainers` to remove
 * after a killed run.
 */
export const CONTROL_DIR_LABEL = "dev.hud.control.dir";
/** Label (annotation on pods) with the time a container, service or pod was made. */
export const CREATED_LABEL = "dev.hud.created";
/** Label on every swarm service: the pool it belongs to. */
export const POOL_LABEL = "dev.hud.pool";
/** Label on every pod and secret: the runner's host name. */
export const HOST_LABEL = "dev.hud.host";
/** Label on every pod and secret: the runtime that made it. */
export const RUNTIME_LABEL = "dev.hud.runtime";

/**
 * The variable that tells an image's program where the control socket is
 * (`ContainerRuntime` sets it; `_container_main.ts` relays it).
 */
export const CONTROL_SOCKET_VAR = "HUD_CONTROL_SOCKET";
/**
 * Label on every snapshot image `ContainerRuntime.snapshot()` commits: the
 * snapshot's id (with the owner label: the committing process's pid), for
 * `removeStaleSnapshots` to remove after a killed run.
 */
export const SNAPSHOT_LABEL = "dev.hud.snapshot";
/** The repository snapshot images are tagged in (`hud-snapshot:snap-...`). */
export const SNAPSHOT_REPO = "hud-snapshot";
