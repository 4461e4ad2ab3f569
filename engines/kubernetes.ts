/**
 * Environments on Kubernetes: {@linkcode KubernetesRuntime} places an
 * environment image in a bare Pod per rollout, or leases the pods of a pool
 * to rollouts, talking to the API server with `fetch` (no kubectl), and
 * {@linkcode removeStalePods} cleans up after a runner that was killed.
 *
 * The runtime is the orchestration; its parts live beside it: the options
 * and their defaults (`_kube_options.ts`), what a listing says about a pod
 * (`_pod_status.ts`, pure), the specs it asks for (`_pod_spec.ts`, pure),
 * the API calls (`_kube_pods.ts`), the pool shared with the other pooled
 * runtimes (`_pool.ts`).
 *
 * @module
 */

import {
  placementOf,
  type PlacementWithUrl,
  type PlaceOptions,
  type RuntimeProvider,
} from "../runtime/placement.ts";
import { type HeldSession, holdReady, probeReady } from "../runtime/_probe.ts";
import { type ControlAddress, controlAddress, generateToken } from "../_internal/auth.ts";
import { NotReadyError } from "../errors.ts";
import { Deadline, delay } from "../_internal/async.ts";
import { errorMessage } from "../_internal/util.ts";
import { processAlive } from "../_internal/process.ts";
import { HOST_LABEL, OWNER_LABEL, RUNTIME_LABEL } from "./_constants.ts";
import { KubeApiError, KubeClient, type KubeConfig, loadKubeConfig } from "./_kube.ts";
import { PortForward } from "./_portforward.ts";
import { LeasePool, Poller, type PoolMember, scaleTarget } from "./_pool.ts";
import {
  type KubernetesConfig,
  type KubernetesOwner,
  type KubernetesRuntimeOptions,
  resolveKubernetesOptions,
} from "./_kube_options.ts";
import {
  failedOnItsNode,
  failOnLostNode,
  markGone,
  newPodState,
  observePod,
  pendingByNode,
  podProgress,
  type PodState,
} from "./_pod_status.ts";
import { hostLabel, NodeAvoidance, podSpec, secretSpec } from "./_pod_spec.ts";
import { CreateSlots, PodApi, type Slot } from "./_kube_pods.ts";
import { checkPublicNetwork } from "./_network_support.ts";

export { KubeApiError };
export type {
  KubernetesOwner,
  KubernetesPoolOptions,
  KubernetesRuntimeOptions,
} from "./_kube_options.ts";

/** What the runtime holds of each pod it made: its state, and what it opened for it. */
interface Pod extends PodState {
  /** Said when the status changes. */
  notify: (() => void) | null;
  member: PoolMember | null;
  /** A pool pod's idle session: its end says the server is gone, before the node controller does. */
  lifeline: HeldSession | null;
  forward: PortForward | null;
  deleting: Promise<void> | null;
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
  readonly #config: KubernetesConfig;
  readonly #name = `hud-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  readonly #token = generateToken();
  readonly #pods = new Map<string, Pod>();
  readonly #pool: LeasePool | null;
  readonly #slots: CreateSlots;
  readonly #poller: Poller;
  readonly #avoidance = new NodeAvoidance();
  /** Work in the background (pods growing, lifelines watched): close() waits for it. */
  readonly #checks = new Set<Promise<void>>();
  /** Aborted by close: pods still being readied stop waiting (nothing polls them any more). */
  readonly #closing = new AbortController();
  #api: PodApi | null = null;
  #secretUid = "";
  #started: Promise<void> | null = null;
  #closed: Promise<void> | null = null;
  #desired: number;
  #creating = 0;
  #idleSince = Date.now();
  #lastError = "";
  /** A pod no node could start: said to whoever waits, and the pool's creations paused, until then. */
  #fatal: { error: Error; until: number } | null = null;
  /** Whether pod IPs can be reached from here (asked once). */
  #route: Promise<boolean> | null = null;

  /**
   * A runtime for `image`.
   *
   * @param image an image the nodes can pull (or have: `imagePullPolicy: "IfNotPresent"`)
   * @param options the API server, namespace, pool, limits, deadlines
   * @throws {TypeError} for an empty image name
   * @throws {RangeError} for counts, rates or times out of range
   */
  constructor(image: string, options: KubernetesRuntimeOptions = {}) {
    checkPublicNetwork(
      "KubernetesRuntime",
      options.network,
      "its pods are on the cluster's pod network",
    );
    const config = this.#config = resolveKubernetesOptions(image, options);
    this.#desired = config.replicas;
    this.#pool = config.pooled ? new LeasePool(config.width, `pool "${this.#name}"`) : null;
    this.#slots = new CreateSlots(config.maxCreating);
    this.#poller = new Poller(config.pollInterval, () => this.#refresh(), (err) => {
      this.#lastError = `listing pods: ${errorMessage(err)}`;
    });
  }

  /** The image placed. */
  get image(): string {
    return this.#config.image;
  }

  /** The runtime's name: its Secret's, and the prefix of its pods'. */
  get name(): string {
    return this.#name;
  }

  /** The namespace, once started. */
  get namespace(): string {
    return this.#api?.namespace ?? "";
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
    const pool = this.#pool;
    if (pool === null) return;
    const timeout = options.timeout ?? this.#config.readyTimeout;
    using deadline = new Deadline(timeout, options.signal, "pods ready");
    while (pool.readyCount < n) {
      if (this.#closed) throw this.#closedError();
      // No pod could start on any node: the pod's error now, not a time-out later.
      this.#throwIfNoneCanStart();
      if (deadline.signal.aborted) {
        if (options.signal?.aborted) throw options.signal.reason;
        throw new NotReadyError(
          `Cannot ready pool "${this.#name}": ${pool.readyCount} of ${n} pods ready after ${timeout} ms${this.#lastErrorText()}`,
        );
      }
      await this.#poller.poll().catch((err) => {
        this.#lastError = `listing pods: ${errorMessage(err)}`;
      });
      await delay(this.#config.pollInterval, deadline.signal).catch(() => {});
    }
  }

  /**
   * A pod for one rollout: a new one, or a free one of the pool.
   * @throws {NotReadyError} when no pod is ready in time or the pod failed, with its events
   */
  async place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    if (this.#closed) throw this.#closedError();
    options.signal?.throwIfAborted();
    await this.#start(options.signal);
    const pool = this.#pool;
    if (pool === null) return await this.#placePod(options.signal);
    this.#throwIfNoneCanStart();
    const member = pool.take() ?? await (() => {
      const waiting = pool.wait(
        this.#config.readyTimeout,
        options.signal,
        () =>
          `(${pool.readyCount} ready, ${this.#desired} wanted, at most ${this.#config.max}${this.#lastErrorText()})`,
      );
      this.#poller.poll().catch(() => {});
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

  #closedError(): Error {
    return new Deno.errors.Interrupted(
      `Cannot place on "${this.#name}": the KubernetesRuntime is closed`,
    );
  }

  #lastErrorText(): string {
    return this.#lastError === "" ? "" : `; last pod error: ${this.#lastError}`;
  }

  /** The error of a pod no node could start, while the pool has no ready pod and it is recent. */
  #throwIfNoneCanStart(): void {
    if (this.#fatal && Date.now() < this.#fatal.until && this.#pool?.readyCount === 0) {
      throw this.#fatal.error;
    }
  }

  #start(signal?: AbortSignal): Promise<void> {
    this.#started ??= this.#setUp(signal);
    return this.#started;
  }

  /** The API server, the namespace, the owner, and the Secret that holds the token. */
  async #setUp(signal?: AbortSignal): Promise<void> {
    const config = this.#config;
    const kube = await loadKubeConfig({ kubeconfig: config.kubeconfig, context: config.context });
    const api = new PodApi(new KubeClient(kube), config.namespace ?? kube.namespace, config);
    try {
      const owner = await this.#owner(api, kube, signal);
      const spec = secretSpec(config, this.#name, this.#token, owner);
      this.#secretUid = await api.createSecret(spec, signal);
    } catch (err) {
      api.close();
      throw err;
    }
    this.#api = api;
    this.#poller.start();
  }

  /** What owns the Secret: the option, else the pod this process runs in (same namespace). */
  async #owner(
    api: PodApi,
    kube: KubeConfig,
    signal?: AbortSignal,
  ): Promise<KubernetesOwner | null> {
    const owner = this.#config.owner;
    if (owner) return owner;
    if (owner === false || !kube.inCluster || !kube.podName) return null;
    if (kube.namespace !== api.namespace) return null;
    const self = await api.pod(kube.podName, signal);
    return self?.metadata.uid ? { name: self.metadata.name, uid: self.metadata.uid } : null;
  }

  // -- pods --------------------------------------------------------------

  /** Creates a pod (rate-limited, retried); returns its record. */
  async #create(signal?: AbortSignal): Promise<Pod> {
    const spec = podSpec(this.#config, {
      runtime: this.#name,
      secretUid: this.#secretUid,
      avoidance: this.#avoidance.affinity(Date.now()),
    });
    const created = await this.#api!.createPod(spec, this.#config.image, signal);
    const pod: Pod = {
      ...newPodState(created, Date.now()),
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
      pod.lifeline?.close();
      pod.lifeline = null;
      await forward?.close();
      try {
        await this.#api!.deletePod(pod.name, force || pod.notReady);
      } catch (err) {
        // A later call (close) tries again rather than reuse the failure.
        pod.deleting = null;
        throw err;
      }
    })();
    return pod.deleting;
  }

  /** Deletes a pod in the background, and forgets it once it is gone (and out of the pool). */
  #discard(pod: Pod, force: boolean): void {
    this.#delete(pod, force).then(() => {
      if (pod.member === null || this.#pool?.get(pod.member.id) === undefined) {
        this.#pods.delete(pod.name);
      }
    }, () => {});
  }

  /** One listing of the runtime's pods, folded into their records; then the pool is tended. */
  async #refresh(): Promise<void> {
    const api = this.#api;
    if (api === null || this.#closed) return;
    const listed = await api.listPods(this.#name, 2);
    const now = Date.now();
    for (const obj of listed) {
      const pod = this.#pods.get(obj.metadata.name);
      if (!pod) continue;
      observePod(pod, obj, now, pod.deleting !== null);
      this.#avoidance.seen(pod.node);
      pod.notify?.();
    }
    const names = new Set(listed.map((o) => o.metadata.name));
    for (const pod of markGone(this.#pods.values(), names, now)) pod.notify?.();
    // A pod bound to a node that stopped answering never starts: fail it rather than wait.
    for (const [node, pending] of pendingByNode(this.#pods.values())) {
      if (await api.nodeReady(node) !== false) continue;
      failOnLostNode(pending, node);
      for (const p of pending) p.notify?.();
    }
    if (this.#pool) await this.#tendPool(this.#pool);
  }

  /** Whether this process can route to pod IPs (asked once, of the first pod). */
  #routable(pod: Pod): Promise<boolean> {
    const reach = this.#config.reach;
    if (reach !== "auto") return Promise.resolve(reach === "pod-ip");
    this.#route ??= reachable(pod.ip, this.#config.port);
    return this.#route;
  }

  // -- readying a pod ----------------------------------------------------

  /**
   * Waits until the pod runs and answers `hello`; returns its address, and,
   * with `hold`, the session of that `hello` kept open (a pool pod's
   * lifeline). Throws (with the pod's events) when it fails; the caller
   * deletes it.
   */
  async #readyPod(
    pod: Pod,
    signal: AbortSignal,
    slot: Slot,
    hold: boolean,
  ): Promise<{ address: ControlAddress; session: HeldSession | null }> {
    await this.#running(pod, signal, slot);
    const address = await this.#address(pod);
    return { address, session: await this.#handshake(pod, address, signal, hold) };
  }

  /** Waits until the pod runs with an address; a pod waiting for room gives its slot back. */
  async #running(pod: Pod, signal: AbortSignal, slot: Slot): Promise<void> {
    while (true) {
      if (signal.aborted) {
        if (timedOut(signal)) {
          await this.#fail(
            pod,
            `not ready after ${this.#config.readyTimeout} ms (phase ${pod.phase})`,
          );
        }
        throw signal.reason;
      }
      const progress = podProgress(pod, Date.now(), this.#config.unschedulableTimeout);
      if (progress.state === "failed") await this.#fail(pod, progress.why);
      // Waiting for room holds no create slot.
      if (progress.state === "unschedulable") slot.release();
      if (progress.state === "running") return;
      await nextChange(pod, this.#config.pollInterval, signal);
    }
  }

  /** The pod's control address: its IP when routable, else a port-forward's on loopback. */
  async #address(pod: Pod): Promise<ControlAddress> {
    const port = this.#config.port;
    if (await this.#routable(pod)) return controlAddress(pod.ip, port, this.#token);
    const api = this.#api!;
    pod.forward = new PortForward(api.client, api.namespace, pod.name, port);
    return controlAddress("127.0.0.1", pod.forward.port, this.#token);
  }

  /**
   * `hello` until the pod's server answers, through the client library's
   * handshake (attempts of 1.5 s, its failure looked at between them).
   */
  async #handshake(
    pod: Pod,
    address: ControlAddress,
    signal: AbortSignal,
    hold: boolean,
  ): Promise<HeldSession | null> {
    const probe = { readyTimeout: 1_500, retryInterval: 150, signal };
    for (let attempt = 1;; attempt++) {
      if (pod.failure !== null) await this.#fail(pod, `failed: ${pod.failure}`);
      try {
        if (hold) return await holdReady(address, probe);
        await probeReady(address, probe);
        return null;
      } catch (err) {
        if (signal.aborted) {
          if (timedOut(signal)) {
            await this.#fail(
              pod,
              `did not answer hello after ${this.#config.readyTimeout} ms (${attempt} attempts): ${
                errorMessage(err)
              }`,
            );
          }
          throw signal.reason;
        }
      }
      await delay(150, signal).catch(() => {});
    }
  }

  /** Throws why the pod cannot be placed, with its events (and its log, when it exited). */
  async #fail(pod: Pod, why: string): Promise<never> {
    throw await this.#api!.podError(pod, this.#config.image, why);
  }

  // -- bare pods ---------------------------------------------------------

  async #placePod(signal?: AbortSignal): Promise<PlacementWithUrl> {
    const slot = await this.#slots.take(signal);
    let pod: Pod | null = null;
    try {
      using deadline = new Deadline(
        this.#config.readyTimeout,
        signal ? AbortSignal.any([signal, this.#closing.signal]) : this.#closing.signal,
        "pod ready",
      );
      pod = await this.#create(deadline.signal);
      const { address } = await this.#readyPod(pod, deadline.signal, slot, false);
      return this.#bare(pod, address);
    } catch (err) {
      if (pod !== null) {
        // At once: a failed placement leaves nothing behind.
        await this.#delete(pod, true).catch(() => {});
        this.#pods.delete(pod.name);
      }
      throw err;
    } finally {
      slot.release();
    }
  }

  /** A bare pod's placement: releasing it deletes the pod, saying so when it died. */
  #bare(pod: Pod, address: ControlAddress): PlacementWithUrl {
    let released: Promise<void> | null = null;
    const params = { pod: pod.name, namespace: this.namespace, node: pod.node, ip: pod.ip };
    return placementOf(address, params, () => {
      released ??= (async () => {
        const died = pod.failure ?? (pod.notReady ? await this.#api!.nodeProblem(pod.node) : null);
        await this.#delete(pod, died !== null);
        this.#pods.delete(pod.name);
        if (died !== null) {
          throw new Error(
            `Pod ${pod.name} of "${this.#config.image}" on node ${pod.node} died while placed: ${died}`,
          );
        }
      })();
      return released;
    });
  }

  // -- the pool ----------------------------------------------------------

  /** Dead pods out, the pool's size set by demand, idle pods removed or new ones started. */
  async #tendPool(pool: LeasePool): Promise<void> {
    await this.#retire(pool);
    const demand = pool.demand;
    const now = Date.now();
    if (demand > 0) this.#idleSince = now;
    this.#desired = scaleTarget(this.#desired, demand, now - this.#idleSince, this.#config);
    // Scale down: idle ready members first.
    let live = pool.liveCount + this.#creating;
    for (const m of pool.members()) {
      if (live <= this.#desired) break;
      if (m.dead === null && m.leases === 0 && m.ready) {
        pool.kill(m, "scaled down");
        const pod = this.#pods.get(m.id);
        if (pod) this.#discard(pod, false);
        live--;
      }
    }
    if (this.#fatal && now < this.#fatal.until) return;
    for (; live < this.#desired && !this.#closed; live++) this.#background(this.#grow());
  }

  /** Takes failed and lost pods out of the pool; deletes dead ones whose leases are over. */
  async #retire(pool: LeasePool): Promise<void> {
    for (const pod of this.#pods.values()) {
      const m = pod.member;
      if (m === null || m.dead !== null) continue;
      if (pod.failure !== null || pod.gone) pool.kill(m, pod.failure ?? "the pod is gone");
      else if (pod.notReady) {
        this.#avoidance.avoid(pod.node, Date.now());
        pool.kill(m, await this.#api!.nodeProblem(pod.node));
        this.#delete(pod, true).catch(() => {});
      }
    }
    for (const pod of [...this.#pods.values()]) {
      const m = pod.member;
      if (m !== null && m.dead !== null && pool.get(m.id) === undefined) {
        this.#discard(pod, pod.notReady);
      }
    }
  }

  /** Runs `work` in the background; close() waits for it. */
  #background(work: Promise<void>): void {
    this.#checks.add(work);
    work.finally(() => this.#checks.delete(work));
  }

  /** One more pod for the pool, ready, or its failure recorded. */
  async #grow(): Promise<void> {
    this.#creating++;
    let slot: Slot | null = null;
    let pod: Pod | null = null;
    try {
      slot = await this.#slots.take();
      if (this.#closed) return;
      using deadline = new Deadline(this.#config.readyTimeout, this.#closing.signal, "pod ready");
      pod = await this.#create(deadline.signal);
      const { address, session } = await this.#readyPod(pod, deadline.signal, slot, true);
      this.#join(pod, address, session!);
    } catch (err) {
      await this.#growFailed(pod, err);
    } finally {
      slot?.release();
      this.#creating--;
    }
  }

  /** A ready pod joins the pool; its `hello` session stays open as its lifeline. */
  #join(pod: Pod, address: ControlAddress, session: HeldSession): void {
    this.#watchLifeline(pod, session);
    if (this.#closed) throw this.#closedError();
    const member: PoolMember = {
      id: pod.name,
      node: pod.node,
      address,
      params: {
        pod: pod.name,
        namespace: this.namespace,
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
    this.#pool!.add(member);
    this.#pool!.markReady(member);
    this.#fatal = null;
  }

  /**
   * A pod that could not join: deleted at once; one that could not start on
   * its node sends the next ones elsewhere while there are other nodes, and
   * one that cannot start on any node is said to those waiting (rather than
   * let them time out) and pauses the pool's creations.
   */
  async #growFailed(pod: Pod | null, err: unknown): Promise<void> {
    this.#lastError = errorMessage(err);
    let elsewhere = false;
    if (pod !== null) {
      if (!this.#closed && failedOnItsNode(pod)) {
        this.#avoidance.avoid(pod.node, Date.now());
        elsewhere = "affinity" in this.#avoidance.affinity(Date.now());
      }
      await this.#delete(pod, true).catch(() => {});
      this.#pods.delete(pod.name);
    }
    const pool = this.#pool!;
    if (err instanceof NotReadyError && pool.readyCount === 0 && !elsewhere && !this.#closed) {
      this.#fatal = { error: err, until: Date.now() + 10_000 };
      pool.rejectWaiters(() => err);
    }
  }

  /**
   * Watches a pool pod's idle session: when its server dies the connection
   * ends at once (a lost node is the node controller's to notice), and the
   * pod leaves the pool and the API.
   */
  #watchLifeline(pod: Pod, session: HeldSession): void {
    pod.lifeline = session;
    this.#background(session.ended.then(() => {
      if (pod.lifeline !== session || this.#closed) return; // closed by us
      pod.lifeline = null;
      session.close();
      const m = pod.member;
      if (m !== null && m.dead === null) {
        this.#pool!.kill(m, `its server on node ${pod.node} went away`);
        // Useless now, whatever its node does: out of the API at once.
        this.#discard(pod, true);
      }
    }));
  }

  // -- closing -----------------------------------------------------------

  async #shutdown(): Promise<void> {
    this.#closing.abort(this.#closedError());
    this.#pool?.rejectWaiters(() => this.#closedError());
    try {
      await this.#started?.catch(() => {});
      await this.#poller.stop();
      const api = this.#api;
      if (api === null) return;
      for (const p of this.#pods.values()) {
        p.lifeline?.close();
        p.lifeline = null;
      }
      await Promise.allSettled([...this.#checks]);
      await Promise.allSettled([...this.#pods.values()].map((p) => this.#delete(p, p.notReady)));
      await api.deleteSecret(this.#name);
      // Wait (bounded) for the pods to go; a lost node's are forced out, and so are those
      // still there at the end (a kubelet too slow to confirm): none is left in the API.
      await api.removeLeft(this.#name, this.#config.closeTimeout);
    } finally {
      for (const p of this.#pods.values()) await p.forward?.close();
      this.#api?.close();
    }
  }
}

/**
 * Whether a pod at `ip` can be reached from here: a connection, or a
 * refusal (the pod is there, not yet listening), within 2 s.
 */
async function reachable(ip: string, port: number): Promise<boolean> {
  try {
    // Deno.connect's own signal: given up on, the connect ends (raced, it went on and left
    // its connection open).
    const conn = await Deno.connect({ hostname: ip, port, signal: AbortSignal.timeout(2_000) });
    conn.close();
    return true;
  } catch (err) {
    return err instanceof Deno.errors.ConnectionRefused;
  }
}

/** Whether a deadline's signal fired for its time rather than an abort. */
function timedOut(signal: AbortSignal): boolean {
  return signal.reason instanceof DOMException && signal.reason.name === "TimeoutError";
}

/** Resolves when the pod's status changes, after `ms`, or on abort, whichever comes first. */
function nextChange(pod: Pod, ms: number, signal: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    const t = setTimeout(done, ms);
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
  const removed: string[] = [];
  const stale = staleTest(options.olderThan ?? Infinity);
  for (const kind of ["secrets", "pods"] as const) {
    const list = await client.call(
      "GET",
      `/api/v1/namespaces/${ns}/${kind}?labelSelector=${encodeURIComponent(OWNER_LABEL)}`,
    ) as { items: Labelled[] };
    for (const item of list.items.filter(stale)) {
      const force = kind === "pods" ? "?gracePeriodSeconds=0" : "";
      try {
        await client.call(
          "DELETE",
          `/api/v1/namespaces/${ns}/${kind}/${item.metadata.name}${force}`,
        );
        removed.push(`${kind.slice(0, -1)}/${item.metadata.name}`);
      } catch (err) {
        if (!(err instanceof KubeApiError && err.status === 404)) throw err;
      }
    }
  }
  return removed;
}

/** A listed object's name, age and labels. */
interface Labelled {
  metadata: { name: string; creationTimestamp?: string; labels?: Record<string, string> };
}

/**
 * Whether a runtime's object is stale: made by a runner on this host that is
 * gone, or longer ago than `olderThan` ms.
 */
function staleTest(olderThan: number): (item: Labelled) => boolean {
  const host = hostLabel();
  const now = Date.now();
  return (item) => {
    const labels = item.metadata.labels ?? {};
    if (!(RUNTIME_LABEL in labels)) return false;
    const owner = Number(labels[OWNER_LABEL]);
    const orphan = labels[HOST_LABEL] === host && Number.isInteger(owner) && owner !== Deno.pid &&
      !processAlive(owner);
    return orphan || now - Date.parse(item.metadata.creationTimestamp ?? "") > olderThan;
  };
}
