// KubernetesRuntime's calls to the API server, in one namespace: its Secret,
// its pods (created and deleted at rates of their own), their events and
// logs, the nodes they run on; and the slots that bound how many pods are
// being created at once.

import { NotReadyError } from "../errors.ts";
import { abortable, Deadline, delay } from "../_internal/async.ts";
import { KubeApiError, type KubeClient, RateLimiter } from "./_kube.ts";
import {
  eventsText,
  logText,
  logWorthShowing,
  type NodeObject,
  nodeProblem,
  nodeReady,
  type PodObject,
  type PodState,
} from "./_pod_status.ts";
import { RUNTIME_LABEL } from "./_constants.ts";

/** Rates of the calls that make and remove pods, per second. */
export interface PodRates {
  createRate: number;
  deleteRate: number;
}

/** The API server, as one runtime's pods see it: one namespace, its own rate limits. */
export class PodApi implements Disposable {
  readonly client: KubeClient;
  readonly namespace: string;
  readonly #creates: RateLimiter;
  readonly #deletes: RateLimiter;

  constructor(client: KubeClient, namespace: string, rates: PodRates) {
    this.client = client;
    this.namespace = namespace;
    this.#creates = new RateLimiter(rates.createRate);
    this.#deletes = new RateLimiter(rates.deleteRate);
  }

  #path(kind: "pods" | "secrets" | "events", name = ""): string {
    return `/api/v1/namespaces/${encodeURIComponent(this.namespace)}/${kind}${
      name ? `/${name}` : ""
    }`;
  }

  /** Creates the Secret; returns its uid. */
  async createSecret(spec: unknown, signal?: AbortSignal): Promise<string> {
    const secret = await this.client.call("POST", this.#path("secrets"), spec, { signal }) as {
      metadata: { uid: string };
    };
    return secret.metadata.uid;
  }

  /** Deletes the Secret (gone already is fine). */
  async deleteSecret(name: string): Promise<void> {
    await this.client.call("DELETE", this.#path("secrets", name)).catch(unlessGone);
  }

  /**
   * Creates a pod (rate-limited, retried).
   * @throws {NotReadyError} when a quota refuses it
   */
  async createPod(spec: unknown, image: string, signal?: AbortSignal): Promise<PodObject> {
    await this.#creates.acquire(signal);
    try {
      return await this.client.call("POST", this.#path("pods"), spec, { signal }) as PodObject;
    } catch (err) {
      if (err instanceof KubeApiError && err.status === 403 && /quota/i.test(err.message)) {
        throw new NotReadyError(`Cannot create a pod of "${image}": ${err.message}`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /** Deletes a pod (rate-limited, retried; at once with `force`); gone already is fine. */
  async deletePod(name: string, force: boolean): Promise<void> {
    await this.#deletes.acquire();
    const grace = force ? "?gracePeriodSeconds=0" : "";
    await this.client.call("DELETE", `${this.#path("pods", name)}${grace}`).catch(unlessGone);
  }

  /** The pods of runtime `runtime` (a listing that is retried less, or not at all, with `attempts`). */
  async listPods(runtime: string, attempts?: number): Promise<PodObject[]> {
    const selector = encodeURIComponent(`${RUNTIME_LABEL}=${runtime}`);
    const list = await this.client.call(
      "GET",
      `${this.#path("pods")}?labelSelector=${selector}`,
      undefined,
      attempts === undefined ? {} : { attempts },
    ) as { items: PodObject[] };
    return list.items;
  }

  /** A pod by name, or null when it cannot be read. */
  async pod(name: string, signal?: AbortSignal): Promise<PodObject | null> {
    return await this.client.call("GET", this.#path("pods", name), undefined, { signal })
      .catch(() => null) as PodObject | null;
  }

  /** The pod's last events, `; events: reason: message | ...`, for errors ("" when none). */
  async events(name: string): Promise<string> {
    const selector = encodeURIComponent(`involvedObject.name=${name}`);
    try {
      const list = await this.client.call(
        "GET",
        `${this.#path("events")}?fieldSelector=${selector}`,
        undefined,
        { attempts: 2 },
      ) as { items?: { reason?: string; message?: string; lastTimestamp?: string }[] };
      return eventsText(list.items ?? []);
    } catch {
      return "";
    }
  }

  /** The pod's last lines of output, `; last output: ...`, for errors ("" when none). */
  async logs(name: string): Promise<string> {
    try {
      const path = `${this.#path("pods", name)}/log?tailLines=5`;
      return logText(await this.client.call("GET", path, undefined, { attempts: 2 }));
    } catch {
      return "";
    }
  }

  /** Why a pod of `image` cannot be placed, with its events (and its log, when it exited). */
  async podError(pod: PodState, image: string, why: string): Promise<NotReadyError> {
    const events = await this.events(pod.name);
    const logs = logWorthShowing(pod, why) ? await this.logs(pod.name) : "";
    const node = pod.node ? ` on node ${pod.node}` : "";
    return new NotReadyError(`Pod ${pod.name} of "${image}"${node} ${why}${logs}${events}`);
  }

  /** The node's Ready condition; undefined when it cannot be read (no permission). */
  async nodeReady(node: string): Promise<boolean | undefined> {
    try {
      return nodeReady(await this.#node(node, 1));
    } catch {
      return undefined;
    }
  }

  /** Why a pod on a lost node is gone: the node's condition, or that it is gone. */
  async nodeProblem(node: string): Promise<string> {
    try {
      return nodeProblem(node, await this.#node(node, 2));
    } catch (err) {
      return err instanceof KubeApiError && err.status === 404
        ? `node ${node} is gone`
        : `node ${node} is not ready`;
    }
  }

  #node(node: string, attempts: number): Promise<NodeObject> {
    const path = `/api/v1/nodes/${encodeURIComponent(node)}`;
    return this.client.call("GET", path, undefined, { attempts }) as Promise<NodeObject>;
  }

  /**
   * Waits (bounded by `timeout`) until the runtime's pods are gone; those
   * still there are then deleted at once (gone from the API: their kubelets
   * stop them when they catch up) and waited for 5 s more.
   */
  async removeLeft(runtime: string, timeout: number): Promise<void> {
    using deadline = new Deadline(timeout, undefined, "pod removal");
    let pods = await this.listPods(runtime);
    while (pods.length > 0 && !deadline.signal.aborted) {
      await delay(250, deadline.signal).catch(() => {});
      pods = await this.listPods(runtime);
    }
    if (pods.length === 0) return;
    await Promise.allSettled(pods.map((p) => this.deletePod(p.metadata.name, true)));
    using forced = new Deadline(5_000, undefined, "forced pod removal");
    while ((await this.listPods(runtime)).length > 0 && !forced.signal.aborted) {
      await delay(250, forced.signal).catch(() => {});
    }
  }

  close(): void {
    this.client.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/** Rethrows anything but a 404: what is gone need not be deleted. */
function unlessGone(err: unknown): void {
  if (!(err instanceof KubeApiError && err.status === 404)) throw err;
}

/** A slot taken from {@linkcode CreateSlots}; releasing it twice releases it once. */
export interface Slot {
  release(): void;
}

/** Pods being created (not yet ready or unschedulable) at once: at most `size`. */
export class CreateSlots {
  #free: number;
  readonly #waiters: (() => void)[] = [];

  constructor(size: number) {
    this.#free = size;
  }

  /** Waits for a free slot, in arrival order. */
  async take(signal?: AbortSignal): Promise<Slot> {
    while (this.#free === 0) {
      const { promise, resolve } = Promise.withResolvers<void>();
      this.#waiters.push(resolve);
      try {
        await abortable(promise, signal);
      } catch (err) {
        // A waiter that gave up must not take the wake-up of the next one.
        const i = this.#waiters.indexOf(resolve);
        if (i >= 0) this.#waiters.splice(i, 1);
        throw err;
      }
    }
    this.#free--;
    let held = true;
    return {
      release: () => {
        if (!held) return;
        held = false;
        this.#free++;
        this.#waiters.shift()?.();
      },
    };
  }
}
