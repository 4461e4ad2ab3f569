/**
 * {@linkcode buildEnvironmentImage}: an OCI image of an environment module,
 * built with the local engine and no registry.
 *
 * @module
 */

import { checkV8Flags, SERVER_V8_FLAGS } from "../runtime/subprocess.ts";
import { TarWriter } from "./_tar.ts";
import { buildContext, inUsr, linkedLibraries, output } from "./_base_image.ts";
import { CONTAINER_PORT, CONTROL_LABEL, ENV_LABEL, ENV_VERSION_LABEL } from "./_constants.ts";

/** Options for {@linkcode buildEnvironmentImage}. */
export interface BuildImageOptions {
  /**
   * Engine socket.
   * @default as {@linkcode ContainerRuntimeOptions.socket}
   */
  socket?: string;
  /**
   * Base image (one with bash and coreutils, for workspaces); `scratch` holds
   * only Deno and the libraries it links.
   * @default "scratch"
   */
  from?: string;
  /** Labels: `dev.hud.env` and the version are added. */
  labels?: Record<string, string>;
  /** The environment's name, for the `dev.hud.env` label. */
  envName: string;
  /** The environment's version, for the `dev.hud.env.version` label. */
  envVersion: string;
  /**
   * V8 flags the image's server starts with; `[]` keeps V8's defaults.
   * @default {@linkcode SERVER_V8_FLAGS}
   */
  v8Flags?: readonly string[];
  /**
   * Where the module and the SDK go in the image (a base image's own `/app`
   * may be the agent's working directory).
   * @default "/app"
   */
  appDir?: string;
  /**
   * More files for the image, by absolute path (a task's facts, say).
   * @default {}
   */
  files?: Record<string, Uint8Array>;
  /** Aborts the build. */
  signal?: AbortSignal;
}

const SDK_ROOT = new URL("../", import.meta.url);

interface GraphInfo {
  modules: {
    local?: string;
    specifier: string;
    error?: string;
    dependencies?: { specifier: string; code?: { specifier?: string; error?: string } }[];
  }[];
}

/** A module graph: its local files, and where each bare specifier in it resolved. */
interface Graph {
  files: string[];
  bare: Map<string, string>;
}

/** The nearest deno.json or deno.jsonc above `file`, the config `deno run FILE` from there uses. */
async function nearestConfig(file: string): Promise<string | null> {
  let dir = file.slice(0, file.lastIndexOf("/"));
  while (true) {
    for (const name of ["deno.json", "deno.jsonc"]) {
      const path = `${dir}/${name}`;
      if (await Deno.stat(path).then((s) => s.isFile, () => false)) return path;
    }
    if (dir === "") return null;
    dir = dir.slice(0, dir.lastIndexOf("/"));
  }
}

/**
 * The module graph of `entry` as `deno info` resolves it with `config`.
 * Refuses a graph with an import that does not resolve: the image could not
 * start.
 */
async function moduleGraph(entry: string, config: string | null, shown: string): Promise<Graph> {
  const args = ["info", "--json", ...(config === null ? [] : ["--config", config]), entry];
  const info = JSON.parse(await output(Deno.execPath(), args)) as GraphInfo;
  const files: string[] = [];
  const bare = new Map<string, string>();
  for (const m of info.modules) {
    if (m.error) {
      throw new Error(`Cannot build image: "${shown}" imports ${m.specifier}: ${m.error}`);
    }
    if (m.specifier.startsWith("file:") && m.local) files.push(m.local);
    for (const dep of m.dependencies ?? []) {
      // A type-only import has no code: nothing of it runs.
      if (dep.code === undefined) continue;
      const to = dep.code.specifier;
      if (dep.code.error || to === undefined) {
        throw new Error(
          `Cannot build image: "${shown}" imports "${dep.specifier}", which does not resolve ` +
            `(${dep.code.error ?? "no module"}); map it in ${
              config ?? "a deno.json beside the module"
            } (see the README)`,
        );
      }
      // The image holds the files under its app directory, not at their paths here.
      if (dep.specifier.startsWith("/") || /^file:/i.test(dep.specifier)) {
        throw new Error(
          `Cannot build image: "${shown}" imports "${dep.specifier}" by its path on this ` +
            `machine, which the image does not have; import it by a relative path, or map it ` +
            `in ${config ?? "a deno.json beside the module"} (see the README)`,
        );
      }
      if (/^(\.{0,2}\/|[a-z][a-z0-9+.-]*:)/i.test(dep.specifier)) continue;
      const before = bare.get(dep.specifier);
      if (before !== undefined && before !== to) {
        throw new Error(
          `Cannot build image: "${dep.specifier}" resolves to both ${before} and ${to}; ` +
            `map it once`,
        );
      }
      bare.set(dep.specifier, to);
    }
  }
  return { files, bare };
}

function commonDir(paths: string[]): string {
  let common = paths[0].split("/").slice(0, -1);
  for (const p of paths) {
    const parts = p.split("/");
    let i = 0;
    while (i < common.length && common[i] === parts[i]) i++;
    common = common.slice(0, i);
  }
  return common.join("/") || "/";
}

/**
 * Builds an OCI image of an environment module with the local engine, no
 * registry needed: Deno's own binary and the shared libraries it links
 * (`ldd`), the module and its local imports, and this SDK's command line,
 * started as `serve` on port 8765 (`_container_main.ts`): on the
 * container's loopback behind the unix socket {@linkcode ContainerRuntime}
 * shares (label `dev.hud.control=socket`), with the token it passes in
 * `HUD_SERVE_TOKEN`; or, when no socket is given (a swarm replica, HUD's
 * DockerRuntime), on every interface for the engine to publish, with
 * `--no-auth-without-token`: without authentication when started with no
 * token either (HUD's runtimes send none), as HUD's own images serve. A
 * `FROM scratch` image has `root` and `nobody` (65534, the user
 * ContainerRuntime runs as) in /etc/passwd; Deno's libraries are added to
 * any base. The bare imports of the module (`"@hud/sdk"`, mapped by the
 * nearest `deno.json` above it) are mapped where they sit in the image.
 *
 * @param modulePath the environment module
 * @param tag the image name
 * @param options base image, labels, engine socket
 * @returns the image id
 * @throws {Error} when an import of the module does not resolve, or names a
 *   file by absolute path or `file:` URL (the image could not start)
 */
export async function buildEnvironmentImage(
  modulePath: string,
  tag: string,
  options: BuildImageOptions,
): Promise<string> {
  checkV8Flags("the image", options.v8Flags);
  const appDir = (options.appDir ?? "/app").replace(/\/+$/, "");
  if (!appDir.startsWith("/") || appDir === "") {
    throw new TypeError(`Cannot build image "${tag}": appDir "${appDir}" must be an absolute path`);
  }
  for (const path of Object.keys(options.files ?? {})) {
    if (!path.startsWith("/") || path.split("/").includes("..")) {
      throw new TypeError(`Cannot build image "${tag}": file "${path}" must be an absolute path`);
    }
  }
  const app = await appFiles(modulePath, appDir);
  const from = options.from ?? "scratch";
  const tar = new TarWriter();
  await addRuntime(tar, from);
  for (const f of app.files) tar.file(`root${app.at(f)}`, await Deno.readFile(f));
  for (const [path, data] of Object.entries(options.files ?? {})) tar.file(`root${path}`, data);
  // No lock file: the image is read-only.
  tar.file(
    `root${appDir}/.hud_imports.json`,
    new TextEncoder().encode(JSON.stringify({ imports: app.imports, lock: false }, null, 2) + "\n"),
  );
  const cmd = [
    "/usr/local/bin/deno",
    "run",
    "-A",
    ...v8FlagsArgs(options.v8Flags ?? SERVER_V8_FLAGS),
    `--config=${appDir}/.hud_imports.json`,
    app.at(app.entry),
    app.at(app.cli),
    app.at(app.module),
  ];
  tar.file("Dockerfile", new TextEncoder().encode(dockerfile(from, cmd, options)));
  return await buildContext(tar, tag, options);
}

/** `--v8-flags=...`, or nothing for V8's defaults. */
function v8FlagsArgs(flags: readonly string[]): string[] {
  return flags.length === 0 ? [] : [`--v8-flags=${flags.join(",")}`];
}

/**
 * The files of this machine that {@linkcode buildEnvironmentImage} puts in
 * an image of `modulePath` (the module's graph, the CLI's and the entry
 * program's), by absolute path, sorted: what a cache key of such an image
 * hashes.
 */
export async function environmentImageFiles(modulePath: string): Promise<string[]> {
  return (await appFiles(modulePath, "/app")).files.sort();
}

/** What goes under the image's app directory, and where each file lands there. */
interface AppFiles {
  /** Host paths: the module's graph, the CLI's and the entry program's. */
  files: string[];
  /** A host path's place in the image. */
  at(path: string): string;
  /** The module's bare specifiers, mapped where they sit in the image. */
  imports: Record<string, string>;
  module: string;
  cli: string;
  entry: string;
}

/**
 * The module's graph as `deno run` from its project resolves it (so that
 * "@hud/sdk" and the project's other mapped imports go into the image), and
 * this SDK's own files, which resolve by relative paths with its own config.
 */
async function appFiles(modulePath: string, appDir: string): Promise<AppFiles> {
  const module = await Deno.realPath(modulePath);
  const cli = new URL("cli.ts", SDK_ROOT).pathname;
  const entry = new URL("_container_main.ts", import.meta.url).pathname;
  const user = await moduleGraph(module, await nearestConfig(module), String(modulePath));
  const sdkConfig = new URL("deno.json", SDK_ROOT).pathname;
  const files = [
    ...new Set([
      ...user.files,
      ...(await moduleGraph(cli, sdkConfig, cli)).files,
      ...(await moduleGraph(entry, sdkConfig, entry)).files,
    ]),
  ];
  const root = commonDir(files);
  const at = (p: string) => `${appDir}/${p.slice(root === "/" ? 1 : root.length + 1)}`;
  // The image holds no deno.json of the project's: its paths point outside.
  const imports: Record<string, string> = {};
  for (const [name, to] of user.bare) {
    imports[name] = to.startsWith("file:")
      ? `file://${at(decodeURIComponent(new URL(to).pathname))}`
      : to;
  }
  return { files, at, imports, module, cli, entry };
}

/**
 * Deno's binary and the libraries it links (at the paths ldd names: through
 * merged /usr on scratch, which also gets `root` and `nobody`, the user
 * ContainerRuntime runs as, that scp and whoami want a name for).
 */
async function addRuntime(tar: TarWriter, from: string): Promise<void> {
  if (from === "scratch") {
    for (const d of ["usr/bin", "usr/lib", "usr/lib64", "etc"]) tar.dir(`root/${d}`);
    tar.symlink("root/bin", "usr/bin");
    tar.symlink("root/lib", "usr/lib");
    tar.symlink("root/lib64", "usr/lib64");
    tar.file(
      "root/etc/passwd",
      new TextEncoder().encode("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"),
    );
    tar.file("root/etc/group", new TextEncoder().encode("root:x:0:\nnogroup:x:65534:\n"));
  }
  tar.dir("root/tmp", 0o1777);
  const deno = await Deno.realPath(Deno.execPath());
  tar.file("root/usr/local/bin/deno", await Deno.readFile(deno), 0o755);
  // On any base (a minimal one may lack libdl).
  for (const lib of await linkedLibraries(deno)) {
    const path = from === "scratch" ? inUsr(lib) : lib;
    tar.file(`root${path}`, await Deno.readFile(await Deno.realPath(lib)), 0o755);
  }
}

/** The image's Dockerfile: its labels, the port, the server's command. */
function dockerfile(from: string, cmd: string[], options: BuildImageOptions): string {
  const labels = {
    ...options.labels,
    [ENV_LABEL]: options.envName,
    [ENV_VERSION_LABEL]: options.envVersion,
    [CONTROL_LABEL]: "socket",
  };
  return [
    `FROM ${from}`,
    "COPY root/ /",
    "ENV DENO_DIR=/tmp/deno HOME=/tmp NO_COLOR=1",
    `LABEL ${
      Object.entries(labels).map(([k, v]) => `${JSON.stringify(k)}=${JSON.stringify(v)}`).join(" ")
    }`,
    `EXPOSE ${CONTAINER_PORT}`,
    // A base image's ENTRYPOINT would take the server's command as its arguments.
    ...(from === "scratch" ? [] : ["ENTRYPOINT []"]),
    `CMD ${JSON.stringify(cmd)}`,
    "",
  ].join("\n");
}
