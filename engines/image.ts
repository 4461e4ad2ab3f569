/**
 * {@linkcode buildEnvironmentImage}: an OCI image of an environment module,
 * built with the local engine and no registry.
 *
 * @module
 */

import { checkV8Flags, SERVER_V8_FLAGS } from "../runtime/subprocess.ts";
import { EngineClient, EngineError } from "./_engine.ts";
import { TarWriter } from "./_tar.ts";
import { CONTAINER_PORT, CONTROL_LABEL, ENV_LABEL } from "./container.ts";

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
  /** Aborts the build. */
  signal?: AbortSignal;
}

const SDK_ROOT = new URL("../", import.meta.url);

async function run(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return new TextDecoder().decode(out.stdout);
}

/** Local files of a module graph, as absolute paths. */
async function localModules(entry: string): Promise<string[]> {
  const info = JSON.parse(await run(Deno.execPath(), ["info", "--json", entry])) as {
    modules: { local?: string; specifier: string }[];
  };
  return info.modules.filter((m) => m.specifier.startsWith("file:") && m.local).map((m) =>
    m.local!
  );
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
 * ContainerRuntime runs as) in /etc/passwd.
 *
 * @param modulePath the environment module
 * @param tag the image name
 * @param options base image, labels, engine socket
 * @returns the image id
 */
export async function buildEnvironmentImage(
  modulePath: string,
  tag: string,
  options: BuildImageOptions,
): Promise<string> {
  checkV8Flags("the image", options.v8Flags);
  const v8Flags = options.v8Flags ?? SERVER_V8_FLAGS;
  const modulePathAbs = await Deno.realPath(modulePath);
  const cli = new URL("cli.ts", SDK_ROOT).pathname;
  const entry = new URL("_container_main.ts", import.meta.url).pathname;
  const files = [
    ...new Set([
      ...await localModules(modulePathAbs),
      ...await localModules(cli),
      ...await localModules(entry),
    ]),
  ];
  const root = commonDir(files);
  const rel = (p: string) => p.slice(root === "/" ? 1 : root.length + 1);
  const tar = new TarWriter();
  const from = options.from ?? "scratch";
  if (from === "scratch") {
    // Merged /usr, so that the paths ldd prints resolve.
    for (const d of ["usr/bin", "usr/lib", "usr/lib64", "etc"]) tar.dir(`root/${d}`);
    tar.symlink("root/bin", "usr/bin");
    tar.symlink("root/lib", "usr/lib");
    tar.symlink("root/lib64", "usr/lib64");
    // nobody: the user ContainerRuntime runs as (scp and whoami want a name).
    tar.file(
      "root/etc/passwd",
      new TextEncoder().encode("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"),
    );
    tar.file("root/etc/group", new TextEncoder().encode("root:x:0:\nnogroup:x:65534:\n"));
  }
  tar.dir("root/tmp", 0o1777);
  const deno = await Deno.realPath(Deno.execPath());
  tar.file("root/usr/local/bin/deno", await Deno.readFile(deno), 0o755);
  if (from === "scratch") {
    const libs = (await run("ldd", [deno])).match(/\/[^ :()]+\.so[^ :()]*/g) ?? [];
    for (const lib of new Set(libs)) {
      const real = await Deno.realPath(lib);
      tar.file(
        `root${lib.replace(/^\/(lib|lib64)\//, "/usr/$1/")}`,
        await Deno.readFile(real),
        0o755,
      );
    }
  }
  for (const f of files) tar.file(`root/app/${rel(f)}`, await Deno.readFile(f));
  const labels = {
    ...options.labels,
    [ENV_LABEL]: options.envName,
    "dev.hud.env.version": options.envVersion,
    [CONTROL_LABEL]: "socket",
  };
  const cmd = [
    "/usr/local/bin/deno",
    "run",
    "-A",
    ...(v8Flags.length === 0 ? [] : [`--v8-flags=${v8Flags.join(",")}`]),
    `/app/${rel(entry)}`,
    `/app/${rel(cli)}`,
    `/app/${rel(modulePathAbs)}`,
  ];
  const dockerfile = [
    `FROM ${from}`,
    "COPY root/ /",
    "ENV DENO_DIR=/tmp/deno HOME=/tmp NO_COLOR=1",
    `LABEL ${
      Object.entries(labels).map(([k, v]) => `${JSON.stringify(k)}=${JSON.stringify(v)}`).join(" ")
    }`,
    `EXPOSE ${CONTAINER_PORT}`,
    `CMD ${JSON.stringify(cmd)}`,
    "",
  ].join("\n");
  tar.file("Dockerfile", new TextEncoder().encode(dockerfile));
  using engine = await EngineClient.open(options.socket, options.signal);
  const res = await engine.raw("POST", `/build?t=${encodeURIComponent(tag)}&rm=1&forcerm=1`, {
    body: tar.bytes(),
    headers: { "content-type": "application/x-tar" },
    signal: options.signal,
  });
  // The build reports as a JSON stream; an error arrives inside it, with status 200.
  const text = await res.text();
  let imageId = "";
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    const msg = JSON.parse(line) as { error?: string; aux?: { ID?: string }; stream?: string };
    if (msg.error) throw new EngineError(`Cannot build image "${tag}": ${msg.error.trim()}`, 500);
    if (msg.aux?.ID) imageId = msg.aux.ID;
  }
  if (imageId === "") {
    const info = await engine.call("GET", `/images/${encodeURIComponent(tag)}/json`) as {
      Id: string;
    };
    imageId = info.Id;
  }
  return imageId;
}
