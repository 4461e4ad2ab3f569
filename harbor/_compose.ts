// A Harbor task's `environment/docker-compose.yaml` (or .yml), read and
// checked: the subset this runner starts through the engine's API
// (harbor/_compose_run.ts), each other feature refused in one line naming it
// and the file. As Harbor's Docker environment merges it: the service `main`
// is the agent's (its image is the task's, built from environment/ or
// `docker_image`, so it takes no `image`, `build`, `command`, `entrypoint`,
// `user`, `working_dir` nor `healthcheck` of its own: the task says those);
// paths are relative to environment/ (Harbor's project directory); `${VAR}`
// is read from `[environment.env]` and Harbor's CONTEXT_DIR. `ports` and
// `expose` are ignored: services reach each other by name on the task's
// networks, and publishing on the host would open them to the host's network.

import { parseYaml } from "../engines/_yaml.ts";
import { isRecord } from "../_internal/util.ts";
import { duration, inside, interpolate, type Refuse, resolveIn, words } from "./_compose_fields.ts";

/** A `depends_on` condition, as compose names it. */
export type ComposeCondition =
  | "service_started"
  | "service_healthy"
  | "service_completed_successfully";

/** A service's healthcheck, durations in ms. */
export interface ComposeHealthcheck {
  /** The engine's `Test`: `["CMD", ...]` or `["CMD-SHELL", cmd]`. */
  test: string[];
  /** Between checks (`interval`; Docker's default 30 s). */
  intervalMs: number;
  /** A check's limit (`timeout`; 30 s). */
  timeoutMs: number;
  /** Failures in a row that make it unhealthy (`retries`; 3). */
  retries: number;
  /** Failures that do not count at first (`start_period`; 0). */
  startPeriodMs: number;
}

/** A named volume mounted into a service. */
export interface ComposeMount {
  /** The task's volume name. */
  source: string;
  /** Where it is mounted. */
  target: string;
  /** Whether it is mounted read-only (`:ro`). */
  readOnly: boolean;
}

/** One service, checked. */
export interface ComposeService {
  /** Its name: others reach it by it. */
  name: string;
  /** An image the engine has or pulls; null when built. */
  image: string | null;
  /** Absolute context and the Dockerfile's path in it; null when `image`. */
  build: { context: string; dockerfile: string } | null;
  /** `environment`. */
  environment: Record<string, string>;
  /** `command`, in words; null: the image's. */
  command: string[] | null;
  /** `entrypoint`, in words; null: the image's. */
  entrypoint: string[] | null;
  /** `depends_on`: what it waits for before it starts. */
  dependsOn: { service: string; condition: ComposeCondition }[];
  /** `healthcheck`; null when none (or disabled). */
  healthcheck: ComposeHealthcheck | null;
  /** The task's networks it joins (`default` when it names none). */
  networks: string[];
  /** The named volumes it mounts. */
  volumes: ComposeMount[];
  /** `working_dir`; null: the image's. */
  workingDir: string | null;
  /** `user`; null: the image's. */
  user: string | null;
}

/** A task's compose file, checked. */
export interface ComposeProject {
  /** The file, absolute. */
  file: string;
  /** The agent's service. */
  main: ComposeService;
  /** The others, in an order that starts each after what it depends on. */
  services: ComposeService[];
  /** The networks to make (`default` among them when a service uses it). */
  networks: string[];
  /** The named volumes to make. */
  volumes: string[];
}

/** A compose feature this runner does not carry out: the loader skips the task with its message. */
export class ComposeRefusal extends Error {
  /** Makes one. */
  constructor(message: string) {
    super(message);
    this.name = "ComposeRefusal";
  }
}

const SERVICE_KEYS = new Set([
  "image",
  "build",
  "environment",
  "command",
  "entrypoint",
  "depends_on",
  "healthcheck",
  "networks",
  "volumes",
  "working_dir",
  "user",
  "ports",
  "expose",
]);
/** What `main` may not set: the task's image, its server and Harbor's settings decide them. */
const MAIN_REFUSED = [
  "image",
  "build",
  "command",
  "entrypoint",
  "user",
  "working_dir",
  "healthcheck",
];
/** Where the runner's own files are in `main`: a volume there would share them with other services. */
const RUNNER_PATHS = /^\/(logs|tests|solution|opt\/hud-[^/]*)(\/|$)/;
const CONDITIONS = new Set([
  "service_started",
  "service_healthy",
  "service_completed_successfully",
]);
const NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;

/** The compose file of environment/ in `taskDir`, or null when it has none. */
export async function findComposeFile(taskDir: string): Promise<string | null> {
  for (const name of ["docker-compose.yaml", "docker-compose.yml"]) {
    const path = `${taskDir}/environment/${name}`;
    const info = await Deno.lstat(path).catch(() => null);
    if (info !== null) return path;
  }
  return null;
}

/**
 * Reads and checks the compose file `file` of the task at `taskDir`.
 *
 * @param text the file's text
 * @param vars what `${VAR}` may name
 * @throws {ComposeRefusal} naming the feature and the file
 */
export function parseCompose(
  file: string,
  text: string,
  taskDir: string,
  vars: Record<string, string>,
): ComposeProject {
  const refuse = (what: string): never => {
    throw new ComposeRefusal(`${file}: ${what}`);
  };
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    return refuse(`cannot read it: ${(err as Error).message}`);
  }
  doc = interpolate(doc, vars, refuse);
  if (!isRecord(doc)) return refuse("it is not a mapping");
  for (const key of Object.keys(doc)) {
    if (!["services", "networks", "volumes", "version", "name"].includes(key)) {
      refuse(`top-level "${key}" is not supported by this runner`);
    }
  }
  const declared = (key: "networks" | "volumes"): string[] => {
    const table = doc[key] ?? {};
    if (!isRecord(table)) return refuse(`"${key}" must be a mapping`);
    for (const [name, value] of Object.entries(table)) {
      if (!NAME.test(name)) refuse(`${key} "${name}": not a valid name`);
      if (value !== null && !(isRecord(value) && Object.keys(value).length === 0)) {
        refuse(
          `${key} "${name}": options (${
            Object.keys(value as object).join(", ")
          }) are not supported by this runner`,
        );
      }
    }
    return Object.keys(table);
  };
  const networks = declared("networks");
  const volumes = declared("volumes");
  const table = doc.services;
  if (!isRecord(table) || !isRecord(table.main)) {
    return refuse('it has no service "main" (the agent\'s, as Harbor names it)');
  }
  const services = Object.entries(table).map(([name, spec]) =>
    service(name, spec, { taskDir, file, networks, volumes, refuse })
  );
  const byName = new Map(services.map((s) => [s.name, s]));
  for (const s of services) {
    for (const d of s.dependsOn) {
      if (!byName.has(d.service)) {
        refuse(`service "${s.name}": depends_on "${d.service}": no such service`);
      }
      if (d.service === "main") refuse(`service "${s.name}": depends_on "main": main starts last`);
      if (d.condition === "service_healthy" && byName.get(d.service)!.healthcheck === null) {
        refuse(
          `service "${s.name}": depends_on "${d.service}" service_healthy: it has no healthcheck`,
        );
      }
    }
  }
  const used = new Set(services.flatMap((s) => s.networks));
  return {
    file,
    main: byName.get("main")!,
    services: startOrder(services.filter((s) => s.name !== "main"), refuse),
    networks: [...used].sort(),
    volumes,
  };
}

interface Context {
  taskDir: string;
  file: string;
  networks: string[];
  volumes: string[];
  refuse: Refuse;
}

function service(name: string, spec: unknown, ctx: Context): ComposeService {
  const refuse = (what: string) => ctx.refuse(`service "${name}": ${what}`);
  if (!NAME.test(name)) refuse("not a valid service name");
  if (!isRecord(spec)) return refuse("must be a mapping");
  for (const key of Object.keys(spec)) {
    if (!SERVICE_KEYS.has(key)) refuse(`"${key}" is not supported by this runner`);
    if (name === "main" && MAIN_REFUSED.includes(key)) {
      refuse(
        `"${key}" is not supported for main (its image, server and users are the task's: environment/Dockerfile or docker_image, task.toml)`,
      );
    }
  }
  if (name !== "main" && (spec.image === undefined) === (spec.build === undefined)) {
    refuse('needs one of "image" and "build"');
  }
  if (spec.image !== undefined && typeof spec.image !== "string") {
    refuse('"image" must be a string');
  }
  return {
    name,
    image: (spec.image as string | undefined) ?? null,
    build: spec.build === undefined ? null : build(spec.build, ctx, refuse),
    environment: environment(spec.environment, refuse),
    command: words(spec.command, "command", refuse),
    entrypoint: words(spec.entrypoint, "entrypoint", refuse),
    dependsOn: dependsOn(spec.depends_on, refuse),
    healthcheck: spec.healthcheck === undefined ? null : healthcheck(spec.healthcheck, refuse),
    networks: serviceNetworks(spec.networks, ctx.networks, refuse),
    volumes: mounts(spec.volumes, ctx.volumes, name === "main", refuse),
    workingDir: optionalString(spec.working_dir, "working_dir", refuse),
    user: optionalString(spec.user, "user", refuse),
  };
}

function optionalString(v: unknown, key: string, refuse: Refuse): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "string" && typeof v !== "number") refuse(`"${key}" must be a string`);
  return String(v);
}

/** `build`: a context (and Dockerfile) inside the task folder, reached through no symlink. */
function build(v: unknown, ctx: Context, refuse: Refuse): ComposeService["build"] {
  const spec = typeof v === "string" ? { context: v } : v;
  if (!isRecord(spec)) return refuse('"build" must be a path or a mapping');
  for (const key of Object.keys(spec)) {
    if (key !== "context" && key !== "dockerfile") {
      refuse(`build "${key}" is not supported by this runner`);
    }
  }
  const context = resolveIn(`${ctx.taskDir}/environment`, String(spec.context ?? "."));
  const dockerfile = String(spec.dockerfile ?? "Dockerfile");
  const path = resolveIn(context, dockerfile);
  if (!inside(context, ctx.taskDir) || !inside(path, context)) {
    refuse(
      `build context "${
        spec.context ?? "."
      }" with dockerfile "${dockerfile}" leads outside the task folder`,
    );
  }
  for (const p of [context, path]) {
    let real: string;
    try {
      real = Deno.realPathSync(p);
    } catch {
      return refuse(`build: "${p}" does not exist`);
    }
    // Reached through a symlink: what it leads to is not what was checked.
    if (real !== p) refuse(`build: "${p}" is reached through a symlink (to "${real}")`);
  }
  return { context, dockerfile: path.slice(context.length + 1) };
}

function environment(v: unknown, refuse: Refuse): Record<string, string> {
  if (v === undefined || v === null) return {};
  const out: Record<string, string> = {};
  const entries: [string, unknown][] = Array.isArray(v)
    ? v.map((item) => {
      const s = String(item);
      const at = s.indexOf("=");
      // "NAME" alone takes this host's value in compose: none is passed on here.
      if (at < 0) refuse(`environment "${s}": a variable without a value is not supported`);
      return [s.slice(0, at), s.slice(at + 1)];
    })
    : isRecord(v)
    ? Object.entries(v)
    : refuse('"environment" must be a mapping or a list');
  for (const [k, value] of entries) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) refuse(`environment "${k}": not a variable name`);
    if (value === null) refuse(`environment "${k}": a variable without a value is not supported`);
    if (typeof value === "object") refuse(`environment "${k}": must be a scalar`);
    out[k] = String(value);
  }
  return out;
}

function dependsOn(v: unknown, refuse: Refuse): ComposeService["dependsOn"] {
  if (v === undefined || v === null) return [];
  if (Array.isArray(v)) return v.map((s) => ({ service: String(s), condition: "service_started" }));
  if (!isRecord(v)) return refuse('"depends_on" must be a list or a mapping');
  return Object.entries(v).map(([service, spec]) => {
    const condition = isRecord(spec)
      ? spec.condition ?? "service_started"
      : spec === null
      ? "service_started"
      : undefined;
    const extra = isRecord(spec) ? Object.keys(spec).filter((k) => k !== "condition") : [];
    if (extra.length > 0) {
      refuse(`depends_on "${service}": "${extra[0]}" is not supported by this runner`);
    }
    if (typeof condition !== "string" || !CONDITIONS.has(condition)) {
      refuse(
        `depends_on "${service}": condition ${
          JSON.stringify(condition)
        } is not supported (service_started, service_healthy or service_completed_successfully)`,
      );
    }
    return { service, condition: condition as ComposeCondition };
  });
}

function healthcheck(v: unknown, refuse: Refuse): ComposeHealthcheck | null {
  if (!isRecord(v)) return refuse('"healthcheck" must be a mapping');
  for (const key of Object.keys(v)) {
    if (!["test", "interval", "timeout", "retries", "start_period", "disable"].includes(key)) {
      refuse(`healthcheck "${key}" is not supported by this runner`);
    }
  }
  if (v.disable === true) return null;
  const t = v.test;
  const test = typeof t === "string"
    ? ["CMD-SHELL", t]
    : Array.isArray(t) && t.length > 0 && ["CMD", "CMD-SHELL", "NONE"].includes(String(t[0]))
    ? t.map(String)
    : refuse('healthcheck "test" must be a string or a list starting with CMD, CMD-SHELL or NONE');
  if (test[0] === "NONE") return null;
  const retries = v.retries ?? 3;
  if (!Number.isSafeInteger(retries) || (retries as number) < 1) {
    refuse(`healthcheck "retries" must be an integer >= 1, got ${JSON.stringify(retries)}`);
  }
  // Docker's defaults: 30 s between checks, 30 s each.
  return {
    test,
    intervalMs: duration(v.interval, "interval", 30_000, refuse),
    timeoutMs: duration(v.timeout, "timeout", 30_000, refuse),
    retries: retries as number,
    startPeriodMs: duration(v.start_period, "start_period", 0, refuse),
  };
}

function serviceNetworks(v: unknown, declared: string[], refuse: Refuse): string[] {
  if (v === undefined || v === null) return ["default"];
  const names = Array.isArray(v)
    ? v.map(String)
    : isRecord(v)
    ? Object.keys(v)
    : refuse('"networks" must be a list or a mapping');
  if (isRecord(v)) {
    for (const [n, spec] of Object.entries(v)) {
      if (spec !== null && !(isRecord(spec) && Object.keys(spec).length === 0)) {
        refuse(`networks "${n}": options (aliases, addresses) are not supported by this runner`);
      }
    }
  }
  for (const n of names) {
    if (n !== "default" && !declared.includes(n)) {
      refuse(`networks "${n}": not declared in the file's "networks"`);
    }
  }
  return names;
}

function mounts(
  v: unknown,
  declared: string[],
  main: boolean,
  refuse: Refuse,
): ComposeMount[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) return refuse('"volumes" must be a list');
  return v.map((item) => {
    if (typeof item !== "string") {
      return refuse('volumes: only the short form ("name:/path[:ro]") is supported by this runner');
    }
    const [source, target, mode, ...more] = item.split(":");
    if (
      target === undefined || more.length > 0 ||
      (mode !== undefined && mode !== "ro" && mode !== "rw")
    ) {
      refuse(`volumes "${item}": only "name:/path[:ro]" is supported by this runner`);
    }
    if (!declared.includes(source)) {
      refuse(
        `volumes "${item}": "${source}" is not a volume the file declares (bind mounts of host paths are not supported)`,
      );
    }
    if (!target.startsWith("/")) refuse(`volumes "${item}": the target must be an absolute path`);
    if (main && RUNNER_PATHS.test(resolveIn("/", target))) {
      refuse(
        `volumes "${item}": the runner's own paths (/logs, /tests, /solution) are not shared with other services`,
      );
    }
    return { source, target, readOnly: mode === "ro" };
  });
}

/** The services ordered so each comes after what it depends on; a cycle is refused. */
function startOrder(services: ComposeService[], refuse: Refuse): ComposeService[] {
  const byName = new Map(services.map((s) => [s.name, s]));
  const out: ComposeService[] = [];
  const state = new Map<string, "visiting" | "done">();
  const visit = (s: ComposeService, path: string[]) => {
    if (state.get(s.name) === "done") return;
    if (state.get(s.name) === "visiting") {
      refuse(`depends_on has a cycle: ${[...path, s.name].join(" -> ")}`);
    }
    state.set(s.name, "visiting");
    for (const d of s.dependsOn) visit(byName.get(d.service)!, [...path, s.name]);
    state.set(s.name, "done");
    out.push(s);
  };
  for (const s of [...services].sort((a, b) => a.name.localeCompare(b.name))) visit(s, []);
  return out;
}
