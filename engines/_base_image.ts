// A FROM-scratch base image of this machine's own shell tools, for
// environments whose workspace runs commands in a container (`hud image
// base`): bash, coreutils, grep, sed, bc, bubblewrap (the workspace's
// sandbox), setpriv, prlimit and env, with every library they link (ldd),
// and, when asked, whole Debian packages of this machine (`packages`: e.g.
// Python or gcc for the Harbor tests' Terminal-Bench tasks). Deno and its
// libraries are added by buildEnvironmentImage. A debootstrap rootfs works
// too, but took 356 s here.

import { EngineClient, EngineError } from "./_engine.ts";
import { TarWriter } from "./_tar.ts";

const TOOLS = ["bash", "grep", "sed", "bc", "bwrap", "setpriv", "prlimit", "env"];

/** Options for {@linkcode buildBaseImage}. */
export interface BuildBaseImageOptions {
  /** Engine socket. @default as ContainerRuntimeOptions.socket */
  socket?: string;
  /** More files: path in the image to content (mode 0755). @default {} */
  extra?: Record<string, Uint8Array>;
  /**
   * Debian packages installed on this machine, copied in whole (every file
   * and symlink `dpkg -L` lists, modes kept, hard links as symlinks), with
   * the libraries their programs and shared objects link.
   * @default []
   */
  packages?: readonly string[];
  /** Aborts the build. */
  signal?: AbortSignal;
}

/** What `cmd args` prints, or an error with what it said. */
export async function output(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return new TextDecoder().decode(out.stdout);
}

/** The shared libraries `ldd` lists for `bin`, as absolute paths. */
export async function linkedLibraries(bin: string): Promise<string[]> {
  const ldd = await output("ldd", [bin]).catch(() => "");
  return [...new Set(ldd.match(/\/[^ :()]+\.so[^ :()]*/g) ?? [])];
}

/** A path on a merged-/usr system, as it sits in the rootfs. */
export function inUsr(path: string): string {
  return path.replace(/^\/(bin|sbin|lib|lib64)\//, "/usr/$1/");
}

/** Sends a build context to the engine; returns the image id (empty when the engine gave none). */
export async function buildContext(
  tar: TarWriter,
  tag: string,
  options: { socket?: string; signal?: AbortSignal },
): Promise<string> {
  using engine = await EngineClient.open(options.socket, options.signal);
  const res = await engine.raw("POST", `/build?t=${encodeURIComponent(tag)}&rm=1&forcerm=1`, {
    body: tar.bytes(),
    headers: { "content-type": "application/x-tar" },
    signal: options.signal,
  });
  // The build reports as a JSON stream; an error arrives inside it, with status 200.
  let imageId = "";
  for (const line of (await res.text()).split("\n")) {
    if (line.trim() === "") continue;
    const msg = JSON.parse(line) as { error?: string; aux?: { ID?: string } };
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

/**
 * Adds the files and symlinks of Debian package `pkg` (as `dpkg -L` lists
 * them) to `files` and `links`, and the libraries its ELF files link to
 * `libs`. A second name for a file (a hard link, by `seen`'s device:inode
 * keys) becomes a symlink to the first, so that it costs one copy.
 */
async function addPackage(
  pkg: string,
  files: Map<string, { host: string; mode: number }>,
  links: Map<string, string>,
  libs: Set<string>,
  seen: Map<string, string>,
): Promise<void> {
  const list = await output("dpkg", ["-L", pkg]).catch((err) => {
    throw new Error(
      `Cannot build base image: package "${pkg}" is not installed on this machine; install it (apt-get install ${pkg})`,
      { cause: err },
    );
  });
  for (const host of list.split("\n")) {
    // Documentation is left out: it is most of some packages' size.
    if (!host.startsWith("/") || /^\/usr\/share\/(doc|man|info|locale|lintian)\//.test(host)) {
      continue;
    }
    let info: Deno.FileInfo;
    try {
      info = await Deno.lstat(host);
    } catch (err) {
      // dpkg lists files a diversion or a later package moved away.
      if (err instanceof Deno.errors.NotFound) continue;
      throw err;
    }
    const path = inUsr(host);
    if (info.isSymlink) {
      links.set(path, await Deno.readLink(host));
    } else if (info.isFile && !files.has(path)) {
      const key = `${info.dev}:${info.ino}`;
      const first = seen.get(key);
      if (first !== undefined) {
        links.set(path, first);
        continue;
      }
      seen.set(key, path);
      const mode = info.mode! & 0o7777;
      files.set(path, { host, mode });
      if ((mode & 0o111) !== 0 || /\.so(\.|$)/.test(host)) {
        for (const lib of await linkedLibraries(host)) libs.add(lib);
      }
    }
  }
}

/**
 * Builds the base image as `tag`: this machine's shell tools and their
 * libraries, merged /usr, `root` and `nobody` in /etc/passwd.
 *
 * @returns the image id
 */
export async function buildBaseImage(
  tag: string,
  options: BuildBaseImageOptions = {},
): Promise<string> {
  const { files, links } = await hostTree(options.packages ?? []);
  const tar = new TarWriter();
  for (const d of ["usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc"]) tar.dir(`root/${d}`);
  for (const l of ["bin", "sbin", "lib", "lib64"]) tar.symlink(`root/${l}`, `usr/${l}`);
  tar.dir("root/tmp", 0o1777);
  tar.file(
    "root/etc/passwd",
    new TextEncoder().encode("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/bin/sh\n"),
  );
  tar.file("root/etc/group", new TextEncoder().encode("root:x:0:\nnogroup:x:65534:\n"));
  for (const [path, { host, mode }] of files) {
    tar.file(`root${path}`, await Deno.readFile(host), mode);
  }
  if (!files.has("/usr/bin/sh") && !links.has("/usr/bin/sh")) links.set("/usr/bin/sh", "bash");
  for (const [path, target] of links) if (!files.has(path)) tar.symlink(`root${path}`, target);
  for (const [path, data] of Object.entries(options.extra ?? {})) {
    tar.file(`root${path}`, data, 0o755);
  }
  tar.file(
    "Dockerfile",
    new TextEncoder().encode(
      `FROM scratch\nCOPY root/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n` +
        `LABEL "dev.hud.base"="shell"\n`,
    ),
  );
  return await buildContext(tar, tag, options);
}

/**
 * What the base image takes from this machine, by its path in the image
 * (merged /usr): coreutils' and the tools' binaries, the packages' files,
 * and every library they link; and the symlinks among them.
 */
async function hostTree(packages: readonly string[]): Promise<{
  files: Map<string, { host: string; mode: number }>;
  links: Map<string, string>;
}> {
  const coreutils = (await output("dpkg", ["-L", "coreutils"])).split("\n")
    .filter((p) => /^\/(usr\/)?bin\/[^/]+$/.test(p));
  const bins = new Set<string>();
  for (const p of [...coreutils, ...TOOLS.map((t) => `/usr/bin/${t}`)]) {
    try {
      bins.add(await Deno.realPath(p));
    } catch {
      // not on this machine (bc is optional: only the third lab's check uses it)
    }
  }
  const libs = new Set<string>();
  for (const bin of bins) for (const lib of await linkedLibraries(bin)) libs.add(lib);
  const files = new Map<string, { host: string; mode: number }>();
  const links = new Map<string, string>();
  for (const bin of bins) files.set(inUsr(bin), { host: bin, mode: 0o755 });
  const seen = new Map<string, string>();
  for (const pkg of packages) await addPackage(pkg, files, links, libs, seen);
  for (const lib of libs) {
    const path = inUsr(lib);
    if (!files.has(path)) files.set(path, { host: await Deno.realPath(lib), mode: 0o755 });
  }
  return { files, links };
}
