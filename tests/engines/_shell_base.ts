// A FROM-scratch base image of this machine's own shell tools, for
// environments whose workspace runs commands in a container: bash,
// coreutils, grep, sed, bc, bubblewrap (the workspace's sandbox), setpriv,
// prlimit and env, with every library they and Deno link (ldd). A
// debootstrap rootfs works too, but took 356 s here: too slow for CI.

import { EngineClient } from "../../engines/_engine.ts";
import { TarWriter } from "../../engines/_tar.ts";

const TOOLS = ["bash", "grep", "sed", "bc", "bwrap", "setpriv", "prlimit", "env"];

async function output(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
  return new TextDecoder().decode(out.stdout);
}

/** A path on a merged-/usr system, as it sits in the rootfs. */
function inUsr(path: string): string {
  return path.replace(/^\/(bin|sbin|lib|lib64)\//, "/usr/$1/");
}

/**
 * Builds the base image as `tag` on the engine at `socket` (default: the
 * default one), with `extra` files (path in the image: content, mode 0755).
 */
export async function buildShellBase(
  tag: string,
  socket?: string,
  extra: Record<string, Uint8Array> = {},
): Promise<void> {
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
  for (const bin of [...bins, await Deno.realPath(Deno.execPath())]) {
    const ldd = await output("ldd", [bin]).catch(() => "");
    for (const lib of ldd.match(/\/[^ :()]+\.so[^ :()]*/g) ?? []) libs.add(lib);
  }
  const tar = new TarWriter();
  for (const d of ["usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc"]) tar.dir(`root/${d}`);
  for (const l of ["bin", "sbin", "lib", "lib64"]) tar.symlink(`root/${l}`, `usr/${l}`);
  tar.dir("root/tmp", 0o1777);
  tar.file(
    "root/etc/passwd",
    new TextEncoder().encode("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/bin/sh\n"),
  );
  tar.file("root/etc/group", new TextEncoder().encode("root:x:0:\nnogroup:x:65534:\n"));
  for (const bin of bins) tar.file(`root${inUsr(bin)}`, await Deno.readFile(bin), 0o755);
  tar.symlink("root/usr/bin/sh", "bash");
  for (const [path, data] of Object.entries(extra)) tar.file(`root${path}`, data, 0o755);
  for (const lib of libs) {
    const path = `root${inUsr(lib)}`;
    const dir = path.slice(0, path.lastIndexOf("/"));
    if (!["root/usr/lib", "root/usr/lib64"].includes(dir)) tar.dir(dir);
    tar.file(path, await Deno.readFile(await Deno.realPath(lib)), 0o755);
  }
  tar.file(
    "Dockerfile",
    new TextEncoder().encode("FROM scratch\nCOPY root/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n"),
  );
  using engine = await EngineClient.open(socket);
  const res = await engine.raw("POST", `/build?t=${encodeURIComponent(tag)}&rm=1&forcerm=1`, {
    body: tar.bytes(),
    headers: { "content-type": "application/x-tar" },
    signal: AbortSignal.timeout(240_000),
  });
  for (const line of (await res.text()).split("\n")) {
    if (line.trim() === "") continue;
    const msg = JSON.parse(line) as { error?: string };
    if (msg.error) throw new Error(`Cannot build ${tag}: ${msg.error}`);
  }
}
