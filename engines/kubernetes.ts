/**
 * Environments on Kubernetes: {@linkcode KubernetesRuntime} places an
 * environment image in a bare Pod per rollout, or leases the pods of a pool
 * to rollouts, talking to the API server with `fetch` (no kubectl), and
 * {@linkcode removeStalePods} cleans up after a runner that was killed.
 *
 * @module
 */

import type { Placement, PlaceOptions, RuntimeProvider } from "../runtime/placement.ts";
import { probeReady } from "../runtime/_probe.ts";
import { parseControlUrl } from "../_internal/control_url.ts";
import { formatHostPort } from "../_internal/net.ts";
import { encodeFrame } from "../_internal/framing.ts";
import { closeQuietly, writeAll } from "../_internal/io.ts";
import { NotReadyError } from "../errors.ts";
import { generateToken, withToken } from "../_internal/auth.ts";
import { abortable, Deadline, delay } from "../_internal/async.ts";
import { errorMessage } from "../_internal/util.ts";
import { CONTAINER_PORT, OWNER_LABEL } from "./container.ts";
import { KubeApiError, KubeClient, type KubeConfig, loadKubeConfig, RateLimiter } from "./_kube.ts";
import { PortForward } from "./_portforward.ts";
import { LeasePool, type PoolMember } from "./_pool.ts";
import { processAlive } from "../_internal/process.ts";

export { KubeApiError };

/** Label on every pod and secret: the runner's host name. */
export const HOST_LABEL = "dev.hud.host";
/** Label on every pod and secret: the runtime that made it. */
export const RUNTIME_LABEL = "dev.hud.runtime";

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
}

interface PodStatus {
  phase?: string;
  podIP?: string;
  reason?: string;
  message?: string;
  conditions?: { type: string; status: string; reason?: string; message?: string }[];
  containerStatuses?: {
    name: string;
    ready?: boolean;
    restartCount?: number;
    state?: {
      waiting?: { reason?: string; message?: string };
      running?: unknown;
      terminated?: { exitCode?: number; reason?: string; message?: string };
    };
  }[];
}

interface PodObject {
  metadata: { name: string; uid?: string; deletionTimestamp?: string };
  spec?: { nodeName?: string };
  status?: PodStatus;
}

/** What the runtime tracks of each pod it made. */
interface Pod {
  name: string;
  node: string;
  ip: string;
  phase: string;
  /** The pod failed (fatal reason, with the pod's words) or its node is gone. */
  failure: string | null;
  /** Since when the container has waited for a reason that may be fatal, and which. */
  waitingSince: number;
  waitingReason: string;
  unschedulable: string | null;
  unschedulableSince: number;
  /** The Ready condition was true once. */
  wasReady: boolean;
  /** The Ready condition went false after it was true (the node controller lost its node). */
  notReady: boolean;
  gone: boolean;
  createdAt: number;
  /** Said when the status changes. */
  notify: (() => void) | null;
  member: PoolMember | null;
  /** A pool pod's idle connection: its end says the server is gone, before the node controller does. */
  lifeline: Deno.TcpConn | null;
  forward: PortForward | null;
  deleting: Promise<void> | null;
}

/**
 * Container waiting reasons that do not get better by waiting, and how long
 * one may last before placing fails, in ms: a pod's Secret can take the
 * kubelet a few seconds to see (CreateContainerConfigError: "failed to sync
 * secret cache"), and the kubelet tries again by itself.
 */
const FATAL_WAITING = new Map([
  ["ErrImagePull", 0],
  ["ImagePullBackOff", 0],
  ["InvalidImageName", 0],
  ["ErrImageNeverPull", 0],
  ["CreateContainerConfigError", 20_000],
  ["CreateContainerError", 20_000],
  ["RunContainerError", 0],
  ["CrashLoopBackOff", 0],
]);

/**
 * How long a pool's new pods keep off a node where one of its pods could not
 * start (pull error, no answer, a lost node), in ms: the scheduler would
 * otherwise keep choosing that node, the one with the fewest of them.
 */
const AVOID_NODE_MS = 60_000;

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

/**
 * Places an environment image on Kubernetes, through the API server (with
 * `fetch`: a kubeconfig's server, CA and credentials, or the pod's service
 * account). Without `pool`, each placement is one bare Pod
 * (`restartPolicy: Never`: a rollout cannot survive a restart); with it,
 * a pool of such pods is leased to rollouts (`width` at a time each), pods
 * that die are replaced, demand scales the pool up to `maxReplicas` and
 * idleness back to `minReplicas`.
 *
 * Readiness is the handshake (`hello` answered), not the pod's phase.
 * Placing fails fast, with the pod's events, on image pull errors, crash
 * loops, a container that exits, quota refusals and pods unschedulable for
 * longer than `unschedulableTimeout` (which hold no create slot meanwhile);
 * a pod whose placement fails is deleted at once. Pods are reached by
 * their IP when this process can route to it, else through the API
 * server's port-forward.
 *
 * The token is in a Secret (one per runtime) that the pods read into
 * `HUD_SERVE_TOKEN`; the pods own no service-account token and get no
 * service links. Cleanup survives a crash of this process: the pods carry
 * labels for {@linkcode removeStalePods} (`hud gc`), an
 * `activeDeadlineSeconds`, and are owned by the Secret (so deleting it
 * deletes them), which the runner's own pod owns when this process runs in
 * the cluster. Creations and deletions have rate limits of their own; calls
 * are retried on 409, 429 and 5xx with jitter.
 *
 * The service account needs, in the namespace: pods (create, get, list,
 * delete), pods/portforward (create, get), pods/log (get), secrets (create,
 * delete), events (list), and nodes (get) cluster-wide to name lost nodes.
 *
 * @example
 * ```ts ignore
 * import { connect } from "../client.ts";
 * import { KubernetesRuntime } from "./kubernetes.ts";
 *
 * await using runtime = new KubernetesRuntime("registry:5000/robolab:1", { namespace: "evals" });
 * await using client = await connect(runtime);
 * console.log(client.manifest.env.name);
 * ```
 */
export class KubernetesRuntime implements RuntimeProvider, AsyncDisposable {
  readonly #image: string;
  readonly #options: KubernetesRuntimeOptions;
  readonly #name: string;
  readonly #token = generateToken();
  readonly #pods = new Map<string, Pod>();
  readonly #pool: LeasePool | null;
  readonly #min: number;
  readonly #max: number;
  readonly #creates: RateLimiter;
  readonly #deletes: RateLimiter;
  readonly #slotWaiters: (() => void)[] = [];
  readonly #checks = new Set<Promise<void>>();
  #slots: number;
  #client: KubeClient | null = null;
  #namespace = "";
  #secretUid = "";
  #owner: KubernetesOwner | null = null;
  #started: Promise<void> | null = null;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #polling: Promise<void> | null = null;
  #closed: Promise<void> | null = null;
  #desired: number;
  #creating = 0;
  #idleSince = Date.now();
  #lastError = "";
  #fatal: Error | null = null;
  #fatalUntil = 0;
  #route: Promise<boolean> | null = null;
  /** Aborted by close: pods still being readied stop waiting (nothing polls them any more). */
  readonly #closing = new AbortController();
  /** Nodes the pool's new pods keep off, and until when. */
  readonly #avoid = new Map<string, number>();
  /** Nodes the runtime's pods were scheduled on. */
  readonly #seenNodes = new Set<string>();

  /**
   * A runtime for `image`.
   *
   * @param image an image the nodes can pull (or have: `imagePullPolicy: "IfNotPresent"`)
   * @param options the API server, namespace, pool, limits, deadlines
   * @throws {TypeError} for an empty image name
   * @throws {RangeError} for counts, rates or times out of range
   */
  constructor(image: string, options: KubernetesRuntimeOptions = {}) {
    if (typeof image !== "string" || image === "") {
      throw new TypeError("Cannot create KubernetesRuntime: image must be a non-empty string");
    }
    const pool = options.pool;
    const min = pool?.minReplicas ?? 1;
    const initial = pool?.replicas ?? min;
    const max = pool?.maxReplicas ?? Math.max(min, initial, 8);
    checkPositive("minReplicas", min);
    checkPositive("width", pool?.width);
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
      !Number.isInteger(max) || max < min || !Number.isInteger(initial) || initial < min ||
      initial > max
    ) {
      throw new RangeError(
        `Cannot create KubernetesRuntime: need minReplicas <= replicas <= maxReplicas, got "${min}", "${initial}", "${max}"`,
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
    this.#image = image;
    this.#options = options;
    this.#min = min;
    this.#max = max;
    this.#desired = pool ? initial : 0;
    this.#name = `hud-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
    this.#pool = pool ? new LeasePool(pool.width ?? 1, `pool "${this.#name}"`) : null;
    this.#slots = options.maxCreating ?? 8;
    this.#creates = new RateLimiter(options.createRate ?? 10);
    this.#deletes = new RateLimiter(options.deleteRate ?? 20);
  }

  /** The image placed. */
  get image(): string {
    return this.#image;
  }

  /** The runtime's name: its Secret's, and the prefix of its pods'. */
  get name(): string {
    return this.#name;
  }

  /** The namespace, once started. */
  get namespace(): string {
    return this.#namespace;
  }

  /** Pods the pool is set to run now (0 without a pool). */
  get desiredReplicas(): number {
    return this.#desired;
  }

  /** Ready pods of the pool, by node. */
  get readyByNode(): Record<string, number> {
    return this.#pool?.readyByNode ?? {};
  }

  /** Names of the pods that exist now, by node ("" before scheduling). */
  get podsByNode(): Record<string, string[]> {
    const out: Record<string, string[]> = {};
    for (const p of this.#pods.values()) {
      if (!p.gone) (out[p.node] ??= []).push(p.name);
    }
    return out;
  }

  /**
   * Starts (once) and, with a pool, waits until `n` pods are ready.
   * @throws {NotReadyError} when they are not ready in time, with the last pod error, or at
   * once when no pod can start on any node (a pull error everywhere), with that pod's error
   */
  async ready(
    n: number = this.#desired,
    options: { signal?: AbortSignal; timeout?: number } = {},
  ): Promise<void> {
    await this.#start(options.signal);
    if (this.#pool === null) return;
    const timeout = options.timeout ?? this.#options.readyTimeout ?? 120_000;
    using deadline = new Deadline(timeout, options.signal, "pods ready");
    while (this.#pool.readyCount < n) {
      if (this.#closed) throw this.#closedError();
      // No pod could start on any node: the pod's error now, not a time-out later.
      if (this.#fatal && Date.now() < this.#fatalUntil && this.#pool.readyCount === 0) {
        throw this.#fatal;
      }
      if (deadline.signal.aborted) {
        if (options.signal?.aborted) throw options.signal.reason;
        throw new NotReadyError(
          `Cannot ready pool "${this.#name}": ${this.#pool.readyCount} of ${n} pods ready after ${timeout} ms${this.#lastErrorText()}`,
        );
      }
      await this.#poll().catch((err) => this.#lastError = `listing pods: ${errorMessage(err)}`);
      await delay(this.#pollMs(), deadline.signal).catch(() => {});
    }
  }

  /**
   * A pod for one rollout: a new one, or a free one of the pool.
   * @throws {NotReadyError} when no pod is ready in time or the pod failed, with its events
   */
  async place(options: PlaceOptions = {}): Promise<Placement> {
    if (this.#closed) throw this.#closedError();
    options.signal?.throwIfAborted();
    await this.#start(options.signal);
    if (this.#pool === null) return await this.#placePod(options.signal);
    const pool = this.#pool;
    if (this.#fatal && Date.now() < this.#fatalUntil && pool.readyCount === 0) throw this.#fatal;
    const member = pool.take() ?? await (() => {
      const waiting = pool.wait(
        this.#options.readyTimeout ?? 120_000,
        options.signal,
        () =>
          `${pool.readyCount} ready, ${this.#desired} wanted, at most ${this.#max}${this.#lastErrorText()}`,
      );
      this.#poll().catch(() => {});
      return waiting;
    })();
    // A moment for the pod's lifeline to say that its server died with the rollout.
    return pool.lease(member, () => this.#idleSince = Date.now(), () => delay(50));
  }

  /** Deletes the pods and the Secret, and waits (bounded) for the pods to go; idempotent. */
  close(): Promise<void> {
    this.#closed ??= this.#shutdown();
    return this.#closed;
  }

  /** Same as {@linkcode KubernetesRuntime.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #pollMs(): number {
    return this.#options.pollInterval ?? 500;
  }

  #closedError(): Error {
    return new Deno.errors.Interrupted(
      `Cannot place on "${this.#name}": the KubernetesRuntime is closed`,
    );
  }

  #lastErrorText(): string {
    return this.#lastError === "" ? "" : `; last pod error: ${this.#lastError}`;
  }

  #podsPath(name = ""): string {
    return `/api/v1/namespaces/${encodeURIComponent(this.#namespace)}/pods${
      name ? `/${name}` : ""
    }`;
  }

  #start(signal?: AbortSignal): Promise<void> {
    this.#started ??= this.#setUp(signal);
    return this.#started;
  }

  async #setUp(signal?: AbortSignal): Promise<void> {
    const o = this.#options;
    const config: KubeConfig = await loadKubeConfig({
      kubeconfig: o.kubeconfig,
      context: o.context,
    });
    const client = new KubeClient(config);
    this.#client = client;
    this.#namespace = o.namespace ?? config.namespace;
    if (o.owner) {
      this.#owner = o.owner;
    } else if (o.owner === undefined && config.inCluster && config.podName) {
      const self = await client.call(
        "GET",
        `/api/v1/namespaces/${config.namespace}/pods/${config.podName}`,
        undefined,
        { signal },
      )
        .catch(() => null) as PodObject | null;
      if (self?.metadata.uid && config.namespace === this.#namespace) {
        this.#owner = { name: self.metadata.name, uid: self.metadata.uid };
      }
    }
    const secret = await client.call(
      "POST",
      `/api/v1/namespaces/${encodeURIComponent(this.#namespace)}/secrets`,
      {
        apiVersion: "v1",
        kind: "Secret",
        metadata: {
          name: this.#name,
          labels: this.#labels(),
          ...(this.#owner ? { ownerReferences: [ownerReference(this.#owner)] } : {}),
        },
        type: "Opaque",
        data: { token: btoa(this.#token) },
      },
      { signal },
    ).catch((err) => {
      this.#client = null;
      client.close();
      throw err;
    }) as { metadata: { uid: string } };
    this.#secretUid = secret.metadata.uid;
    this.#schedule();
  }

  #labels(): Record<string, string> {
    return {
      ...this.#options.labels,
      [OWNER_LABEL]: String(Deno.pid),
      [HOST_LABEL]: hostLabel(),
      [RUNTIME_LABEL]: this.#name,
    };
  }

  #spec(): unknown {
    const o = this.#options;
    const resources = o.cpus || o.memory
      ? {
        requests: {
          ...(o.cpus ? { cpu: `${Math.round(o.cpus * 1000)}m` } : {}),
          ...(o.memory ? { memory: String(o.memory) } : {}),
        },
        limits: {
          ...(o.cpus ? { cpu: `${Math.round(o.cpus * 1000)}m` } : {}),
          ...(o.memory ? { memory: String(o.memory) } : {}),
        },
      }
      : undefined;
    return {
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        generateName: `${this.#name}-`,
        labels: this.#labels(),
        annotations: { "dev.hud.created": new Date().toISOString() },
        // The Secret owns the pods: deleting it (close, `hud gc`, the runner's pod going) deletes them.
        ownerReferences: [
          ownerReference({ kind: "Secret", name: this.#name, uid: this.#secretUid }),
        ],
      },
      spec: {
        restartPolicy: "Never",
        automountServiceAccountToken: false,
        enableServiceLinks: false,
        activeDeadlineSeconds: Math.ceil((o.activeDeadline ?? 3_600_000) / 1000),
        terminationGracePeriodSeconds: 2,
        ...(o.nodeSelector ? { nodeSelector: o.nodeSelector } : {}),
        ...this.#avoidance(),
        // Soft, not DoNotSchedule: a lost node (which keeps counting, with no
        // pods) must not keep its replacements from being scheduled.
        ...(o.spread === false ? {} : {
          topologySpreadConstraints: [{
            maxSkew: 1,
            topologyKey: "kubernetes.io/hostname",
            whenUnsatisfiable: "ScheduleAnyway",
            labelSelector: { matchLabels: { [RUNTIME_LABEL]: this.#name } },
          }],
        }),
        ...(o.tolerations ? { tolerations: o.tolerations } : {}),
        ...(o.imagePullSecrets
          ? { imagePullSecrets: o.imagePullSecrets.map((name) => ({ name })) }
          : {}),
        containers: [{
          name: "env",
          image: this.#image,
          ...(o.imagePullPolicy ? { imagePullPolicy: o.imagePullPolicy } : {}),
          ...(o.command ? { command: o.command } : {}),
          env: [
            ...Object.entries(o.env ?? {}).map(([name, value]) => ({ name, value })),
            {
              name: "HUD_SERVE_TOKEN",
              valueFrom: { secretKeyRef: { name: this.#name, key: "token" } },
            },
          ],
          ports: [{ name: "hud", containerPort: o.port ?? CONTAINER_PORT }],
          ...(resources ? { resources } : {}),
        }],
      },
    };
  }

  /** The pool's node to keep off for a while (its pod could not start there, or the node was lost). */
  #avoidNode(node: string): void {
    if (this.#pool !== null && node !== "") this.#avoid.set(node, Date.now() + AVOID_NODE_MS);
  }

  /** The affinity that keeps new pods off the nodes to avoid; none when that is every node seen. */
  #avoidance(): { affinity?: unknown } {
    const now = Date.now();
    for (const [node, until] of this.#avoid) if (until <= now) this.#avoid.delete(node);
    if (this.#avoid.size === 0 || [...this.#seenNodes].every((n) => this.#avoid.has(n))) return {};
    return {
      affinity: {
        nodeAffinity: {
          requiredDuringSchedulingIgnoredDuringExecution: {
            // One requirement per node: the API allows a single value in a matchFields NotIn.
            nodeSelectorTerms: [{
              matchFields: [...this.#avoid.keys()].sort().map((node) => ({
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

  // -- create slots ------------------------------------------------------

  async #takeSlot(signal?: AbortSignal): Promise<void> {
    while (this.#slots === 0) {
      await abortable(new Promise<void>((r) => this.#slotWaiters.push(r)), signal);
    }
    this.#slots--;
  }

  #giveSlot(): void {
    this.#slots++;
    this.#slotWaiters.shift()?.();
  }

  // -- pods --------------------------------------------------------------

  /** Creates a pod (rate-limited, retried); returns its record. */
  async #create(signal?: AbortSignal): Promise<Pod> {
    await this.#creates.acquire(signal);
    const created = await this.#client!.call("POST", this.#podsPath(), this.#spec(), { signal })
      .catch((err) => {
        if (err instanceof KubeApiError && err.status === 403 && /quota/i.test(err.message)) {
          throw new NotReadyError(`Cannot create a pod of "${this.#image}": ${err.message}`, {
            cause: err,
          });
        }
        throw err;
      }) as PodObject;
    const pod: Pod = {
      name: created.metadata.name,
      node: created.spec?.nodeName ?? "",
      ip: "",
      phase: "Pending",
      failure: null,
      waitingSince: 0,
      waitingReason: "",
      unschedulable: null,
      unschedulableSince: 0,
      wasReady: false,
      notReady: false,
      gone: false,
      createdAt: Date.now(),
      notify: null,
      member: null,
      lifeline: null,
      forward: null,
      deleting: null,
    };
    this.#pods.set(pod.name, pod);
    return pod;
  }

  /** Deletes a pod (rate-limited, retried; force when its node is gone). */
  #delete(pod: Pod, force = false): Promise<void> {
    pod.deleting ??= (async () => {
      const forward = pod.forward;
      pod.forward = null;
      const lifeline = pod.lifeline;
      pod.lifeline = null;
      if (lifeline) closeQuietly(lifeline);
      await forward?.close();
      await this.#deletes.acquire();
      const grace = force || pod.notReady ? "?gracePeriodSeconds=0" : "";
      try {
        await this.#client!.call("DELETE", `${this.#podsPath(pod.name)}${grace}`);
      } catch (err) {
        if (!(err instanceof KubeApiError && err.status === 404)) {
          // A later call (close) tries again rather than reuse the failure.
          pod.deleting = null;
          throw err;
        }
      }
    })();
    return pod.deleting;
  }

  /** The pod's last events, `reason: message`, for errors. */
  async #events(pod: Pod): Promise<string> {
    try {
      const list = await this.#client!.call(
        "GET",
        `/api/v1/namespaces/${encodeURIComponent(this.#namespace)}/events?fieldSelector=${
          encodeURIComponent(`involvedObject.name=${pod.name}`)
        }`,
        undefined,
        { attempts: 2 },
      ) as { items?: { reason?: string; message?: string; lastTimestamp?: string }[] };
      const items = (list.items ?? []).sort((a, b) =>
        String(a.lastTimestamp).localeCompare(String(b.lastTimestamp))
      );
      const seen = [...new Set(items.map((e) => `${e.reason}: ${e.message}`))].slice(-4);
      return seen.length === 0 ? "" : `; events: ${seen.join(" | ")}`;
    } catch {
      return "";
    }
  }

  async #logs(pod: Pod): Promise<string> {
    try {
      const text = await this.#client!.call(
        "GET",
        `${this.#podsPath(pod.name)}/log?tailLines=5`,
        undefined,
        {
          attempts: 2,
        },
      ) as string;
      const lines = String(text ?? "").trim().split("\n").filter((l) => l !== "").slice(-5);
      return lines.length === 0 ? "" : `; last output: ${lines.join(" | ")}`;
    } catch {
      return "";
    }
  }

  /** Folds one pod's status from a listing into its record; says what changed. */
  #observe(pod: Pod, obj: PodObject): void {
    const st = obj.status ?? {};
    pod.node = obj.spec?.nodeName ?? pod.node;
    if (pod.node !== "") this.#seenNodes.add(pod.node);
    pod.ip = st.podIP ?? pod.ip;
    pod.phase = st.phase ?? pod.phase;
    const scheduled = st.conditions?.find((c) => c.type === "PodScheduled");
    if (scheduled?.status === "False" && scheduled.reason === "Unschedulable") {
      if (pod.unschedulable === null) pod.unschedulableSince = Date.now();
      pod.unschedulable = scheduled.message ?? "unschedulable";
    } else {
      pod.unschedulable = null;
    }
    const c = st.containerStatuses?.[0];
    if (!c?.state?.waiting) pod.waitingReason = "";
    if (pod.failure === null) {
      const waiting = c?.state?.waiting;
      const term = c?.state?.terminated;
      const grace = waiting?.reason ? FATAL_WAITING.get(waiting.reason) : undefined;
      if (grace !== undefined) {
        if (pod.waitingReason !== waiting!.reason) {
          pod.waitingReason = waiting!.reason!;
          pod.waitingSince = Date.now();
        }
        if (Date.now() - pod.waitingSince >= grace) {
          pod.failure = `${waiting!.reason}${waiting!.message ? `: ${waiting!.message}` : ""}`;
        }
      } else if (term || pod.phase === "Failed" || pod.phase === "Succeeded") {
        pod.failure = `the container exited${
          term?.exitCode !== undefined ? ` with code ${term.exitCode}` : ""
        }${
          term?.reason
            ? ` (${term.reason})`
            : st.reason
            ? ` (${st.reason}${st.message ? `: ${st.message}` : ""})`
            : ""
        }`;
      }
    }
    const ready = st.conditions?.find((c) => c.type === "Ready");
    if (ready?.status === "True") pod.wasReady = true;
    // The node controller marks the pods of a node it lost not ready.
    else if (pod.wasReady && ready?.status === "False") pod.notReady = true;
    if (obj.metadata.deletionTimestamp && !pod.deleting) pod.failure ??= "the pod is being deleted";
    pod.notify?.();
  }

  #schedule(): void {
    if (this.#closed || this.#timer !== null) return;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#poll().catch((err) => this.#lastError = `listing pods: ${errorMessage(err)}`)
        .finally(() => this.#schedule());
    }, this.#pollMs());
  }

  /** One listing of the runtime's pods; concurrent callers share it. */
  #poll(): Promise<void> {
    this.#polling ??= this.#refresh().finally(() => this.#polling = null);
    return this.#polling;
  }

  async #refresh(): Promise<void> {
    if (this.#client === null || this.#closed) return;
    const list = await this.#client.call(
      "GET",
      `${this.#podsPath()}?labelSelector=${encodeURIComponent(`${RUNTIME_LABEL}=${this.#name}`)}`,
      undefined,
      { attempts: 2 },
    ) as { items: PodObject[] };
    const seen = new Set<string>();
    for (const obj of list.items) {
      const pod = this.#pods.get(obj.metadata.name);
      if (!pod) continue;
      seen.add(pod.name);
      this.#observe(pod, obj);
    }
    for (const pod of this.#pods.values()) {
      // Listed before its creation returned, or gone (deleted by someone, or by us).
      if (seen.has(pod.name) || Date.now() - pod.createdAt < 5_000) continue;
      if (!pod.gone) {
        pod.gone = true;
        pod.failure ??= "the pod was deleted";
        pod.notify?.();
      }
    }
    // A pod bound to a node that stopped answering never starts: fail it rather than wait.
    const pending = [...this.#pods.values()].filter((p) =>
      !p.gone && p.node !== "" && p.phase === "Pending" && p.failure === null
    );
    for (const node of new Set(pending.map((p) => p.node))) {
      if (await this.#nodeReady(node) !== false) continue;
      for (const p of pending) {
        if (p.node !== node) continue;
        p.failure = `its node ${node} is not ready`;
        p.notReady = true;
        p.notify?.();
      }
    }
    if (this.#pool) await this.#tendPool();
  }

  /** The node's Ready condition; undefined when it cannot be read (no permission). */
  async #nodeReady(node: string): Promise<boolean | undefined> {
    try {
      const n = await this.#client!.call(
        "GET",
        `/api/v1/nodes/${encodeURIComponent(node)}`,
        undefined,
        {
          attempts: 1,
        },
      ) as { status?: { conditions?: { type: string; status: string }[] } };
      const ready = n.status?.conditions?.find((c) => c.type === "Ready");
      return ready === undefined ? undefined : ready.status === "True";
    } catch {
      return undefined;
    }
  }

  /** Why a pod on a lost node is gone: the node's condition. */
  async #nodeProblem(node: string): Promise<string> {
    try {
      const n = await this.#client!.call(
        "GET",
        `/api/v1/nodes/${encodeURIComponent(node)}`,
        undefined,
        {
          attempts: 2,
        },
      ) as { status?: { conditions?: { type: string; status: string; reason?: string }[] } };
      const ready = n.status?.conditions?.find((c) => c.type === "Ready");
      return `node ${node} is not ready (${ready?.reason ?? ready?.status ?? "unknown"})`;
    } catch (err) {
      return err instanceof KubeApiError && err.status === 404
        ? `node ${node} is gone`
        : `node ${node} is not ready`;
    }
  }

  /** Whether this process can route to pod IPs (asked once, of the first pod). */
  #routable(pod: Pod): Promise<boolean> {
    const reach = this.#options.reach ?? "auto";
    if (reach !== "auto") return Promise.resolve(reach === "pod-ip");
    this.#route ??= (async () => {
      try {
        // Deno.connect's own signal: given up on, the connect ends (raced, it went on and left
        // its connection open).
        const conn = await Deno.connect({
          hostname: pod.ip,
          port: this.#options.port ?? CONTAINER_PORT,
          signal: AbortSignal.timeout(2_000),
        });
        conn.close();
        return true;
      } catch (err) {
        // Refused: the pod is there, not yet listening.
        return err instanceof Deno.errors.ConnectionRefused;
      }
    })();
    return this.#route;
  }

  /**
   * Waits until the pod runs and answers `hello`; returns its url. Throws
   * (with the pod's events) when it fails; the caller deletes it.
   */
  async #readyPod(pod: Pod, signal: AbortSignal, slot: { held: boolean }): Promise<string> {
    const o = this.#options;
    const readyTimeout = o.readyTimeout ?? 120_000;
    const unschedulableTimeout = o.unschedulableTimeout ?? 30_000;
    const fail = async (why: string): Promise<never> => {
      const events = await this.#events(pod);
      const logs = pod.phase === "Failed" || pod.phase === "Succeeded" || /exited/.test(why)
        ? await this.#logs(pod)
        : "";
      throw new NotReadyError(
        `Pod ${pod.name} of "${this.#image}"${
          pod.node ? ` on node ${pod.node}` : ""
        } ${why}${logs}${events}`,
      );
    };
    while (true) {
      if (signal.aborted) {
        if (signal.reason instanceof DOMException && signal.reason.name === "TimeoutError") {
          await fail(`not ready after ${readyTimeout} ms (phase ${pod.phase})`);
        }
        throw signal.reason;
      }
      if (pod.failure !== null) await fail(`failed: ${pod.failure}`);
      if (pod.unschedulable !== null) {
        // Waiting for room holds no create slot.
        if (slot.held) {
          slot.held = false;
          this.#giveSlot();
        }
        if (Date.now() - pod.unschedulableSince >= unschedulableTimeout) {
          await fail(`is unschedulable: ${pod.unschedulable}`);
        }
      }
      if (pod.phase === "Running" && pod.ip !== "") break;
      await new Promise<void>((resolve) => {
        const t = setTimeout(done, this.#pollMs());
        const onAbort = () => done();
        signal.addEventListener("abort", onAbort, { once: true });
        function done() {
          clearTimeout(t);
          signal.removeEventListener("abort", onAbort);
          resolve();
        }
        pod.notify = () => {
          pod.notify = null;
          done();
        };
      });
    }
    let url: string;
    if (await this.#routable(pod)) {
      url = withToken(`tcp://${formatHostPort(pod.ip, o.port ?? CONTAINER_PORT)}`, this.#token);
    } else {
      pod.forward = new PortForward(
        this.#client!,
        this.#namespace,
        pod.name,
        o.port ?? CONTAINER_PORT,
      );
      url = withToken(`tcp://127.0.0.1:${pod.forward.port}`, this.#token);
    }
    let lastError: unknown;
    for (let attempt = 1;; attempt++) {
      if (pod.failure !== null) await fail(`failed: ${pod.failure}`);
      try {
        await probeReady(url, { readyTimeout: 1_500, retryInterval: 150, signal });
        return url;
      } catch (err) {
        lastError = err;
        if (signal.aborted) {
          if (signal.reason instanceof DOMException && signal.reason.name === "TimeoutError") {
            await fail(
              `did not answer hello after ${readyTimeout} ms (${attempt} attempts): ${
                errorMessage(lastError)
              }`,
            );
          }
          throw signal.reason;
        }
      }
      await delay(150, signal).catch(() => {});
    }
  }

  // -- bare pods ---------------------------------------------------------

  async #placePod(signal?: AbortSignal): Promise<Placement> {
    const readyTimeout = this.#options.readyTimeout ?? 120_000;
    await this.#takeSlot(signal);
    const slot = { held: true };
    let pod: Pod | null = null;
    try {
      using deadline = new Deadline(
        readyTimeout,
        signal ? AbortSignal.any([signal, this.#closing.signal]) : this.#closing.signal,
        "pod ready",
      );
      pod = await this.#create(deadline.signal);
      const url = await this.#readyPod(pod, deadline.signal, slot);
      const placed = pod;
      let released: Promise<void> | null = null;
      return {
        url,
        params: { pod: placed.name, namespace: this.#namespace, node: placed.node, ip: placed.ip },
        [Symbol.asyncDispose]: () => {
          released ??= (async () => {
            const died = placed.failure ??
              (placed.notReady ? await this.#nodeProblem(placed.node) : null);
            await this.#delete(placed, died !== null);
            this.#pods.delete(placed.name);
            if (died !== null) {
              throw new Error(
                `Pod ${placed.name} of "${this.#image}" on node ${placed.node} died while placed: ${died}`,
              );
            }
          })();
          return released;
        },
      };
    } catch (err) {
      if (pod !== null) {
        const failed = pod;
        // At once: a failed placement leaves nothing behind.
        await this.#delete(failed, true).catch(() => {});
        this.#pods.delete(failed.name);
      }
      throw err;
    } finally {
      if (slot.held) this.#giveSlot();
    }
  }

  // -- the pool ----------------------------------------------------------

  async #tendPool(): Promise<void> {
    const pool = this.#pool!;
    for (const pod of this.#pods.values()) {
      const m = pod.member;
      if (m === null || m.dead !== null) continue;
      if (pod.failure !== null || pod.gone) pool.kill(m, pod.failure ?? "the pod is gone");
      else if (pod.notReady) {
        this.#avoidNode(pod.node);
        pool.kill(m, await this.#nodeProblem(pod.node));
        this.#delete(pod, true).catch(() => {});
      }
    }
    // Dead members whose leases are over: delete their pods.
    for (const pod of [...this.#pods.values()]) {
      const m = pod.member;
      if (m !== null && m.dead !== null && pool.get(m.id) === undefined) {
        this.#delete(pod, pod.notReady).then(() => this.#pods.delete(pod.name), () => {});
      }
    }
    const demand = pool.demand;
    if (demand > 0) this.#idleSince = Date.now();
    const width = this.#options.pool?.width ?? 1;
    const needed = Math.ceil(demand / width);
    if (needed > this.#desired) this.#desired = Math.min(this.#max, needed);
    else if (
      demand === 0 && this.#desired > this.#min &&
      Date.now() - this.#idleSince >= (this.#options.pool?.scaleDownAfter ?? 10_000)
    ) {
      this.#desired = this.#min;
    }
    // Scale down: idle ready members first.
    let live = pool.liveCount + this.#creating;
    for (const m of pool.members()) {
      if (live <= this.#desired) break;
      if (m.dead === null && m.leases === 0 && m.ready) {
        pool.kill(m, "scaled down");
        const pod = this.#pods.get(m.id);
        if (pod) this.#delete(pod).then(() => this.#pods.delete(pod.name), () => {});
        live--;
      }
    }
    if (this.#fatal && Date.now() < this.#fatalUntil) return;
    while (live < this.#desired && !this.#closed) {
      live++;
      this.#creating++;
      const check = this.#grow().finally(() => {
        this.#creating--;
        this.#checks.delete(check);
      });
      this.#checks.add(check);
    }
  }

  /** One more pod for the pool, ready, or its failure recorded. */
  async #grow(): Promise<void> {
    const pool = this.#pool!;
    const readyTimeout = this.#options.readyTimeout ?? 120_000;
    const slot = { held: false };
    let pod: Pod | null = null;
    try {
      await this.#takeSlot();
      slot.held = true;
      if (this.#closed) return;
      using deadline = new Deadline(readyTimeout, this.#closing.signal, "pod ready");
      pod = await this.#create(deadline.signal);
      const url = await this.#readyPod(pod, deadline.signal, slot);
      await this.#holdLifeline(pod, url);
      if (this.#closed) throw this.#closedError();
      const member: PoolMember = {
        id: pod.name,
        node: pod.node,
        url,
        params: {
          pod: pod.name,
          namespace: this.#namespace,
          node: pod.node,
          ip: pod.ip,
          pool: this.#name,
        },
        ready: false,
        dead: null,
        leases: 0,
        lastUsed: 0,
      };
      pod.member = member;
      pool.add(member);
      pool.markReady(member);
      this.#fatal = null;
    } catch (err) {
      this.#lastError = errorMessage(err);
      let elsewhere = false;
      if (pod !== null) {
        const failed = pod;
        // A pod that could not start on its node (not one whose program exited: that would
        // exit anywhere) sends the next ones to the other nodes, while there are some.
        if (
          !this.#closed && failed.unschedulable === null &&
          !failed.failure?.startsWith("the container exited")
        ) {
          this.#avoidNode(failed.node);
          elsewhere = "affinity" in this.#avoidance();
        }
        await this.#delete(failed, true).catch(() => {});
        this.#pods.delete(failed.name);
      }
      // A pod that cannot start (pull error, bad config, quota) on any node: say so to those
      // waiting rather than let them time out, and pause the pool's creations.
      if (err instanceof NotReadyError && pool.readyCount === 0 && !elsewhere && !this.#closed) {
        this.#fatal = err;
        this.#fatalUntil = Date.now() + 10_000;
        pool.rejectWaiters(() => err);
      }
    } finally {
      if (slot.held) this.#giveSlot();
    }
  }

  /**
   * Opens an idle session to a pool pod and watches it: when its server
   * dies the connection ends at once (a lost node is the node controller's
   * to notice), and the pod leaves the pool and the API.
   */
  async #holdLifeline(pod: Pod, url: string): Promise<void> {
    const { token, ...addr } = parseControlUrl(url);
    const conn = await Deno.connect(addr);
    pod.lifeline = conn;
    await writeAll(
      conn,
      encodeFrame({ jsonrpc: "2.0", id: 1, method: "hello", params: token ? { token } : {} }),
    );
    const watching = (async () => {
      const buf = new Uint8Array(4096);
      try {
        while ((await conn.read(buf)) !== null) { /* the hello's reply; nothing else comes */ }
      } catch {
        // reset: the same
      }
      if (pod.lifeline !== conn || this.#closed) return; // closed by us
      pod.lifeline = null;
      closeQuietly(conn);
      const m = pod.member;
      if (m !== null && m.dead === null) {
        this.#pool!.kill(m, `its server on node ${pod.node} went away`);
        // Useless now, whatever its node does: out of the API at once.
        this.#delete(pod, true).then(() => {
          if (this.#pool!.get(m.id) === undefined) this.#pods.delete(pod.name);
        }, () => {});
      }
    })();
    this.#checks.add(watching);
    watching.finally(() => this.#checks.delete(watching));
  }

  async #shutdown(): Promise<void> {
    this.#closing.abort(this.#closedError());
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    this.#pool?.rejectWaiters(() => this.#closedError());
    try {
      await this.#started?.catch(() => {});
      await this.#polling?.catch(() => {});
      const client = this.#client;
      if (client === null) return;
      for (const p of this.#pods.values()) {
        const lifeline = p.lifeline;
        p.lifeline = null;
        if (lifeline) closeQuietly(lifeline);
      }
      await Promise.allSettled([...this.#checks]);
      await Promise.allSettled([...this.#pods.values()].map((p) => this.#delete(p, p.notReady)));
      try {
        await client.call(
          "DELETE",
          `/api/v1/namespaces/${encodeURIComponent(this.#namespace)}/secrets/${this.#name}`,
        );
      } catch (err) {
        if (!(err instanceof KubeApiError && err.status === 404)) throw err;
      }
      // Wait (bounded) for the pods to go; a lost node's are forced out, and so are those
      // still there at the end (a kubelet too slow to confirm): none is left in the API.
      const left = async () =>
        (await client.call(
          "GET",
          `${this.#podsPath()}?labelSelector=${
            encodeURIComponent(`${RUNTIME_LABEL}=${this.#name}`)
          }`,
        ) as { items: PodObject[] }).items;
      using deadline = new Deadline(this.#options.closeTimeout ?? 30_000, undefined, "pod removal");
      let pods = await left();
      while (pods.length > 0 && !deadline.signal.aborted) {
        await delay(250, deadline.signal).catch(() => {});
        pods = await left();
      }
      if (pods.length > 0) {
        await Promise.allSettled(pods.map(async (p) => {
          await this.#deletes.acquire();
          await client.call("DELETE", `${this.#podsPath(p.metadata.name)}?gracePeriodSeconds=0`)
            .catch((err) => {
              if (!(err instanceof KubeApiError && err.status === 404)) throw err;
            });
        }));
        using forced = new Deadline(5_000, undefined, "forced pod removal");
        while ((await left()).length > 0 && !forced.signal.aborted) {
          await delay(250, forced.signal).catch(() => {});
        }
      }
    } finally {
      for (const p of this.#pods.values()) await p.forward?.close();
      this.#client?.close();
      this.#client = null;
    }
  }
}

function ownerReference(o: KubernetesOwner): Record<string, unknown> {
  return {
    apiVersion: o.apiVersion ?? "v1",
    kind: o.kind ?? "Pod",
    name: o.name,
    uid: o.uid,
    blockOwnerDeletion: false,
  };
}

/** Options for {@linkcode removeStalePods}. */
export interface RemoveStalePodsOptions {
  /** As {@linkcode KubernetesRuntimeOptions.kubeconfig}. */
  kubeconfig?: string;
  /** As {@linkcode KubernetesRuntimeOptions.context}. */
  context?: string;
  /** As {@linkcode KubernetesRuntimeOptions.namespace}. */
  namespace?: string;
  /**
   * Also remove what live runners made longer ago than this, in ms.
   * @default Infinity (only what runners on this host that are gone made)
   */
  olderThan?: number;
}

/**
 * Removes what killed runners left in a namespace: the Secrets and pods
 * labelled by {@linkcode KubernetesRuntime} whose creating process (on this
 * host) is gone, or older than `olderThan`.
 *
 * @returns the names removed (`secret/NAME`, `pod/NAME`)
 */
export async function removeStalePods(options: RemoveStalePodsOptions = {}): Promise<string[]> {
  const config = await loadKubeConfig({ kubeconfig: options.kubeconfig, context: options.context });
  using client = new KubeClient(config);
  const ns = encodeURIComponent(options.namespace ?? config.namespace);
  const host = hostLabel();
  const removed: string[] = [];
  const now = Date.now();
  for (const kind of ["secrets", "pods"] as const) {
    const list = await client.call(
      "GET",
      `/api/v1/namespaces/${ns}/${kind}?labelSelector=${encodeURIComponent(OWNER_LABEL)}`,
    ) as {
      items: {
        metadata: { name: string; creationTimestamp?: string; labels?: Record<string, string> };
      }[];
    };
    for (const item of list.items) {
      const labels = item.metadata.labels ?? {};
      if (!(RUNTIME_LABEL in labels)) continue;
      const owner = Number(labels[OWNER_LABEL]);
      const orphan = labels[HOST_LABEL] === host && Number.isInteger(owner) && owner !== Deno.pid &&
        !processAlive(owner);
      const old =
        now - Date.parse(item.metadata.creationTimestamp ?? "") > (options.olderThan ?? Infinity);
      if (!orphan && !old) continue;
      try {
        await client.call(
          "DELETE",
          `/api/v1/namespaces/${ns}/${kind}/${item.metadata.name}${
            kind === "pods" ? "?gracePeriodSeconds=0" : ""
          }`,
        );
        removed.push(`${kind.slice(0, -1)}/${item.metadata.name}`);
      } catch (err) {
        if (!(err instanceof KubeApiError && err.status === 404)) throw err;
      }
    }
  }
  return removed;
}
