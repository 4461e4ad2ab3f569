// What KubernetesRuntime asks the API for: its Secret, its pods' spec and
// labels, and the nodes a pool's new pods keep off for a while. Pure
// functions of the runtime's config and state, tested without a cluster.

import type { KubernetesConfig, KubernetesOwner } from "./_kube_options.ts";
import { SERVE_TOKEN_VAR } from "../_internal/auth.ts";
import { CREATED_LABEL, HOST_LABEL, OWNER_LABEL, RUNTIME_LABEL } from "./_constants.ts";

/**
 * How long a pool's new pods keep off a node where one of its pods could not
 * start (pull error, no answer, a lost node), in ms: the scheduler would
 * otherwise keep choosing that node, the one with the fewest of them.
 */
export const AVOID_NODE_MS = 60_000;

/** A label value: at most 63 characters of [A-Za-z0-9._-], alphanumeric at both ends. */
function labelValue(s: string): string {
  return s.replace(/[^A-Za-z0-9._-]/g, "-").slice(0, 63).replace(
    /^[^A-Za-z0-9]+|[^A-Za-z0-9]+$/g,
    "",
  );
}

/** This machine's name, as a label value. */
export function hostLabel(): string {
  return labelValue(Deno.hostname()) || "unknown";
}

/** The labels of the runtime's Secret and pods: the caller's, and those `hud gc` reads. */
function podLabels(config: KubernetesConfig, runtime: string): Record<string, string> {
  return {
    ...config.labels,
    [OWNER_LABEL]: String(Deno.pid),
    [HOST_LABEL]: hostLabel(),
    [RUNTIME_LABEL]: runtime,
  };
}

/** An owner reference: deleting the owner deletes what it owns. */
function ownerReference(o: KubernetesOwner): Record<string, unknown> {
  return {
    apiVersion: o.apiVersion ?? "v1",
    kind: o.kind ?? "Pod",
    name: o.name,
    uid: o.uid,
    blockOwnerDeletion: false,
  };
}

/** The runtime's Secret: its token, owned by `owner` (the runner's pod) when there is one. */
export function secretSpec(
  config: KubernetesConfig,
  runtime: string,
  token: string,
  owner: KubernetesOwner | null,
): unknown {
  return {
    apiVersion: "v1",
    kind: "Secret",
    metadata: {
      name: runtime,
      labels: podLabels(config, runtime),
      ...(owner ? { ownerReferences: [ownerReference(owner)] } : {}),
    },
    type: "Opaque",
    data: { token: btoa(token) },
  };
}

/** What a pod's spec depends on besides the config. */
export interface PodContext {
  /** The runtime's name: its Secret's, and its pods' prefix. */
  runtime: string;
  /** The Secret's uid: it owns the pods. */
  secretUid: string;
  /** The affinity that keeps the pod off nodes to avoid (none: `{}`). */
  avoidance: { affinity?: unknown };
}

/**
 * A bare pod that serves the image: no restarts, no service-account token,
 * no service links, a dead-man's switch, the token from the Secret, owned by
 * the Secret (so that deleting it deletes them: close, `hud gc`, the
 * runner's pod going).
 */
export function podSpec(config: KubernetesConfig, context: PodContext): unknown {
  const { runtime, secretUid } = context;
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      generateName: `${runtime}-`,
      labels: podLabels(config, runtime),
      annotations: { [CREATED_LABEL]: new Date().toISOString() },
      ownerReferences: [ownerReference({ kind: "Secret", name: runtime, uid: secretUid })],
    },
    spec: {
      restartPolicy: "Never",
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      activeDeadlineSeconds: Math.ceil(config.activeDeadline / 1000),
      terminationGracePeriodSeconds: 2,
      ...(config.nodeSelector ? { nodeSelector: config.nodeSelector } : {}),
      ...context.avoidance,
      ...spread(config, runtime),
      ...(config.tolerations ? { tolerations: config.tolerations } : {}),
      ...(config.imagePullSecrets
        ? { imagePullSecrets: config.imagePullSecrets.map((name) => ({ name })) }
        : {}),
      containers: [container(config, runtime)],
    },
  };
}

/**
 * A soft spread over nodes, not DoNotSchedule: a lost node (which keeps
 * counting, with no pods) must not keep its replacements from being
 * scheduled.
 */
function spread(config: KubernetesConfig, runtime: string): Record<string, unknown> {
  if (!config.spread) return {};
  return {
    topologySpreadConstraints: [{
      maxSkew: 1,
      topologyKey: "kubernetes.io/hostname",
      whenUnsatisfiable: "ScheduleAnyway",
      labelSelector: { matchLabels: { [RUNTIME_LABEL]: runtime } },
    }],
  };
}

function container(config: KubernetesConfig, runtime: string): Record<string, unknown> {
  return {
    name: "env",
    image: config.image,
    ...(config.imagePullPolicy ? { imagePullPolicy: config.imagePullPolicy } : {}),
    ...(config.command ? { command: config.command } : {}),
    env: [
      ...Object.entries(config.env).map(([name, value]) => ({ name, value })),
      { name: SERVE_TOKEN_VAR, valueFrom: { secretKeyRef: { name: runtime, key: "token" } } },
    ],
    ports: [{ name: "hud", containerPort: config.port }],
    ...resources(config),
  };
}

/** CPU and memory, as both request and limit. */
function resources(config: KubernetesConfig): Record<string, unknown> {
  if (!config.cpus && !config.memory) return {};
  const amounts = {
    ...(config.cpus ? { cpu: `${Math.round(config.cpus * 1000)}m` } : {}),
    ...(config.memory ? { memory: String(config.memory) } : {}),
  };
  return { resources: { requests: amounts, limits: { ...amounts } } };
}

/**
 * The nodes a pool's new pods keep off for a while, because one of its pods
 * could not start there or the node was lost, and the nodes its pods were
 * scheduled on.
 */
export class NodeAvoidance {
  readonly #until = new Map<string, number>();
  readonly #seen = new Set<string>();

  /** A node the runtime's pods were scheduled on. */
  seen(node: string): void {
    if (node !== "") this.#seen.add(node);
  }

  /** Keeps new pods off `node` until `now + AVOID_NODE_MS`. */
  avoid(node: string, now: number): void {
    if (node !== "") this.#until.set(node, now + AVOID_NODE_MS);
  }

  /**
   * The affinity that keeps new pods off the nodes to avoid; none when no
   * node is to be avoided, or when that is every node seen (better a node
   * that failed once than none).
   */
  affinity(now: number): { affinity?: unknown } {
    for (const [node, until] of this.#until) if (until <= now) this.#until.delete(node);
    if (this.#until.size === 0 || [...this.#seen].every((n) => this.#until.has(n))) return {};
    return {
      affinity: {
        nodeAffinity: {
          requiredDuringSchedulingIgnoredDuringExecution: {
            // One requirement per node: the API allows a single value in a matchFields NotIn.
            nodeSelectorTerms: [{
              matchFields: [...this.#until.keys()].sort().map((node) => ({
                key: "metadata.name",
                operator: "NotIn",
                values: [node],
              })),
            }],
          },
        },
      },
    };
  }
}
