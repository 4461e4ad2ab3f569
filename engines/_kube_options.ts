// KubernetesRuntime's options, and the one function that checks them and
// resolves every default into the record the runtime runs on (as `bind()`
// does for the server with `ServerConfig`).

import type { PoolLimits } from "./_pool.ts";
import { CONTAINER_PORT } from "./_constants.ts";
import type { PublicNetwork } from "./_network_support.ts";

/** A pool of pods leased to rollouts, instead of a pod per placement. */
export interface KubernetesPoolOptions {
  /**
   * Fewest pods kept running.
   * @default 1
   */
  minReplicas?: number;
  /**
   * Most pods demand may scale the pool to.
   * @default max(minReplicas, replicas, 8)
   */
  maxReplicas?: number;
  /**
   * Pods started at once.
   * @default minReplicas
   */
  replicas?: number;
  /**
   * Rollouts one pod serves at a time.
   * @default 1
   */
  width?: number;
  /**
   * How long the pool stays idle before it scales down to `minReplicas`, in ms.
   * @default 10_000
   */
  scaleDownAfter?: number;
}

/** An object that owns the runtime's pods (deleting it deletes them). */
export interface KubernetesOwner {
  /**
   * The owner's API version.
   * @default "v1"
   */
  apiVersion?: string;
  /**
   * The owner's kind.
   * @default "Pod"
   */
  kind?: string;
  /** The owner's name, in the runtime's namespace. */
  name: string;
  /** The owner's uid. */
  uid: string;
}

/** Options for {@linkcode KubernetesRuntime}. */
export interface KubernetesRuntimeOptions {
  /**
   * A kubeconfig file.
   * @default `KUBECONFIG`, else the pod's service account in a cluster, else ~/.kube/config
   */
  kubeconfig?: string;
  /**
   * The kubeconfig's context.
   * @default its current-context
   */
  context?: string;
  /**
   * The namespace of the pods.
   * @default the context's (or the pod's own), else "default"
   */
  namespace?: string;
  /** Lease the pods of a pool to rollouts; without it, one pod per placement. */
  pool?: KubernetesPoolOptions;
  /**
   * Variables for the environment's process (the token is added, from a Secret).
   * @default {}
   */
  env?: Record<string, string>;
  /** CPUs per pod (request and limit), `1.5`. */
  cpus?: number;
  /** Memory per pod (request and limit), in bytes. */
  memory?: number;
  /**
   * Extra labels on the pods.
   * @default {}
   */
  labels?: Record<string, string>;
  /** The pods' nodeSelector. */
  nodeSelector?: Record<string, string>;
  /**
   * Spread the pods over nodes: a soft `topologySpreadConstraint` on
   * `kubernetes.io/hostname` (maxSkew 1, ScheduleAnyway) over this runtime's
   * pods, so that losing a node loses few of them. `false` leaves placement
   * to the scheduler alone.
   * @default true
   */
  spread?: boolean;
  /** The pods' tolerations, as the API spells them. */
  tolerations?: Record<string, unknown>[];
  /** The pods' imagePullPolicy; Kubernetes' default when unset (Always for :latest). */
  imagePullPolicy?: "Always" | "IfNotPresent" | "Never";
  /** Secrets with registry credentials. */
  imagePullSecrets?: string[];
  /** The container's command, instead of the image's. */
  command?: string[];
  /**
   * The port the image serves on.
   * @default 8765
   */
  port?: number;
  /**
   * How `place()` reaches a pod: by its IP when this process can route to it
   * ("auto" tries once), else through the API server's port-forward.
   * @default "auto"
   */
  reach?: "auto" | "pod-ip" | "port-forward";
  /**
   * How long a pod may take to answer `hello`, from its creation, in ms.
   * @default 120_000
   */
  readyTimeout?: number;
  /**
   * How long a pod may wait unschedulable before placing fails, in ms (it
   * holds no create slot meanwhile).
   * @default 30_000
   */
  unschedulableTimeout?: number;
  /**
   * How long a pod may live, in ms: its activeDeadlineSeconds, the dead-man's
   * switch if this process dies. Set it to the rollout timeout plus grace.
   * @default 3_600_000
   */
  activeDeadline?: number;
  /**
   * Pods being created (not yet ready or unschedulable) at once.
   * @default 8
   */
  maxCreating?: number;
  /**
   * Pod creations per second.
   * @default 10
   */
  createRate?: number;
  /**
   * Pod deletions per second.
   * @default 20
   */
  deleteRate?: number;
  /**
   * How often the runtime lists its pods, in ms.
   * @default 500
   */
  pollInterval?: number;
  /**
   * The object whose deletion deletes the pods; `false` for none.
   * @default the pod this process runs in, when in the cluster and its namespace
   */
  owner?: KubernetesOwner | false;
  /**
   * How long `close()` waits for the pods to go, in ms; those still there
   * are then deleted at once (`gracePeriodSeconds=0`: gone from the API, their
   * kubelets stop them when they catch up).
   * @default 30_000
   */
  closeTimeout?: number;
  /**
   * The network its placements have: only `"public"` (the cluster's pod network: a NetworkPolicy holds only where the cluster's CNI enforces it). Anything
   * else (`"none"`, an allowlist, a network by phase) is refused, never
   * silently run public: ContainerRuntime enforces those.
   * @default "public"
   */
  network?: PublicNetwork;
}

/**
 * {@linkcode KubernetesRuntimeOptions}, checked, with every default
 * resolved: what {@linkcode KubernetesRuntime} runs on.
 */
export interface KubernetesConfig extends PoolLimits {
  image: string;
  kubeconfig: string | undefined;
  context: string | undefined;
  /** `undefined`: the context's (or the pod's own). */
  namespace: string | undefined;
  /** Whether pods are pooled (else one per placement). */
  pooled: boolean;
  /** Pods the pool starts with (0 without a pool). */
  replicas: number;
  env: Record<string, string>;
  cpus: number | undefined;
  memory: number | undefined;
  labels: Record<string, string>;
  nodeSelector: Record<string, string> | undefined;
  spread: boolean;
  tolerations: Record<string, unknown>[] | undefined;
  imagePullPolicy: KubernetesRuntimeOptions["imagePullPolicy"];
  imagePullSecrets: string[] | undefined;
  command: string[] | undefined;
  port: number;
  reach: "auto" | "pod-ip" | "port-forward";
  readyTimeout: number;
  unschedulableTimeout: number;
  activeDeadline: number;
  maxCreating: number;
  createRate: number;
  deleteRate: number;
  pollInterval: number;
  /** `undefined`: the pod this process runs in, when in the cluster and its namespace. */
  owner: KubernetesOwner | false | undefined;
  closeTimeout: number;
}

function checkPositive(what: string, value: number | undefined, integer = true): void {
  if (value === undefined) return;
  if (typeof value !== "number" || !(value > 0) || (integer && !Number.isInteger(value))) {
    throw new RangeError(
      `Cannot create KubernetesRuntime: ${what} must be a positive ${
        integer ? "integer" : "number"
      }, got "${value}"`,
    );
  }
}

/** Checks counts, rates, times and choices. */
function checkOptions(options: KubernetesRuntimeOptions): void {
  checkPositive("minReplicas", options.pool?.minReplicas);
  checkPositive("width", options.pool?.width);
  checkPositive("maxCreating", options.maxCreating);
  checkPositive("port", options.port);
  for (const k of ["createRate", "deleteRate", "cpus", "memory"] as const) {
    checkPositive(k, options[k], false);
  }
  for (const k of ["readyTimeout", "activeDeadline", "pollInterval", "closeTimeout"] as const) {
    checkPositive(k, options[k], false);
  }
  if (options.unschedulableTimeout !== undefined && !(options.unschedulableTimeout >= 0)) {
    throw new RangeError(
      `Cannot create KubernetesRuntime: unschedulableTimeout must be >= 0, got "${options.unschedulableTimeout}"`,
    );
  }
  if (
    options.reach !== undefined && !["auto", "pod-ip", "port-forward"].includes(options.reach)
  ) {
    throw new TypeError(
      `Cannot create KubernetesRuntime: reach must be "auto", "pod-ip" or "port-forward", got "${options.reach}"`,
    );
  }
  if (options.spread !== undefined && typeof options.spread !== "boolean") {
    throw new TypeError(
      `Cannot create KubernetesRuntime: spread must be true or false, got "${options.spread}"`,
    );
  }
}

/** The pool's sizes, checked: `min <= replicas <= max`. */
function poolSizes(pool: KubernetesPoolOptions | undefined): PoolLimits & { replicas: number } {
  const min = pool?.minReplicas ?? 1;
  const replicas = pool?.replicas ?? min;
  const max = pool?.maxReplicas ?? Math.max(min, replicas, 8);
  if (
    !Number.isInteger(max) || max < min || !Number.isInteger(replicas) || replicas < min ||
    replicas > max
  ) {
    throw new RangeError(
      `Cannot create KubernetesRuntime: need minReplicas <= replicas <= maxReplicas, got "${min}", "${replicas}", "${max}"`,
    );
  }
  return {
    min,
    max,
    replicas,
    width: pool?.width ?? 1,
    scaleDownAfter: pool?.scaleDownAfter ?? 10_000,
  };
}

/**
 * The record a {@linkcode KubernetesRuntime} runs on: the options checked,
 * every default here.
 * @throws {TypeError} for an empty image name, an unknown `reach`, a `spread` not boolean
 * @throws {RangeError} for counts, rates or times out of range
 */
export function resolveKubernetesOptions(
  image: string,
  options: KubernetesRuntimeOptions,
): KubernetesConfig {
  if (typeof image !== "string" || image === "") {
    throw new TypeError("Cannot create KubernetesRuntime: image must be a non-empty string");
  }
  checkOptions(options);
  const sizes = poolSizes(options.pool);
  const o = options;
  return {
    ...sizes,
    image,
    kubeconfig: o.kubeconfig,
    context: o.context,
    namespace: o.namespace,
    pooled: o.pool !== undefined,
    replicas: o.pool !== undefined ? sizes.replicas : 0,
    env: { ...o.env },
    cpus: o.cpus,
    memory: o.memory,
    labels: { ...o.labels },
    nodeSelector: o.nodeSelector,
    spread: o.spread ?? true,
    tolerations: o.tolerations,
    imagePullPolicy: o.imagePullPolicy,
    imagePullSecrets: o.imagePullSecrets,
    command: o.command,
    port: o.port ?? CONTAINER_PORT,
    reach: o.reach ?? "auto",
    readyTimeout: o.readyTimeout ?? 120_000,
    unschedulableTimeout: o.unschedulableTimeout ?? 30_000,
    activeDeadline: o.activeDeadline ?? 3_600_000,
    maxCreating: o.maxCreating ?? 8,
    createRate: o.createRate ?? 10,
    deleteRate: o.deleteRate ?? 20,
    pollInterval: o.pollInterval ?? 500,
    owner: o.owner,
    closeTimeout: o.closeTimeout ?? 30_000,
  };
}
