// A Harbor compose task's services (harbor/_compose.ts read them), started
// through the engine's API (Docker's, or Podman's compatible one: no compose
// binary) for each rollout: the task's networks (each service known by its
// name there) and named volumes made, the other services created and started
// each after its `depends_on` conditions hold, then the agent's service
// (`main`, the task's image placed by ContainerRuntime) once its own hold, on
// the networks it names with the task's network policy by phase (a
// "no-network" phase leaves it nothing but loopback, as Harbor's Docker
// environment leaves its main service). Every container, network and volume
// carries the project's label and is removed when the placement is released,
// also when starting failed or was aborted (found by label, so one whose
// create call's answer was lost goes too). A condition that does not hold in
// its bound fails the placement (a `provisioning` failure, not a zero),
// naming the service.

import { ContainerRuntime, type ContainerRuntimeOptions } from "../engines/container.ts";
import { EngineClient, EngineError, inspectImage, removeContainer } from "../engines/_engine.ts";
import { connect, needsNetwork, resolveNetwork } from "../engines/_container_network.ts";
import { OWNER_LABEL } from "../engines/_constants.ts";
import {
  placementOf,
  type PlacementWithUrl,
  type PlaceOptions,
  type RuntimeProvider,
} from "../runtime/placement.ts";
import { delay } from "../_internal/async.ts";
import { buildContext, HarborBuildError, slug } from "./image.ts";
import type { HarborTask } from "./loader.ts";
import type { ComposeCondition, ComposeProject, ComposeService } from "./_compose.ts";
import { sha256, treeHash } from "./_tree.ts";

/** The label every container, network and volume of one rollout's services carries. */
export const PROJECT_LABEL = "dev.hud.harbor.project";
/** The label of the service a container (or built image) is. */
export const SERVICE_LABEL = "dev.hud.harbor.service";
/** How long a one-shot service (`service_completed_successfully`) may run. */
const COMPLETION_BOUND_MS = 120_000;
/** Slack over a healthcheck's own bound (the engine's first check waits one interval). */
const HEALTH_SLACK_MS = 5_000;
const POLL_MS = 200;

/** The services' images, by service: built (cached by content hash), or as the file names them. */
export interface ComposeImages {
  images: Map<string, string>;
  /** Whether any was built in this call. */
  built: boolean;
}

/**
 * Builds the images of the task's services that have `build` (tagged by
 * their context's content hash, so a second run builds nothing, and
 * labelled with the task), and pulls those named by `image` that the engine
 * does not have.
 *
 * @throws {HarborBuildError} when one does not build or cannot be pulled, naming the service
 */
export async function composeImages(
  task: HarborTask,
  project: ComposeProject,
  options: { socket?: string; signal?: AbortSignal },
): Promise<ComposeImages> {
  const timeoutSec = task.config.environment.buildTimeoutSec;
  const timeout = AbortSignal.timeout(timeoutSec * 1000);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  using engine = await EngineClient.open(options.socket, signal);
  const images = new Map<string, string>();
  let built = false;
  for (const s of project.services) {
    if (s.build === null) {
      await pullIfAbsent(engine, task, s, signal);
      images.set(s.name, s.image!);
      continue;
    }
    const hash = await sha256([await treeHash(s.build.context), s.build.dockerfile]);
    const tag = `hud-harbor-compose/${slug(task.name)}-${slug(s.name)}:${hash.slice(0, 16)}`;
    images.set(s.name, tag);
    if (await exists(engine, tag)) continue;
    await buildContext(engine, task, {
      dir: s.build.context,
      tag,
      timeoutSec,
      key: `[environment] (service "${s.name}")`,
      dockerfile: s.build.dockerfile,
      labels: {
        "dev.hud.harbor.task": task.name,
        "dev.hud.harbor.path": task.path,
        [SERVICE_LABEL]: s.name,
      },
    }, signal);
    built = true;
  }
  return { images, built };
}

async function exists(engine: EngineClient, image: string): Promise<boolean> {
  return await inspectImage(engine, image) !== null;
}

async function pullIfAbsent(
  engine: EngineClient,
  task: HarborTask,
  s: ComposeService,
  signal: AbortSignal,
): Promise<void> {
  const image = s.image!;
  if (await exists(engine, image)) return;
  const fail = (why: string): never => {
    throw new HarborBuildError(
      `Cannot run Harbor task "${task.name}": service "${s.name}": cannot pull image "${image}": ${why}`,
    );
  };
  let text = "";
  try {
    const res = await engine.raw("POST", `/images/create?fromImage=${encodeURIComponent(image)}`, {
      signal,
    });
    text = await res.text();
  } catch (err) {
    fail((err as Error).message);
  }
  const error = text.split("\n").map((l) => {
    try {
      return (JSON.parse(l) as { error?: string }).error;
    } catch {
      return undefined;
    }
  }).find((e) => e !== undefined);
  if (error !== undefined) fail(error);
  if (!await exists(engine, image)) fail("the engine did not keep it");
}

/** One rollout's services: what it made, to remove. */
class Project {
  readonly name: string;
  readonly labels: Record<string, string>;
  readonly #task: HarborTask;
  readonly #compose: ComposeProject;
  readonly #socket: string | undefined;
  readonly #ids = new Map<string, string>();

  constructor(task: HarborTask, socket: string | undefined) {
    this.#task = task;
    this.#compose = task.compose!;
    this.#socket = socket;
    this.name = `hud-${slug(task.name).slice(0, 40)}-${crypto.randomUUID().slice(0, 8)}`;
    this.labels = {
      [OWNER_LABEL]: String(Deno.pid),
      "dev.hud.harbor.task": task.name,
      "dev.hud.harbor.path": task.path,
      [PROJECT_LABEL]: this.name,
    };
  }

  network(name: string): string {
    return `${this.name}_${name}`;
  }

  volume(name: string): string {
    return `${this.name}_${name}`;
  }

  /**
   * Makes the networks and volumes, starts the services in order, and waits
   * for what `main` depends on. Creating calls take no signal: an abort
   * between the engine's create and its answer would leave a thing we hold
   * no name for; the abort is seen right after.
   */
  async up(images: Map<string, string>, internal: boolean, signal?: AbortSignal): Promise<void> {
    using engine = await EngineClient.open(this.#socket, signal);
    for (const n of this.#compose.networks) {
      await engine.call("POST", "/networks/create", {
        Name: this.network(n),
        Driver: "bridge",
        Internal: internal,
        CheckDuplicate: true,
        Labels: this.labels,
      });
      signal?.throwIfAborted();
    }
    for (const v of this.#compose.volumes) {
      await engine.call("POST", "/volumes/create", { Name: this.volume(v), Labels: this.labels });
      signal?.throwIfAborted();
    }
    for (const s of this.#compose.services) {
      await this.#await(engine, s, signal);
      const id = await this.#create(engine, s, images.get(s.name)!);
      signal?.throwIfAborted();
      for (const n of s.networks.slice(1)) {
        await connect(engine, id, { name: this.network(n), aliases: [s.name] }, signal);
      }
      await engine.call("POST", `/containers/${id}/start`, undefined, signal);
    }
    await this.#await(engine, this.#compose.main, signal);
  }

  async #create(engine: EngineClient, s: ComposeService, image: string): Promise<string> {
    const first = this.network(s.networks[0]);
    const created = await engine.call(
      "POST",
      `/containers/create?name=${encodeURIComponent(`${this.name}-${s.name}`)}`,
      {
        Image: image,
        Hostname: s.name,
        Env: Object.entries(s.environment).map(([k, v]) => `${k}=${v}`),
        ...(s.command !== null ? { Cmd: s.command } : {}),
        ...(s.entrypoint !== null ? { Entrypoint: s.entrypoint } : {}),
        ...(s.workingDir !== null ? { WorkingDir: s.workingDir } : {}),
        ...(s.user !== null ? { User: s.user } : {}),
        ...(s.healthcheck !== null
          ? {
            Healthcheck: {
              Test: s.healthcheck.test,
              Interval: Math.round(s.healthcheck.intervalMs * 1e6),
              Timeout: Math.round(s.healthcheck.timeoutMs * 1e6),
              Retries: s.healthcheck.retries,
              StartPeriod: Math.round(s.healthcheck.startPeriodMs * 1e6),
            },
          }
          : {}),
        Labels: { ...this.labels, [SERVICE_LABEL]: s.name },
        HostConfig: {
          NetworkMode: first,
          Mounts: s.volumes.map((v) => ({
            Type: "volume",
            Source: this.volume(v.source),
            Target: v.target,
            ReadOnly: v.readOnly,
          })),
          PidsLimit: 4096,
        },
        NetworkingConfig: { EndpointsConfig: { [first]: { Aliases: [s.name] } } },
      },
    ) as { Id: string };
    this.#ids.set(s.name, created.Id);
    return created.Id;
  }

  /** Waits until each of `s`'s dependencies meets its condition, each within its bound. */
  async #await(engine: EngineClient, s: ComposeService, signal?: AbortSignal): Promise<void> {
    for (const d of s.dependsOn) {
      const dep = this.#compose.services.find((x) => x.name === d.service)!;
      const id = this.#ids.get(d.service)!;
      const boundMs = conditionBound(dep, d.condition);
      const until = performance.now() + boundMs;
      // Podman runs healthchecks from systemd timers, which an API service
      // without systemd has none of: there the check is run at each interval
      // through Podman's own endpoint, which records its result as a timer would.
      const drive = d.condition === "service_healthy" && engine.product.startsWith("Podman");
      let nextCheck = performance.now();
      const fail = async (why: string): Promise<never> => {
        const logs = await engine.logs(id, 5).catch(() => "");
        const last = logs.trim().split("\n").filter((l) => l !== "").slice(-3).join(" | ");
        throw new Error(
          `Cannot start Harbor task "${this.#task.name}": service "${d.service}" ${why} (${s.name} depends_on it, ${d.condition}; ${this.#compose.file})${
            last ? `; last output: ${last}` : ""
          }`,
        );
      };
      while (true) {
        const info = await engine.call("GET", `/containers/${id}/json`, undefined, signal) as {
          State?: { Running?: boolean; ExitCode?: number; Health?: { Status?: string } };
        };
        const state = info.State ?? {};
        // Started is all compose asks here: it started it, whether it still runs or not.
        if (d.condition === "service_started") break;
        if (d.condition === "service_completed_successfully") {
          if (!state.Running) {
            if (state.ExitCode === 0) break;
            await fail(`exited with code ${state.ExitCode}`);
          }
        } else {
          if (!state.Running) {
            await fail(`exited with code ${state.ExitCode} before it was healthy`);
          }
          if (drive && performance.now() >= nextCheck) {
            nextCheck = performance.now() + dep.healthcheck!.intervalMs;
            await engine.call("GET", `/libpod/containers/${id}/healthcheck`, undefined, signal);
            continue;
          }
          const health = state.Health?.Status;
          if (health === "healthy") break;
          if (health === "unhealthy") await fail("is unhealthy (its healthcheck failed)");
        }
        if (performance.now() > until) {
          await fail(
            d.condition === "service_healthy"
              ? `did not become healthy within ${Math.ceil(boundMs / 1000)} s`
              : `did not complete within ${Math.ceil(boundMs / 1000)} s`,
          );
        }
        await delay(POLL_MS, signal);
      }
    }
  }

  /** Removes everything that carries the project's label: containers, then networks and volumes. */
  async down(): Promise<void> {
    using engine = await EngineClient.open(this.#socket);
    const filters = encodeURIComponent(
      JSON.stringify({ label: [`${PROJECT_LABEL}=${this.name}`] }),
    );
    const containers = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
      Id: string;
    }[];
    await Promise.all(containers.map((c) => removeContainer(engine, c.Id, 2)));
    const networks = await engine.call("GET", `/networks?filters=${filters}`) as { Name: string }[];
    for (const n of networks) {
      await engine.call("DELETE", `/networks/${encodeURIComponent(n.Name)}`).catch(ignoreGone);
    }
    const volumes = await engine.call("GET", `/volumes?filters=${filters}`) as {
      Volumes?: { Name: string }[] | null;
    };
    for (const v of volumes.Volumes ?? []) {
      await engine.call("DELETE", `/volumes/${encodeURIComponent(v.Name)}?force=true`).catch(
        ignoreGone,
      );
    }
  }
}

/** How long `dep` may take to meet `condition`, in ms. */
function conditionBound(dep: ComposeService, condition: ComposeCondition): number {
  const hc = dep.healthcheck;
  if (condition === "service_healthy") {
    return hc!.startPeriodMs + (hc!.retries + 1) * (hc!.intervalMs + hc!.timeoutMs) +
      HEALTH_SLACK_MS;
  }
  return condition === "service_completed_successfully" ? COMPLETION_BOUND_MS : 0;
}

/** The longest starting a compose task's services may wait on their conditions, in ms. */
export function composeStartBound(project: ComposeProject): number {
  let total = 0;
  for (const s of [...project.services, project.main]) {
    for (const d of s.dependsOn) {
      total += conditionBound(project.services.find((x) => x.name === d.service)!, d.condition);
    }
  }
  return total;
}

function ignoreGone(err: unknown): void {
  if (!(err instanceof EngineError && err.status === 404)) throw err;
}

/**
 * Places a compose task for each rollout: its services started (a
 * {@linkcode Project}), then `main` by a ContainerRuntime of `options` on
 * the project's networks and volumes; releasing the placement removes
 * `main`, then the rest. {@linkcode close} waits for every release.
 */
export class ComposeRuntime implements RuntimeProvider {
  readonly #task: HarborTask;
  readonly #image: string;
  readonly #images: Map<string, string>;
  readonly #options: ContainerRuntimeOptions;
  readonly #inflight = new Set<Promise<unknown>>();

  /**
   * @param task a task with a compose file
   * @param image the image of `main` (buildHarborImage's)
   * @param images the other services' images (composeImages')
   * @param options main's ContainerRuntime options (its `network` is the task's by phase)
   */
  constructor(
    task: HarborTask,
    image: string,
    images: Map<string, string>,
    options: ContainerRuntimeOptions,
  ) {
    this.#task = task;
    this.#image = image;
    this.#images = images;
    this.#options = options;
  }

  /** Starts the services, then places `main`; on any failure removes what it made. */
  place(options: PlaceOptions = {}): Promise<PlacementWithUrl> {
    return this.#track(this.#place(options));
  }

  /** Waits for every placement being made and every release. */
  async close(): Promise<void> {
    while (this.#inflight.size > 0) await Promise.allSettled([...this.#inflight]);
  }

  #track<T>(work: Promise<T>): Promise<T> {
    this.#inflight.add(work);
    const done = () => void this.#inflight.delete(work);
    work.then(done, done);
    return work;
  }

  async #place(options: PlaceOptions): Promise<PlacementWithUrl> {
    const compose = this.#task.compose!;
    const project = new Project(this.#task, this.#options.socket);
    const plan = resolveNetwork(this.#options.network);
    let runtime: ContainerRuntime | null = null;
    try {
      // No phase of main on a network outside: the services get no route out either.
      await project.up(this.#images, !needsNetwork(plan), options.signal);
      runtime = new ContainerRuntime(this.#image, {
        ...this.#options,
        env: { ...this.#options.env, ...compose.main.environment },
        labels: { ...this.#options.labels, ...project.labels, [SERVICE_LABEL]: "main" },
        networks: compose.main.networks.map((n) => ({
          name: project.network(n),
          aliases: ["main"],
        })),
        volumes: compose.main.volumes.map((v) => ({ ...v, source: project.volume(v.source) })),
      });
      const placement = await runtime.place(options);
      let released: Promise<void> | null = null;
      const release = () =>
        released ??= this.#track((async () => {
          try {
            await placement[Symbol.asyncDispose]();
          } finally {
            await runtime!.close();
            await project.down();
          }
        })());
      return placementOf(
        placement.address,
        { ...placement.params, project: project.name },
        release,
        placement.enterPhase?.bind(placement),
      );
    } catch (err) {
      await runtime?.close();
      // What did not start is removed; a removal that fails too is said with why it started.
      await project.down().catch((gone: unknown) => {
        throw new Error(`${(err as Error).message}; removing its services failed too: ${gone}`, {
          cause: err,
        });
      });
      throw err;
    }
  }
}
