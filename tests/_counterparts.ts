// What tests need besides Deno: the real counterparts they talk to (Chromium,
// OpenSSH, a sandbox, an engine, a cluster...), each with the way to get it.
// A test declares them with `test(name, { needs: [CHROMIUM] }, fn)`
// (tests/_test.ts). Where one is missing, the test is skipped and its name
// says which and how to install it (`deno test` counts it as ignored in its
// summary); where one is required, it fails instead: HUD_REQUIRE_ALL=1 (what
// .ci/run sets, and CI=true) requires every counterpart,
// HUD_REQUIRE_<NAME>=1 one of them (HUD_REQUIRE_K8S for "k8s").
//
// Each probe runs once per test module, when a test that needs it is
// declared, and is synchronous (tests are declared at module load).

import { landlockArgv } from "../workspace/_landlock.ts";
import {
  DEFAULT_PATH,
  findProgram as which,
  sandboxArgv,
  type SandboxConfig,
} from "../workspace/_sandbox.ts";
import { findEngineSocket } from "../engines/_engine.ts";

/** A program, service or capability of the machine that some tests need. */
export interface Counterpart {
  /** Its short name, as the skip message and `HUD_REQUIRE_<NAME>` spell it. */
  readonly name: string;
  /** How to get it, one line. */
  readonly install: string;
  /** `null` when it is here; else what is missing, one line. */
  readonly missing: string | null;
  /** Whether a missing one fails the test (CI) instead of skipping it. */
  readonly required: boolean;
  /** The variable that requires it alone: `HUD_REQUIRE_<NAME>`. */
  readonly requireVar: string;
}

function readEnv(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined; // no --allow-env
  }
}

/** The variable that requires counterpart `name`: `HUD_REQUIRE_<NAME>`. */
export function requireVar(name: string): string {
  return `HUD_REQUIRE_${name.toUpperCase().replace(/[^A-Z0-9]+/g, "_")}`;
}

/** Whether a missing `name` fails tests here instead of skipping them. */
export function isRequired(name: string): boolean {
  return readEnv("HUD_REQUIRE_ALL") === "1" || readEnv("CI") === "true" ||
    readEnv(requireVar(name)) === "1";
}

/**
 * A counterpart whose `probe` says what is missing (or null); the probe runs
 * at most once, when `missing` is first read.
 */
export function counterpart(
  name: string,
  install: string,
  probe: () => string | null,
): Counterpart {
  let result: { missing: string | null } | undefined;
  return {
    name,
    install,
    get missing() {
      result ??= { missing: probe() };
      return result.missing;
    },
    get required() {
      return isRequired(name);
    },
    requireVar: requireVar(name),
  };
}

/** Whether a file is there. */
function present(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/** A probe for programs on PATH: null, or which are missing. */
function programs(...names: string[]): () => string | null {
  return () => {
    const absent = names.filter((n) => which(n) === null);
    return absent.length === 0 ? null : `${absent.join(", ")} not found`;
  };
}

/** A probe for a Python module of /usr/bin/python3. */
function pythonModule(module: string): () => string | null {
  return () => {
    try {
      const out = new Deno.Command("/usr/bin/python3", {
        args: ["-c", `import ${module}`],
        stdout: "null",
        stderr: "null",
      }).outputSync();
      return out.success ? null : `python3 cannot import ${module}`;
    } catch {
      return "/usr/bin/python3 not found";
    }
  };
}

/**
 * Whether `true` runs under `isolation` here, as a workspace would run it:
 * null, or the last line of what the mechanism said.
 */
export function sandboxProbe(isolation: "bwrap" | "unshare"): string | null {
  if (Deno.build.os !== "linux") return `no ${isolation} on ${Deno.build.os}`;
  const cwd = Deno.makeTempDirSync({ prefix: "hud-sandbox-probe-" });
  try {
    const config: SandboxConfig = { isolation, writable: [cwd], network: false, user: null };
    const [name, ...args] = sandboxArgv(["true"], cwd, config);
    const program = which(name);
    if (program === null) return `"${name}" is not installed`;
    const out = new Deno.Command(program, {
      args,
      cwd: "/",
      env: { PATH: DEFAULT_PATH },
      clearEnv: true,
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).outputSync();
    if (out.success) return null;
    const said = new TextDecoder().decode(out.stderr).trim().split("\n").pop();
    return said || `exit status ${out.code}`;
  } finally {
    Deno.removeSync(cwd, { recursive: true });
  }
}

const SANDBOX_INSTALL =
  "apt-get install bubblewrap; in a container, user namespaces must be allowed: see docs/capabilities.md#where-user-namespaces-are-not-allowed";

/** A workspace sandbox, by either mechanism (bubblewrap, else util-linux `unshare`). */
export const SANDBOX: Counterpart = counterpart("sandbox", SANDBOX_INSTALL, () => {
  const bwrap = sandboxProbe("bwrap");
  if (bwrap === null) return null;
  const unshare = sandboxProbe("unshare");
  return unshare === null ? null : `no sandbox works here (bwrap: ${bwrap}; unshare: ${unshare})`;
});

/** A working bubblewrap sandbox. */
export const BWRAP: Counterpart = counterpart("bwrap", SANDBOX_INSTALL, () => {
  const why = sandboxProbe("bwrap");
  return why === null ? null : `bwrap cannot sandbox here: ${why}`;
});

/** A working util-linux `unshare` sandbox. */
export const UNSHARE: Counterpart = counterpart("unshare", SANDBOX_INSTALL, () => {
  const why = sandboxProbe("unshare");
  return why === null ? null : `unshare cannot sandbox here: ${why}`;
});

/** Root (uid switches, mounts, cgroups, network namespaces). */
export const ROOT_USER: Counterpart = counterpart(
  "root",
  "run the tests as root (sudo -E deno task test)",
  () => Deno.uid() === 0 ? null : `runs as uid ${Deno.uid()}, not root`,
);

/** Linux's Landlock (5.13 or later, enabled), which a workspace's `protect` is made of. */
export const LANDLOCK: Counterpart = counterpart(
  "landlock",
  "run the tests on Linux 5.13 or later with landlock among its LSMs (lsm= on the kernel's command line)",
  () => {
    if (Deno.build.os !== "linux") return `runs on ${Deno.build.os}`;
    // The launcher's own command line (workspace/_landlock.ts), "--" replaced by "--abi".
    const [deno, ...args] = landlockArgv([], []).slice(0, -1);
    const out = new Deno.Command(deno, {
      args: [...args, "--abi"],
      stdout: "piped",
      stderr: "piped",
    }).outputSync();
    const abi = Number(new TextDecoder().decode(out.stdout).trim());
    return out.success && abi > 0 ? null : "this kernel has no Landlock";
  },
);

/** Linux (namespaces, /proc). */
export const LINUX: Counterpart = counterpart(
  "linux",
  "run the tests on Linux (a VM or a container)",
  () => Deno.build.os === "linux" ? null : `runs on ${Deno.build.os}`,
);

/** Debian's Chromium, for the browser, CDP and viewer tests. */
export const CHROMIUM: Counterpart = counterpart(
  "chromium",
  "apt-get install chromium",
  programs("chromium"),
);

/** OpenSSH's server. */
export const SSHD: Counterpart = counterpart(
  "sshd",
  "apt-get install openssh-server",
  () => present("/usr/sbin/sshd") ? null : "/usr/sbin/sshd not found",
);

/** OpenSSH's client, sftp and scp. */
export const OPENSSH_CLIENT: Counterpart = counterpart(
  "openssh-client",
  "apt-get install openssh-client",
  programs("ssh", "sftp", "scp"),
);

/** Dropbear's client and server. */
export const DROPBEAR: Counterpart = counterpart(
  "dropbear",
  "apt-get install dropbear-bin",
  () =>
    programs("dbclient", "dropbearconvert")() ??
      (present("/usr/sbin/dropbear") ? null : "/usr/sbin/dropbear not found"),
);

/** curl. */
export const CURL: Counterpart = counterpart("curl", "apt-get install curl", programs("curl"));

/** npm, to install a real client from the registry (noVNC). */
export const NPM: Counterpart = counterpart("npm", "apt-get install npm", programs("npm"));

/** GNU diff and cmp, the references the diff tests compare against. */
export const DIFFUTILS: Counterpart = counterpart(
  "diffutils",
  "apt-get install diffutils",
  programs("diff", "cmp"),
);

/** git, whose check-ignore the glob tests compare against. */
export const GIT: Counterpart = counterpart("git", "apt-get install git", programs("git"));

/** find(1), which the SSH client's file fallbacks run on the server. */
export const FIND: Counterpart = counterpart("find", "apt-get install findutils", programs("find"));

/** flock(1), another process holding a lock. */
export const FLOCK: Counterpart = counterpart(
  "flock",
  "apt-get install util-linux",
  programs("flock"),
);

/** ssh-keygen, which writes and reads the keys the SSH key tests compare. */
export const SSH_KEYGEN: Counterpart = counterpart(
  "ssh-keygen",
  "apt-get install openssh-client",
  programs("ssh-keygen"),
);

/** A C compiler (the Harbor ctypes fixture's build). */
export const GCC: Counterpart = counterpart(
  "gcc",
  "apt-get install gcc libc6-dev",
  programs("gcc"),
);

/** Python's cryptography package, the reference for the cipher interop test. */
export const PY_CRYPTOGRAPHY: Counterpart = counterpart(
  "python3-cryptography",
  "apt-get install python3-cryptography",
  pythonModule("cryptography"),
);

/**
 * The interpreter `python3` on PATH names (not pyenv's launcher scripts,
 * slow to start), or "" where there is none: what the Python interop tests
 * run.
 */
export async function pythonExecutable(): Promise<string> {
  try {
    const out = await new Deno.Command("python3", {
      args: ["-c", "import sys; print(sys.executable)"],
      stdout: "piped",
      stderr: "null",
      signal: AbortSignal.timeout(30_000),
    }).output();
    return out.success ? new TextDecoder().decode(out.stdout).trim() : "";
  } catch {
    return ""; // none on PATH: spawning it throws
  }
}

/**
 * The npm package `name`@`version` for Deno: in Deno's npm cache already, or
 * the registry answering (one HEAD request, at most 5 s).
 */
export function npmPackage(name: string, version: string): Counterpart {
  return counterpart(`npm:${name}`, "a network that reaches registry.npmjs.org", () => {
    const dir = readEnv("DENO_DIR") ?? `${readEnv("HOME") ?? "/root"}/.cache/deno`;
    if (present(`${dir}/npm/registry.npmjs.org/${name}/${version}`)) return null;
    try {
      const out = new Deno.Command(Deno.execPath(), {
        args: [
          "eval",
          "--no-lock",
          `const r = await fetch("https://registry.npmjs.org/${name}", { method: "HEAD", signal: AbortSignal.timeout(5000) }); Deno.exit(r.ok ? 0 : 1);`,
        ],
        stdout: "null",
        stderr: "null",
      }).outputSync();
      return out.success
        ? null
        : `${name}@${version} is not in Deno's cache and the npm registry does not answer`;
    } catch {
      return `${name}@${version} is not in Deno's cache and the npm registry does not answer`;
    }
  });
}

/** util-linux `script` (a terminal for ssh -t). */
export const SCRIPT: Counterpart = counterpart(
  "script",
  "apt-get install bsdutils",
  programs("script"),
);

/**
 * A private mount namespace with a bind mount in it (`unshare -m`): root,
 * where the container runtime allows it.
 */
export const MOUNT_NAMESPACE: Counterpart = counterpart(
  "mount-namespace",
  "run the tests as root, outside a container or in one with CAP_SYS_ADMIN",
  () => {
    try {
      const out = new Deno.Command("unshare", {
        args: ["-m", "sh", "-c", "mount --bind /tmp /tmp"],
        stdout: "null",
        stderr: "piped",
      }).outputSync();
      const said = new TextDecoder().decode(out.stderr).trim().split("\n").pop();
      return out.success ? null : `unshare -m cannot bind-mount here: ${said}`;
    } catch {
      return "unshare not found";
    }
  },
);

/** PuTTY's pscp, psftp and puttygen. */
export const PUTTY: Counterpart = counterpart(
  "putty",
  "apt-get install putty-tools",
  programs("pscp", "psftp", "puttygen"),
);

/** Python 3 (the Python interop tests' client and server). */
export const PYTHON3: Counterpart = counterpart(
  "python3",
  "apt-get install python3",
  () => present("/usr/bin/python3") ? null : "/usr/bin/python3 not found",
);

/** paramiko, for /usr/bin/python3. */
export const PARAMIKO: Counterpart = counterpart(
  "paramiko",
  "apt-get install python3-paramiko",
  pythonModule("paramiko"),
);

/** asyncssh, for /usr/bin/python3. */
export const ASYNCSSH: Counterpart = counterpart(
  "asyncssh",
  "apt-get install python3-asyncssh",
  pythonModule("asyncssh"),
);

/** A Docker (or Podman) engine that answers on its socket. */
export const ENGINE: Counterpart = counterpart(
  "engine",
  "apt-get install docker.io and start dockerd (bash .ci/run does, behind its firewall guard)",
  () => {
    try {
      return findEngineSocket() === null ? "no engine socket" : null;
    } catch (err) {
      return err instanceof Error ? err.message.split("\n")[0] : String(err);
    }
  },
);

/** iptables that may change the tables (root with CAP_NET_ADMIN), and flock. */
export const IPTABLES: Counterpart = counterpart(
  "iptables",
  "apt-get install iptables, as root outside a container (or in one with CAP_NET_ADMIN)",
  () => {
    const absent = programs("iptables", "flock")();
    if (absent !== null) return absent;
    const out = new Deno.Command("iptables", {
      args: ["-w", "-t", "filter", "-S", "FORWARD"],
      stdout: "null",
      stderr: "piped",
    }).outputSync();
    const said = new TextDecoder().decode(out.stderr).trim().split("\n")[0];
    return out.success ? null : `iptables cannot read the tables here: ${said}`;
  },
);

/** Podman's API, where HUD_TEST_PODMAN_SOCKET names its socket (.ci/run starts it). */
export const PODMAN: Counterpart = counterpart(
  "podman",
  "apt-get install podman, start its API service (podman system service), and set HUD_TEST_PODMAN_SOCKET to its socket",
  () => {
    const path = readEnv("HUD_TEST_PODMAN_SOCKET");
    if (!path) return "HUD_TEST_PODMAN_SOCKET is not set";
    try {
      return Deno.statSync(path).isSocket ? null : `"${path}" is not a socket`;
    } catch {
      return `no socket at "${path}"`;
    }
  },
);
