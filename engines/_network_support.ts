/**
 * The `network` option of the runtimes that cannot change a placement's
 * network (Kubernetes, Swarm, Slurm): they take only what they give,
 * `"public"`, and refuse in one line anything they would silently not
 * enforce (`"none"`, an allowlist, a network by phase).
 *
 * @module
 */

/** What every such runtime's `network` accepts: the network it gives. */
export type PublicNetwork = true | "public";

/**
 * Throws unless `network` is what `runtime` gives (`gives` says what that
 * is, in the message).
 * @throws {TypeError} naming the runtime, the value and what it supports
 */
export function checkPublicNetwork(runtime: string, network: unknown, gives: string): void {
  if (network === undefined || network === true || network === "public") return;
  const shown = typeof network === "object" && network !== null
    ? ("allow" in network ? "an allowlist" : "a network by phase")
    : JSON.stringify(network);
  throw new TypeError(
    `Cannot create ${runtime}: network ${shown} is not enforced by it (${gives}); it supports "public" only: use ContainerRuntime for "none", an allowlist or a network by phase`,
  );
}
